"""What a new user reads when an input or a command goes wrong: each message names the
file, column, row or flag and ends with what to do (docs/inputs.md, "File rules";
docs/troubleshooting.md). Each test runs `ppre` as the user does, in its own process.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.processes import child_env, ppre_argv


def ppre(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([*ppre_argv(), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or child_env(), cwd=cwd)


def refused(out: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


# --------------------------------------------------------------------------------------
# Input files
# --------------------------------------------------------------------------------------
def test_a_latin1_file_is_refused_with_how_to_convert_it(tmp_path):
    (tmp_path / "members.csv").write_bytes(b"member_id,surname,zip\nc1,M\xfcller,10001\nc2,SMITH,60601\n")
    err = refused(ppre("bisg", "--input", "members.csv", "--output", "probs.csv", cwd=tmp_path))
    assert "file members.csv, data row 1: is not valid UTF-8 text (line 2)" in err
    assert "iconv -f latin1 -t utf-8 members.csv > members.utf8.csv" in err
    # and the converted file is read
    converted = subprocess.run(["iconv", "-f", "latin1", "-t", "utf-8", "members.csv"], capture_output=True,
                               cwd=tmp_path, check=True).stdout
    (tmp_path / "members.utf8.csv").write_bytes(converted)
    assert ppre("bisg", "--input", "members.utf8.csv", "--output", "probs.csv", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("separator, words", [(";", "semicolon"), ("\t", "tab")])
def test_a_semicolon_separated_file_is_named_as_such(tmp_path, separator, words):
    rows = [["member_id", "y_true", "y_pred"]] + [[f"m{i}", "0", str(i % 2)] for i in range(20)]
    (tmp_path / "ero.csv").write_text("".join(separator.join(r) + "\n" for r in rows))
    out = ppre("client", "check-config", "--data-only", "--dataset", "ero=ero.csv", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"file ero.csv: looks {words}-separated" in out.stdout
    assert "save it as CSV with commas" in out.stdout
    assert "is missing column" not in out.stdout  # not read as one column


def test_true_false_predictions_say_to_write_1_0(tmp_path):
    (tmp_path / "ero.csv").write_text("member_id,y_true,y_pred\n" + "".join(
        f"m{i},0,{'True' if i % 2 else 'False'}\n" for i in range(20)))
    out = ppre("client", "check-config", "--data-only", "--dataset", "ero=ero.csv", cwd=tmp_path)
    assert out.returncode == 2 and "WARN" not in out.stdout  # the failure is the message
    assert "file ero.csv, column 'y_pred', data row 1: not a number: expected 0/1 (True/False: write 1/0)" \
        in out.stdout
    # y_true (read as a number by every metric) says the same
    (tmp_path / "ero.csv").write_text("member_id,y_true,y_pred\n" + "".join(f"m{i},false,1\n" for i in range(20)))
    out = ppre("client", "check-config", "--data-only", "--dataset", "ero=ero.csv", cwd=tmp_path)
    assert "column 'y_true', data row 1: not a number: expected 0/1 (True/False: write 1/0)" in out.stdout


def test_a_duplicate_id_names_the_users_own_column(tmp_path):
    (tmp_path / "crm.csv").write_text("Customer Key,Last Name,zip\nc1,GARCIA,10001\nc2,SMITH,60601\n"
                                      "c1,NGUYEN,94103\n")
    err = refused(ppre("bisg", "--input", "crm.csv", "--output", "probs.csv", "--id-column", "Customer Key",
                       "--column", "surname=Last Name", cwd=tmp_path))
    assert "file crm.csv, column 'Customer Key', data row 3: duplicate member id (the same as data row 1)" in err
    (tmp_path / "outputs.csv").write_text("Account,y_true,y_pred\n" + "".join(f"m{i % 15},0,1\n" for i in range(20)))
    out = ppre("client", "check-config", "--data-only", "--dataset", "ero=outputs.csv", "--id-column", "Account",
               cwd=tmp_path)
    assert "file outputs.csv, column 'Account', data row 16: duplicate member id" in out.stdout
    assert "'member_id'" not in out.stdout


def test_a_local_run_whose_ids_match_nothing_says_so_before_encrypting(tmp_path):
    env = {**child_env(test_keys=True), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    made = ppre("demo", "--write-data", "data", "--members", "500", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    lines = (tmp_path / "data/client/ero.csv").read_text().splitlines()
    (tmp_path / "outputs.csv").write_text("\n".join([lines[0]] + ["x" + line for line in lines[1:]]) + "\n")
    out = ppre("audit", "--local", "--metric", "ero", "--executor", "inline", "--tester-members",
               "data/tester/members.csv", "--tester-self-id", "data/tester/self_id.csv", "--client-data",
               "outputs.csv", cwd=tmp_path, env=env)
    err = refused(out)
    assert "file outputs.csv, column 'member_id': no member id matched" in err
    assert "data/tester/members.csv" in err and "--client-id-column" in err
    assert "encrypt" not in err.lower() and "below the Tester's minimum" not in err
