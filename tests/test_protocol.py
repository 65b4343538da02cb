"""The two-party protocol of design §3, in one process (sans-I/O)."""
from __future__ import annotations

import base64
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from client_service.protocol import ClientSession
from common.protocol import wire
from common.crypto import commutative, symmetric
from common.errors import InputError, ProtocolError
from common.protocol.session import PhaseError
from ppre.report.text import render_text
from tests.helpers import plain_ratio
from common.races import RACES
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, Phase, TesterSession
from tester_service.release import INTERSECTION_REFUSAL, IntersectionRefused
from tests.helpers import TEST_BITS, exact_session, local_audit, make_inputs, run_sessions


def _plain(tester: pd.DataFrame, client: pd.DataFrame, form: str = "fpr") -> np.ndarray:
    m = client.merge(tester, on="member_id")
    f = ((m.y_pred == 1) & (m.y_true == 0)).to_numpy(int)
    d = (m.y_true == 0).to_numpy(int) if form == "fpr" else np.ones(len(m), int)
    return plain_ratio(m[list(RACES)].to_numpy(), f, d)


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_one_hot_ero_equals_pandas_fpr(recipient):
    tester, client = make_inputs(400, 300, 200, seed=1, one_hot=True)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=3, result_recipient=recipient)
    result, _, _ = local_audit(tester, client, spec=spec)
    merged = client.merge(tester, on="member_id")
    merged["race"] = merged[list(RACES)].to_numpy().argmax(axis=1)
    negatives = merged[merged.y_true == 0]
    fpr = negatives.groupby("race").y_pred.mean()  # the plain per-group FPR, with pandas
    assert result.n_matched == 200
    for j, g in enumerate(result.by_group):
        assert g.group == RACES[j]
        if j in fpr.index:
            assert abs(g.estimate - fpr[j]) < 1e-9
            assert g.ci_low <= g.estimate + 1e-12 and g.estimate <= g.ci_high + 1e-12
        else:
            assert g.estimate is None


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_fractional_ero_equals_the_weighted_formula(recipient):
    tester, client = make_inputs(300, 300, 250, seed=2)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=1, result_recipient=recipient)
    result, _, _ = local_audit(tester, client, spec=spec)
    assert np.abs(np.array([g.estimate for g in result.by_group]) - _plain(tester, client)).max() < 1e-9


def test_unconditional_ero_form():
    tester, client = make_inputs(200, 200, 150, seed=5)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, metric_option="unconditional")
    result, _, _ = local_audit(tester, client, spec=spec)
    assert result.metric_option == "unconditional"
    assert np.abs(np.array([g.estimate for g in result.by_group]) - _plain(tester, client, "uncond")).max() < 1e-9


def test_zero_denominator_group_is_reported_undefined():
    tester, client = make_inputs(100, 100, 100, seed=6, one_hot=True)
    race = tester[list(RACES)].to_numpy().argmax(axis=1)
    client.loc[race == 0, "y_true"] = 1  # no negatives among 'white' members: FPR undefined
    result, _, _ = local_audit(tester, client)
    assert result.by_group[0].estimate is None and result.by_group[0].ci_low is None
    assert result.to_dict()["groups"][0]["estimate"] is None


def test_keys_are_per_session_and_state_is_dropped_at_the_end():
    tester, client = make_inputs(60, 60, 40)
    _, t1, c1 = local_audit(tester, client)
    _, t2, c2 = local_audit(tester, client)
    assert t1.phase is Phase.DONE
    for s in (t1, t2):
        assert s._com_key is None and s._sealer is None and s._ids is None and s._probabilities is None
        assert s._shuffled is None and s._index is None and s._matched_cts == [] and s._pads is None
    for s in (c1, c2):
        assert s._com_key is None and s._paillier is None and s._ids is None and s._values is None
    spec = AuditSpec(metric="ero", client_dataset="d")
    a, b = exact_session(spec, tester), exact_session(spec, tester)
    assert a._com_key._key.private_bytes_raw() != b._com_key._key.private_bytes_raw()
    assert a._salt_share != b._salt_share


