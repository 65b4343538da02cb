"""The Tester's run history (tester_service.history): finished audits, aggregates only.

* the store: record, list (filters, newest first, limit), get (NotFound naming the id);
  a run recorded atomically (a failure, or a process killed, between its two rows leaves
  nothing); concurrent writers (threads and processes); the schema version check;
* through the real services: only an audit that finished with a released result is
  recorded (not an unknown dataset, a refused operator, a cancelled call, an audit the
  audit log could not record), once, with the run id the operator got; a history that
  cannot be written does not withhold the result; the file holds no member id;
* the Tester's ListRuns / GetRun over mutual TLS, behind the operator allow-list;
* `ppre audit --local` (default file in the data directory, `--history FILE`,
  `--history none`, run id on stderr) and `ppre runs list/show` against a file and
  against a running Tester.
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from client_service.datasets import DatasetRegistry
from common.net import channels, tls
from common.errors import InputError
from common.stats.results import AuditReport
from common.net.tls import TlsIdentity
from ppre.cli import main as ppre_main
from ppre.local import local_services
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from proto import ppre_pb2_grpc as pb_grpc
from tester_service import history as history_mod
from tester_service import server as tester_server
from tester_service.audit_log import AuditLog, result_digest
from tester_service.history import (SCHEMA_VERSION, HistoryError, RunHistory, RunNotFound, local_history_path,
                                    parse_time)
from tester_service.inputs import read_probability_table
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, wait_until, write_inputs

REPO = Path(__file__).resolve().parents[1]
N, OVERLAP = 160, 130


def _report(metric="ero", severity="none", n=100) -> str:
    return json.dumps({"metric": metric, "metric_option": "fpr", "n_matched": n, "bootstrap": 10,
                       "confidence": 0.95, "interval": "percentile",
                       "groups": [{"group": "white", "estimate": 0.1, "ci_low": 0.05, "ci_high": 0.15}],
                       "differences": [], "verdict": {"rule": "range", "tau": 0.05, "severity": severity,
                                                      "significant": False, "flagged": False, "compared": None,
                                                      "message": f"{severity}: no disparity"},
                       "params": {}, "info": {}, "result_recipient": "client", "tau": 0.05, "phase_seconds": {},
                       "preparation": {}})


def _record(history: RunHistory, started_at: str, metric="ero", dataset="ero", severity="none", n=100) -> str:
    return history.record(started_at=started_at, operator="operator.ppre.local", client="client.ppre.local",
                          metric=metric, metric_option="fpr", dataset=dataset,
                          parameters={"bootstrap": 10, "seed": 1, "metric_params": {}}, n_matched=n,
                          report_json=_report(metric, severity, n))


# --------------------------------------------------------------------------- the store

def test_record_list_get_and_filters(tmp_path):
    history = RunHistory(tmp_path / "sub" / "history.sqlite")  # the directory is created
    assert stat.S_IMODE(history.path.stat().st_mode) == 0o600
    a = _record(history, "2026-03-01T09:00:00.000000Z", "ero", "ero", "none", 100)
    b = _record(history, "2026-03-02T09:00:00.000000Z", "lot", "ranking", "high", 200)
    c = _record(history, "2026-03-03T23:59:59.000000Z", "ero", "ranking", "low", 300)
    assert [r.run_id for r in history.list()] == [c, b, a]  # newest first
    assert [r.run_id for r in history.list(metric="ero")] == [c, a]
    assert [r.run_id for r in history.list(dataset="ranking")] == [c, b]
    assert [r.run_id for r in history.list(metric="ero", dataset="ranking")] == [c]
    assert [r.run_id for r in history.list(since="2026-03-02")] == [c, b]
    assert [r.run_id for r in history.list(until="2026-03-02")] == [b, a]  # a date: the whole day
    assert [r.run_id for r in history.list(until="2026-03-03")] == [c, b, a]
    assert [r.run_id for r in history.list(since="2026-03-02T09:00:00Z", until="2026-03-02T09:00:00")] == [b]
    assert [r.run_id for r in history.list(since="2026-03-02T10:00:00+01:00")] == [c, b]  # 09:00 UTC
    assert [r.run_id for r in history.list(limit=2)] == [c, b]
    assert history.list(metric="pot") == []
    summary = history.list(metric="lot")[0]
    assert summary.report_json == "" and "report_json" not in summary.summary()
    assert (summary.dataset, summary.n_matched, summary.severity) == ("ranking", 200, "high")
    assert summary.verdict_message == "high: no disparity" and summary.parameters["seed"] == 1
    run = history.get(b)
    assert run.report_json == _report("lot", "high", 200) and run.result_sha256 == result_digest(run.report_json)
    assert (run.operator, run.client, run.metric_option) == ("operator.ppre.local", "client.ppre.local", "fpr")
    assert run.started_at < run.finished_at or run.finished_at.startswith("20")
    for bad in ({"since": "yesterday"}, {"until": "2026-13-01"}, {"limit": 0 - 1}, {"limit": 10 ** 6}):
        with pytest.raises(InputError):
            history.list(**bad)
    assert parse_time("2026-03-01", parameter="x") == "2026-03-01T00:00:00.000000Z"
    assert parse_time("2026-03-01", parameter="x", end=True) == "2026-03-02T00:00:00.000000Z"


def test_an_unknown_run_id_is_a_clear_not_found(tmp_path):
    history = RunHistory(tmp_path / "h.sqlite")
    with pytest.raises(RunNotFound, match="no run with id 'nosuchrun123'") as info:
        history.get("nosuchrun123")
    assert isinstance(info.value, HistoryError) and info.value.code == "not_found"
    with pytest.raises(HistoryError, match="no run history at"):
        RunHistory(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()  # a reader creates nothing


def test_run_ids_are_short_url_safe_and_distinct():
    ids = {history_mod.new_run_id() for _ in range(2000)}
    assert len(ids) == 2000
    for run_id in ids:
        assert len(run_id) == 12 and set(run_id) <= set("abcdefghijklmnopqrstuvwxyz234567")


def test_a_failure_mid_insert_leaves_nothing_half_written(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite"
    history = RunHistory(path)

    def fail(*a, **kw):
        raise sqlite3.OperationalError("disk I/O error (simulated, after the run's row was written)")
    monkeypatch.setattr(RunHistory, "_insert_result", staticmethod(fail))
    with pytest.raises(HistoryError):
        _record(history, "2026-03-01T09:00:00.000000Z")
    monkeypatch.undo()
    assert history.count() == 0 and history.list() == []
    # and a process that dies between the two rows (no rollback, no cleanup) leaves nothing either
    script = (
        "import os, sys\n"
        "from tester_service.history import RunHistory\n"
        "from tests.test_history import _record\n"
        "RunHistory._insert_result = staticmethod(lambda *a: os._exit(9))\n"
        "_record(RunHistory(sys.argv[1]), '2026-03-01T09:00:00.000000Z')\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, timeout=60)
    assert done.returncode == 9
    assert history.count() == 0
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM results").fetchone()[0] == 0
    run_id = _record(history, "2026-03-01T09:00:00.000000Z")  # the file is fine for the next one
    assert [r.run_id for r in history.list()] == [run_id]


def test_concurrent_writers_threads_and_processes(tmp_path):
    path = tmp_path / "h.sqlite"
    shared = RunHistory(path)
    ids: list[str] = []
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:  # half the threads share one object (its lock), half have their own connections' locking only
            history = shared if k % 2 else RunHistory(path)
            for i in range(15):
                ids.append(_record(history, f"2026-03-01T09:{k:02d}:{i:02d}.000000Z", dataset=f"d{k}"))
                history.list(limit=5)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    script = ("import sys\nfrom tester_service.history import RunHistory\nfrom tests.test_history import _record\n"
              "h = RunHistory(sys.argv[1])\n"
              "for i in range(15): _record(h, f'2026-03-02T10:00:{i:02d}.000000Z', dataset='proc')\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=REPO) for _ in range(2)]
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [p.wait(120) for p in procs] == [0, 0]
    assert errors == []
    assert len(set(ids)) == 90
    runs = shared.list(limit=1000)
    assert len(runs) == 120 and {r.run_id for r in runs} >= set(ids)
    assert len(shared.list(dataset="proc", limit=1000)) == 30
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM results").fetchone()[0] == 120


def test_schema_version_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    RunHistory(path)
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    for open_it in (lambda: RunHistory(path), lambda: RunHistory(path, create=False)):
        with pytest.raises(HistoryError, match=rf"schema version {SCHEMA_VERSION + 1}, written by a newer PPRE; "
                                               rf"this one reads version {SCHEMA_VERSION} only"):
            open_it()
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE notes (x TEXT)")
    with pytest.raises(HistoryError, match="is not a PPRE run history"):
        RunHistory(other)
    with sqlite3.connect(other) as con:  # left as it was
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["notes"]
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(HistoryError, match="cannot be used"):
        RunHistory(garbage)
    # the Tester checks its history when it is configured, before it serves
    with pytest.raises(HistoryError, match="schema version"):
        tester_server.TesterConfig("127.0.0.1:1", lambda: None, history=path)


# --------------------------------------------------------------------------- through the real services

@pytest.fixture()
def inputs(tmp_path):
    return write_inputs(tmp_path, N, OVERLAP, seed=21)


@pytest.fixture()
def services(inputs, tmp_path):
    _, _, tp, cp = inputs
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS,
                        history=tmp_path / "history.sqlite") as svc:
        yield svc


def _request(dataset="ero", **kw) -> pb.AuditRequest:
    return pb.AuditRequest(metric="ero", client_dataset=dataset, bootstrap=kw.pop("bootstrap", 10), has_seed=True,
                           seed=1, **kw)


def _idle(svc) -> bool:
    return svc.tester_servicer.active_sessions == 0 and svc.client_servicer.active_sessions == 0


def _stub(svc, identity: TlsIdentity | None = None):
    channel = channels.make_channel(svc.tester_address, tls=identity or svc.operator_tls,
                                    server_name=tls.TESTER_IDENTITY)
    return channel, pb_grpc.TesterStub(channel)


def test_only_finished_audits_are_recorded_once_and_without_member_ids(services, inputs, tmp_path, monkeypatch):
    svc = services
    history = svc.tester_config.history
    assert isinstance(history, RunHistory)
    # failed: an unknown dataset, a bad option
    assert run_audit(svc.tester_address, _request("no-such-dataset")).error.code == "bad_input"
    assert run_audit(svc.tester_address, _request(metric_option="precision")).error.code == "bad_input"
    # refused: an operator not on the allow-list
    rogue = svc.pki.identity("operator", name="rogue.ppre.local")
    assert run_audit(svc.tester_address, _request(), tls=rogue).error.code == "permission_denied"
    # cancelled: the operator's call ends long before the audit would
    assert run_audit(svc.tester_address, _request(bootstrap=500), timeout=0.05).error.code == "deadline_exceeded"
    assert wait_until(lambda: _idle(svc), 60)
    # an audit the audit log cannot record is not released, so not kept either
    broken_log = tmp_path / "broken-audit.log"
    broken_log.write_text('{"seq": 0, "half a record')
    svc.tester_config.audit_log = AuditLog(broken_log)
    assert run_audit(svc.tester_address, _request()).error.code == "audit_log"
    svc.tester_config.audit_log = AuditLog(tmp_path / "audit.log")
    assert wait_until(lambda: _idle(svc), 60)
    assert history.count() == 0

    event = run_audit(svc.tester_address, _request(tau=0.1, metric_params={}))
    assert event.WhichOneof("event") == "result", event
    assert wait_until(lambda: _idle(svc), 60)
    (run,) = history.list()
    assert event.result.run_id == run.run_id and history.count() == 1
    full = history.get(run.run_id)
    # result recipient client: the Tester keeps its receipt, never an estimate (design §3.7);
    # this process holds both sides, so its operator got the Test-Client's result
    kept, got = AuditReport.from_json(full.report_json), AuditReport.from_json(event.result.report_json)
    assert kept.is_receipt and kept.groups == [] and kept.differences == [] and kept.verdict.compared is None
    assert not got.is_receipt and got.groups and got.groups[0].estimate is not None
    assert (kept.n_matched, kept.release, kept.phase_seconds) == (got.n_matched, got.release, got.phase_seconds)
    audit_record = json.loads((tmp_path / "audit.log").read_text().splitlines()[-1])["record"]
    assert audit_record["outcome"]["result_sha256"] == full.result_sha256  # the two records of one audit
    assert (run.operator, run.client) == ("operator.ppre.local", "client.ppre.local")
    assert (run.metric, run.metric_option, run.dataset, run.n_matched) == ("ero", "fpr", "ero", OVERLAP)
    assert run.parameters == {"bootstrap": 10, "confidence": None, "tau": 0.1, "seed": 1,
                              "result_recipient": "client", "correction": "none", "metric_params": {}}
    report = AuditReport.from_json(full.report_json)
    assert run.severity == report.verdict.severity and run.verdict_message == report.verdict.message
    assert run.started_at <= run.finished_at

    # a history that cannot be written does not withhold the result: it comes without a run id
    def refuse(*a, **kw):
        raise HistoryError("the disk is full (simulated)")
    monkeypatch.setattr(RunHistory, "record", refuse)
    event = run_audit(svc.tester_address, _request())
    assert event.WhichOneof("event") == "result" and event.result.run_id == ""
    monkeypatch.undo()
    assert history.count() == 1

    # no member id anywhere in the file (nor in its WAL)
    tester, client, _, _ = inputs
    data = b"".join(p.read_bytes() for p in tmp_path.glob("history.sqlite*"))
    assert data and full.run_id.encode() in data
    assert not [m for m in set(tester.member_id) | set(client.member_id) if m.encode() in data]


def test_list_and_get_runs_over_grpc_behind_the_operator_allow_list(services, tmp_path):
    svc = services
    svc.tester_config.audit_log = AuditLog(tmp_path / "audit.log")
    event = run_audit(svc.tester_address, _request(result_recipient="tester"))  # the Tester holds the result
    run_id = event.result.run_id
    assert run_id
    channel, stub = _stub(svc)
    with channel:
        reply = stub.ListRuns(pb.ListRunsRequest(), timeout=10)
        assert [r.run_id for r in reply.runs] == [run_id]
        assert reply.runs[0].operator == "operator.ppre.local" and reply.runs[0].n_matched == OVERLAP
        assert json.loads(reply.runs[0].parameters_json)["bootstrap"] == 10
        assert list(stub.ListRuns(pb.ListRunsRequest(metric="lot"), timeout=10).runs) == []
        assert len(stub.ListRuns(pb.ListRunsRequest(dataset="ero", since="2000-01-01", limit=5), timeout=10).runs) == 1
        record = stub.GetRun(pb.GetRunRequest(run_id=run_id), timeout=10)
        assert record.report_json == event.result.report_json and record.summary.run_id == run_id
        assert record.result_sha256 == result_digest(event.result.report_json)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetRun(pb.GetRunRequest(run_id="zzzzzzzzzzzz"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "zzzzzzzzzzzz" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.ListRuns(pb.ListRunsRequest(since="last tuesday"), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "since" in info.value.details()
    # identities not on the operator allow-list: refused before the handler, and logged
    for who, identity in (("rogue.ppre.local", svc.pki.identity("operator", name="rogue.ppre.local")),
                          ("tester.ppre.local", svc.pki.identity("tester")),
                          ("client.ppre.local", svc.pki.identity("client"))):
        channel, stub = _stub(svc, identity)
        with channel:
            for call, request in ((stub.ListRuns, pb.ListRunsRequest()),
                                  (stub.GetRun, pb.GetRunRequest(run_id=run_id))):
                with pytest.raises(grpc.RpcError) as info:
                    call(request, timeout=10)
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert who in info.value.details() and "allow-listed operator" in info.value.details()
    refusals = [json.loads(line)["record"] for line in (tmp_path / "audit.log").read_text().splitlines()][1:]
    assert [(r["who"], r["method"]) for r in refusals][:2] == [("rogue.ppre.local", "/ppre.v1.Tester/ListRuns"),
                                                              ("rogue.ppre.local", "/ppre.v1.Tester/GetRun")]
    # a Tester without a history says so
    svc.tester_config.history = None
    channel, stub = _stub(svc)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            stub.ListRuns(pb.ListRunsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "--history" in info.value.details()
    assert run_audit(svc.tester_address, _request()).result.run_id == ""


# --------------------------------------------------------------------------- the CLI

def _local_audit(inputs, *extra: str) -> list[str]:
    _, _, tp, cp = inputs
    return ["audit", "--local", "--metric", "ero", "--tester-probabilities", str(tp), "--client-data", str(cp),
            "--bootstrap", "10", "--seed", "3", "--no-release-controls", "--executor", "inline", *extra]


def test_local_audits_and_ppre_runs_against_a_file(inputs, tmp_path, capsys, monkeypatch):
    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    default = local_history_path()
    assert default == Path(os.environ["XDG_DATA_HOME"]) / "ppre" / "history.sqlite"
    assert ppre_main(["runs", "list"]) == 0 and "no runs" in capsys.readouterr().err  # nothing yet
    assert not default.exists()

    assert ppre_main(_local_audit(inputs, "--json", "--result-recipient", "tester")) == 0  # kept in the history
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout: exactly the result, no run id in it
    assert "run_id" not in report
    (line,) = [ln for ln in err.splitlines() if ln.startswith("run id: ")]
    run_id = line.removeprefix("run id: ")
    assert default.exists()

    assert ppre_main(["runs", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["id", "date", "(UTC)"] and "severity" in table[0]
    assert len(table) == 2 and table[1].split()[0] == run_id and f" {OVERLAP} " in table[1]
    assert ppre_main(["runs", "list", "--json", "--metric", "ero", "--dataset", "local", "--limit", "3"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert listed["run_id"] == run_id and listed["n_matched"] == OVERLAP and listed["dataset"] == "local"
    assert ppre_main(["runs", "list", "--json", "--metric", "lot"]) == 0
    assert json.loads(capsys.readouterr().out) == {"runs": []}
    assert ppre_main(["runs", "show", run_id, "--json"]) == 0
    assert capsys.readouterr().out.strip() == out.strip()  # the stored JSON is what `ppre audit --json` printed
    assert ppre_main(["runs", "show", run_id]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"run {run_id}: started ") and "operator operator.ppre.local" in shown
    assert render_text(AuditReport.from_json(out)) in shown
    assert ppre_main(["runs", "show", "nosuchrun999"]) == 2
    assert "nosuchrun999" in capsys.readouterr().err
    # `ppre report RUN_ID DIR`: the run's report from the history, its JSON the stored result
    assert ppre_main(["report", run_id, str(tmp_path / "rep")]) == 0
    assert "report.html" in capsys.readouterr().err
    assert (tmp_path / "rep" / "report.json").read_text().strip() == out.strip()
    assert run_id in (tmp_path / "rep" / "report.html").read_text()
    assert ppre_main(["report", "nosuchrun999", str(tmp_path / "rep2")]) == 2
    assert "nosuchrun999" in capsys.readouterr().err and not (tmp_path / "rep2").exists()
    assert ppre_main(["runs", "show", "nosuchrun999", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "not_found"
    assert ppre_main(["runs", "list", "--since", "soon"]) == 2
    assert "since" in capsys.readouterr().err

    # --history FILE: that file instead; --history none: nothing kept, no run id
    own = tmp_path / "own" / "runs.sqlite"
    assert ppre_main(_local_audit(inputs, "--history", str(own))) == 0
    out, err = capsys.readouterr()
    assert "verdict:" in out and "run id: " in err
    assert ppre_main(_local_audit(inputs, "--history", "none")) == 0
    assert "run id" not in capsys.readouterr().err
    assert RunHistory(default).count() == 1 and RunHistory(own).count() == 1
    assert ppre_main(["runs", "list", "--history", str(own), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 1
    assert ppre_main(["runs", "list", "--history", str(tmp_path / "typo.sqlite")]) == 2
    assert "no run history at" in capsys.readouterr().err
    # --history is for --local: a remote Tester keeps its own
    assert ppre_main(["audit", "--tester", "127.0.0.1:1", "--client-dataset", "x", "--metric", "ero",
                      "--history", str(own), "--insecure"]) == 2
    assert "--history" in capsys.readouterr().err


def test_ppre_runs_against_a_running_tester(inputs, tmp_path, capsys, monkeypatch):
    """The services as `ppre tester/client serve --tls-dir ... --history FILE` configure them
    (in-process), the operator's `ppre audit` and `ppre runs list/show --tester`."""
    from client_service.server import ClientConfig
    from client_service.server import serve as serve_client
    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    _, _, tp, cp = inputs
    certs = tmp_path / "certs"
    assert ppre_main(["certs", "init", str(certs)]) == 0
    client_server, client_port, _ = serve_client(
        ClientConfig(DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True,
                     tls=TlsIdentity.from_dir(certs, "client"), accept_noiseless=True), 0, host="127.0.0.1")
    # `ppre tester serve --history FILE` / PPRE_TESTER_HISTORY reach TesterConfig.history
    from ppre.cli import build_parser
    base = ["tester", "serve", "--probabilities", str(tp)]
    assert build_parser().parse_args(base + ["--history", "h.sqlite"]).history == "h.sqlite"
    monkeypatch.setenv("PPRE_TESTER_HISTORY", "env.sqlite")
    assert build_parser().parse_args(base).history == "env.sqlite"
    monkeypatch.delenv("PPRE_TESTER_HISTORY")
    assert build_parser().parse_args(base).history is None
    tester_cfg = tester_server.TesterConfig(f"localhost:{client_port}", lambda: read_probability_table(tp),
                                            min_modulus_bits=TEST_BITS, tls=TlsIdentity.from_dir(certs, "tester"),
                                            release=NO_RELEASE_CONTROLS, history=str(tmp_path / "tester.sqlite"))
    tester_grpc, tester_port, _ = tester_server.serve(tester_cfg, 0, host="127.0.0.1")
    address = f"127.0.0.1:{tester_port}"
    remote = ["--tester", address, "--tls-dir", str(certs)]
    try:
        capsys.readouterr()
        assert ppre_main(["audit", "--tester", address, "--client-dataset", "ero", "--metric", "ero",
                          "--bootstrap", "10", "--json", "--tls-dir", str(certs)]) == 0
        out, err = capsys.readouterr()
        run_id = err.split("run id: ")[1].split()[0]
        assert ppre_main(["runs", "list", *remote]) == 0
        table = capsys.readouterr().out.splitlines()
        assert len(table) == 2 and table[1].startswith(run_id) and "ero" in table[1]
        assert ppre_main(["runs", "list", "--json", "--metric", "ero", "--since", "2000-01-01", *remote]) == 0
        (listed,) = json.loads(capsys.readouterr().out)["runs"]
        assert listed["run_id"] == run_id and listed["operator"] == "operator.ppre.local"
        assert ppre_main(["runs", "show", run_id, "--json", *remote]) == 0
        assert capsys.readouterr().out.strip() == out.strip()
        assert ppre_main(["runs", "show", run_id, *remote]) == 0
        assert render_text(AuditReport.from_json(out)) in capsys.readouterr().out
        assert ppre_main(["runs", "show", "zzzzzzzzzzzz", "--json", *remote]) == 2
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["code"] == "not_found" and "zzzzzzzzzzzz" in error["message"]
        # the Tester's own certificate is no operator's
        assert ppre_main(["runs", "list", "--tester", address, "--ca", str(certs / "ca.pem"),
                          "--cert", str(certs / "tester.pem"), "--key", str(certs / "tester.key"), "--json"]) == 2
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "permission_denied"
        # no certificates: refused before dialling; --tester and --history exclude each other
        assert ppre_main(["runs", "list", "--tester", address]) == 2
        assert "no TLS certificates" in capsys.readouterr().err
        assert ppre_main(["runs", "list", *remote, "--history", "x.sqlite"]) == 2
        assert "not both" in capsys.readouterr().err
    finally:
        tester_grpc.stop(0).wait(5)
        client_server.stop(0).wait(5)


