"""Every received message is validated before use (common.protocol.validation): fuzzed.

Property-based tests (hypothesis, derandomized: the same examples on every run, no
example database written) that drive both parties with random and mutated messages:

* sans-I/O: real two-party transcripts (ERO with either result recipient, LOT with
  units and strata, MQOS-AUC exact with its squares round trip) where one message is
  mutated (a field, a byte of its encoding, dropped, duplicated, or replaced by a random
  message), and random messages injected at a random point of a real run. Every outcome
  is normal progress or a deliberate error (ProtocolError, its PhaseError, or an
  InputError about the data), never another exception; a session that failed refuses
  every later message;
* over gRPC: random message sequences to the Test-Client's Exchange end with an Abort
  and INVALID_ARGUMENT / FAILED_PRECONDITION (or OK, when nothing was wrong), in
  bounded time; a real Tester whose messages are mutated on their way out gives the
  operator a clean error event; RunAudit with random request fields gives a result or
  a bad_input error event. Afterwards both services report SERVING and an audit runs.
"""
from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from client_service import server as client_server
from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from client_service.server import ClientConfig
from client_service.server import serve as serve_client
from common.net import channels
from common.protocol import validation, wire
from common.crypto import commutative, paillier
from common.net.channels import LinkSettings
from common.errors import InputError, PeerAborted, ProtocolError
from common.protocol.session import PhaseError
from proto import ppre_pb2 as pb
from tester_service import server as tester_server
from tester_service.inputs import read_probability_table
from tester_service.release import ReleasePolicy, ReleaseRefused
from tester_service import protocol as tester_protocol
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.server import run_audit
from tester_service.server import serve as serve_tester
from client_service import protocol as client_protocol
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, make_inputs, one_key_inline_chunks, wait_until, write_inputs
from tests.metric_data import random_ranked_lists

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    """Inline chunks (no worker pool for these tiny tables) and one cached 1024-bit key
    pair for the sans-I/O sessions (the gRPC services generate their own)."""
    with one_key_inline_chunks():
        yield


# ---------------------------------------------------------------------------- scenarios
def _loader(frame: pd.DataFrame):
    def load(name, metric):
        if name != "d":
            raise InputError(f"unknown dataset '{name[:20]}'", parameter="client dataset")
        return frame.copy()
    return load


#: release noise on (design §8), without the size thresholds these small tables would fail
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0)


def _scenarios() -> dict[str, tuple[AuditSpec, pd.DataFrame, pd.DataFrame, ReleasePolicy]]:
    tester, client = make_inputs(30, 30, 25, seed=5)
    rng = np.random.default_rng(5)
    auc = pd.DataFrame({"member_id": tester.member_id[:25], "y_true": rng.integers(0, 2, 25),
                        "score": rng.random(25).round(2)})
    lists = random_ranked_lists(8, rng, min_len=2, max_len=4, n_members=30)
    spec = dict(client_dataset="d", bootstrap=3, seed=1)
    off = ReleasePolicy.off()
    return {
        "ero": (AuditSpec(metric="ero", **spec), tester, client, off),
        "ero-tester": (AuditSpec(metric="ero", result_recipient="tester", **spec), tester, client, off),
        "ero-noisy": (AuditSpec(metric="ero", **spec), tester, client, NOISY),
        "lot": (AuditSpec(metric="lot", **spec), tester, lists, off),
        "mqos-auc": (AuditSpec(metric="mqos-auc", **spec), tester, auc, off),
    }


SCENARIOS = _scenarios()
#: the cheap scenarios get most examples; LOT and MQOS-AUC (squares) a few
WEIGHTED = ["ero"] * 3 + ["ero-tester"] * 3 + ["ero-noisy"] * 2 + ["lot", "mqos-auc"]