def _encodings(secret: int | bytes) -> set[bytes]:
    """The ways a key could end up in a message: raw bytes in either byte order, decimal,
    hex (either case) and base64, each whole and, for binary forms, as either half."""
    if isinstance(secret, bytes):
        values = [int.from_bytes(secret, "big"), int.from_bytes(secret, "little")]
        raw = [secret, secret[::-1]]
    else:
        values = [secret]
        size = (secret.bit_length() + 7) // 8
        raw = [secret.to_bytes(size, "big"), secret.to_bytes(size, "little")]
    out = set()
    for r in raw:
        out |= {r, r[:len(r) // 2], r[len(r) // 2:], base64.b64encode(r), r.hex().encode(), r.hex().upper().encode()}
    for v in values:
        out |= {str(v).encode(), f"{v:x}".encode(), f"{v:X}".encode()}
    return out


def _clamped(scalar: bytes) -> bytes:
    """The X25519 scalar as the curve arithmetic uses it (RFC 7748 clamping)."""
    k = bytearray(scalar)
    k[0] &= 248
    k[31] = (k[31] & 127) | 64
    return bytes(k)


def test_no_plaintext_or_key_in_any_message(monkeypatch):
    """Design §3 and §7: no member id, probability or key crosses the wire. Every message of an
    audit is recorded and searched for both parties' member ids, the Tester's
    probabilities, the Tester's X25519 scalar and AES-256 key, and the Test-Client's
    X25519 scalar and Paillier p, q, lambda and phi, in several encodings."""
    aes_keys: list[bytes] = []

    class RecordingAESGCM:  # pyca's AESGCM does not expose its key: record it as it is made
        @staticmethod
        def generate_key(bit_length):
            key = AESGCM.generate_key(bit_length)
            aes_keys.append(key)
            return key

        def __new__(cls, key):
            return AESGCM(key)

    monkeypatch.setattr(symmetric, "AESGCM", RecordingAESGCM)
    tester, client = make_inputs(80, 80, 50, seed=9)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    for recipient in ("client", "tester"):
        t = exact_session(dataclasses.replace(spec, result_recipient=recipient), tester,
                          min_modulus_bits=TEST_BITS)
        c = _client(client)
        keys = {"tester X25519 scalar": t._com_key._key.private_bytes_raw(), "tester AES key": aes_keys[-1]}
        seen: list[bytes] = []

        def tap(direction, msg, c=c, keys=keys, seen=seen):
            if msg.HasField("hello_ack"):  # the Client's keys exist from its HelloAck on
                p, q = c._paillier.p, c._paillier.q
                keys.update({"client X25519 scalar": c._com_key._key.private_bytes_raw(), "Paillier p": p,
                             "Paillier q": q, "Paillier lambda": math.lcm(p - 1, q - 1),
                             "Paillier phi": (p - 1) * (q - 1), "public n": c._paillier.public.n})
            seen.append(msg.SerializeToString())

        try:
            run_sessions(t, c, tap)
        finally:
            t.close()
            c.close()
        assert t.result is not None and len(keys) == 8
        wire_bytes = b"".join(seen)
        # the search works: the public modulus is on the wire, in the encoding the HelloAck uses
        assert any(e in wire_bytes for e in _encodings(keys.pop("public n")))
        for x25519 in ("tester X25519 scalar", "client X25519 scalar"):
            keys[x25519 + " (clamped)"] = _clamped(keys[x25519])
        for name, secret in keys.items():
            leaked = [e for e in _encodings(secret) if e in wire_bytes]
            assert not leaked, f"{name} appears on the wire ({recipient} variant)"
        for member in list(tester.member_id) + list(client.member_id):
            assert member.encode() not in wire_bytes
        for value in tester[list(RACES)].to_numpy().ravel()[:200]:
            assert np.float64(value).tobytes() not in wire_bytes
            assert repr(float(value)).encode() not in wire_bytes


# ---------------------------------------------------------------- a misbehaving peer
def _tester(n=30):
    tester, _ = make_inputs(n, n, n)
    return exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester,
                         min_modulus_bits=TEST_BITS)


def _client(client_df):
    return ClientSession(lambda name, metric: client_df, modulus_bits=TEST_BITS, allow_insecure=True)


def test_wrong_phase_is_a_protocol_error():
    t = _tester()
    with pytest.raises(ProtocolError, match="not allowed in phase"):
        t.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS)))
    _, client = make_inputs(10, 10, 10)
    c = _client(client)
    with pytest.raises(ProtocolError, match="not allowed in phase"):
        c.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.TESTER_ROWS, rows=1, points=b"\x00" * 32)))
    with pytest.raises(ProtocolError, match="unexpected message"):
        c.receive(pb.PeerMessage(client_result=pb.ClientResult()))
    with pytest.raises(ProtocolError, match="unexpected message"):
        c.receive(pb.PeerMessage())


