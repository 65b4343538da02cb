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


# ---------------------------------------------------------------- TLS identities and allow-lists
class _Context:
    """A server-side call's context as gRPC gives it: the peer's verified names."""

    def __init__(self, **auth) -> None:
        self.auth = {k: [v.encode() for v in vs] for k, vs in auth.items()}
        self.aborted = None

    def auth_context(self):
        return self.auth

    def abort(self, code, message):
        self.aborted = (code, message)
        raise PermissionError(message)


def _operators():
    from common.tls import AllowList
    return AllowList.of("operator", ["operator.ppre.local"], "--allow-operator")


def test_an_identity_refusal_is_recorded_with_its_method_identity_and_reason():
    """A refused caller is aborted with PERMISSION_DENIED and told to `on_refused` (the
    Tester's audit log) with the method, the identity and the reason."""
    import grpc
    from common.tls import IdentityInterceptor
    recorded = []
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()},
                                      on_refused=lambda *args: recorded.append(args))
    context = _Context(x509_common_name=["evil.example"], x509_subject_alternative_name=["evil.example"])
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED
    assert len(recorded) == 1
    method, identity, message = recorded[0]
    assert (method, identity) == ("/ppre.v1.Tester/RunAudit", "evil.example") and "evil.example" in message


def test_a_method_under_no_rule_is_refused_even_to_an_allow_listed_peer():
    """Deny by default: a method no rule covers is refused with PERMISSION_DENIED."""
    import grpc
    from common.tls import IdentityInterceptor
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()})
    context = _Context(x509_common_name=["operator.ppre.local"])
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Other/Do", context)
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("key", ["x509_subject_alternative_name", "peer_dns", "peer_uri", "peer_email", "peer_ip"])
def test_a_peer_allow_listed_by_a_subject_alternative_name_is_admitted(key):
    """Any verified name of the peer may be the allow-listed one, not only its CN."""
    from common.tls import IdentityInterceptor
    context = _Context(x509_common_name=["some-host.example"], **{key: ["operator.ppre.local"]})
    IdentityInterceptor({"/ppre.v1.Tester/": _operators()}).check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted is None


def test_the_audit_logs_who_is_the_name_the_caller_was_admitted_under():
    """`caller_identity`: the allow-listed name the peer matched; without a list its CN,
    else its first name; without TLS nothing."""
    from common.tls import caller_identity
    context = _Context(x509_common_name=["cn.example"],
                       x509_subject_alternative_name=["other.example", "operator.ppre.local"])
    assert caller_identity(context, _operators()) == "operator.ppre.local"
    assert caller_identity(context) == "cn.example"
    assert caller_identity(_Context(x509_subject_alternative_name=["a.example", "b.example"])) == "a.example"
    assert caller_identity(_Context()) == ""


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method


def test_every_kind_of_handler_is_guarded_and_only_health_is_open():
    """`intercept_service` wraps each of the four handler kinds so that the identity is
    checked before the behaviour runs, keeps its (de)serialisers, and leaves health open."""
    import grpc
    from common.tls import IdentityInterceptor
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()})
    ran = []

    def behaviour(request, context):
        ran.append(request)
        return "answer"
    makers = {"unary_unary": grpc.unary_unary_rpc_method_handler,
              "unary_stream": grpc.unary_stream_rpc_method_handler,
              "stream_unary": grpc.stream_unary_rpc_method_handler,
              "stream_stream": grpc.stream_stream_rpc_method_handler}
    for kind, make in makers.items():
        original = make(behaviour, request_deserializer=bytes.decode, response_serializer=str.encode)
        handler = interceptor.intercept_service(lambda details: original, _Details("/ppre.v1.Tester/RunAudit"))
        assert handler is not original and getattr(handler, kind) is not None, kind
        assert handler.request_deserializer is bytes.decode and handler.response_serializer is str.encode, kind
        assert handler.request_streaming == original.request_streaming, kind
        assert handler.response_streaming == original.response_streaming, kind
        refused = _Context(x509_common_name=["evil.example"])
        with pytest.raises(PermissionError):
            getattr(handler, kind)("request", refused)
        assert ran == [], kind
        assert getattr(handler, kind)("request", _Context(x509_common_name=["operator.ppre.local"])) == "answer"
        assert ran == ["request"], kind
        ran.clear()
    health = grpc.unary_unary_rpc_method_handler(behaviour)
    assert interceptor.intercept_service(lambda d: health, _Details("/grpc.health.v1.Health/Check")) is health
    assert interceptor.intercept_service(lambda d: None, _Details("/ppre.v1.Tester/Nothing")) is None


