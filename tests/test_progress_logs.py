"""`ppre audit`'s live progress, Ctrl-C, and the services' structured logs.

* The progress renderer (`ppre.progress`): phases in the operator's words, bars, rates,
  ETAs on a terminal (a fake TTY stream), today's plain lines elsewhere, nothing but the
  audit id with --json.
* The log formats (`common.logs`): one JSON object per line with time, level, service,
  audit id, event and fields; text lines with the same id and fields; tracebacks keep
  their frames but not a library exception's message; one line per phase (`PhaseLog`).
* The correlation id: drawn by the Tester per audit, sent in the Hello (checked by the
  Test-Client: short, URL-safe), on both services' log lines, different for two audits,
  returned to the operator (`audit id: ...` on stderr).
* No member-level data and no key in JSON logs at DEBUG: member ids, surnames, first
  names and probabilities, the Paillier modulus and private key, every other session key.
* Ctrl-C: `ppre audit` against running services and with --local exits 130 after one
  line, "cancelled"; the Tester ends the audit and aborts the Test-Client's session; both
  services drop it, stay healthy and run the next audit.
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from common import logs
from common.errors import InputError, ProtocolError
from ppre import progress as pp
from tests.processes import PROGRESS_RE, child_env, foreground_argv, ppre_argv
from tests.test_secrets_at_rest import captured  # noqa: F401 - the fixture that records every key drawn


def ev(phase: str, elapsed: float, done: int = 0, total: int = 0, message: str = "", audit_id: str = ""):
    return SimpleNamespace(phase=phase, elapsed_s=elapsed, done=done, total=total, message=message,
                           audit_id=audit_id)


class FakeTTY(io.StringIO):
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


AUDIT_ID = "Abc_123-xyz"


# --------------------------------------------------------------------------- the renderer

def test_phases_are_named_in_the_operators_words():
    assert [pp.label(p) for p in ("inputs", "handshake", "psi_upload", "psi_shuffled", "client:he_encrypt", "join",
                                  "aggregation", "bootstrap", "client:decrypt")] == \
        ["preparation", "preparation", "upload", "PSI", "encryption", "join", "aggregation", "bootstrap",
         "decryption"]
    assert pp.label("client:squares") == "Test-Client squares" and pp.label("new_phase") == "new_phase"


def test_a_counted_phase_has_a_bar_a_rate_and_an_eta():
    state = pp.ProgressState()
    state.update(ev("psi_upload", 10.0, 0, 12_000, audit_id=AUDIT_ID))
    state.update(ev("psi_upload", 12.0, 3_000, 12_000))
    phase = state.current
    assert state.audit_id == AUDIT_ID and phase.label == "upload"
    assert phase.rate == pytest.approx(1_500.0) and phase.eta_s == pytest.approx(6.0)
    line = pp.render_line(phase, 120)
    assert line.startswith("upload ")
    assert "[" + "\u2588" * 6 + "\u2591" * 18 + "]" in line  # 25% of 24 cells
    assert " 25%" in line and "3,000/12,000 rows" in line and "1,500 rows/s" in line and "ETA 0:06" in line
    assert "(2.0s)" in line
    ascii_line = pp.render_line(phase, 120, ascii_only=True)
    assert "[" + "#" * 6 + "-" * 18 + "]" in ascii_line
    # narrow terminals: cut, never wrapped
    assert len(pp.render_line(phase, 30)) == 30
    # done: no ETA
    state.update(ev("psi_upload", 18.0, 12_000, 12_000))
    assert state.current.eta_s is None and "ETA" not in pp.render_line(state.current, 120)
    assert "100%" in pp.render_line(state.current, 120)


def test_an_uncounted_phase_shows_its_message_and_time():
    state = pp.ProgressState()
    state.update(ev("inputs", 0.0, message="reading the Tester's inputs"))
    state.update(ev("inputs", 1.5))  # a heartbeat: the same phase, later
    line = pp.render_line(state.current, 100)
    assert line.startswith("preparation") and "reading the Tester's inputs" in line and "(1.5s)" in line
    assert "%" not in line and "ETA" not in line


def test_phases_end_with_a_summary_and_keep_their_counts():
    state = pp.ProgressState()
    assert state.update(ev("inputs", 0.0, message="reading")) is None
    assert state.update(ev("handshake", 0.4)) is None  # same label: the same displayed phase
    ended = state.update(ev("join", 3.0, 1_000, 4_000))
    assert ended.label == "preparation" and ended.seconds == pytest.approx(3.0)  # announced at its start
    state.update(ev("join", 5.0, 4_000, 4_000))
    state.update(ev("join", 5.0, message="3000 rows matched"))  # the closing note carries no counts
    assert (state.current.done, state.current.total) == (4_000, 4_000)
    ended = state.update(ev("aggregation", 7.0, 1, 16))
    assert ended.label == "join" and ended.seconds == pytest.approx(2.0)  # counted: ends at its last report
    # the first rows counted came after the previous phase's last report
    assert ended.rate == pytest.approx(1_500.0)
    assert pp.summary_line(ended) == "\u2713 join           2.0s  4,000 rows  1,500 rows/s"
    assert pp.summary_line(ended, ascii_only=True).startswith("ok join")
    assert pp.unit("aggregation") == "items" and pp.unit("join") == "rows"
    assert [p.label for p in state.finished] == ["preparation", "join"]


def test_a_second_count_in_one_phase_restarts_its_rate():
    state = pp.ProgressState()
    state.update(ev("bootstrap", 1.0, 8, 16))
    state.update(ev("bootstrap", 2.0, 16, 16))
    state.update(ev("bootstrap", 3.0, 2, 16))  # a second pass (e.g. squares, then masking)
    assert state.current.rate == pytest.approx(2.0)  # 2 items since 2.0 s
    assert state.current.eta_s == pytest.approx(7.0)


def test_a_terminal_gets_live_lines_redrawn_in_place():
    tty = FakeTTY()
    writer = pp.for_stream(tty)
    assert isinstance(writer, pp.TerminalProgress) and not writer.ascii_only
    writer._width = 100
    writer(ev("inputs", 0.0, message="reading the Tester's inputs", audit_id=AUDIT_ID))
    writer(ev("psi_upload", 1.0, 1_000, 4_000, audit_id=AUDIT_ID))
    writer(ev("psi_upload", 2.0, 3_000, 4_000, audit_id=AUDIT_ID))
    writer(ev("done", 3.0, message="result received", audit_id=AUDIT_ID))
    writer.close()
    text = tty.getvalue()
    assert text.count(f"audit id: {AUDIT_ID}\n") == 1
    assert text.startswith(f"\r\x1b[2Kaudit id: {AUDIT_ID}\n")
    assert "\r\x1b[2Kupload      [" in text and "3,000/4,000 rows" in text and "ETA" in text
    lines = text.split("\n")
    assert any(line.endswith("\u2713 upload         1.0s  3,000/4,000 rows  2,000 rows/s") for line in lines), lines
    assert text.endswith("\r\x1b[2K")  # the "done" line is cleared: the result follows on a clean line
    assert not any(PROGRESS_RE.match(part) for part in re.split(r"\r\x1b\[2K|\n", text))  # no plain lines


def test_a_terminal_that_closes_mid_phase_keeps_its_summary():
    tty = FakeTTY()
    writer = pp.TerminalProgress(tty, width=80)
    writer(ev("client:he_encrypt", 4.0, 100, 400))
    writer.close()
    writer.close()  # idempotent
    assert tty.getvalue().endswith("\u2713 encryption     0.0s  100/400 rows\n")


def test_a_pipe_gets_todays_plain_lines(monkeypatch):
    out = io.StringIO()
    writer = pp.for_stream(out)
    assert isinstance(writer, pp.PlainProgress)
    writer(ev("inputs", 0.0, message="reading the Tester's inputs", audit_id=AUDIT_ID))
    writer(ev("client:he_encrypt", 12.345, 2, 6, message="Test-Client busy: 2 of 6", audit_id=AUDIT_ID))
    writer.close()
    lines = out.getvalue().splitlines()
    assert lines == [f"audit id: {AUDIT_ID}", "[   0.00s] inputs: reading the Tester's inputs",
                     "[  12.35s] client:he_encrypt: Test-Client busy: 2 of 6"]
    assert all(PROGRESS_RE.match(line) for line in lines[1:])  # what tests/processes.py parses
    # a dumb terminal too
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(pp.for_stream(FakeTTY()), pp.PlainProgress)


def test_json_mode_prints_nothing_but_the_audit_id():
    tty = FakeTTY()
    writer = pp.for_stream(tty, as_json=True)
    writer(ev("inputs", 0.0, message="x", audit_id=AUDIT_ID))
    writer(ev("join", 1.0, 5, 10, audit_id=AUDIT_ID))
    writer.close()
    assert tty.getvalue() == f"audit id: {AUDIT_ID}\n"


def test_durations_and_counts_read_well():
    assert [pp.duration(s) for s in (0, 7.4, 205, 3723)] == ["0:00", "0:07", "3:25", "1:02:03"]
    assert pp.count(1234567) == "1,234,567"
    assert pp.bar(0.5, 4, ascii_only=True) == "##--"


# --------------------------------------------------------------------------- log formats

def _record(msg="audit started; active sessions: %d", args=(1,), name="ppre.tester", level=logging.INFO,
            exc_info=None, **extra):
    record = logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_time_level_service_audit_id_event_and_fields():
    form = logs.JsonFormatter("client")
    line = form.format(_record(**logs.audit_extra(AUDIT_ID, "phase", phase="join", seconds=1.23456789,
                                                  done=3, total=None, ratio=float("nan"))))
    obj = json.loads(line)
    assert "\n" not in line
    assert set(obj) == {"time", "level", "service", "logger", "audit_id", "event", "message", "fields"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", obj["time"])
    assert obj["level"] == "INFO" and obj["service"] == "tester" and obj["logger"] == "ppre.tester"
    assert obj["audit_id"] == AUDIT_ID and obj["event"] == "phase"
    assert obj["message"] == "audit started; active sessions: 1"
    assert obj["fields"] == {"phase": "join", "seconds": 1.234568, "done": 3, "ratio": "nan"}  # None dropped
    # without an explicit event: the message template (stable across lines of a kind)
    obj = json.loads(form.format(_record(name="grpc")))
    assert obj["event"] == "audit started; active sessions: %d" and obj["service"] == "client"
    assert obj["audit_id"] is None and "fields" not in obj


def test_the_thread_bound_audit_id_reaches_every_line():
    out = io.StringIO()
    logger = logging.getLogger("ppre.test.progress_logs")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        logs.configure("json", "tester", logger=logger)
        logger.info("outside")
        with logs.audit_context(AUDIT_ID):
            logger.info("inside")
            seen = []
            t = threading.Thread(target=lambda: seen.append(logs.current_audit_id()))
            t.start()
            t.join()
        logger.info("after")
        logs.configure("text", logger=logger)
        with logs.audit_context(AUDIT_ID):
            logger.info("as text", extra=logs.audit_extra(event="phase", phase="join", counts={"a": 1}))
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["audit_id"] for x in lines[:3]] == [None, AUDIT_ID, None]
    assert seen == [None]  # a thread binds its own audit
    assert lines[3].endswith(f"ppre.test.progress_logs INFO as text [audit {AUDIT_ID} phase=join counts={{\"a\":1}}]")


def test_both_formats_withhold_a_library_exceptions_message():
    import sys

    for form in (logs.JsonFormatter("tester"), logs.TextFormatter()):
        try:
            member = "M" + "000777"  # the source line a traceback shows must not spell it
            {}.__getitem__(member)
        except KeyError:
            text = form.format(_record("internal error", (), exc_info=sys.exc_info()))
        assert "M000777" not in text and "KeyError (message withheld" in text
        try:
            raise InputError("must be positive", parameter="tau")
        except InputError:
            text = form.format(_record("input", (), exc_info=sys.exc_info()))
        assert "InputError: parameter 'tau': must be positive" in text
        if isinstance(form, logs.JsonFormatter):
            assert text.count("\n") == 0 and json.loads(text)["exception"].startswith("Traceback")


def test_the_log_format_is_checked():
    with pytest.raises(InputError, match="--log-format"):
        logs.formatter("yaml")
    assert isinstance(logs.formatter(" JSON "), logs.JsonFormatter)
    from ppre.cli import build_parser
    args = build_parser().parse_args(["tester", "serve", "--log-format", "json"])
    assert args.log_format == "json"
    args = build_parser().parse_args(["client", "serve"])
    assert args.log_format == "text"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["client", "serve", "--log-format", "xml"])


def test_phase_log_writes_one_line_per_clock_lap_with_its_counts(caplog):
    caplog.set_level(logging.INFO, logger="ppre.test.phases")
    phases = logs.PhaseLog(logging.getLogger("ppre.test.phases"), AUDIT_ID)
    clock: dict[str, float] = {}
    phases.watch(clock)
    phases.update("psi_upload", 10, 40)
    phases.update("psi_upload", 40, 40)
    clock["psi_tester_encrypt"] = 1.5  # the session's PhaseClock laps
    phases.update("join", 5, 100)  # the lap is logged with the counts reported while it ran
    clock["client_encrypt_and_join"] = 2.0
    clock["open_probabilities"] = 0.25
    phases.update("", 0, 0)
    clock["psi_tester_encrypt"] = 2.0  # a lap name seen again: its new time only
    phases.finish()
    phases.update("x", 1, 1)  # after finish: nothing
    records = [r for r in caplog.records if r.name == "ppre.test.phases"]
    assert [r.fields for r in records] == [
        {"phase": "psi_tester_encrypt", "seconds": 1.5, "progress": "psi_upload", "done": 40, "total": 40},
        {"phase": "client_encrypt_and_join", "seconds": 2.0, "progress": "join", "done": 5, "total": 100},
        {"phase": "open_probabilities", "seconds": 0.25},
        {"phase": "psi_tester_encrypt", "seconds": 0.5}]
    assert all(r.audit_id == AUDIT_ID and r.event == "phase" for r in records)
    assert records[0].getMessage() == "phase psi_tester_encrypt took 1.500 s (psi_upload: 40 of 40)"


# --------------------------------------------------------------------------- the id in the Hello

def test_the_test_client_checks_the_audit_id_in_the_hello():
    from client_service.protocol import ClientSession
    from tester_service.protocol import AuditSpec, TesterSession
    from tests.helpers import TEST_BITS, make_inputs

    tester_df, client_df = make_inputs(20, 20, 15, seed=2)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=1)
    [hello] = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS).start()
    assert logs.valid_audit_id(hello.hello.audit_id) and len(hello.hello.audit_id) == 16
    assert TesterSession(spec, tester_df, audit_id="given-id").start()[0].hello.audit_id == "given-id"
    assert logs.new_audit_id() != logs.new_audit_id()

    def client():
        return ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True)
    for good in ("", "a", "Ab_9-" * 12):
        hello.hello.audit_id = good
        assert client().receive(hello)[0].HasField("hello_ack")
    for bad in ("a" * 65, "has space", "new\nline", "semi;colon", "ünï", "a/b", "{\"x\":1}"):
        hello.hello.audit_id = bad
        with pytest.raises(ProtocolError, match="audit id"):
            client().receive(hello)


# --------------------------------------------------------------------------- no member data, no key

def test_json_debug_logs_hold_no_member_data_and_no_key(tmp_path, captured):
    """Both services in this process (real gRPC servers, their servicers), the Tester
    preparing BISG probabilities from a members file (surnames, first names), JSON logs at
    DEBUG for every logger: an audit for each result recipient and one with an unknown
    dataset. No log line holds a member id, surname, first name or probability, the
    Paillier modulus or any private key, salt or mask; every line is one JSON object, and
    the audit's lines carry the id the operator got."""
    import numpy as np

    from client_service.datasets import DatasetRegistry
    from common.races import RACES
    from ppre.local import local_services
    from ppre.synth import SynthConfig, synthesize
    from proto import ppre_pb2 as pb
    from tester_service.demographics.preparation import PreparationConfig
    from tester_service.release import ReleasePolicy
    from tester_service.server import prepare_from_files, run_audit
    from tests.helpers import TEST_BITS
    from tests.test_secrets_at_rest import _int_forms, _leaks

    data = synthesize(SynthConfig(members=250, seed=11))
    members, self_id, ero = (tmp_path / f"{name}.csv" for name in ("members", "self_id", "ero"))
    data.members.to_csv(members, index=False)
    data.self_id.to_csv(self_id, index=False)
    data.ero.to_csv(ero, index=False)
    tables: list[pd.DataFrame] = []

    def load():
        table = prepare_from_files(members, self_id, PreparationConfig(threshold=0.825))
        tables.append(table.copy())
        return table

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    handler.setFormatter(logs.JsonFormatter("local"))
    handler.addFilter(logs.AuditFilter())
    events: list = []
    ids: list[str] = []
    try:
        with local_services(load, DatasetRegistry(named={"ero": str(ero)}), modulus_bits=TEST_BITS,
                            allow_insecure=True, release=ReleasePolicy(budget=float("inf"))) as svc:
            for recipient, dataset in (("client", "ero"), ("tester", "ero"), ("client", "nope")):
                seen: list = []
                event = run_audit(svc.tester_address, pb.AuditRequest(
                    metric="ero", client_dataset=dataset, bootstrap=15, has_seed=True, seed=3,
                    result_recipient=recipient), timeout=120, on_progress=seen.append)
                events.append(event)
                ids.append(seen[0].audit_id)
                assert {p.audit_id for p in seen} == {ids[-1]}
                assert wait_idle(svc)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert [e.WhichOneof("event") for e in events] == ["result", "result", "error"]
    assert len(set(ids)) == 3 and all(logs.valid_audit_id(i) for i in ids)
    text = out.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert {line["level"] for line in lines} >= {"DEBUG", "INFO", "WARNING"}
    for audit_id in ids:
        services = {line["service"] for line in lines if line["audit_id"] == audit_id}
        assert "tester" in services, audit_id
    assert {line["service"] for line in lines if line["audit_id"] == ids[0]} == {"tester", "client"}
    assert any(line["event"] == "phase" and line["service"] == "client" and line["audit_id"] == ids[0]
               for line in lines)

    # what must not be there
    assert len(captured.paillier) == 2 and tables
    needles = captured.all_text()
    for i, key in enumerate(captured.paillier):
        n = key.p * key.q
        needles.update({f"n{i} ({form})": text_ for form, text_ in zip(("dec", "hex", "HEX"), _int_forms(n))})
        needles[f"n{i} (b64)"] = __import__("base64").b64encode(n.to_bytes((n.bit_length() + 7) // 8, "big")).decode()
    assert not _leaks(text, needles)
    assert not re.search(r"\d{64}|[0-9a-fA-F]{64}", text)
    words = set(re.findall(r"[A-Za-z][A-Za-z'-]+", " ".join(str(line.get("message")) + json.dumps(line.get("fields"))
                                                            for line in lines)))
    people = set(data.members.member_id) | set(data.self_id.member_id) | set(data.ero.member_id)
    assert not [m for m in people if m in text]
    names = {n for n in set(data.members.surname) | set(data.members.first_name) if len(n) >= 3}
    assert not sorted(names & words)
    for table in tables:
        for value in table[[c for c in table.columns if c in RACES]].to_numpy().ravel():
            v = float(value)
            for form in (repr(v), f"{v:.6f}", str(np.float64(v))):
                if len(form.replace("0", "").replace(".", "")) >= 4:
                    assert not re.search(rf"(?<![\d.]){re.escape(form)}(?!\d)", text), form


def wait_idle(svc, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if svc.client_servicer.active_sessions == 0 and svc.tester_servicer.active_sessions == 0:
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- as OS processes

N_TESTER, N_OVERLAP = 3000, 2000
N_SMALL, N_SMALL_OVERLAP = 300, 200
AUDIT_ID_LINE = re.compile(r"^audit id: ([A-Za-z0-9_-]+)$", re.M)


def _json_lines(service) -> list[dict]:
    return [json.loads(line) for line in service.log_bytes(current=False).decode().splitlines()
            if line.startswith("{")]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Test-Client and a Tester as OS processes, JSON logs at DEBUG (`ppre -v -v ...
    --log-format json`), one worker each."""
    from tests.helpers import make_inputs
    from tests.processes import make_client, make_tester, write_dataset

    base = tmp_path_factory.mktemp("progress-logs")
    dataset = write_dataset(base / "data", N_TESTER, N_TESTER, N_OVERLAP, seed=9)
    _, small = make_inputs(N_TESTER, N_SMALL, N_SMALL_OVERLAP, seed=9)
    small.to_csv(dataset.client_dir / "small.csv", index=False)
    env = {"PPRE_WORKERS": "1"}
    client = make_client(base, dataset, env=env, extra=["--log-format", "json"])
    tester = make_tester(base, dataset, client.address, env=env, extra=["--log-format", "json"])
    for service in (client, tester):
        service.argv_tail = ["-v", *service.argv_tail]
    try:
        client.start()
        client.wait_healthy()
        tester.start()
        tester.wait_healthy()
        yield SimpleNamespace(tester=tester, client=client, dataset=dataset)
    finally:
        tester.close()
        client.close()


def _operator(services, dataset: str, **kw):
    from tests.processes import OperatorAudit
    return OperatorAudit(services.tester.address, dataset, **kw)


@pytest.mark.slow
def test_one_correlation_id_per_audit_on_both_services(services):
    """Two audits through the services as processes: the operator is told each audit's id;
    both services' JSON log lines of that audit carry it (every line of the Tester's audit
    thread, the Test-Client's lines from its Hello on, one line per phase, the audits'
    outcome lines); the two ids differ."""
    outcomes = [_operator(services, "small", as_json=False, bootstrap=20, timeout=120).wait() for _ in range(2)]
    ids = []
    for outcome in outcomes:
        assert outcome.rc == 0, outcome.describe()
        found = AUDIT_ID_LINE.findall(outcome.stderr)
        assert len(found) == 1, outcome.describe()
        ids.append(found[0])
    assert ids[0] != ids[1]
    assert services.tester.wait_sessions(0, 15) and services.client.wait_sessions(0, 15)
    tester_lines, client_lines = _json_lines(services.tester), _json_lines(services.client)
    for lines, service in ((tester_lines, "tester"), (client_lines, "client")):
        assert lines and all({"time", "level", "service", "audit_id", "event", "message"} <= set(x) for x in lines)
        assert {x["service"] for x in lines} == {service}
        assert "DEBUG" in {x["level"] for x in lines}
    for audit_id in ids:
        mine = [x for x in tester_lines if x["audit_id"] == audit_id]
        events = [x["event"] for x in mine]
        assert events[0] == "audit_started" and "audit_finished" in events and events.count("phase") >= 5, events
        [finished] = [x for x in mine if x["event"] == "audit_finished"]
        assert finished["fields"]["outcome"] == "result" and finished["fields"]["n_matched"] == N_SMALL_OVERLAP
        assert finished["fields"]["phase_seconds"]
        theirs = [x for x in client_lines if x["audit_id"] == audit_id]
        events = [x["event"] for x in theirs]
        assert "session_opened" in events and "session_finished" in events and events.count("phase") >= 4, events
        assert any(x["fields"].get("progress") == "he_encrypt" and x["fields"]["total"] == N_SMALL
                   for x in theirs if x["event"] == "phase")
        assert any("active sessions: 0" in x["message"] for x in theirs)
    # between an audit's start and its end, every line of the Tester's audit thread names it
    for lines in (tester_lines,):
        for x in lines:
            if x["event"] in ("phase", "audit_finished", "audit ended; active sessions: %d"):
                assert x["audit_id"] in ids, x
    # nothing member-level in them either
    tester_df = pd.read_csv(services.dataset.probabilities, dtype={"member_id": str})
    text = services.tester.log_bytes(current=False) + services.client.log_bytes(current=False)
    assert not [m for m in tester_df.member_id[:N_OVERLAP + 50] if m.encode() in text]
    from tests.test_secrets_at_rest import _probability_patterns
    assert not [p.pattern for p in _probability_patterns(tester_df.head(400)) if p.search(text)]


_SHOW_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_test_run_that_ignores_sigint_still_gives_the_operator_ctrl_c(wrapped):
    """A test run started in the background by a script ignores SIGINT, and so would its
    children: the Ctrl-C tests below start the operator with SIGINT at its default
    (`foreground_argv`), as a terminal's foreground command has it."""
    child = [sys.executable, "-c", _SHOW_SIGINT]
    parent = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    shown = subprocess.run([sys.executable, "-c", parent, *(foreground_argv(child) if wrapped else child)],
                           env=child_env(), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str(wrapped)


@pytest.mark.slow
def test_ctrl_c_cancels_the_audit_on_both_services(services):
    """SIGINT to `ppre audit` once the Tester uploads its rows: the operator exits 130
    with one line, "cancelled" (no traceback, nothing on stdout); the Tester logs the
    cancellation and aborts the Test-Client's session; both drop it; both stay healthy
    and the next audit succeeds."""
    from tests.processes import health_status

    holder: list = []
    fired: list[str] = []

    def interrupt(progress):
        if not fired and progress.phase in ("psi_upload", "psi_shuffled", "join"):
            fired.append(progress.phase)
            os.kill(holder[0].proc.pid, signal.SIGINT)
    op = _operator(services, "ero", as_json=False, bootstrap=300, timeout=120, on_progress=interrupt)
    holder.append(op)
    outcome = op.wait()
    assert fired, outcome.describe()
    assert outcome.rc == 130, outcome.describe()
    assert outcome.stdout == "" and "Traceback" not in outcome.stderr
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert lines[-1] == "cancelled" and lines.count("cancelled") == 1, outcome.describe()
    [audit_id] = AUDIT_ID_LINE.findall(outcome.stderr)
    assert services.tester.wait_sessions(0, 20) and services.client.wait_sessions(0, 20), \
        services.tester.log_tail() + services.client.log_tail()
    tester_lines = [x for x in _json_lines(services.tester) if x["audit_id"] == audit_id]
    assert any(x["message"].startswith("audit cancelled by the operator") for x in tester_lines), tester_lines
    [finished] = [x for x in tester_lines if x["event"] == "audit_finished"]
    assert finished["fields"]["outcome"] == "cancelled"
    client_lines = [x for x in _json_lines(services.client) if x["audit_id"] == audit_id]
    [ended] = [x for x in client_lines if x["event"] == "session_finished"]
    # the Abort, or the cancelled call when the Test-Client was busy past the Abort's grace
    assert ended["fields"]["outcome"] in ("aborted_by_tester:cancelled", "call_ended"), ended
    for service in (services.tester, services.client):
        assert health_status(service.address) == "SERVING"
    ok = _operator(services, "small", as_json=True, bootstrap=20, timeout=120).wait()
    assert ok.rc == 0 and ok.json["n_matched"] == N_SMALL_OVERLAP, ok.describe()


@pytest.mark.slow
def test_ctrl_c_with_local_ends_both_sessions_and_exits_130(tmp_path):
    """`ppre -v audit --local` on two worker processes; Ctrl-C as a terminal sends it (SIGINT
    to the whole process group) once the Tester uploads: exit 130, one "cancelled" line,
    both in-process services log the session dropped, no traceback (the workers ignore
    SIGINT: the pool stays whole while the audit ends), nothing left running."""
    from tests.helpers import make_inputs
    from tests.processes import group_pids, wait_for

    tester_df, client_df = make_inputs(N_TESTER, N_TESTER, N_OVERLAP, seed=4)
    tester_df.to_csv(tmp_path / "probs.csv", index=False)
    client_df.to_csv(tmp_path / "ero.csv", index=False)
    argv = ppre_argv() + ["-v", "audit", "--local", "--metric", "ero", "--tester-probabilities",
                          str(tmp_path / "probs.csv"), "--client-data", str(tmp_path / "ero.csv"), "--bootstrap",
                          "300", "--no-release-controls", "--history", "none", "--log-format", "json"]
    proc = subprocess.Popen(foreground_argv(argv), env=child_env({"PPRE_WORKERS": "2", "PYTHONFAULTHANDLER": "1"}),
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path)
    stderr: list[str] = []
    fired = threading.Event()

    def read() -> None:
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            stderr.append(line)
            match = PROGRESS_RE.match(line)
            if match and match.group(2) in ("psi_upload", "psi_shuffled", "join") and not fired.is_set():
                fired.set()
                os.killpg(proc.pid, signal.SIGINT)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        rc = None
        os.kill(proc.pid, signal.SIGABRT)  # faulthandler: every thread's stack on stderr
        time.sleep(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    reader.join(timeout=10)
    stdout = proc.stdout.read().decode()
    text = "\n".join(stderr)
    assert rc is not None, f"hung (SIGINT {'sent' if fired.is_set() else 'not sent'}):\n{text[-20000:]}"
    assert fired.is_set(), text
    assert rc == 130 and stdout == "", text
    assert "Traceback" not in text and "BrokenProcessPool" not in text, text
    said = [line for line in stderr if line.strip() and not line.startswith("{")]  # besides the log lines
    assert said[-1] == "cancelled" and said.count("cancelled") == 1, text
    entries = [json.loads(line) for line in stderr if line.startswith("{")]
    [audit_id] = AUDIT_ID_LINE.findall(text)
    mine = [x for x in entries if x["audit_id"] == audit_id]
    assert any(x["message"].startswith("audit cancelled by the operator") for x in mine), text
    sessions = {(x["service"], x["message"]) for x in mine if "active sessions: 0" in x["message"]}
    assert {s for s, _ in sessions} == {"tester", "client"}, text
    assert wait_for(lambda: not group_pids(proc.pid), 10), group_pids(proc.pid)