def _client_after_hello():
    tester_df, client_df = make_inputs(20, 20, 20)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester_df, min_modulus_bits=TEST_BITS)
    c = _client(client_df)
    [hello] = t.start()
    [ack] = c.receive(hello)
    return t, c, ack


def test_garbage_and_off_curve_points_are_protocol_errors():
    _, c, _ = _client_after_hello()
    with pytest.raises(ProtocolError, match="bytes for 2 rows"):
        c.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.TESTER_ROWS, rows=2, points=b"garbage")))
    _, c, _ = _client_after_hello()
    width = c._reader.layout.sealed
    twist = next(u for u in range(2, 1000) if not commutative._on_curve(u))
    with pytest.raises(ProtocolError, match="not on Curve25519"):
        c.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.TESTER_ROWS, rows=1,
                                                     points=twist.to_bytes(32, "little"), sealed=b"\x00" * width)))
    _, c, _ = _client_after_hello()
    with pytest.raises(ProtocolError, match="end says 5 rows"):
        c.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.TESTER_ROWS, rows=5)))


def test_wrong_table_and_bad_hello_are_protocol_errors():
    _, c, _ = _client_after_hello()
    with pytest.raises(ProtocolError, match="expected a chunk of tester rows"):
        c.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.AGGREGATES, rows=1)))
    _, client = make_inputs(10, 10, 10)
    for hello in (pb.Hello(protocol_version=99), pb.Hello(protocol_version=1, salt_share=b"short")):
        with pytest.raises(ProtocolError):
            _client(client).receive(pb.PeerMessage(hello=hello))


def test_ciphertexts_out_of_range_from_the_client_are_refused():
    """The Test-Client's ciphertexts (here all >= n²) are refused by the join's task for
    their chunk, the first one named."""
    t, c, ack = _client_after_hello()
    out = list(t.receive(ack))
    replies = [m for msg in out for m in c.receive(msg)]
    shuffled = [m for m in replies if m.HasField("chunk") and m.chunk.table == pb.SHUFFLED_ROWS]
    for m in replies:
        if m.HasField("chunk") and m.chunk.table == pb.CLIENT_ROWS:
            m.chunk.ciphertexts = b"\xff" * len(m.chunk.ciphertexts)  # >= n^2
    assert shuffled
    with pytest.raises(ProtocolError, match="ciphertext 0 is out of range"):
        for m in replies:
            list(t.receive(m))


@pytest.mark.parametrize("joins", [True, False])
def test_a_bad_ciphertext_fails_the_audit_whether_its_row_joins_or_not(joins):
    """One row's ciphertext out of range (all its bytes 0xff) ends the audit with the same
    protocol error whether its member is one of the Tester's or not: a check of the
    joined rows alone would answer, by failing or not, whether a chosen member is one of
    ours (a membership oracle). The row is picked by doubling the Test-Client's points
    with the Tester's key, as the join does."""
    tester_df, client_df = make_inputs(20, 20, 10)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester_df, min_modulus_bits=TEST_BITS)
    c = _client(client_df)
    [hello] = t.start()
    [ack] = c.receive(hello)
    replies = [m for msg in t.receive(ack) for m in c.receive(msg)]
    rows = [m.chunk for m in replies if m.HasField("chunk") and m.chunk.table == pb.CLIENT_ROWS]
    assert len(rows) == 1
    for m in replies:  # the shuffled table, indexed
        if not (m.HasField("chunk") and m.chunk.table == pb.CLIENT_ROWS) and \
                not (m.HasField("table_end") and m.table_end.table == pb.CLIENT_ROWS):
            list(t.receive(m))
    doubled = np.frombuffer(t._com_key.multiply_task()(rows[0].points, 0), dtype="S32")
    member = np.isin(doubled, t._index[0])
    assert member.sum() == 10
    row = int(np.flatnonzero(member == joins)[0])
    width = len(rows[0].ciphertexts) // rows[0].rows
    cts = bytearray(rows[0].ciphertexts)
    cts[row * width:(row + 1) * width] = b"\xff" * width
    rows[0].ciphertexts = bytes(cts)
    with pytest.raises(ProtocolError, match=f"ciphertext {row} is out of range"):
        for m in replies:
            if (m.HasField("chunk") and m.chunk.table == pb.CLIENT_ROWS) or \
                    (m.HasField("table_end") and m.table_end.table == pb.CLIENT_ROWS):
                list(t.receive(m))