# ---------------------------------------------------------------- what arrives from the peer
def test_the_peers_timings_are_a_few_named_finite_non_negative_numbers():
    """`check_seconds`: up to MAX_SECONDS_ENTRIES named entries; a negative, NaN or
    infinite value, a bad name or one entry too many is refused."""
    from common.errors import ProtocolError
    from common.validation import MAX_SECONDS_ENTRIES, check_seconds
    full = {f"phase_{i}": float(i) for i in range(MAX_SECONDS_ENTRIES)}
    assert check_seconds(full) == full
    for bad in ({"join": -1.0}, {"join": float("nan")}, {"join": float("inf")}, {"join phase": 1.0}, {"": 1.0},
                dict(full, one_more=1.0)):
        with pytest.raises(ProtocolError):
            check_seconds(bad)


def test_a_heartbeat_carries_a_short_printable_phase():
    from common.errors import ProtocolError
    from common.validation import MAX_HEARTBEAT_PHASE_CHARS, check_heartbeat
    from proto import ppre_pb2 as pb
    check_heartbeat(pb.Heartbeat(phase="j" * MAX_HEARTBEAT_PHASE_CHARS))
    for bad in ("j" * (MAX_HEARTBEAT_PHASE_CHARS + 1), "join\n", "\x1b[2J"):
        with pytest.raises(ProtocolError):
            check_heartbeat(pb.Heartbeat(phase=bad))


def _masked_plaintexts_refused(tamper):
    """An ERO audit whose result goes to the Tester, driven to the end with `tamper`
    applied to each batch of the Test-Client's messages: the Tester's refusal (None if
    it accepted them all)."""
    from client_service.protocol import ClientSession
    from common.errors import ProtocolError
    from tester_service.protocol import AuditSpec, TesterSession
    from tester_service.release import ReleasePolicy
    from tests.helpers import TEST_BITS, make_inputs
    tester_df, client_df = make_inputs(60, 60, 60, seed=41)
    client_df = client_df.assign(member_id=client_df["member_id"].astype(str))
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=3, seed=1, result_recipient="tester")
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=ReleasePolicy.off())
    client = ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True)
    try:
        pending = list(tester.start())
        while pending:
            replies = [r for msg in pending for r in client.receive(msg)]
            replies = tamper(replies)
            try:
                pending = [out for r in replies for out in tester.receive(r)]
            except ProtocolError as exc:
                return exc
        assert tester.result is not None
        return None
    finally:
        tester.close()
        client.close()


def _masked(replies):
    return [r for r in replies if r.WhichOneof("body") == "masked_plaintexts"]


def test_masked_plaintexts_wider_than_the_widest_plaintext_are_refused():
    """The same values, re-encoded one byte wider than MAX_PLAINTEXT_WIDTH (the count
    and every value unchanged), are refused on their width alone."""
    from common.validation import MAX_PLAINTEXT_WIDTH

    def widen(replies):
        for r in _masked(replies):
            mp = r.masked_plaintexts
            values = [int.from_bytes(mp.values[i:i + mp.width], "big", signed=True)
                      for i in range(0, len(mp.values), mp.width)]
            width = MAX_PLAINTEXT_WIDTH + 1
            mp.values = b"".join(v.to_bytes(width, "big", signed=True) for v in values)
            mp.width = width
        return replies
    assert _masked_plaintexts_refused(lambda replies: replies) is None  # untouched: accepted
    assert "malformed" in str(_masked_plaintexts_refused(widen))


def test_an_empty_chunk_of_masked_plaintexts_that_is_not_the_last_is_refused():
    from proto import ppre_pb2 as pb

    def pad(replies):
        first = next(i for i, r in enumerate(replies) if r.WhichOneof("body") == "masked_plaintexts")
        empty = pb.PeerMessage()
        empty.masked_plaintexts.width = replies[first].masked_plaintexts.width
        empty.masked_plaintexts.last = False
        return replies[:first] + [empty] + replies[first:]

    def once(replies):
        return pad(replies) if _masked(replies) else replies
    assert "empty chunk" in str(_masked_plaintexts_refused(once))

