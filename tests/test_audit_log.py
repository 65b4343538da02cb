"""The Tester's keyed, chained audit log (tester_service.audit_log, `ppre log verify`, `ppre log
head`); the older, unkeyed logs stay readable. A record's link (hash or MAC, the documented
HMAC over canonical JSON) covers each of its fields; the exported head anchors the chain,
a removed tail and a rewritten record included; a key is made only for a log without
records; records are stamped in UTC; every refusal names the file and the fix."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading

import pytest

from client_service.datasets import DatasetRegistry
from ppre.cli import main as ppre_main
from ppre.commands.log import KEY_ENV
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service import audit_log as al
from tester_service.audit_log import GENESIS, AuditLog, AuditLogError, result_digest, verify
from tester_service.inputs import read_probability_table
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, write_inputs


def _lines(path) -> list[str]:
    return path.read_text().splitlines()


def test_records_are_chained_and_verify(tmp_path):
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    entries = [log.append({"n": i}) for i in range(3)]
    assert [e["seq"] for e in entries] == [1, 2, 3]
    assert entries[0]["prev"] == GENESIS and entries[1]["prev"] == entries[0]["hash"]
    result = verify(path)
    assert result.ok and result.records == 3 and result.broken_line is None


@pytest.mark.parametrize("damage, line, reason", [
    ("change", 2, "does not match its hash"),
    ("remove", 2, "sequence number"),
    ("swap", 2, "sequence number"),
    ("truncate", 4, "incomplete record"),
    ("garbage", 3, "not a log record"),
])
def test_verify_names_the_first_broken_record(tmp_path, damage, line, reason):
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    for i in range(4):
        log.append({"metric": "ero", "n": i})
    lines = _lines(path)
    if damage == "change":
        lines[1] = lines[1].replace('"n":1', '"n":7')
    elif damage == "remove":
        del lines[1]
    elif damage == "swap":
        lines[1], lines[2] = lines[2], lines[1]
    elif damage == "garbage":
        lines[2] = "{not json"
    text = "\n".join(lines) + "\n"
    if damage == "truncate":
        text = text[:-10]
    path.write_text(text)
    result = verify(path)
    assert not result.ok and result.broken_line == line and reason in result.reason, result
    assert result.records == line - 1


def test_a_changed_hash_breaks_the_next_link_too(tmp_path):
    """Recomputing a changed record's own hash does not help: the next record's link breaks."""
    from tester_service.audit_log import record_hash
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    for i in range(3):
        log.append({"n": i})
    lines = _lines(path)
    entry = json.loads(lines[0])
    entry["record"] = {"n": 99}
    entry["hash"] = record_hash(entry["prev"], entry["seq"], entry["time"], entry["record"])
    lines[0] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    result = verify(path)
    assert not result.ok and result.broken_line == 2 and "previous record" in result.reason


def test_concurrent_appends_keep_one_chain(tmp_path):
    path = tmp_path / "audit.log"
    logs = [AuditLog(path) for _ in range(2)]  # two writers on one file (flock), 4 threads each

    def work(log, k):
        for i in range(25):
            log.append({"writer": k, "i": i})
    threads = [threading.Thread(target=work, args=(logs[k % 2], k)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = verify(path)
    assert result.ok and result.records == 200


def test_a_damaged_tail_is_never_appended_to(tmp_path):
    path = tmp_path / "audit.log"
    AuditLog(path).append({"n": 1})
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(AuditLogError, match="incomplete record"):
        AuditLog(path).append({"n": 2})


def test_ppre_log_verify(tmp_path, capsys):
    path = tmp_path / "audit.log"
    AuditLog(path).append({"n": 1})
    AuditLog(path).append({"n": 2})
    assert ppre_main(["log", "verify", str(path)]) == 0
    assert "2 records, chain intact" in capsys.readouterr().out
    path.write_text(path.read_text().replace('"n":2', '"n":3'))
    assert ppre_main(["log", "verify", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out == {"ok": False, "records": 1, "broken_line": 2,
                   "reason": "its content does not match its hash (it was changed)"}


def test_every_audit_request_is_recorded_without_member_data(tmp_path):
    """Through the real services: a finished audit (with the digest of the very result the
    operator got), a failed one and a refused one (session limit) each leave one record;
    nothing in the log is a member id."""
    tester, client, tp, cp = write_inputs(tmp_path, 120, 90, seed=3)
    log_path = tmp_path / "audit.log"
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS) as svc:
        svc.tester_config.audit_log = AuditLog(log_path)
        ok = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10,
                                                           has_seed=True, seed=4, result_recipient="tester"))
        bad = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10,
                                                            metric_option="precision"))
    assert ok.WhichOneof("event") == "result" and bad.error.code == "bad_input"
    result = verify(log_path)
    assert result.ok and result.records == 2
    first, second = (json.loads(line)["record"] for line in _lines(log_path))
    assert first["metric"] == "ero" and first["client_dataset"] == "ero" and first["who"]
    assert first["parameters"]["bootstrap"] == 10 and first["parameters"]["seed"] == 4
    assert first["outcome"] == {"status": "result", "n_matched": 90,
                                "result_sha256": result_digest(ok.result.report_json),
                                "release": {"controls": False, "rho": 0.0}}  # the controls it ran under
    assert first["client"] == svc.tester_config.client_identity
    assert second["outcome"]["status"] == "error" and second["outcome"]["code"] == "bad_input"
    text = log_path.read_text()
    assert not any(member in text for member in set(tester.member_id) | set(client.member_id))


def test_refused_and_cancelled_requests_have_their_own_outcomes():
    from tester_service.server import audit_record
    request = pb.AuditRequest(metric="lot", client_dataset="q", metric_option="raw",
                              metric_params={"same_group_pairs": "true"})
    refused = audit_record(request, "ipv4:10.0.0.1:5000", None, 0, refusal="resource_exhausted: limit 1")
    assert refused["outcome"] == {"status": "refused", "reason": "resource_exhausted: limit 1"}
    assert refused["parameters"]["metric_params"] == {"same_group_pairs": "true"}
    assert refused["parameters"]["bootstrap"] is None  # absent: the default was to apply
    assert audit_record(request, "x", None, 0)["outcome"] == {"status": "cancelled"}


# --------------------------------------------------------------------------- keyed and anchored
from tester_service import audit_log as al  # noqa: E402


def _keyed(tmp_path, n: int = 3):
    log_path, key_path = tmp_path / "state" / "audit.log", tmp_path / "keys" / "audit-log.key"
    log_path.parent.mkdir(exist_ok=True)
    log = AuditLog.keyed(log_path, key_path)
    entries = [log.append({"n": i}) for i in range(n)]
    return log_path, key_path, entries


def test_keyed_records_carry_a_mac_and_export_the_head(tmp_path):
    log_path, key_path, entries = _keyed(tmp_path)
    assert key_path.stat().st_mode & 0o777 == 0o600
    key = al.load_key(key_path)
    assert [e["seq"] for e in entries] == [1, 2, 3] and all("hash" not in e for e in entries)
    assert entries[0]["prev"] == GENESIS and entries[1]["prev"] == entries[0]["mac"]
    assert entries[2]["mac"] == al.record_mac(key, entries[1]["mac"], 3, entries[2]["time"], {"n": 2})
    assert al.head_path(key_path).read_text().strip() == f"3:{entries[2]['mac']}"
    result = verify(log_path, key, al.parse_head(str(al.head_path(key_path))))
    assert result.ok and result.keyed and result.records == 3 and "head matches" in result.reason
    # a restart reads the same key and goes on with the chain
    assert AuditLog.keyed(log_path, key_path).append({"n": 3})["prev"] == entries[2]["mac"]
    assert verify(log_path, key, al.parse_head(str(al.head_path(key_path)))).records == 4


def test_a_keyed_log_does_not_verify_without_its_key_or_with_another(tmp_path):
    log_path, key_path, _ = _keyed(tmp_path)
    result = verify(log_path)
    assert not result.ok and result.broken_line == 1 and "give the log's key" in result.reason
    other = tmp_path / "other.key"
    other.write_text("ab" * al.KEY_BYTES + "\n")
    result = verify(log_path, al.load_key(other))
    assert not result.ok and result.broken_line == 1 and "MAC does not match" in result.reason


@pytest.mark.parametrize("where", ["same directory", "subdirectory"])
def test_the_key_must_live_outside_the_logs_directory(tmp_path, where):
    log_path = tmp_path / "audit.log"
    key_path = tmp_path / "audit.key" if where == "same directory" else tmp_path / "keys" / "audit.key"
    with pytest.raises(AuditLogError, match="lies in the log's directory.*--audit-log-key"):
        AuditLog.keyed(log_path, key_path)
    assert not key_path.exists()


def test_a_lost_key_is_not_silently_replaced(tmp_path):
    log_path, key_path, _ = _keyed(tmp_path)
    key_path.unlink()
    with pytest.raises(AuditLogError, match="holds records but its key .* is missing"):
        AuditLog.keyed(log_path, key_path)
    key_path.write_text("not hex\n")
    with pytest.raises(AuditLogError, match="is not a key"):
        AuditLog.keyed(log_path, key_path)


def test_keyed_and_unkeyed_records_are_never_mixed(tmp_path):
    plain = tmp_path / "state" / "plain.log"
    plain.parent.mkdir()
    AuditLog(plain).append({"n": 1})
    with pytest.raises(AuditLogError, match="written without a key.*new file"):
        AuditLog.keyed(plain, tmp_path / "keys" / "k.key")
    log_path, key_path, _ = _keyed(tmp_path)
    with pytest.raises(AuditLogError, match="is keyed: give its key"):
        AuditLog(log_path).append({"n": 9})
    other = tmp_path / "other" / "k.key"
    with pytest.raises(AuditLogError, match="not made with this key"):
        AuditLog(log_path, bytes(al.KEY_BYTES)).append({"n": 9})
    assert verify(log_path, al.load_key(key_path)).records == 3 and not other.exists()


def test_ppre_log_head_and_verify_expect_head(tmp_path, capsys):
    log_path, key_path, entries = _keyed(tmp_path)
    assert ppre_main(["log", "head", str(log_path), "--key", str(key_path)]) == 0
    head = capsys.readouterr().out.strip()
    assert head == f"3:{entries[2]['mac']}"
    assert ppre_main(["log", "verify", str(log_path), "--key", str(key_path), "--expect-head", head]) == 0
    assert "3 records, chain intact, every MAC checked; the exported head matches" in capsys.readouterr().out
    # the key from the environment, as the service reads it; a head that is not one
    os.environ[KEY_ENV] = str(key_path)
    try:
        assert ppre_main(["log", "verify", str(log_path), "--expect-head", "3:xyz"]) == 2
        assert "is not a log head" in capsys.readouterr().err
        al.head_path(key_path).unlink()  # no head beside the key: the tail is not anchored, and says so
        assert ppre_main(["log", "verify", str(log_path), "--json"]) == 0
        assert "tail not anchored" in json.loads(capsys.readouterr().out)["reason"]
    finally:
        del os.environ[KEY_ENV]


def test_tester_serve_needs_a_key_for_its_audit_log(tmp_path, capsys):
    tester, _, tp, _ = write_inputs(tmp_path, 20, 10, seed=3)
    base = ["tester", "serve", "--port", "0", "--probabilities", str(tp), "--insecure", "--no-release-controls",
            "--audit-log", str(tmp_path / "audit.log")]
    assert ppre_main(base) == 2
    err = capsys.readouterr().err
    assert "--audit-log-key FILE" in err and "outside the log's directory" in err and "serving" not in err
    assert ppre_main(base + ["--audit-log-key", str(tmp_path / "audit.key")]) == 2
    assert "lies in the log's directory" in capsys.readouterr().err


def test_a_keyed_log_through_the_services(tmp_path):
    """The service appends keyed records (and the head) as the audit runs."""
    _, _, tp, cp = write_inputs(tmp_path, 120, 90, seed=3)
    log_path, key_path = tmp_path / "state" / "audit.log", tmp_path / "keys" / "audit.key"
    log_path.parent.mkdir()
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS) as svc:
        svc.tester_config.audit_log = AuditLog.keyed(log_path, key_path)
        bad = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="nope", bootstrap=10))
    assert bad.error.code == "bad_input"
    result = verify(log_path, al.load_key(key_path), al.parse_head(str(al.head_path(key_path))))
    assert result.ok and result.records == 1, result


def test_the_head_is_exported_outside_the_logs_directory(tmp_path):
    log_path = tmp_path / "state" / "audit.log"
    log_path.parent.mkdir()
    with pytest.raises(AuditLogError, match="head .* lies in the log's directory"):
        AuditLog.keyed(log_path, tmp_path / "keys" / "k.key", head=tmp_path / "state" / "audit.head")


# --------------------------------------------------------------------------- each field linked, the head, the key, refusals
def test_an_unreadable_log_does_not_verify(tmp_path):
    """A log that cannot be read is not "intact": `verify` says it is broken and why."""
    result = al.verify(tmp_path / "missing.log")
    assert result.ok is False and result.records == 0 and "cannot be read" in result.reason, result


def test_a_head_of_one_record_detects_a_rewritten_first_record(tmp_path):
    """The exported head anchors a log of a single record too: rewriting and re-hashing
    that record passes the plain chain but not the head."""
    plain = tmp_path / "plain.log"
    al.AuditLog(plain).append({"n": 0})
    head = (1, al.verify(plain).last)
    entry = json.loads(plain.read_text())
    entry["record"] = {"n": 99}
    entry["hash"] = al.record_hash(entry["prev"], entry["seq"], entry["time"], entry["record"])
    plain.write_text(json.dumps(entry) + "\n")
    assert al.verify(plain).ok  # the chain alone is intact ...
    result = al.verify(plain, None, head)
    assert not result.ok and result.broken_line == 1 and "rewritten" in result.reason, result


@pytest.mark.parametrize("link", ["hash", "mac"])
@pytest.mark.parametrize("field", ["prev", "seq", "time", "record"])
def test_the_link_of_a_record_depends_on_each_of_its_fields(link, field):
    """The link (plain hash or MAC) changes when any one field changes, the sequence
    number included (not only through the verifier's separate position check)."""
    key = bytes(range(al.KEY_BYTES))
    fields = {"prev": al.GENESIS, "seq": 1, "time": "2026-01-01T00:00:00.000000Z", "record": {"n": 1}}
    changed = {"prev": "1" * 64, "seq": 2, "time": "2026-01-01T00:00:01.000000Z", "record": {"n": 2}}
    other = dict(fields, **{field: changed[field]})

    def of(f):
        args = (f["prev"], f["seq"], f["time"], f["record"])
        return al.record_hash(*args) if link == "hash" else al.record_mac(key, *args)
    assert of(fields) != of(other)


def test_the_mac_is_the_documented_hmac_over_canonical_json():
    """m = HMAC-SHA256(key, prev ‖ canonical JSON of {"seq", "time", "record"}) (sorted
    keys, no spaces, UTF-8 as is), so that any verifier built from the docs agrees and
    logs stay verifiable across versions."""
    key = bytes(range(al.KEY_BYTES))
    record = {"who": "opérateur", "metric": "ero", "b": [1, 2]}
    prev, seq, time = "a" * 64, 7, "2026-01-01T00:00:00.000000Z"
    body = json.dumps({"seq": seq, "time": time, "record": record}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")
    assert body.startswith(b'{"record":{"b":[1,2],"metric":"ero","who":"op\xc3\xa9rateur"},"seq":7,')
    assert al.record_mac(key, prev, seq, time, record) == hmac.new(key, prev.encode() + body,
                                                                  hashlib.sha256).hexdigest()
    assert al.record_hash(prev, seq, time, record) == hashlib.sha256(prev.encode() + body).hexdigest()


def test_a_new_key_only_for_a_log_without_records(tmp_path):
    """`load_key(create=True)` makes a key (64 hex digits, 0600, its directories too) for
    a missing or empty log, and refuses one for a log holding anything, one byte included:
    a new key cannot vouch for old records."""
    from tester_service import audit_log as al
    log = tmp_path / "state" / "audit.log"
    log.parent.mkdir()
    log.write_bytes(b"")
    key_path = tmp_path / "keys" / "deep" / "audit.key"
    key = al.load_key(key_path, log, create=True)
    assert len(key) == al.KEY_BYTES and key_path.read_text() == key.hex() + "\n"
    assert key_path.stat().st_mode & 0o777 == 0o600
    second = tmp_path / "keys" / "other.key"  # its directory exists already
    assert len(al.load_key(second, None, create=True)) == al.KEY_BYTES
    log.write_bytes(b"\n")
    with pytest.raises(al.AuditLogError, match="holds records but its key .* is missing"):
        al.load_key(tmp_path / "keys" / "third.key", log, create=True)
    assert not (tmp_path / "keys" / "third.key").exists()
    with pytest.raises(al.AuditLogError, match=r"cannot be read \(Is a directory\)"):
        al.load_key(tmp_path / "keys", None)


def test_the_head_lies_beside_the_key_and_records_are_stamped_in_utc(tmp_path, monkeypatch):
    import re
    import time as time_module

    from tester_service import audit_log as al
    assert al.head_path(tmp_path / "k" / "audit.key") == tmp_path / "k" / "audit.key.head"
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # nine hours from UTC: a local stamp would show it
    time_module.tzset()
    try:
        before = time_module.time()
        entry = al.AuditLog(tmp_path / "audit.log").append({"n": 1})
    finally:
        monkeypatch.delenv("TZ")
        time_module.tzset()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", entry["time"])
    import datetime as dt
    stamped = dt.datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    assert abs(stamped.timestamp() - before) < 60


def test_an_incomplete_record_fails_verification_as_false_not_unknown(tmp_path):
    from tester_service import audit_log as al
    path = tmp_path / "audit.log"
    al.AuditLog(path).append({"n": 1})
    path.write_bytes(path.read_bytes()[:-1])
    result = al.verify(path)
    assert result.ok is False and result.records == 0 and result.broken_line == 1
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert al.verify(empty) == al.Verification(True, 0, None, "empty log", False, al.GENESIS)


def test_a_verification_against_the_exported_head_names_what_it_found(tmp_path):
    """Every field of the verdict, whole: a removed tail (the records left, the range
    removed), a head that names another record (the line before it intact), an
    anchored and an unanchored intact chain, an unkeyed one, and a head of 0 records on
    an empty log."""
    from tester_service import audit_log as al
    log_path, key_path = tmp_path / "state" / "audit.log", tmp_path / "keys" / "audit.key"
    log_path.parent.mkdir()
    log = al.AuditLog.keyed(log_path, key_path)
    entries = [log.append({"n": i}) for i in range(4)]
    key = al.load_key(key_path)
    head = (4, entries[3]["mac"])
    assert al.verify(log_path, key, head) == al.Verification(
        True, 4, None, "chain intact, every MAC checked; the exported head matches", True, entries[3]["mac"])
    assert al.verify(log_path, key) == al.Verification(
        True, 4, None, f"chain intact, every MAC checked; {al.UNANCHORED}", True, entries[3]["mac"])
    assert al.verify(log_path, key, (3, entries[1]["mac"])) == al.Verification(
        False, 2, 3, "is not the record the exported head names (the log was rewritten from here on)", True,
        entries[3]["mac"])
    lines = log_path.read_bytes().splitlines(keepends=True)
    log_path.write_bytes(b"".join(lines[:2]))
    assert al.verify(log_path, key, head) == al.Verification(
        False, 2, None, "truncated: the log holds 2 records, its exported head 4 (records 3-4 were removed)", True,
        entries[1]["mac"])
    plain = tmp_path / "plain.log"
    last = [al.AuditLog(plain).append({"n": i}) for i in range(2)][-1]
    assert al.verify(plain) == al.Verification(True, 2, None, al.UNKEYED, False, last["hash"])
    empty = tmp_path / "state" / "empty.log"
    empty.write_bytes(b"")
    assert al.verify(empty, key, (0, al.GENESIS)).ok


def test_the_audit_logs_refusals_name_the_file_and_the_fix(tmp_path):
    """What an operator reads when the log cannot go on, each message whole: it names the
    file and what to do."""
    from tester_service import audit_log as al
    state, keys = tmp_path / "state", tmp_path / "keys"
    state.mkdir()
    log_path, key_path = state / "audit.log", keys / "audit.key"
    al.AuditLog.keyed(log_path, key_path).append({"n": 1})

    def message(call) -> str:
        with pytest.raises(al.AuditLogError) as refused:
            call()
        return str(refused.value)

    missing_dir = tmp_path / "absent" / "audit.head"
    assert message(lambda: al._write_head(missing_dir, 1, al.GENESIS)) == \
        f"the audit log's head {missing_dir} cannot be written (No such file or directory); --audit-log-head FILE"
    bad_head = tmp_path / "bad.head"
    bad_head.write_bytes(b"\xff\xfe")
    assert message(lambda: al.parse_head(str(bad_head))).startswith(f"the log head {bad_head} cannot be read (")
    assert message(lambda: al.AuditLog(tmp_path).append({"n": 1})) == \
        f"the audit log {tmp_path} cannot be opened (Is a directory)"
    assert message(lambda: al.AuditLog(log_path).append({"n": 2})) == \
        f"the audit log {log_path} is keyed: give its key (--audit-log-key)"
    assert message(lambda: al.AuditLog(log_path, bytes(al.KEY_BYTES)).append({"n": 2})) == \
        (f"the last record of the audit log {log_path} was not made with this key (another key, or the record was "
         "changed): run `ppre log verify --key FILE`")
    head_inside = state / "audit.head"
    assert message(lambda: al.AuditLog.keyed(log_path, key_path, head=head_inside)) == \
        (f"the audit log's head {head_inside} lies in the log's directory {state.resolve()}: export it where "
         "whoever can write the log cannot (--audit-log-head FILE)")
    key_inside = state / "audit.key"
    assert message(lambda: al.load_key(key_inside, log_path)) == \
        (f"the audit log's key {key_inside} lies in the log's directory {state.resolve()}: keep it where whoever "
         "can write the log cannot read it (another directory or volume), --audit-log-key FILE")
    plain = tmp_path / "plain" / "audit.log"
    plain.parent.mkdir()
    al.AuditLog(plain).append({"n": 1})
    assert message(lambda: al.AuditLog.keyed(plain, keys / "other.key")) == al.UNKEYED_LOG.format(path=plain)
    assert message(lambda: al.AuditLog(plain, al.load_key(key_path)).append({"n": 2})) == \
        al.UNKEYED_LOG.format(path=plain)
    broken = tmp_path / "broken.log"
    broken.write_text("{not a record\n")
    assert message(lambda: al.AuditLog(broken).append({"n": 1})) == \
        f"the last record of the audit log {broken} cannot be read; run `ppre log verify`"
    assert al.verify(log_path).reason == \
        "a keyed record: give the log's key (--key FILE, env PPRE_AUDIT_LOG_KEY_FILE) to check it"
    assert al.verify(plain, al.load_key(key_path)).reason == \
        "has no MAC (an unkeyed record: the log was written without a key, or rewritten by someone without it)"


@pytest.mark.parametrize("keyed", [False, True])
def test_the_audit_log_link_covers_every_field_of_a_record(tmp_path, keyed):
    """Changing any one field of a record (its time, its sequence number, its link to the
    previous record, or any field of its content) while keeping its stored hash or MAC
    is detected."""
    import json
    from tester_service.audit_log import AuditLog, load_key, verify
    path = tmp_path / "logs" / "audit.log"
    path.parent.mkdir()
    key = load_key(tmp_path / "keys" / "audit.key", path, create=True) if keyed else None
    log = AuditLog(path, key)
    for i in range(3):
        log.append({"metric": "ero", "n": i, "outcome": "result"})
    lines = path.read_text().splitlines()
    assert verify(path, key).ok
    entry = json.loads(lines[1])
    changes = {
        "time": lambda e: e.update(time=e["time"].replace(e["time"][-8:-1], "0000000")),
        "seq": lambda e: e.update(seq=e["seq"] + 10),
        "prev": lambda e: e.update(prev="0" * len(e["prev"])),
        "record.metric": lambda e: e["record"].update(metric="pot"),
        "record.n": lambda e: e["record"].update(n=9),
        "record.outcome": lambda e: e["record"].update(outcome="refused"),
        "record (a field added)": lambda e: e["record"].update(extra=1),
    }
    for field, change in changes.items():
        changed = json.loads(lines[1])
        change(changed)
        assert changed != entry, field
        damaged = lines[:1] + [json.dumps(changed, sort_keys=True, separators=(",", ":"))] + lines[2:]
        path.write_text("\n".join(damaged) + "\n")
        result = verify(path, key)
        assert not result.ok and result.broken_line == 2, (field, result)