def test_a_shuffled_row_repeated_across_chunks_is_refused():
    """Step 3: the shuffled table is a permutation of our rows; a point sent twice, in two
    chunks or in one, is refused when the table ends, before any row is joined (the
    chunks' points are checked on the executor as they arrive, the repeats when the
    table is indexed)."""
    t, c, ack = _client_after_hello()
    out = list(t.receive(ack))
    replies = [m for msg in out for m in c.receive(msg)]
    shuffled = [m for m in replies if m.HasField("chunk") and m.chunk.table == pb.SHUFFLED_ROWS]
    assert len(shuffled) == 1 and shuffled[0].chunk.rows == 20
    chunk = shuffled[0].chunk
    width = len(chunk.sealed) // chunk.rows
    first = pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=10, points=chunk.points[:320], sealed=chunk.sealed[:10 * width])
    # the second half with its first point replaced by one of the first half
    second = pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=10, points=chunk.points[:32] + chunk.points[352:],
                           sealed=chunk.sealed[10 * width:])
    t.receive(pb.PeerMessage(chunk=first))
    t.receive(pb.PeerMessage(chunk=second))
    with pytest.raises(ProtocolError, match="duplicate row in the shuffled table"):
        t.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS, rows=20)))
    t2, c2, ack2 = _client_after_hello()
    for msg in t2.receive(ack2):
        c2.receive(msg)
    t2.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=20,
                                                  points=chunk.points[:32] * 2 + chunk.points[64:],
                                                  sealed=chunk.sealed)))
    with pytest.raises(ProtocolError, match="duplicate row in the shuffled table"):
        t2.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS, rows=20)))


@pytest.mark.parametrize("bad, expected", [("twist", "point 13 is not on Curve25519"),
                                            ("small", "point 13 has small order"),
                                            ("wide", "point 13 is not canonically encoded")])
def test_a_bad_point_in_the_shuffled_table_is_refused_by_its_place_before_the_join(bad, expected):
    """Step 3: the shuffled table's points are checked on the executor as its chunks
    arrive (`tester_service.join.check_shuffled_chunk`): a point off the curve, of small
    order or not canonically encoded, in the second of two chunks, is refused when the
    table ends, named by its place in the whole table, and the session stays failed."""
    t, c, ack = _client_after_hello()
    replies = [m for msg in t.receive(ack) for m in c.receive(msg)]
    [chunk] = [m.chunk for m in replies if m.HasField("chunk") and m.chunk.table == pb.SHUFFLED_ROWS]
    width = len(chunk.sealed) // chunk.rows
    u = {"twist": next(u for u in range(2, 1000) if not commutative._on_curve(u)),
         "small": max(commutative.SMALL_ORDER_U), "wide": commutative.P + 3}[bad]
    points = chunk.points[:13 * 32] + u.to_bytes(32, "little") + chunk.points[14 * 32:]
    t.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=10, points=points[:320],
                                                 sealed=chunk.sealed[:10 * width])))
    t.receive(pb.PeerMessage(chunk=pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=10, points=points[320:],
                                                 sealed=chunk.sealed[10 * width:])))
    with pytest.raises(ProtocolError, match=expected):
        t.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS, rows=20)))
    with pytest.raises(PhaseError, match="already failed"):
        t.receive(pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS, rows=20)))


def test_weak_paillier_key_from_the_client_is_refused():
    tester_df, client_df = make_inputs(10, 10, 10)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d"), tester_df)  # production minimum: 2048
    c = _client(client_df)
    [hello] = t.start()
    [ack] = c.receive(hello)
    with pytest.raises(ProtocolError, match="refused"):
        t.receive(ack)


def test_empty_intersection_is_refused_as_a_small_one():
    """One answer for an empty and a too-small intersection, without a count (design §8.2)."""
    tester, client = make_inputs(30, 30, 0)
    with pytest.raises(IntersectionRefused) as refused:
        local_audit(tester, client)
    assert str(refused.value) == INTERSECTION_REFUSAL and refused.value.code == "release_refused"


def test_a_client_result_carrying_a_result_is_a_protocol_error():
    """Design §3.7: under result recipient client the Test-Client keeps the result; a
    ClientResult that carries one (a modified Test-Client pushing it) is refused, unread."""
    tester, client = make_inputs(30, 30, 20)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester, min_modulus_bits=TEST_BITS)
    c = _client(client)

    def push(direction, msg):
        if msg.HasField("client_result"):
            msg.client_result.report_json = c.result.to_json()  # the genuine result
    with pytest.raises(ProtocolError, match="keeps the result"):
        run_sessions(t, c, tap=push)
    assert t.result is None


