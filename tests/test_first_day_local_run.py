"""What a new user gets back after `ppre audit --local`: `ppre runs list`, `ppre runs
show` and `ppre report` give back the estimates the terminal showed, with the request's
correction and the verdict's severity, and the history holds no member id, probability
or test value; a reader that closes the pipe early (`| head -1`) ends every printing
command quietly.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.processes import child_env, ppre_argv


def ppre(*args: str, env: dict, cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """`ppre ARGS` as a user runs it, in its own process."""
    return subprocess.run([*ppre_argv(), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """One `ppre audit --local --correction calibration` on 3,000 synthetic members
    (test keys), with its own data directory: (env, cwd, terminal's stdout, run id)."""
    home = tmp_path_factory.mktemp("first-day")
    env = {**child_env(test_keys=True), "XDG_DATA_HOME": str(home / "xdg")}
    made = ppre("demo", "--write-data", "data", "--members", "3000", env=env, cwd=home)
    assert made.returncode == 0, made.stderr
    out = ppre("audit", "--local", "--metric", "ero", "--correction", "calibration", "--executor", "inline",
               "--tester-members", "data/tester/members.csv", "--tester-self-id", "data/tester/self_id.csv",
               "--client-data", "data/client/ero.csv", env=env, cwd=home)
    assert out.returncode == 0, out.stderr
    run_id = next(line.split(": ", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("run id:"))
    return env, home, out.stdout, run_id


def _table(text: str) -> list[str]:
    """The estimate rows of a printed result (one line per group)."""
    groups = ("white ", "black ", "api ", "aian ", "multiple ", "hispanic ", "overall ")
    return [line for line in text.splitlines() if line.startswith(groups)]


def test_runs_show_prints_the_estimates_the_terminal_showed(local_run):
    env, home, shown, run_id = local_run
    out = ppre("runs", "show", run_id, env=env, cwd=home)
    assert out.returncode == 0, out.stderr
    assert _table(shown) and _table(out.stdout) == _table(shown)
    assert "result delivered to the Test-Client" not in out.stdout and "--results-dir" not in out.stdout
    assert "correction: calibration" in out.stdout
    verdict = json.loads(ppre("runs", "show", run_id, "--json", env=env, cwd=home).stdout)["verdict"]
    listed = ppre("runs", "list", env=env, cwd=home).stdout
    row = next(line for line in listed.splitlines() if line.startswith(run_id))
    assert verdict["severity"] and row.endswith(verdict["severity"])


def test_report_of_the_run_holds_its_estimates_and_correction(local_run):
    env, home, shown, run_id = local_run
    out = ppre("report", run_id, "report", env=env, cwd=home)
    assert out.returncode == 0, out.stderr
    data = json.loads((home / "report" / "report.json").read_text(encoding="utf-8"))
    assert data["correction"]["method"] == "calibration" and data["n_matched"] == 3000
    black = next(g for g in data["groups"] if g["group"] == "black")
    assert f"{black['estimate']:.4f}" in next(line for line in _table(shown) if line.startswith("black "))
    page = (home / "report" / "report.html").read_text(encoding="utf-8")
    assert f"{black['estimate']:.4f}" in page and "calibration (M^-1 Num" in page
    assert "Result delivered to the Test-Client" not in page


def test_the_history_holds_aggregates_only(local_run, tmp_path):
    """No member id, probability or test value: the ids of the input files appear nowhere
    in the history file, and what it keeps of the run is one result (`AuditReport`:
    aggregates), no table."""
    from common.stats.results import AuditReport
    env, home, _, run_id = local_run
    history = Path(env["XDG_DATA_HOME"]) / "ppre" / "history.sqlite"
    with sqlite3.connect(history) as con:
        dumped = "\n".join(con.iterdump())
        (kept,) = con.execute("SELECT report_json FROM results WHERE run_id = ?", (run_id,)).fetchone()
    ids = [line.split(",")[0] for line in (home / "data" / "client" / "ero.csv").read_text().splitlines()[1:]]
    assert ids and not any(f"'{i}'" in dumped or f'"{i}"' in dumped for i in ids)
    report = AuditReport.from_json(kept)
    assert json.loads(report.to_json()) == json.loads(kept)  # nothing beside the result's own fields
    assert len(report.groups) == 7 and not report.cells and not report.pools


@pytest.mark.parametrize("command", [["runs", "list"], ["runs", "list", "--json"], ["runs", "show", "RUN"],
                                     ["--help"], ["audit", "--help"]])
def test_a_closed_pipe_ends_the_command_quietly(local_run, command):
    """`ppre runs list | head -1`: the reader has gone before the command writes; the
    command ends with no traceback and the shell's status for a closed pipe (141; help
    text is argparse's, which ends as if it had been read: 0)."""
    env, home, _, run_id = local_run
    argv = [*ppre_argv(), *(run_id if a == "RUN" else a for a in command)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=home)
    proc.stdout.close()  # `head -1` that has read its line, or never reads at all
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert rc == (0 if "--help" in command else 141), (rc, err)


def test_a_receipt_page_names_the_requested_correction(tmp_path):
    """A service's history keeps the Tester's receipt (the result is the Test-Client's):
    its page says which correction the request asked for, not "none"."""
    from common.stats.results import receipt
    from tester_service.history import RunHistory
    kept = receipt(metric="ero", option="fpr", bootstrap=10, confidence=0.95, interval="percentile", tau=0.05,
                   params={}, audit_id="q3V8m1Xc0aZkR2tE")
    history = RunHistory(tmp_path / "history.sqlite")
    run_id = history.record(started_at="2026-03-01T12:00:00.000000Z", operator="operator.ppre.local",
                            client="client.ppre.local", metric="ero", metric_option="fpr", dataset="ero",
                            parameters={"correction": "calibration", "result_recipient": "client"}, n_matched=90,
                            report_json=kept.to_json())
    env = child_env(test_keys=True)
    out = ppre("report", run_id, str(tmp_path / "rep"), "--history", str(tmp_path / "history.sqlite"),
               env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "calibration requested: applied by the Test-Client" in page and "<dd>none</dd>" not in page