def _pair(name: str) -> tuple[TesterSession, ClientSession]:
    spec, tester, client, release = SCENARIOS[name]
    return (TesterSession(spec, tester, min_modulus_bits=TEST_BITS, n_buckets=8, release=release),
            ClientSession(_loader(client), modulus_bits=TEST_BITS, allow_insecure=True))


def _transcript_lengths() -> dict[str, int]:
    out = {}
    for name in SCENARIOS:
        t, c = _pair(name)
        log = []
        _drive(t, c, lambda i, msg: log.append(msg) or [msg])
        assert t.result is not None, name
        out[name] = len(log)
    return out


# ---------------------------------------------------------------------------- messages
_INT_MAX = {F.TYPE_UINT32: 2**32 - 1, F.TYPE_UINT64: 2**64 - 1}
_WORDS = ["", "ero", "lot", "mqos-auc", "output", "prob-count", "client", "tester", "ratio", "additive", "fpr",
          "exact", "d", "white", "black", "overall", "x" * 300]


def _scalar(field) -> st.SearchStrategy:
    t = field.type
    if t in _INT_MAX:
        top = _INT_MAX[t]
        return st.one_of(st.sampled_from([0, 1, 2, 3, 8, 32, 76, 128, 1000, top]), st.integers(0, top))
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_DOUBLE:
        return st.one_of(st.sampled_from([0.0, 0.5, 1.0, -1.0, float("nan"), float("inf")]), st.floats())
    if t == F.TYPE_STRING:
        return st.one_of(st.sampled_from(_WORDS), st.text(max_size=20))
    if t == F.TYPE_BYTES:
        return st.one_of(st.binary(max_size=160), st.integers(0, 4).map(lambda k: b"\x09" * (32 * k)),
                         st.integers(1, 3).map(lambda k: b"\xff" * (128 * k)))
    if t == F.TYPE_ENUM:
        return st.integers(0, 9)
    raise AssertionError(f"no strategy for {field.full_name}")


def _body(descriptor) -> st.SearchStrategy:
    fields = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value = _scalar(f.message_type.fields_by_name["value"])
            fields[f.name] = st.dictionaries(st.sampled_from(_WORDS[:12]) | st.text(max_size=8), value, max_size=3)
        elif f.is_repeated:
            fields[f.name] = st.lists(_scalar(f), max_size=4)
        else:
            fields[f.name] = _scalar(f)
    cls = getattr(pb, descriptor.name)
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


def peer_messages(*, heartbeats: bool = True) -> st.SearchStrategy:
    """Any PeerMessage body with random fields."""
    kinds = [f for f in pb.PeerMessage.DESCRIPTOR.oneofs_by_name["body"].fields
             if heartbeats or f.name != "heartbeat"]
    return st.one_of([_body(f.message_type).map(lambda b, name=f.name: pb.PeerMessage(**{name: b}))
                      for f in kinds])


@dataclass
class Mutation:
    """One change to the `at`-th message of a transcript (`at` modulo its length)."""

    at: int
    op: str
    pick: int
    value: Any

    def apply(self, msg: pb.PeerMessage) -> list[pb.PeerMessage]:
        if self.op == "drop":
            return []
        if self.op == "duplicate":
            return [msg, _copy(msg)]
        if self.op == "replace":
            return [self.value]
        m = _copy(msg)
        if self.op == "encoding":  # a byte of the serialised message: what the Inbox decodes
            data = bytearray(m.SerializeToString())
            if isinstance(self.value, bytes) and self.value:
                data[self.pick % len(data):self.pick % len(data)] = self.value
            elif data:
                data[self.pick % len(data)] ^= 1 + self.pick % 255
            return [wire.parse_peer_message(bytes(data))]
        body = getattr(m, m.WhichOneof("body"))
        fields = body.DESCRIPTOR.fields
        if not fields:
            return [m]
        _set_field(body, fields[self.pick % len(fields)], self.pick, self.value)
        return [m]


def _copy(msg: pb.PeerMessage) -> pb.PeerMessage:
    out = pb.PeerMessage()
    out.CopyFrom(msg)
    return out


