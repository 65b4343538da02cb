"""Every message from the peer is validated before use (`common.protocol.validation`, the
Tester's join), and each refusal reaches the operator in its own words.

What arrives from the peer: phase timings, heartbeats, labels, the Hello's sizes, names
and audit request at their edges, the Test-Client's key up to its largest size, the cap
on the bytes of a whole session. Tables: a chunk past the announced rows is refused as
it arrives, a table shorter than announced at its end; a row's resampling bucket or
stratum out of range; ciphertexts that are not units; squares and masked plaintexts of
another size than asked for. The Test-Client's checks of the AggregatesHeader (groups,
bootstrap parameters, interval, cells, release fields) and of the aggregates. Unit
tests feed the validators directly; the others tamper with a real transcript between
the two sessions and show the untouched one accepted."""
from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd
import pytest

from common.errors import ProtocolError
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.held_key import client_key, fast_crypto, session_pair  # noqa: F401  (the fixtures)
from tests.helpers import make_inputs


# ---------------------------------------------------------------- what arrives from the peer, in words
def test_the_peers_timings_are_a_few_named_finite_non_negative_numbers():
    """`check_seconds`: up to MAX_SECONDS_ENTRIES named entries; a negative, NaN or
    infinite value, a bad name or one entry too many is refused."""
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_SECONDS_ENTRIES, check_seconds
    full = {f"phase_{i}": float(i) for i in range(MAX_SECONDS_ENTRIES)}
    assert check_seconds(full) == full
    for bad in ({"join": -1.0}, {"join": float("nan")}, {"join": float("inf")}, {"join phase": 1.0}, {"": 1.0},
                dict(full, one_more=1.0)):
        with pytest.raises(ProtocolError):
            check_seconds(bad)


@pytest.mark.parametrize("seconds, text", [
    ({f"phase_{i}": 1.0 for i in range(65)}, "too many phase timings"),
    ({"Bad Key": 1.0}, "malformed phase timings"),
    ({"join": float("nan")}, "malformed phase timings"),
    ({"join": -1.0}, "malformed phase timings"),
])
def test_phase_timings_are_refused_in_words(seconds, text):
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_SECONDS_ENTRIES, check_seconds
    assert MAX_SECONDS_ENTRIES == 64
    with pytest.raises(ProtocolError) as refused:
        check_seconds(seconds)
    assert str(refused.value) == text
    assert check_seconds({"join": 0.0, "psi_upload": 2.5}) == {"join": 0.0, "psi_upload": 2.5}


def test_a_heartbeat_carries_a_short_printable_phase():
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_HEARTBEAT_PHASE_CHARS, check_heartbeat
    from proto import ppre_pb2 as pb
    check_heartbeat(pb.Heartbeat(phase="j" * MAX_HEARTBEAT_PHASE_CHARS))
    for bad in ("j" * (MAX_HEARTBEAT_PHASE_CHARS + 1), "join\n", "\x1b[2J"):
        with pytest.raises(ProtocolError):
            check_heartbeat(pb.Heartbeat(phase=bad))


@pytest.mark.parametrize("phase", ["x" * 65, "join\n"])
def test_a_malformed_heartbeat_is_refused_in_words(phase):
    from common.errors import ProtocolError
    from common.protocol.validation import check_heartbeat
    from proto import ppre_pb2 as pb
    with pytest.raises(ProtocolError) as refused:
        check_heartbeat(pb.Heartbeat(phase=phase))
    assert str(refused.value) == "malformed heartbeat"
    check_heartbeat(pb.Heartbeat(phase="x" * 64))


def test_announced_labels_are_few_non_empty_and_short():
    """Group and strata labels from the peer: at most `most` of them, none empty, none
    longer than MAX_LABEL_CHARS."""
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_LABEL_CHARS, _labels
    assert _labels(["g"] * 4, "groups", 4) == ("g",) * 4
    assert _labels(["x" * MAX_LABEL_CHARS], "groups", 4) == ("x" * MAX_LABEL_CHARS,)
    for bad in (["g"] * 5, ["a", ""], ["x" * (MAX_LABEL_CHARS + 1)]):
        with pytest.raises(ProtocolError):
            _labels(bad, "groups", 4)


