"""A new user's own exports: `ppre bisg` reads a members file whose columns have other
names through the column mapping (`--id-column`, `--column`), and `ppre client
check-config` warns of a dataset named after a metric it cannot serve, naming the
missing column.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.processes import child_env, ppre_argv

MEMBERS = ("Customer Key,Last Name,zip\n"
           "c1,GARCIA,10001\nc2,SMITH,60601\nc3,NGUYEN,94103\nc4,JOHNSON,30303\n")


def ppre(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*ppre_argv(), *args], capture_output=True, text=True, timeout=60, env=child_env(), cwd=cwd)


def test_bisg_reads_ones_own_members_export_through_the_column_mapping(tmp_path):
    (tmp_path / "crm.csv").write_text(MEMBERS)
    out = ppre("bisg", "--input", "crm.csv", "--output", "probs.csv", "--id-column", "Customer Key",
               "--column", "surname=Last Name", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "probs.csv").read_text().splitlines()
    assert lines[0].replace('"', "").startswith("member_id,white,black") and len(lines) == 5
    assert lines[1].startswith("c1,")


def test_bisg_names_a_mapping_to_a_column_it_does_not_read(tmp_path):
    (tmp_path / "crm.csv").write_text(MEMBERS)
    out = ppre("bisg", "--input", "crm.csv", "--output", "probs.csv", "--id-column", "Customer Key",
               "--column", "surnme=Last Name", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--column" in out.stderr and "did you mean 'surname'?" in out.stderr
    assert not (tmp_path / "probs.csv").exists()


def test_check_config_warns_of_a_dataset_named_after_a_metric_it_cannot_serve(tmp_path):
    (tmp_path / "model_outputs.csv").write_text("member_id,y_pred\n" + "".join(f"m{i},{i % 2}\n" for i in range(20)))
    out = ppre("client", "check-config", "--data-only", "--dataset", "ero=model_outputs.csv", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    warn = next(line for line in out.stdout.splitlines() if line.strip().startswith("WARN"))
    assert "named after ero but cannot serve it: it lacks y_true" in warn and "--column y_true=" in warn
    assert "1 warning:" in out.stdout and "all is well but for the warnings above" in out.stdout
    data = json.loads(ppre("client", "check-config", "--data-only", "--json", "--dataset", "ero=model_outputs.csv",
                           cwd=tmp_path).stdout)
    assert data["ok"] and len(data["warnings"]) == 1 and "y_true" in data["warnings"][0]
    # a dataset that serves the metric it is named after: no warning
    (tmp_path / "ero.csv").write_text("member_id,y_pred,y_true\n" + "".join(f"m{i},{i % 2},0\n" for i in range(20)))
    quiet = ppre("client", "check-config", "--data-only", "--dataset", "ero=ero.csv", cwd=tmp_path)
    assert quiet.returncode == 0 and "WARN" not in quiet.stdout and "\nall is well\n" in quiet.stdout + "\n"