def _coerce(field, pick: int, value: Any, current: Any) -> Any:
    t = field.type
    if t in _INT_MAX:
        if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
            return int(value) % (_INT_MAX[t] + 1)
        return (int(current) + (-1, 1, 1 << 16)[pick % 3]) % (_INT_MAX[t] + 1)  # one less, one more, far more
    if t == F.TYPE_BOOL:
        return not current
    if t == F.TYPE_DOUBLE:
        return float(value) if isinstance(value, (int, float)) else float("nan")
    if t == F.TYPE_STRING:
        return value if isinstance(value, str) else _WORDS[pick % len(_WORDS)]
    if t == F.TYPE_BYTES:
        if isinstance(value, bytes):
            return value
        data = bytearray(current)
        if not data:
            return b"\x01" * (1 + pick % 64)
        where = pick % len(data)
        if pick % 3 == 0:  # cut
            return bytes(data[:where])
        data[where] ^= 1 + (pick >> 8) % 255  # flip a byte
        return bytes(data)
    if t == F.TYPE_ENUM:
        return pick % 10
    raise AssertionError(field.full_name)


def _set_field(body, field, pick: int, value: Any) -> None:
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        container = getattr(body, name)
        if container and pick % 2:
            del container[sorted(container)[0]]
        else:
            key = value if isinstance(value, str) else "x"
            container[key] = _coerce(field.message_type.fields_by_name["value"], pick, value,
                                     field.message_type.fields_by_name["value"].default_value)
        return
    if field.is_repeated:
        container = getattr(body, name)
        if container and pick % 2:
            container.pop()
        else:  # a repeated field's default is [], so mutate from its last element or the type's zero
            zero = {F.TYPE_STRING: "", F.TYPE_BYTES: b"", F.TYPE_BOOL: False, F.TYPE_DOUBLE: 0.0}.get(field.type, 0)
            container.append(_coerce(field, pick, value, container[-1] if container else zero))
        return
    setattr(body, name, _coerce(field, pick, value, getattr(body, name)))


_VALUES = st.one_of(st.none(), st.sampled_from([0, 1, -1, 2**32, 2**64 - 1, 0.0, float("nan"), float("inf"), ""]),
                    st.integers(-2**70, 2**70), st.text(max_size=30), st.binary(max_size=70))


def mutations(ops=("field", "field", "field", "encoding", "drop", "duplicate", "replace"), *,
              heartbeats: bool = True) -> st.SearchStrategy:
    def build(op):
        value = peer_messages(heartbeats=heartbeats) if op == "replace" else _VALUES
        return st.builds(Mutation, at=st.integers(0, 1000), op=st.just(op), pick=st.integers(0, 2**20),
                         value=value)
    return st.sampled_from(ops).flatmap(build)


# ---------------------------------------------------------------------------- sans-I/O driver
class Failed(Exception):
    """`side` raised `exc` on a message (`delivered` False: the message's bytes did not
    decode, so `side` never saw it)."""

    def __init__(self, side, exc: BaseException, delivered: bool = True) -> None:
        super().__init__(repr(exc))
        self.side, self.exc, self.delivered = side, exc, delivered


def _drive(t: TesterSession, c: ClientSession, change) -> None:
    """`run_sessions` with `change(i, msg) -> [messages]` applied to the i-th message;
    an exception while a side receives (or produces its answers) is raised as Failed."""
    to_client, to_tester = deque(t.start()), deque()
    i = 0
    while to_client or to_tester:
        for queue_in, side, queue_out in ((to_client, c, to_tester), (to_tester, t, to_client)):
            while queue_in:
                msg = queue_in.popleft()
                try:
                    batch = change(i, msg)
                except ProtocolError as exc:  # the bytes no longer decode: what the Inbox raises
                    raise Failed(side, exc, delivered=False) from exc
                i += 1
                for m in batch:
                    try:
                        queue_out.extend(side.receive(m))
                    except Exception as exc:
                        raise Failed(side, exc) from exc


