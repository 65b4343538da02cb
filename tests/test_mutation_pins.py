"""Properties of the controls that a mutation tool's survivors showed the suite did not pin
(bench/RESULTS.md, "Mutation audit of the release controls"): the audit log's chain and
head, the TLS allow-lists and certificate checks, the peer-message validators and the
verdict. Each test fails on the mutant it is named after in the note and passes on the
code."""
from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from tester_service import audit_log as al


# ---------------------------------------------------------------- the audit log
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