@pytest.mark.slow
def test_tester_serve_history_flag_as_a_process(tmp_path, capsys, monkeypatch):
    """`ppre tester serve --history FILE` as an OS process: a finished audit is kept (and
    an unknown dataset is not); `ppre runs list/show --tester` read it over mTLS."""
    from tests.processes import dev_cert_dir, make_client, make_tester, write_dataset
    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    dataset = write_dataset(tmp_path / "data", N, N, OVERLAP, seed=5)
    path = tmp_path / "tester-history.sqlite"
    client = make_client(tmp_path, dataset)
    tester = None
    try:
        client.start()
        client.wait_healthy()
        tester = make_tester(tmp_path, dataset, client.address, extra=["--history", str(path)])
        tester.start()
        tester.wait_healthy()
        assert run_audit(tester.address, _request("nope"), timeout=120).error.code == "bad_input"
        event = run_audit(tester.address, _request(), timeout=120)
        assert event.WhichOneof("event") == "result" and event.result.run_id, event
        remote = ["--tester", tester.address, "--tls-dir", str(dev_cert_dir())]
        assert ppre_main(["runs", "list", "--json", *remote]) == 0
        (listed,) = json.loads(capsys.readouterr().out)["runs"]
        assert listed["run_id"] == event.result.run_id and listed["n_matched"] == OVERLAP
        assert ppre_main(["runs", "show", event.result.run_id, "--json", *remote]) == 0
        assert capsys.readouterr().out.strip() == event.result.report_json
    finally:
        if tester is not None:
            tester.close()
        client.close()
    assert RunHistory(path, create=False).count() == 1