def _deliberate(exc: BaseException) -> bool:
    """The errors a session raises on purpose for a peer's bad message."""
    if isinstance(exc, (ProtocolError, ReleaseRefused)):  # the peer's fault, or the Tester's release policy
        return True
    # a mutated Hello may name another dataset or metric, or break the salt: the data
    # then fails its own checks (columns, empty intersection), as for an operator's typo
    return isinstance(exc, InputError)


def _check_sticky(side) -> None:
    """A session that failed refuses every later message (of any kind it knows)."""
    assert side.failed
    for probe in (pb.PeerMessage(table_end=pb.TableEnd()), pb.PeerMessage(chunk=pb.TableChunk(rows=1)),
                  pb.PeerMessage(abort=pb.Abort(code="x"))):
        with pytest.raises(PhaseError, match="already failed"):
            side.receive(probe)


def _run_mutated(name: str, mutation: Mutation, length: int) -> str:
    t, c = _pair(name)
    at = mutation.at % length
    try:
        _drive(t, c, lambda i, msg: mutation.apply(msg) if i == at else [msg])
    except Failed as failed:
        assert _deliberate(failed.exc), f"{type(failed.exc).__name__}: {failed.exc}"
        if failed.delivered:
            _check_sticky(failed.side)
        return type(failed.exc).__name__
    finally:
        t.close()
        c.close()
    return "progress"


LENGTHS: dict[str, int] = {}


def _length(name: str) -> int:
    if not LENGTHS:
        LENGTHS.update(_transcript_lengths())
    return LENGTHS[name]


@settings(FUZZ, max_examples=120)
@given(name=st.sampled_from(WEIGHTED), mutation=mutations())
def test_mutated_transcripts_end_in_progress_or_a_protocol_error(name, mutation):
    event(f"{mutation.op}: {_run_mutated(name, mutation, _length(name))}")


@settings(FUZZ, max_examples=60)
@given(name=st.sampled_from(WEIGHTED), at=st.integers(0, 1000), to_tester=st.booleans(),
       junk=st.lists(peer_messages(), min_size=1, max_size=3))
def test_random_messages_at_any_point_are_refused_cleanly(name, at, to_tester, junk):
    """A real run up to a random message, then random messages to either side."""
    t, c = _pair(name)
    at = at % _length(name)
    side = t if to_tester else c

    def change(i, msg):
        if i == at:
            raise _Stop()
        return [msg]
    try:
        try:
            _drive(t, c, change)
        except _Stop:
            pass
        for m in junk:
            try:
                list(side.receive(m))
            except Exception as exc:
                assert _deliberate(exc), f"{type(exc).__name__}: {exc}"
                _check_sticky(side)
                event(type(exc).__name__)
                break
            event("accepted")
    finally:
        t.close()
        c.close()


class _Stop(Exception):
    pass


# ---------------------------------------------------------------------------- deterministic checks
def test_every_phase_is_in_the_table_or_terminal():
    assert {p.value for p in tester_protocol.Phase} - set(validation.TESTER_ACCEPTS) == {"start", "done", "closed"}
    assert {p.value for p in client_protocol.Phase} - set(validation.CLIENT_ACCEPTS) == {"done", "closed"}


def test_a_failed_session_refuses_the_next_real_message():
    t, c = _pair("ero")
    [hello] = t.start()
    bad = _copy(hello)
    bad.hello.salt_share = b"short"
    with pytest.raises(ProtocolError, match="32 bytes"):
        c.receive(bad)
    with pytest.raises(PhaseError, match="already failed"):
        c.receive(hello)  # the right message, too late
    t.close()
    c.close()


