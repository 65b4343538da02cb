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


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    """`ppre demo --write-data data` with 500 members: data/tester/{members,self_id}.csv, data/client/ero.csv."""
    home = tmp_path_factory.mktemp("first-day-messages")
    made = ppre("demo", "--write-data", "data", "--members", "500", cwd=home)
    assert made.returncode == 0, made.stderr
    return home


def local_audit(home: Path, client_data: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**child_env(test_keys=True), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    return ppre("audit", "--local", "--metric", "ero", "--executor", "inline", "--tester-members",
                str(home / "data/tester/members.csv"), "--tester-self-id", str(home / "data/tester/self_id.csv"),
                "--client-data", client_data, cwd=tmp_path, env=env, timeout=120)


def test_a_local_run_whose_ids_match_nothing_says_so_before_encrypting(demo_data, tmp_path):
    lines = (demo_data / "data/client/ero.csv").read_text().splitlines()
    (tmp_path / "outputs.csv").write_text("\n".join([lines[0]] + ["x" + line for line in lines[1:]]) + "\n")
    err = refused(local_audit(demo_data, "outputs.csv", tmp_path))
    assert "file outputs.csv, column 'member_id': no member id matched" in err
    assert "data/tester/members.csv" in err and "--client-id-column" in err
    assert "audit id:" not in err and "below the Tester's minimum" not in err  # no audit was started


def test_an_audit_says_what_its_two_ids_are_for(demo_data, tmp_path):
    out = local_audit(demo_data, str(demo_data / "data/client/ero.csv"), tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    run_id = next(line for line in lines if line.startswith("run id: ")).removeprefix("run id: ")
    assert any(line.startswith("audit id: ") for line in lines)
    words = lines[lines.index(f"run id: {run_id}") + 1]
    assert f"the run id names this result in the run history: ppre runs show {run_id}" in words
    assert "the audit id printed first names this audit in both services' log lines" in words


# --------------------------------------------------------------------------------------
# Progress, health, TLS files, a failed start
# --------------------------------------------------------------------------------------
def test_the_demo_prints_each_progress_line_once_under_heartbeats(tmp_path):
    """The Tester's heartbeat repeats its latest progress while a phase is silent; the
    demo's plain progress (never a terminal) prints it once."""
    env = child_env({"PPRE_HEARTBEAT_S": "0.05"}, test_keys=True)
    out = ppre("demo", "--members", "2000", "--bootstrap", "100", cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    events = [line.split("] ", 1)[1] for line in out.stdout.splitlines() if line.startswith("  [")]
    assert "handshake: session keys generated; contacting the Test-Client" in events
    assert len(events) == len(set(events)), [e for e in events if events.count(e) > 1]


def test_plain_progress_prints_a_repeated_event_once_after_other_news():
    import io

    from ppre.progress import PlainProgress
    from proto import ppre_pb2 as pb
    out = io.StringIO()
    writer = PlainProgress(out)
    handshake = dict(phase="handshake", message="session keys generated; contacting the Test-Client", audit_id="A")
    writer(pb.Progress(elapsed_s=0.2, **handshake))
    writer(pb.Progress(phase="client:keygen", message="Test-Client busy", elapsed_s=0.3, audit_id="A"))
    writer(pb.Progress(elapsed_s=5.2, **handshake))  # the Tester's heartbeat: its latest own progress
    assert sum("handshake:" in line for line in out.getvalue().splitlines()) == 1


@pytest.fixture(scope="module")
def client_of_another_ca(tmp_path_factory):
    """A Test-Client service (the session's development CA) and a second CA's certificates."""
    from tests.processes import make_client, write_dataset
    base = tmp_path_factory.mktemp("other-ca")
    made = ppre("certs", "init", "other", cwd=base)
    assert made.returncode == 0, made.stderr
    client = make_client(base, write_dataset(base / "data", 20, 20, 20)).start()
    try:
        client.wait_healthy()
        yield base, client
    finally:
        client.close()


def test_health_against_a_service_of_another_ca_prints_its_one_line(client_of_another_ca):
    base, client = client_of_another_ca
    out = ppre("health", client.address, "--tls-dir", "other", "--tls-role", "operator", "--server-identity",
               "client.ppre.local", cwd=base)
    assert out.returncode == 4, out.stdout + out.stderr
    assert out.stdout.startswith("TLS FAILED: a service answers at") and len(out.stdout.splitlines()) == 1
    assert out.stderr == "", out.stderr  # no gRPC core log line ("Handshake failed ...")


def test_tls_paths_that_are_the_wrong_kind_name_the_flag(tmp_path):
    made = ppre("certs", "init", "certs", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "a-file").write_text("")
    address = "127.0.0.1:9"
    err = refused(ppre("health", address, "--tls-dir", "nosuch", "--tls-role", "operator", cwd=tmp_path))
    assert "parameter '--tls-dir': 'nosuch' does not exist" in err and "ppre certs init DIR" in err
    assert "file nosuch" not in err
    err = refused(ppre("health", address, "--tls-dir", "a-file", "--tls-role", "operator", cwd=tmp_path))
    assert "parameter '--tls-dir': 'a-file' is a file, not a directory" in err
    err = refused(ppre("health", address, "--ca", "certs/ca.pem", "--cert", "certs", "--key", "certs/operator.key",
                       cwd=tmp_path))
    assert "parameter '--cert': 'certs' is a directory: give the PEM file, or the directory as --tls-dir DIR" in err


def test_a_tester_that_cannot_bind_its_port_leaves_no_history_file(demo_data, tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = refused(ppre("tester", "serve", "--insecure", "--port", str(port), "--ephemeral-budget",
                           "--members", str(demo_data / "data/tester/members.csv"), "--history", "h2.sqlite",
                           cwd=tmp_path))
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert not list(tmp_path.glob("h2.sqlite*"))
    # an existing history is never removed
    (tmp_path / "kept.sqlite").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        refused(ppre("tester", "serve", "--insecure", "--port", str(taken.getsockname()[1]), "--ephemeral-budget",
                     "--members", str(demo_data / "data/tester/members.csv"), "--history", "kept.sqlite",
                     cwd=tmp_path))
    assert (tmp_path / "kept.sqlite").exists()