@pytest.mark.parametrize("garbage", ["[]", "{}", '{"metric": "ero"}', "not json"])
def test_any_report_in_a_client_result_is_a_protocol_error(garbage):
    tester, client = make_inputs(30, 30, 20)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester, min_modulus_bits=TEST_BITS)

    def tamper(direction, msg):
        if msg.HasField("client_result"):
            msg.client_result.report_json = garbage
    with pytest.raises(ProtocolError):
        run_sessions(t, _client(client), tap=tamper)


def test_the_tester_ends_with_a_receipt_and_the_test_client_keeps_the_result():
    """Result recipient client (the default): the Tester's `result` is a receipt with its
    own facts and no estimate; the Test-Client's session holds the result and hands it to
    `deliver` under the audit's id."""
    tester, client = make_inputs(40, 40, 30)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester, min_modulus_bits=TEST_BITS)
    kept = {}
    c = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True,
                      deliver=lambda audit_id, report: kept.setdefault(audit_id, report))
    merged = run_sessions(t, c)
    receipt = t.result
    assert receipt.is_receipt and receipt.delivered_to == "client" and receipt.audit_id == t.audit_id
    assert receipt.groups == [] and receipt.differences == [] and receipt.verdict.compared is None
    assert receipt.n_matched == 30 and "total" in receipt.phase_seconds
    assert "result delivered to the Test-Client" in render_text(receipt) and t.audit_id in render_text(receipt)
    assert kept == {t.audit_id: c.result} and c.result.overall is not None and c.result.overall.estimate is not None
    assert merged.n_matched == 30 and not merged.is_receipt and merged.groups == c.result.groups


@pytest.mark.parametrize("bad", [dict(bootstrap=0), dict(confidence=1.0), dict(metric="auc"),
                                 dict(result_recipient="everyone"), dict(metric_option="pr")])
def test_bad_audit_parameters(bad):
    spec = AuditSpec(**{**dict(metric="ero", client_dataset="d"), **bad})
    with pytest.raises(InputError):
        spec.validated()


# ---------------------------------------------------------------- chunking
def test_a_million_rows_never_make_a_large_message():
    n = 1_000_000
    points = bytes(32) * n
    sealed = bytes(76) * n
    sizes = [m.ByteSize() for m in wire.table_messages(wire.tester_rows(76), n, points=points, sealed=sealed)]
    assert len(sizes) > 100 and max(sizes) < wire.CHUNK_BYTES + 1024 < wire.MAX_MESSAGE_BYTES
    # the widest row (a 4096-bit ciphertext and a point) too
    assert wire.rows_per_chunk(512 + 32) * (512 + 32) <= wire.CHUNK_BYTES


def test_distinct_points_partition_the_points_as_numpys_unique_does():
    """`distinct_points` (the multiplicity count's integer sort of the points' first 8
    bytes) groups exactly the equal points and counts them, as `np.unique` does, also
    where two different points share their first 8 bytes (it falls back to the byte
    strings) and for an empty table; `exact_sum` is exact past int64 (Python integers)."""
    import secrets

    from tester_service.aggregation import distinct_points, exact_sum
    rng = np.random.default_rng(5)
    distinct = np.frombuffer(secrets.token_bytes(32 * 500), dtype="S32")
    twin = bytearray(distinct[:1].tobytes())  # all 32 bytes (an S32 item drops trailing NULs)
    twin[31] ^= 1  # same first 8 bytes, another point
    pool = np.concatenate([distinct, np.array([bytes(twin)], dtype="S32")])
    for points in (pool[rng.integers(0, 500, 2000)], pool[rng.integers(0, 501, 2000)], pool[[0, 500, 0, 500, 3]]):
        member, counts = distinct_points(points)
        _, expected_member, expected_counts = np.unique(points, return_inverse=True, return_counts=True)
        pairs = set(zip(member.tolist(), expected_member.tolist()))
        assert len(pairs) == len(counts) == len(expected_counts)  # the same partition
        assert sorted(counts.tolist()) == sorted(expected_counts.tolist())
        assert all(counts[a] == expected_counts[b] for a, b in pairs)
    assert len(distinct_points(np.empty(0, dtype="S32"))[1]) == 0
    big = np.array([1 << 62, 1 << 62, 5], dtype=np.int64)
    assert exact_sum(big) == (1 << 63) + 5
    assert exact_sum(np.array([3, 4], dtype=np.int64)) == 7 and exact_sum(np.array([-2, 5])) == 3