def test_small_order_points_and_oversized_keys_are_refused():
    for u in commutative.SMALL_ORDER_U - {1}:
        with pytest.raises(ProtocolError, match="small order"):
            commutative.check_points(u.to_bytes(32, "little"))
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True).public
    n_bytes, h_bytes = key.to_bytes()
    assert validation.check_public_key(n_bytes, h_bytes, min_bits=TEST_BITS) == key
    big = (1 << (validation.MAX_MODULUS_BITS + 8)) + 1
    with pytest.raises(ProtocolError, match="larger than"):
        validation.check_public_key(big.to_bytes(1026, "big"), b"\x02", min_bits=TEST_BITS)


def test_the_received_bytes_cap_and_the_abort_code():
    spec, tester, client, release = SCENARIOS["ero"]
    t = TesterSession(spec, tester, min_modulus_bits=TEST_BITS, n_buckets=8, release=release)
    c = ClientSession(_loader(client), modulus_bits=TEST_BITS, allow_insecure=True, max_received_bytes=100)
    [hello] = t.start()
    [ack] = c.receive(hello)  # a Hello is well under 100 bytes
    rows = list(t.receive(ack))
    with pytest.raises(ProtocolError, match="more than 100 bytes"):
        for m in rows:
            c.receive(m)
    fresh = ClientSession(_loader(client), modulus_bits=TEST_BITS, allow_insecure=True)
    with pytest.raises(PeerAborted) as info:
        fresh.receive(pb.PeerMessage(abort=pb.Abort(code="Result; DROP", message="m" * 10_000)))
    assert info.value.code == "peer_error" and len(str(info.value)) < 2100
    for s in (t, c, fresh):
        s.close()