def test_a_key_at_the_largest_size_is_accepted_even_with_a_leading_zero_byte():
    """The Test-Client's modulus may be MAX_MODULUS_BITS long; its bytes may carry one
    leading zero (MAX_MODULUS_BITS / 8 + 1 bytes), and h twice as many and one: accepted.
    A byte more of either, or one bit more of n, is refused in the check's words."""
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_MODULUS_BITS, check_public_key
    a = (3 << (MAX_MODULUS_BITS // 2 - 2)) + 1
    n = a * (a + 2)  # odd, composite, not a square: the checks a key's modulus must pass
    assert n.bit_length() == MAX_MODULUS_BITS
    h = (2).to_bytes(1, "big")
    key = check_public_key(b"\0" + n.to_bytes(MAX_MODULUS_BITS // 8, "big"), h, min_bits=2048)
    assert key.n == n
    with pytest.raises(ProtocolError, match=r"^Paillier key refused: larger than 8192 bits$"):
        check_public_key(b"\0\0" + n.to_bytes(MAX_MODULUS_BITS // 8, "big"), h, min_bits=2048)
    # h may take twice n's bytes and one more (leading zeros included), not a byte beyond
    n_bytes = b"\0" + n.to_bytes(MAX_MODULUS_BITS // 8, "big")
    assert check_public_key(n_bytes, (2).to_bytes(2 * len(n_bytes) + 1, "big"), min_bits=2048).h == 2
    with pytest.raises(ProtocolError, match=r"^Paillier key refused: larger than 8192 bits$"):
        check_public_key(n_bytes, (2).to_bytes(2 * len(n_bytes) + 2, "big"), min_bits=2048)
    wider = n * 4 + 1  # MAX_MODULUS_BITS + 2 bits, in MAX_MODULUS_BITS / 8 + 1 bytes
    with pytest.raises(ProtocolError, match=r"^Paillier modulus of 8194 bits refused \(maximum 8192\)$"):
        check_public_key(wider.to_bytes(MAX_MODULUS_BITS // 8 + 1, "big"), h, min_bits=2048)


def test_the_received_bytes_cap_counts_the_whole_session_and_a_failed_gate_says_why():
    """The cap on what a peer may send counts every message of the session: messages each
    well under it are refused once their sum passes it (and a sum exactly at it is
    not); a gate that failed refuses the next message naming the error's kind."""
    from common.errors import ProtocolError
    from common.protocol.session import PhaseError
    from common.protocol.validation import ClientInbound
    from proto import ppre_pb2 as pb
    beat = pb.PeerMessage(heartbeat=pb.Heartbeat(phase="aggregation", done=1, total=2))
    size = beat.ByteSize()
    gate = ClientInbound(max_received_bytes=3 * size)
    for _ in range(3):
        assert gate._admit("wait_tester_rows", beat) == "heartbeat"
    with pytest.raises(ProtocolError, match=rf"^the Tester sent more than {3 * size} bytes in one session$"):
        gate._admit("wait_tester_rows", beat)
    failed = ClientInbound()
    failed.fail(ProtocolError("x"))
    with pytest.raises(PhaseError, match=r"^the session has already failed \(ProtocolError\): no further message "
                                         r"from the Tester is accepted$"):
        failed._admit("wait_tester_rows", beat)


# ---------------------------------------------------------------- the Hello
def test_hello_refusals_and_stated_facts_say_what_is_wrong_in_their_own_words():
    """The Test-Client's Hello checks and the stated-facts rule, whole: an unknown protocol
    version, a short salt share, labels that are too many or empty; facts missing or not
    asked for, each named and joined by ", "."""
    from types import SimpleNamespace
    from common.errors import ProtocolError
    from common.protocol import validation
    from common.protocol.validation import ClientInbound
    from proto import ppre_pb2 as pb
    with pytest.raises(ProtocolError, match=r"^protocol version 99 is not supported$"):
        ClientInbound()._hello(None, pb.Hello(protocol_version=99))
    with pytest.raises(ProtocolError, match=r"^salt share must be 32 bytes$"):
        ClientInbound()._hello(None, pb.Hello(protocol_version=validation.PROTOCOL_VERSION, salt_share=b"x"))
    with pytest.raises(ProtocolError, match=r"^too many, empty or too long strata labels$"):
        validation._labels(["a", ""], "strata labels", 4)
    assert validation._labels(["a", "b"], "strata labels", 2) == ("a", "b")
    metric = SimpleNamespace(stated_facts=("spread", "moments"))
    with pytest.raises(ProtocolError, match=r"^the Test-Client's dataset facts lack spread, moments, which the "
                                            r"interval under release noise reads$"):
        validation._check_stated_facts(metric, {}, True)
    with pytest.raises(ProtocolError, match=r"^the Test-Client stated spread, moments, which an audit whose "
                                            r"interval is not from second moments does not ask for$"):
        validation._check_stated_facts(metric, {"spread": 1, "moments": 2}, False)
    validation._check_stated_facts(metric, {"spread": 1, "moments": 2}, True)
    validation._check_stated_facts(metric, {}, False)


def _real_hello():
    """The Hello a Tester sends for an ERO audit under the defaults."""
    from tester_service.protocol import AuditSpec, TesterSession
    from tests.helpers import TEST_BITS, make_inputs
    tester, _ = make_inputs(40, 1, 0)
    session = TesterSession(AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1), tester,
                            min_modulus_bits=TEST_BITS, n_buckets=8)
    try:
        [message] = session.start()
    finally:
        session.close()
    return message.hello


HELLO_EDGES = [  # (field, accepted at the edge, refused beyond it, the refusal)
    ("probability_bits", [8, 48], [7, 49], "probability scale out of range"),
    ("result_recipient", ["client", "tester"], ["", "both", "Client"], "unknown result recipient"),
    ("sealed_width", ["sealed_width(1)", "sealed_width(MAX_GROUPS)"],
     ["sealed_width(0)", "sealed_width(MAX_GROUPS) + 8", "sealed_width(1) + 1", "sealed_width(1) - 1"],
     "sealed row width out of range"),
    ("buckets", [1, "MAX_BUCKETS"], [0, "MAX_BUCKETS + 1"], "bucket count out of range"),
    ("client_dataset", ["'x' * MAX_NAME_CHARS"], ["'x' * (MAX_NAME_CHARS + 1)"], "dataset name too long"),
    ("audit_id", ["'a' * 64", "'A-z_0'"], ["'a' * 65", "'a b'", "'é'"],
     "the audit id must be 1-64 URL-safe characters (A-Z, a-z, 0-9, '_', '-')"),
]


@pytest.mark.parametrize("field,accepted,refused,words", HELLO_EDGES, ids=[e[0] for e in HELLO_EDGES])
def test_each_hello_check_at_its_edges(field, accepted, refused, words):
    """Each of the Test-Client's checks of the Hello's sizes and names, at its edges: the
    edge itself passes that check (the Hello goes on, or fails a later check in other
    words), one step beyond is refused in the check's own words."""
    from common.crypto.symmetric import sealed_width
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_BUCKETS, MAX_GROUPS, MAX_NAME_CHARS, ClientInbound
    names = {"sealed_width": sealed_width, "MAX_GROUPS": MAX_GROUPS, "MAX_BUCKETS": MAX_BUCKETS,
             "MAX_NAME_CHARS": MAX_NAME_CHARS}
    hello = _real_hello()

    def check(value):
        h = type(hello)()
        h.CopyFrom(hello)
        literal = field == "result_recipient" or not isinstance(value, str)
        setattr(h, field, value if literal else eval(value, names))  # an expression of the limits above
        return ClientInbound()._hello(None, h)
    for value in accepted:
        try:
            check(value)
        except ProtocolError as exc:
            assert str(exc) != words, (field, value)
    for value in refused:
        with pytest.raises(ProtocolError) as info:
            check(value)
        assert str(info.value) == words, (field, value, str(info.value))


def test_the_hellos_metric_parameters_are_capped_in_number_and_length():
    """At most MAX_PARAMS parameters and MAX_PARAM_CHARS characters of names and values
    together: one more of either is refused in these words; at the caps the check passes
    (the metric then refuses parameters it does not know, in its own words)."""
    from common.errors import ProtocolError
    from common.protocol.validation import MAX_PARAM_CHARS, MAX_PARAMS, ClientInbound
    words = "too many or too long metric parameters"
    hello = _real_hello()

    def check(params):
        h = type(hello)()
        h.CopyFrom(hello)
        h.metric_params.clear()
        h.metric_params.update(params)
        return ClientInbound()._hello(None, h)
    many = {f"p{i:02d}": "1" for i in range(MAX_PARAMS)}
    long_value = {"p": "x" * (MAX_PARAM_CHARS - 1)}
    for params in (many, long_value):
        with pytest.raises(ProtocolError) as info:
            check(params)
        assert str(info.value) != words
    for params in ({**many, "q": "1"}, {"p": "x" * MAX_PARAM_CHARS}):
        with pytest.raises(ProtocolError) as info:
            check(params)
        assert str(info.value) == words


def test_the_hellos_audit_request_is_checked_against_the_metric_in_its_own_words():
    """What the Hello asks for, against the metric the Test-Client knows: the metric, its
    option (the first when none is named), its parameters, a correction it has, second
    moments it can release; the parsed choice carries the release's flags and the
    metric as the release makes it (`Metric.for_release`)."""
    from common.errors import ProtocolError
    from common.metrics.base import RELEASE_NOISE, SECOND_MOMENTS
    from common.metrics.mqos_auc import BINNED, EXACT
    from common.protocol.validation import ClientInbound
    hello = _real_hello()

    def check(**fields):
        h = type(hello)()
        h.CopyFrom(hello)
        for name, value in fields.items():
            if name == "metric_params":
                h.metric_params.clear()
                h.metric_params.update(value)
            else:
                setattr(h, name, value)
        return ClientInbound()._hello(None, h)

    def refused(words, **fields):
        with pytest.raises(ProtocolError) as info:
            check(**fields)
        assert str(info.value) == words, str(info.value)
    refused("the Tester asked for a metric this Test-Client does not know", metric="auc")
    refused("the Tester asked for 'gini', which is not an option of ero", metric_option="gini")
    refused("the Tester's metric parameters are refused: parameter 'metric parameter': 'x' is not a parameter of "
            "ero (known: decision_threshold)", metric_params={"x": "1"})
    refused("the Tester asked for a correction 'bayes' that ero lacks", correction="bayes")
    refused("the Tester asked for a correction 'calibration' that lot lacks", metric="lot", metric_option="idcg",
            correction="calibration")
    refused("the Tester asked for second moments, which prob-count lacks", metric="prob-count", metric_option="",
            second_moments=True)
    choice = check(correction="calibration")
    assert choice.option == "fpr" and choice.params.get(SECOND_MOMENTS) is True and RELEASE_NOISE not in choice.params
    assert check(correction="", second_moments=False).params.get(SECOND_MOMENTS) is None
    count = check(metric="prob-count", metric_option="", second_moments=False, correction="none")
    assert count.option == "default" and count.params.get(RELEASE_NOISE) is True
    assert check(metric="prob-count", metric_option="", second_moments=False, release_noise=False,
                 correction="none").params.get(RELEASE_NOISE) is None
    assert check(metric="mqos-auc", metric_option="", second_moments=True, correction="none").metric is BINNED
    assert check(metric="mqos-auc", metric_option="", second_moments=False, correction="none").metric is EXACT


# ---------------------------------------------------------------- the validators' tables, fed directly
def _reader_session(layout, **fields):
    """A stand-in for a session as the validators read it: its table reader and the facts
    named (the validators read only these)."""
    from types import SimpleNamespace
    from common.protocol import wire
    return SimpleNamespace(_reader=wire.TableReader(layout), **{"_blind": False, "_blind_plan": None, **fields})


def _ciphertext_chunk(table, key, rows):
    from common.crypto import paillier
    from proto import ppre_pb2 as pb
    cts = paillier.encrypt_chunk(key.n, key.h, list(range(rows)))
    return pb.TableChunk(table=table, rows=rows, ciphertexts=paillier.ciphertexts_to_bytes(cts, key.ciphertext_bytes))


def test_the_test_client_caps_square_requests_and_only_them(monkeypatch):
    """The Tester's square requests are capped at MAX_SQUARES (nothing announces their
    count); its own rows are not (up to the tables' cap): with the cap at 3, a fourth
    request is refused, and a table of four Tester rows is not."""
    from common.crypto import paillier
    from common.protocol import validation, wire
    from common.protocol.validation import ClientInbound
    from common.errors import ProtocolError
    from proto import ppre_pb2 as pb
    from tests.helpers import TEST_BITS
    from common.crypto.symmetric import sealed_width
    monkeypatch.setattr(validation, "MAX_SQUARES", 3)
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public
    s = _reader_session(wire.ciphertext_table(pb.SQUARE_REQUEST, pub.ciphertext_bytes), _paillier=key)
    assert len(ClientInbound()._chunk(s, _ciphertext_chunk(pb.SQUARE_REQUEST, pub, 3)).ciphertexts) == 3
    with pytest.raises(ProtocolError, match=r"^square requests exceed 3 rows$"):
        ClientInbound()._chunk(s, _ciphertext_chunk(pb.SQUARE_REQUEST, pub, 1))
    rows = _reader_session(wire.tester_rows(sealed_width(6)), _paillier=key)
    chunk = pb.TableChunk(table=pb.TESTER_ROWS, rows=4, points=b"\x09" * (32 * 4),
                          sealed=b"\0" * (sealed_width(6) * 4))
    assert ClientInbound()._chunk(rows, chunk).ciphertexts is None


def test_the_test_client_refuses_aggregates_beyond_the_header_as_they_arrive():
    """The AggregatesHeader announces its rows ((B + 1) x items plus the zero tests): a
    chunk that goes beyond them is refused as it arrives, in these words, not only at the
    table's end."""
    from common.crypto import paillier
    from common.errors import ProtocolError
    from common.protocol import wire
    from common.protocol.validation import ClientInbound
    from proto import ppre_pb2 as pb
    from tests.helpers import TEST_BITS
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public
    header = pb.AggregatesHeader(interval="percentile", replicates=1, items=2, zero_tests=1)  # 2 x 2 + 1 = 5
    s = _reader_session(wire.ciphertext_table(pb.AGGREGATES, pub.ciphertext_bytes), _paillier=key, _header=header)
    ClientInbound()._chunk(s, _ciphertext_chunk(pb.AGGREGATES, pub, 4))
    with pytest.raises(ProtocolError, match=r"^aggregates: more than the 5 rows announced$"):
        ClientInbound()._chunk(s, _ciphertext_chunk(pb.AGGREGATES, pub, 2))


def test_the_testers_row_checks_say_what_is_wrong_in_their_own_words():
    """The Tester's checks of the Test-Client's rows and of the shuffled table, whole: a
    shuffled chunk's points (checked on the executor, not in the gate: a repeat is
    refused when the table is indexed, `tests/test_protocol.py`), a bucket and a stratum
    out of range."""
    from types import SimpleNamespace
    from common.errors import ProtocolError
    from common.protocol import wire
    from common.protocol.validation import TesterInbound
    from proto import ppre_pb2 as pb
    from common.crypto.symmetric import sealed_width
    inbound = TesterInbound()
    inbound.sent_rows[pb.TESTER_ROWS] = 2
    width = sealed_width(6)
    shuffled = _reader_session(wire.shuffled_rows(width))
    base = (9).to_bytes(32, "little")  # Curve25519's base point
    twice = pb.TableChunk(table=pb.SHUFFLED_ROWS, rows=2, points=base * 2, sealed=b"\0" * (2 * width))
    inbound._chunk(shuffled, twice)  # its size only: the points are the executor's
    from common.crypto import commutative
    from tester_service.join import check_shuffled_chunk
    assert check_shuffled_chunk(base * 2, 0) is None
    small = max(commutative.SMALL_ORDER_U).to_bytes(32, "little")
    with pytest.raises(ProtocolError, match=r"^point 8 has small order$"):
        check_shuffled_chunk(base + small, 7)
    with pytest.raises(ProtocolError, match=r"^point 7 is not on Curve25519$"):
        check_shuffled_chunk((0).to_bytes(32, "little"), 7)
    metric = SimpleNamespace(resampling="unit", random_groups=0)
    layout = wire.client_rows(1, 0, 0, units=True, strata=True)

    def rows(unit, stratum):
        s = _reader_session(layout, metric=metric, _n_buckets=4, _strata_labels=("1-2", "2-3"), _client_rows=1)
        return s, pb.TableChunk(table=pb.CLIENT_ROWS, rows=1, points=b"\x09" * 32, units=wire.pack_indices([unit]),
                                strata=wire.pack_indices([stratum]))
    assert TesterInbound()._chunk(*rows(3, 1)).strata.tolist() == [1]
    with pytest.raises(ProtocolError, match=r"^a row's resampling bucket is out of range$"):
        TesterInbound()._chunk(*rows(4, 1))
    with pytest.raises(ProtocolError, match=r"^a row's stratum is out of range$"):
        TesterInbound()._chunk(*rows(3, 2))


# ---------------------------------------------------------------- the Test-Client's tables, tampered with
def _drive(spec, tester_df, client_df, *, to_tester=lambda replies: replies, to_client=lambda messages: messages):
    """Both sessions (no release controls) driven to the end, each batch of the Test-Client's
    messages passed through `to_tester` and of the Tester's through `to_client`: (the first
    refusal either raised or None, the Tester's result)."""
    from client_service.protocol import ClientSession
    from common.errors import ProtocolError
    from tester_service.protocol import TesterSession
    from tester_service.release import ReleasePolicy
    from tests.helpers import TEST_BITS
    client_df = client_df.assign(member_id=client_df["member_id"].astype(str))
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=ReleasePolicy.off())
    client = ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True)
    try:
        pending = list(tester.start())
        while pending:
            try:
                replies = to_tester([r for msg in to_client(list(pending)) for r in client.receive(msg)])
                pending = [out for r in replies for out in tester.receive(r)]
            except ProtocolError as exc:
                return exc, None
        return None, tester.result
    finally:
        tester.close()
        client.close()


def _tester_refusal(spec, tester_df, client_df, tamper):
    """The Tester's refusal of the Test-Client's messages passed through `tamper` (None if
    it accepted them all and finished with a result)."""
    refused, result = _drive(spec, tester_df, client_df, to_tester=tamper)
    if refused is None:
        assert result is not None
    return refused


def _auc_frame(tester_df, rng) -> pd.DataFrame:
    ids = list(tester_df.member_id)
    y = rng.integers(0, 2, len(ids))
    return pd.DataFrame({"member_id": ids, "y_true": y, "score": (rng.random(len(ids)) + 0.5 * y).round(3)})


def _auc_inputs(n: int, seed: int):
    tester_df, _ = make_inputs(n, n, n, seed=seed)
    return tester_df, _auc_frame(tester_df, np.random.default_rng(seed))


def test_a_chunk_past_the_announced_row_count_is_refused_on_arrival():
    """The Test-Client's rows one more than its HelloAck announced (chunk and end
    consistent): refused as the chunk arrives, not only at the table's end."""
    from proto import ppre_pb2 as pb
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    grown = []

    def grow(replies):
        for r in replies:
            kind = r.WhichOneof("body")
            if kind == "chunk" and r.chunk.table == pb.CLIENT_ROWS and not grown:
                rows = r.chunk.rows
                for column in ("points", "sealed", "ciphertexts", "units", "strata"):
                    data = getattr(r.chunk, column)
                    if data:
                        setattr(r.chunk, column, data + data[:len(data) // rows])
                r.chunk.rows = rows + 1
                grown.append(1)
            elif kind == "table_end" and r.table_end.table == pb.CLIENT_ROWS:
                r.table_end.rows += 1
        return replies
    tester_df, client_df = make_inputs(60, 60, 60, seed=43)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=3, seed=1)
    refusal = _tester_refusal(spec, tester_df, client_df, grow)
    assert grown and "more than the" in str(refusal), refusal


@pytest.mark.parametrize("metric, option", [("lot", ""), ("mqos-auc", "sampled")])
def test_a_rows_resampling_bucket_out_of_range_is_refused(metric, option):
    """Each of the Test-Client's rows names a resampling bucket below the Tester's
    bucket count (LOT's queries), or a random group 0..G of the metric's own (MQOS-AUC
    sampled): a value out of range is refused as the chunk arrives."""
    import numpy as np
    from common.metrics import get_metric
    from proto import ppre_pb2 as pb
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    from tests.metric_data import random_ranked_lists
    if metric == "lot":
        tester_df, _ = make_inputs(300, 300, 300, seed=45)
        client_df = random_ranked_lists(60, np.random.default_rng(45), min_len=3, max_len=5, n_members=60)
        bad = (1 << 32) - 1
    else:
        tester_df, client_df = _auc_inputs(120, 45)
        bad = get_metric(metric).for_option(option).random_groups + 1
    spec = AuditSpec(metric=metric, metric_option=option, client_dataset="d", bootstrap=3, seed=1)
    changed = []

    def out_of_range(replies):
        for r in replies:
            if r.WhichOneof("body") == "chunk" and r.chunk.table == pb.CLIENT_ROWS and not changed:
                assert r.chunk.units, "the rows carry their buckets"
                r.chunk.units = bad.to_bytes(4, "big") + r.chunk.units[4:]
                changed.append(1)
        return replies
    assert _tester_refusal(spec, tester_df, client_df, lambda replies: replies) is None  # untouched: accepted
    assert "out of range" in str(_tester_refusal(spec, tester_df, client_df, out_of_range))


def test_a_rows_stratum_out_of_range_is_refused():
    """LOT: each row's stratum (rank pair) indexes the strata labels the HelloAck
    announced; the first index past them is refused as the chunk arrives."""
    import numpy as np
    from proto import ppre_pb2 as pb
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    from tests.metric_data import random_ranked_lists
    tester_df, _ = make_inputs(300, 300, 300, seed=46)
    lists = random_ranked_lists(60, np.random.default_rng(46), min_len=3, max_len=5, n_members=60)
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=3, seed=1)
    labels = []

    def past_the_labels(replies):
        for r in replies:
            kind = r.WhichOneof("body")
            if kind == "hello_ack":
                labels.extend(r.hello_ack.strata_labels)
            elif kind == "chunk" and r.chunk.table == pb.CLIENT_ROWS and labels:
                r.chunk.strata = len(labels).to_bytes(4, "big") + r.chunk.strata[4:]
                labels.clear()
        return replies
    assert _tester_refusal(spec, tester_df, lists, lambda replies: replies) is None  # untouched: accepted
    assert "stratum is out of range" in str(_tester_refusal(spec, tester_df, lists, past_the_labels))


def _squares_refused(tamper):
    """An MQOS-AUC exact audit (the Test-Client returns the squares the Tester asked for)."""
    import numpy as np
    import pandas as pd
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    tester_df, _ = make_inputs(120, 120, 120, seed=42)
    rng = np.random.default_rng(42)
    y = rng.integers(0, 2, len(tester_df))
    client_df = pd.DataFrame({"member_id": list(tester_df.member_id), "y_true": y,
                              "score": (rng.random(len(y)) + 0.5 * y).round(3)})
    spec = AuditSpec(metric="mqos-auc", metric_option="exact", client_dataset="d", seed=1)
    return _tester_refusal(spec, tester_df, client_df, tamper)


def _resize_squares(delta: int):
    """Make the squares table `delta` rows longer (a copy of its first row) or shorter,
    its chunk and its end consistent with each other."""
    from proto import ppre_pb2 as pb
    done = []

    def tamper(replies):
        for r in replies:
            kind = r.WhichOneof("body")
            if kind == "chunk" and r.chunk.table == pb.SQUARES and not done:
                width = len(r.chunk.ciphertexts) // r.chunk.rows
                cts = r.chunk.ciphertexts
                r.chunk.ciphertexts = cts + cts[:width] if delta > 0 else cts[:-width]
                r.chunk.rows += delta
                done.append(1)
            elif kind == "table_end" and r.table_end.table == pb.SQUARES:
                r.table_end.rows += delta
        return replies
    return tamper


@pytest.mark.parametrize("delta", [1, -1])
def test_a_squares_table_of_another_length_than_requested_is_refused(delta):
    """MQOS-AUC exact: one square per request, no more and no fewer, though the chunk
    and the end agree with each other."""
    assert _squares_refused(lambda replies: replies) is None  # untouched: accepted
    assert re.search("announced", str(_squares_refused(_resize_squares(delta))))


def _masked_plaintexts_refused(tamper):
    """An ERO audit whose result goes to the Tester (masked plaintexts come back)."""
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    tester_df, client_df = make_inputs(60, 60, 60, seed=41)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=3, seed=1, result_recipient="tester")
    return _tester_refusal(spec, tester_df, client_df, tamper)


def _masked(replies):
    return [r for r in replies if r.WhichOneof("body") == "masked_plaintexts"]


def test_masked_plaintexts_wider_than_the_widest_plaintext_are_refused():
    """The same values, re-encoded one byte wider than MAX_PLAINTEXT_WIDTH (the count
    and every value unchanged), are refused on their width alone."""
    from common.protocol.validation import MAX_PLAINTEXT_WIDTH

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


def test_masked_plaintexts_in_several_chunks_are_accepted_and_give_the_same_result():
    """A table of masked plaintexts split into two non-empty chunks, the first not the
    last, is a normal transfer (a large result always is): accepted, with the same count
    checked at the end (the empty-chunk check refuses only an empty chunk)."""
    from proto import ppre_pb2 as pb

    def split(replies):
        out = []
        for r in replies:
            mp = r.masked_plaintexts
            if r.WhichOneof("body") != "masked_plaintexts" or len(mp.values) < 2 * mp.width:
                out.append(r)
                continue
            cut = len(mp.values) // mp.width // 2
            head, tail = pb.PeerMessage(), pb.PeerMessage()
            head.masked_plaintexts.width = tail.masked_plaintexts.width = mp.width
            head.masked_plaintexts.values = mp.values[:cut * mp.width]
            tail.masked_plaintexts.values = mp.values[cut * mp.width:]
            head.masked_plaintexts.last, tail.masked_plaintexts.last = False, mp.last
            tail.masked_plaintexts.phase_seconds.update(mp.phase_seconds)
            out += [head, tail]
        return out
    assert _masked_plaintexts_refused(split) is None


def test_masked_plaintexts_refusals_name_what_is_wrong():
    """The masked plaintexts' refusals in words: wider than the widest plaintext, and one
    more value than the items (the exact texts the operator reads)."""
    from common.protocol.validation import MAX_PLAINTEXT_WIDTH

    def widen(replies):
        for r in _masked(replies):
            r.masked_plaintexts.width = MAX_PLAINTEXT_WIDTH + 1
            r.masked_plaintexts.values = bytes(MAX_PLAINTEXT_WIDTH + 1)
        return replies

    def extra(replies):
        for r in _masked(replies):
            mp = r.masked_plaintexts
            mp.values = mp.values + bytes(mp.width)
        return replies
    assert str(_masked_plaintexts_refused(widen)) == "masked plaintext table is malformed"
    assert str(_masked_plaintexts_refused(extra)) == "too many masked plaintexts"


@pytest.mark.parametrize("text, shown", [("out of disk space", "out of disk space"),
                                         ("", "the Test-Client aborted")])
def test_the_test_clients_abort_reaches_the_tester_with_its_text(text, shown):
    """The Test-Client's Abort ends the Tester's session with the Test-Client's own words
    (or, without any, says who aborted), and its code."""
    from common.errors import PeerAborted
    from proto import ppre_pb2 as pb

    def abort(replies):
        if not replies:
            return replies
        msg = pb.PeerMessage()
        msg.abort.code, msg.abort.message = "input_error", text
        return [msg]
    refused = _masked_plaintexts_refused(abort)
    assert isinstance(refused, PeerAborted) and (refused.code, str(refused)) == ("input_error", shown)


# ---------------------------------------------------------------- ciphertexts that are not units, short tables
def _tester_refuses(tester, client, tamper) -> ProtocolError:
    """Drive both sessions, `tamper`ing with each batch of the Test-Client's messages;
    the refusal the Tester raises (the Test-Client raising fails the test: the Tester
    must refuse first, on arrival)."""
    pending = list(tester.start())
    while pending:
        replies = [r for msg in pending for r in client.receive(msg)]
        tamper(replies)
        try:
            pending = [out for r in replies for out in tester.receive(r)]
        except ProtocolError as exc:
            return exc
    pytest.fail("the Tester accepted the tampered table")


def _non_unit(key, salt: int) -> int:
    """A ciphertext in range but sharing the factor p with n (gcd(c, n) = p)."""
    pub = key.public
    return key.p * (salt % (pub.n2 // key.p - 2) + 2) % pub.n2


@pytest.mark.usefixtures("fast_crypto")
def test_a_test_clients_row_ciphertext_that_is_not_a_unit_is_refused(client_key):
    """A Test-Client that sends a multiple of a factor of n would learn membership from
    non-unit aggregates through any amount of noise: its rows are refused."""
    tester_df, client_df = make_inputs(60, 60, 60, seed=37)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=1)
    tester, client = session_pair(spec, tester_df, client_df, ReleasePolicy.off())
    width = client_key.public.ciphertext_bytes
    def tamper(replies):
        for r in replies:
            if r.WhichOneof("body") == "chunk" and r.chunk.table == pb.CLIENT_ROWS:
                cts = bytearray(r.chunk.ciphertexts)
                cts[:width] = _non_unit(client_key, 7).to_bytes(width, "big")
                r.chunk.ciphertexts = bytes(cts)
    try:
        assert "ciphertext 0 is" in str(_tester_refuses(tester, client, tamper))
    finally:
        tester.close()
        client.close()


@pytest.mark.usefixtures("fast_crypto")
def test_a_square_that_is_not_a_unit_is_refused(client_key):
    """MQOS-AUC exact: the squares the Test-Client returns are ciphertexts the Tester
    reads too; a non-unit among them is refused."""
    tester_df, _ = make_inputs(200, 200, 200, seed=38)
    client_df = _auc_frame(tester_df, np.random.default_rng(38))
    spec = AuditSpec(metric="mqos-auc", metric_option="exact", client_dataset="d", seed=1)
    tester, client = session_pair(spec, tester_df, client_df, ReleasePolicy.off())
    width = client_key.public.ciphertext_bytes
    tampered = []
    def tamper(replies):
        for r in replies:
            if r.WhichOneof("body") == "chunk" and r.chunk.table == pb.SQUARES:
                cts = bytearray(r.chunk.ciphertexts)
                cts[-width:] = _non_unit(client_key, 11).to_bytes(width, "big")
                r.chunk.ciphertexts = bytes(cts)
                tampered.append(1)
    try:
        assert re.search("ciphertext [0-9]+ is", str(_tester_refuses(tester, client, tamper)))
        assert tampered
    finally:
        tester.close()
        client.close()


def _drop_last_row(chunk: pb.TableChunk) -> None:
    rows = chunk.rows
    for column in ("points", "sealed", "ciphertexts", "units", "strata"):
        data = getattr(chunk, column)
        if data:
            setattr(chunk, column, data[:len(data) - len(data) // rows])
    chunk.rows = rows - 1


@pytest.mark.usefixtures("fast_crypto")
@pytest.mark.parametrize("table", [pb.SHUFFLED_ROWS, pb.CLIENT_ROWS])
def test_a_table_that_ends_with_fewer_rows_than_announced_is_refused(table):
    """The Test-Client's table is one row short and its end says so consistently: the
    Tester refuses it (it announced, or was sent, one row more)."""
    tester_df, client_df = make_inputs(40, 40, 40, seed=39)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=1)
    tester, client = session_pair(spec, tester_df, client_df, ReleasePolicy.off())
    cut = []
    def tamper(replies):
        for r in replies:
            kind = r.WhichOneof("body")
            if kind == "chunk" and r.chunk.table == table and not cut:
                _drop_last_row(r.chunk)
                cut.append(1)
            elif kind == "table_end" and r.table_end.table == table:
                r.table_end.rows -= 1
    try:
        assert "announced" in str(_tester_refuses(tester, client, tamper))
        assert cut
    finally:
        tester.close()
        client.close()


# ---------------------------------------------------------------- the Tester's messages: the Test-Client's checks
def test_an_aggregates_table_shorter_than_announced_is_refused_by_the_test_client():
    """The Tester's aggregates one row short of the AggregatesHeader's (B + 1) x items +
    zero tests, its last chunk and its end consistent with each other: the Test-Client
    refuses it at the table's end."""
    from client_service.protocol import ClientSession
    from common.errors import ProtocolError
    from proto import ppre_pb2 as pb
    from tester_service.protocol import AuditSpec, TesterSession
    from tester_service.release import ReleasePolicy
    from tests.helpers import TEST_BITS, make_inputs
    tester_df, client_df = make_inputs(60, 60, 60, seed=47)
    client_df = client_df.assign(member_id=client_df["member_id"].astype(str))
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=3, seed=1)
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=ReleasePolicy.off())
    client = ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True)

    def one_row_short(messages):
        chunks = [m for m in messages if m.WhichOneof("body") == "chunk" and m.chunk.table == pb.AGGREGATES]
        for m in messages:
            if chunks and m is chunks[-1]:
                width = len(m.chunk.ciphertexts) // m.chunk.rows
                m.chunk.ciphertexts = m.chunk.ciphertexts[:-width]
                m.chunk.rows -= 1
            elif m.WhichOneof("body") == "table_end" and m.table_end.table == pb.AGGREGATES:
                m.table_end.rows -= 1
        return messages
    try:
        pending = list(tester.start())
        with pytest.raises(ProtocolError, match="announced"):
            while pending:
                replies = [r for msg in one_row_short(list(pending)) for r in client.receive(msg)]
                pending = [out for r in replies for out in tester.receive(r)]
    finally:
        tester.close()
        client.close()


def _client_refusal(tamper, metric: str = "ero", option: str = "", correction: str = "none",
                    recipient: str = "client"):
    """An audit without release controls (ERO, or MQOS-AUC with `option`) with the
    Tester's messages passed through `tamper` before the Test-Client reads them: the
    Test-Client's refusal (None if it accepted them all)."""
    from tester_service.protocol import AuditSpec
    from tests.helpers import make_inputs
    tester_df, client_df = make_inputs(60, 60, 60, seed=53) if metric == "ero" else _auc_inputs(60, 53)
    spec = AuditSpec(metric=metric, client_dataset="d", bootstrap=3, seed=1, metric_option=option,
                     correction=correction, result_recipient=recipient)
    return _drive(spec, tester_df, client_df, to_client=tamper)[0]


@functools.lru_cache(maxsize=None)
def _untouched_refusal(metric: str = "ero", option: str = "", correction: str = "none",
                       recipient: str = "client"):
    """`_client_refusal` of the Tester's messages as they are (each setting's audit run once)."""
    return _client_refusal(lambda messages: messages, metric, option, correction, recipient)


def _header(edit):
    def tamper(messages):
        for m in messages:
            if m.WhichOneof("body") == "aggregates_header":
                edit(m.aggregates_header)
        return messages
    return tamper


@pytest.mark.parametrize("groups, small, text", [
    (["white", "white", "black", "api", "aian", "multiple"], (), "aggregates header: bad group list"),
    ([], (), "aggregates header: bad group list"),
    (None, ("martian",), "aggregates header: small groups are not among the groups"),
])
def test_the_test_client_refuses_a_header_with_a_bad_group_list(groups, small, text):
    """The AggregatesHeader's groups must be distinct and non-empty, and its small groups
    among them: each refusal in its words, each condition refused on its own."""
    assert _untouched_refusal() is None  # untouched: accepted

    def edit(header):
        given = list(header.groups) if groups is None else groups
        del header.groups[:], header.small_groups[:]
        header.groups.extend(given)
        header.small_groups.extend(small)
    refused = _client_refusal(_header(edit))
    assert refused is not None and str(refused) == text


@pytest.mark.parametrize("field, value", [("confidence", 0.0), ("confidence", 1.0), ("confidence", 1.5),
                                          ("tau", 0.0), ("tau", -0.05), ("replicates", 0)])
def test_the_test_client_refuses_a_header_with_bad_bootstrap_parameters(field, value):
    """Confidence strictly inside (0, 1), τ above 0 and at least one replicate, each edge
    refused in its words."""
    def edit(header):
        setattr(header, field, value)
    refused = _client_refusal(_header(edit))
    assert refused is not None and str(refused) == "aggregates header: bad bootstrap parameters"


def test_the_test_client_refuses_an_unknown_interval_or_too_many_random_groups():
    """An interval method it does not know, or more random groups than MAX_RANDOM_GROUPS,
    is refused in its words; exactly MAX_RANDOM_GROUPS passes that check (the table is then
    refused for holding fewer rows than the edited header announces)."""
    from common.protocol.validation import MAX_RANDOM_GROUPS
    interval = "aggregates header: unknown interval method or too many random groups"

    def edit(method, replicates):
        def apply(header):
            header.interval, header.replicates = method, replicates
        return _header(apply)
    assert str(_client_refusal(edit("magic", 3))) == interval
    assert str(_client_refusal(edit("random_groups", MAX_RANDOM_GROUPS + 1))) == interval
    assert "rows received" in str(_client_refusal(edit("random_groups", MAX_RANDOM_GROUPS)))


@pytest.mark.parametrize("metric, option, text", [
    ("ero", "", "aggregates header: second moments the Hello did not ask for (no squares, no stated facts)"),
    ("mqos-auc", "sampled", "aggregates header: mqos-auc has no second moments to release"),
])
def test_the_test_client_refuses_a_parametric_header_it_did_not_ask_for(metric, option, text):
    """A header that says "parametric" (second moments) where the Hello asked for none
    (ERO without release noise), or for a metric whose interval never comes from them
    (MQOS-AUC sampled), is refused in the words of its own check, not caught by the
    other instead."""
    def edit(header):
        header.interval = "parametric"
    assert _untouched_refusal(metric, option) is None
    assert str(_client_refusal(_header(edit), metric, option)) == text


@pytest.mark.parametrize("unidentifiable, correction", [
    (["white"], "none"),                     # named although no correction was asked for
    (["martian"], "calibration"),            # not among the groups
    (["black", "black"], "calibration"),     # named twice
])
def test_the_test_client_refuses_unidentifiable_groups_that_cannot_be(unidentifiable, correction):
    """The header's unidentifiable groups must be among its groups, each named once, and
    only where the Hello asked for the correction: each of the three conditions refused
    on its own."""
    def edit(header):
        del header.unidentifiable[:]
        header.unidentifiable.extend(unidentifiable)
    assert _untouched_refusal(correction=correction) is None
    assert str(_client_refusal(_header(edit), correction=correction)) == \
        "aggregates header: the unidentifiable groups are not among the groups"


@pytest.mark.parametrize("change", ["items", "item_slots", "suppressed out of range", "suppressed twice"])
def test_the_test_client_refuses_a_header_whose_cells_are_not_the_plans(change):
    """The header's item count and slots per item must be the plan's, and its suppressed
    items distinct indices among them: each of the four conditions refused on its own."""
    def edit(header):
        if change == "items":
            header.items += 1
        elif change == "item_slots":
            header.item_slots += 1
        elif change == "suppressed out of range":
            header.suppressed_items.append(header.items)
        else:
            header.suppressed_items.extend([0, 0])
    assert str(_client_refusal(_header(edit))) == "aggregates header: the cells do not match the metric's plan"


@pytest.mark.parametrize("field", ["plain_rows", "zero_tests"])
def test_the_test_client_refuses_plain_rows_or_zero_tests_under_the_additive_mask(field):
    """Where only the Tester learns the result (the additive mask) the header may announce
    no plain rows and no zero tests, whatever the interval."""
    def edit(header):
        setattr(header, field, 1 if field == "plain_rows" else header.items)
    assert _untouched_refusal(recipient="tester") is None
    assert str(_client_refusal(_header(edit), recipient="tester")) == "aggregates header: malformed release fields"