def test_status_mapping():
    assert client_server.status_for(ProtocolError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert client_server.status_for(PhaseError("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert client_server.status_for(PeerAborted("bad_input", "x")) is None
    assert client_server.status_for(InputError("x")) is None


# ---------------------------------------------------------------------------- over gRPC
PEER_TIMEOUT_S = 5.0
CALL_LIMIT_S = 15.0


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """Both services on loopback (short peer timeout, audits bounded at 30 s), and a
    record of every Test-Client exchange (its session and final status)."""
    directory = tmp_path_factory.mktemp("fuzz")
    tester, _, tp, cp = write_inputs(directory, 60, 40, seed=21)
    exchanges: list = []

    class Recorded(client_server._Exchange):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            exchanges.append(self)

    settings_ = LinkSettings(peer_timeout_s=PEER_TIMEOUT_S, heartbeat_s=1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client_server, "_Exchange", Recorded)
        mp.setattr(tester_server, "Outbox", MutatingOutbox)
        mp.setattr(client_server, "Outbox", ClientMutatingOutbox)
        client_config = ClientConfig(DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS,
                                     allow_insecure=True, settings=settings_, accept_noiseless=True)
        client, client_port, client_servicer = serve_client(client_config, 0, host="127.0.0.1")
        address = f"127.0.0.1:{client_port}"
        tester_config = tester_server.TesterConfig(address, lambda: read_probability_table(tp),
                                                   min_modulus_bits=TEST_BITS, n_buckets=8, settings=settings_,
                                                   deadline_s=30.0, release=NO_RELEASE_CONTROLS)
        server, tester_port, _ = serve_tester(tester_config, 0, host="127.0.0.1")
        try:
            yield dict(client=address, tester=f"127.0.0.1:{tester_port}", client_servicer=client_servicer,
                       tester_config=tester_config, exchanges=exchanges, hello=_real_hello(tester))
        finally:
            MutatingOutbox.plan = ClientMutatingOutbox.plan = None
            for s in (server, client):
                s.stop(grace=0).wait(10)


def _real_hello(tester: pd.DataFrame) -> pb.PeerMessage:
    session = TesterSession(AuditSpec(metric="ero", client_dataset="ero", bootstrap=3), tester,
                            min_modulus_bits=TEST_BITS, n_buckets=8, release=NO_RELEASE_CONTROLS)
    [hello] = session.start()
    session.close()
    return hello


class MutatingOutbox(tester_server.Outbox):
    """The Tester's outbox, with `plan` (a Mutation) applied to the message it is at."""

    plan: Mutation | None = None

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._sent = 0

    def put(self, message, checkpoint=None):
        plan = type(self).plan
        if plan is None or message.WhichOneof("body") == "abort":
            return super().put(message, checkpoint)
        at, self._sent = self._sent, self._sent + 1
        for m in (plan.apply(message) if at == plan.at else [message]):
            super().put(m, checkpoint)


class ClientMutatingOutbox(MutatingOutbox):
    """The same, in the Test-Client's servicer."""

    plan: Mutation | None = None


def _check_outcome(outcome: pb.AuditEvent, took: float, mutation: Mutation) -> None:
    """A result, or an error the operator can act on: the protocol broken, the data
    refused, or the Test-Client's own Abort (when the mutation made it one)."""
    kind = outcome.WhichOneof("event")
    assert took < 35, (took, outcome)
    event(f"{mutation.op}: {outcome.error.code or kind}")
    if kind == "result":
        return
    assert kind == "error"
    allowed = {"protocol_error", "bad_input"}
    if mutation.at == 0:  # the Hello (or HelloAck): a salt share changed in flight makes the two
        allowed.add("release_refused")  # parties hash ids apart, the join is empty and refused
    if mutation.op == "replace" and mutation.value.HasField("abort"):
        allowed.add(mutation.value.abort.code if re.fullmatch(r"[a-z_]{1,40}", mutation.value.abort.code)
                    else "peer_error")
    assert outcome.error.code in allowed, outcome.error


def _healthy(services) -> None:
    assert wait_until(lambda: services["client_servicer"].active_sessions == 0
                      and services["tester_config"].sessions == [], timeout=20)
    assert channels.check_health(services["client"]) and channels.check_health(services["tester"])


def _typed(channel):
    return channel.stream_stream("/ppre.v1.Client/Exchange", request_serializer=pb.PeerMessage.SerializeToString,
                                 response_deserializer=pb.PeerMessage.FromString)


@settings(FUZZ, max_examples=40)
@given(with_hello=st.booleans(), junk=st.lists(peer_messages(), min_size=1, max_size=4),
       mutation=st.none() | st.none() | mutations(ops=("field", "encoding")))
def test_the_test_client_answers_random_messages_with_a_clean_status(services, with_hello, junk, mutation):
    hello = services["hello"]
    if mutation is not None:
        mutation.at = 0
        try:
            hello = mutation.apply(hello)[0]
        except ProtocolError:
            pass  # a mutation that no longer decodes: send the real Hello
    requests = ([hello] if with_hello else []) + junk
    t0 = time.monotonic()
    replies, status = [], grpc.StatusCode.OK
    with channels.make_channel(services["client"]) as channel:
        try:
            for reply in _typed(channel)(iter(requests), timeout=CALL_LIMIT_S):
                replies.append(reply)
        except grpc.RpcError as exc:
            status = exc.code()
    took = time.monotonic() - t0
    assert took < CALL_LIMIT_S, took
    assert status in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), \
        (status, replies)
    aborts = [r.abort for r in replies if r.HasField("abort")]
    assert all(a.code != "internal" for a in aborts), aborts
    event(f"{status.name} {[r.WhichOneof('body') for r in replies]} {[a.code for a in aborts]}")
    if status is not grpc.StatusCode.OK:
        assert aborts and aborts[-1].code == "protocol_error", (status, replies)
        kind = services["exchanges"][-1].status[0]
        assert kind == status


@settings(FUZZ, max_examples=14)
@given(mutation=mutations(ops=("field", "field", "encoding", "duplicate", "replace"), heartbeats=False))
def test_a_tester_sending_mutated_messages_gets_a_clean_error(services, mutation):
    """The real Tester, whose k-th outgoing message is mutated, against the real
    Test-Client: the operator gets a result or a clean error event, within bounds."""
    mutation.at %= 6  # Hello, the rows' chunk and end, and (for the result) the header, aggregates, end
    _mutated_audit(MutatingOutbox, services, mutation)


@settings(FUZZ, max_examples=14)
@given(mutation=mutations(ops=("field", "field", "encoding", "duplicate", "replace"), heartbeats=False))
def test_a_test_client_sending_mutated_messages_gives_the_operator_a_protocol_error(services, mutation):
    """The real Test-Client, whose k-th outgoing message is mutated, against the real
    Tester: the operator gets a result or a clean error event, within bounds."""
    mutation.at %= 6  # HelloAck, the shuffled rows' chunk and end, its own rows' chunk and end, the result
    _mutated_audit(ClientMutatingOutbox, services, mutation)


def _mutated_audit(outbox, services, mutation) -> None:
    """One audit with `outbox` mutating its k-th message: a result or a clean error, in
    bounded time, and both services healthy afterwards."""
    outbox.plan = mutation
    try:
        t0 = time.monotonic()
        outcome = run_audit(services["tester"], pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=3,
                                                                 has_seed=True, seed=2), timeout=40)
        took = time.monotonic() - t0
    finally:
        outbox.plan = None
    _check_outcome(outcome, took, mutation)
    _healthy(services)


_TEXT = st.one_of(st.sampled_from(_WORDS), st.text(max_size=12))


def _mostly(valid, *invalid) -> st.SearchStrategy:
    """A field that is valid about three times in four (so that whole requests often are)."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), st.sampled_from(list(invalid)))


@st.composite
def audit_requests(draw) -> pb.AuditRequest:
    """AuditRequests, about one in five entirely valid (those run a whole, small audit)."""
    request = pb.AuditRequest(
        metric=draw(_mostly("ero", "output", "lot", "prob-count", "mqos-auc", "nonsense", "")),
        client_dataset=draw(st.one_of(_mostly("ero", "", "nope", "../ero", "e" * 5000), _TEXT)),
        bootstrap=draw(_mostly(3, 0, 1, 100_001, 2**32 - 1)),
        has_seed=draw(st.booleans()), seed=draw(st.integers(0, 2**64 - 1)),
        result_recipient=draw(_mostly("", "client", "tester", "nobody")),
        metric_option=draw(_mostly("", "fpr", "unconditional", "raw", "z" * 300)),
        metric_params=draw(_mostly({}, {"bandwidth": "0.1"}, {"": ""}, {"x" * 5000: "1"})))
    for name, values in (("confidence", [0.0, 0.5, 0.95, 1.0, -1.0, float("nan"), float("inf")]),
                         ("tau", [0.0, 0.05, -1.0, float("nan"), float("inf"), 1e300])):
        value = draw(st.none() | st.none() | st.sampled_from(values))
        if value is not None:
            setattr(request, name, value)
    return request


@settings(FUZZ, max_examples=30)
@given(request=audit_requests())
def test_run_audit_with_random_requests_gives_a_result_or_bad_input(services, request):
    t0 = time.monotonic()
    outcome = run_audit(services["tester"], request, timeout=40)
    assert time.monotonic() - t0 < 35
    kind = outcome.WhichOneof("event")
    event(outcome.error.code or kind)
    if kind == "error":
        assert outcome.error.code == "bad_input", outcome.error
    else:
        assert kind == "result"


def test_services_stay_healthy_and_a_normal_audit_succeeds(services):
    """Runs after the fuzzing above (file order): nothing is left over, both services
    report SERVING, and the next audit succeeds."""
    _healthy(services)
    event = run_audit(services["tester"], pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=3,
                                                           has_seed=True, seed=1), timeout=60)
    assert event.WhichOneof("event") == "result", event
    _healthy(services)
