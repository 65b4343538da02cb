"""Privacy steps whose absence would leave every audit result unchanged.

Each test here fails when one privacy step of design §3, §4 and §7 is left
out, although the audit's numbers stay correct without it: full-length one-time pads,
a jointly chosen random-oracle salt, P2's shuffle, P2's own rows in random order, P1
dropping its plaintext table, M draws per bootstrap replicate, rerandomised replicates,
sampled AUC pairs in random order, masked MQOS-AUC squaring requests.
"""
from __future__ import annotations

import gc
import secrets
import types

import numpy as np
import pytest

from client_service.protocol import ClientSession
from common.stats import bootstrap as boot
from common.crypto import commutative, encoding, paillier
from tester_service import aggregation
from common.errors import ProtocolError
from common.crypto.masking import PRECISION_BITS, R_MAX_BITS, R_MIN_BITS, STATISTICAL_BITS, AdditiveMask, RatioMask
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession
from tests.helpers import TEST_BITS, apply_ratio_mask, exact_session, local_audit, make_inputs, run_sessions


def _client(client_df) -> ClientSession:
    return ClientSession(lambda name, metric: client_df, modulus_bits=TEST_BITS, allow_insecure=True)


def _chunks(messages, table):
    return [m.chunk for m in messages if m.HasField("chunk") and m.chunk.table == table]


# ---------------------------------------------------------------- one-time pads (design §3.7)
def test_additive_pads_carry_the_statistical_bits():
    """Only-P1 variant (design §3.7): a pad must be `STATISTICAL_BITS` longer than the values
    it hides, or the padded value P2 decrypts tells it the value's magnitude (a pad of
    the values' own length hides nothing about a value near the bound)."""
    bound_bits = 20
    pads = [p for _ in range(50) for p in AdditiveMask.draw(20, bound_bits).pads]
    assert all(0 <= p < 1 << (bound_bits + STATISTICAL_BITS) for p in pads)
    # uniform below 2^(bound + 64): among 1000 pads the longest is within a few bits of
    # the maximum, and none is anywhere near as short as the value bound itself
    assert max(p.bit_length() for p in pads) >= bound_bits + STATISTICAL_BITS - 4
    assert min(p.bit_length() for p in pads) > bound_bits + STATISTICAL_BITS // 2
    assert AdditiveMask.max_bits(bound_bits) > bound_bits + STATISTICAL_BITS


def test_padded_values_seen_by_the_client_are_statistically_hidden():
    """What P2 decrypts in the only-P1 variant (design §3.7): every Num and Den slot is
    padded far beyond the largest value an aggregate can take, so P2's plaintexts say
    nothing about the aggregates (statistical distance 2^-64)."""
    tester, client = make_inputs(40, 40, 40, seed=4)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=8, seed=2, result_recipient="tester")
    seen: list[pb.PeerMessage] = []
    result, _, _ = local_audit(tester, client, spec=spec, tap=lambda direction, msg: seen.append(msg))
    assert result.n_matched == 40
    [header] = [m.aggregates_header for m in seen if m.HasField("aggregates_header")]
    layout = encoding.SlotLayout(header.slot_bits, 2)
    slots = []
    for m in seen:
        if m.HasField("masked_plaintexts"):
            mp = m.masked_plaintexts
            for i in range(0, len(mp.values), mp.width):
                slots += layout.unpack(int.from_bytes(mp.values[i:i + mp.width], "big", signed=True))
    assert len(slots) == 2 * (spec.bootstrap + 1) * len(result.groups)  # groups and overall
    # the largest true |Num| or |Den|: every replicate draws at most n rows (n <= M
    # buckets of one row each), each worth at most value_bound (1 for ERO) * 2^32
    value_bits = (2 * 40 * (1 << encoding.PROBABILITY_BITS)).bit_length()
    assert min(abs(v).bit_length() for v in slots) > value_bits + 24
    assert max(abs(v).bit_length() for v in slots) >= value_bits + STATISTICAL_BITS - 8


def test_ratio_mask_factors_are_log_uniform_and_full_entropy():
    """P2-learns variant (design §4.7): r has a log-uniform bit length in
    [R_MIN_BITS, R_MAX_BITS] with its top bit set and every lower bit random. A factor
    drawn from a small set (say powers of two) would let P2 try each r and strip the
    mask; one longer than R_MAX_BITS would break the slot plan (`max_bits`). The noise
    is uniform below r·2^PRECISION_BITS: as large as r, so the masked ratio's continued
    fraction does not contain Num/Den (tests/test_crypto_toolkit.py runs that attack)."""
    masks = [RatioMask.draw() for _ in range(3000)]
    lengths = np.array([m.r.bit_length() for m in masks])
    assert lengths.min() == R_MIN_BITS and lengths.max() == R_MAX_BITS
    assert set(lengths.tolist()) == set(range(R_MIN_BITS, R_MAX_BITS + 1))  # every length, ~61 times each
    assert all(m.r & 1 for m in masks)
    # below the top bit, each of the (at least 31) lower bits is set about half the time
    for below_top in range(1, R_MIN_BITS):
        freq = np.mean([(m.r >> (m.r.bit_length() - 1 - below_top)) & 1 for m in masks])
        assert 0.4 < freq < 0.6, (below_top, freq)
    for bit in range(1, R_MIN_BITS - 1):
        assert 0.4 < np.mean([(m.r >> bit) & 1 for m in masks]) < 0.6, bit
    relative = [e / m.r for m in masks for e in (m.e_num, m.e_den)]
    assert 0 <= min(relative) and max(relative) < 1 << PRECISION_BITS
    assert max(relative) > 0.99 * (1 << PRECISION_BITS)  # the noise spans its whole range
    assert 0.45 < np.mean(relative) / (1 << PRECISION_BITS) < 0.55  # uniformly


def test_ratio_mask_bound_covers_every_masked_value():
    """The slot plan (design §4.4): `RatioMask.max_bits(v)` bounds r*X + e for any X < 2^v, so
    the overflow check made before any HE work cannot be passed by a masked value."""
    for value_bits in (1, 40, 200):
        x = (1 << value_bits) - 1
        r = (1 << R_MAX_BITS) - 1
        worst = r * x + (r << PRECISION_BITS) - 1
        assert worst.bit_length() <= RatioMask.max_bits(value_bits)
        largest = max(apply_ratio_mask(RatioMask.draw(), x, x)[0] for _ in range(200))
        assert largest.bit_length() <= RatioMask.max_bits(value_bits)


# ---------------------------------------------------------------- the random-oracle salt (design §3.1)
def test_session_salt_depends_on_both_shares():
    """RO(id) = hash_to_curve(SHA-256(salt || id)) with a salt that neither party chooses
    alone (design §3.1): a Tester that could fix the salt could precompute RO over any list
    of ids and reuse it across sessions; so could a Test-Client."""
    t, c = secrets.token_bytes(32), secrets.token_bytes(32)
    salt = commutative.session_salt(t, c)
    assert len(salt) == 32
    assert commutative.session_salt(t, c) == salt  # both parties derive the same salt
    assert commutative.session_salt(t, secrets.token_bytes(32)) != salt
    assert commutative.session_salt(secrets.token_bytes(32), c) != salt
    assert commutative.session_salt(c, t) != salt  # the two roles are not interchangeable
    with pytest.raises(ProtocolError, match="32 bytes"):
        commutative.session_salt(t, c[:16])


def test_same_hello_gives_each_client_session_its_own_random_oracle():
    """Replaying one Hello (one Tester share) to two Test-Client sessions still gives two
    unrelated random oracles: the Client's share enters the salt (design §3.1)."""
    tester_df, client_df = make_inputs(10, 10, 10)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d"), tester_df, min_modulus_bits=TEST_BITS)
    [hello] = t.start()
    c1, c2 = _client(client_df), _client(client_df)
    [ack1], [ack2] = c1.receive(hello), c2.receive(hello)
    assert c1._salt != c2._salt
    assert c1._salt == commutative.session_salt(hello.hello.salt_share, ack1.hello_ack.salt_share)
    assert c2._salt == commutative.session_salt(hello.hello.salt_share, ack2.hello_ack.salt_share)
    assert commutative.hash_ids(c1._salt, ["m000001"]) != commutative.hash_ids(c2._salt, ["m000001"])


# ---------------------------------------------------------------- P2's shuffle (design §3.3)
def test_client_shuffles_the_doubly_encrypted_rows():
    """Step 3 (design §3.3): P2 returns P1's rows doubly encrypted and *shuffled*. Without the
    shuffle, P1 links each doubly encrypted id to the row it sent at the same position,
    so the join would tell P1 exactly which of its members P2 holds (and their outputs).
    The sealed blobs pass through P2 unchanged, so they reveal the permutation."""
    n = 300
    tester, client = make_inputs(n, 20, 20, seed=3)
    seen: list[pb.PeerMessage] = []
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=2, seed=1)
    local_audit(tester, client, spec=spec, tap=lambda direction, msg: seen.append(msg))
    width = len(_chunks(seen, pb.TESTER_ROWS)[0].sealed) // _chunks(seen, pb.TESTER_ROWS)[0].rows

    def blobs(table):
        packed = b"".join(c.sealed for c in _chunks(seen, table))
        return [packed[i:i + width] for i in range(0, len(packed), width)]

    sent, returned = blobs(pb.TESTER_ROWS), blobs(pb.SHUFFLED_ROWS)
    assert len(sent) == len(returned) == n and sorted(sent) == sorted(returned)
    position = {blob: i for i, blob in enumerate(sent)}
    perm = np.array([position[blob] for blob in returned])
    assert (perm == np.arange(n)).sum() < 10  # a uniform permutation has ~1 fixed point
    # nor a shift or a reversal: the order returned is uncorrelated with the order sent
    # (|Spearman rho| has standard deviation 1/sqrt(n-1) ~ 0.058 under a uniform shuffle)
    assert abs(np.corrcoef(perm, np.arange(n))[0, 1]) < 0.3
    steps = np.diff(perm) % n
    assert np.bincount(steps).max() < n // 10


# ---------------------------------------------------------------- P1 drops its table (design §3.2, §7)
def _reachable(root) -> list:
    """Every object reachable from `root` through attributes, containers and closures
    (modules, classes and function globals excluded)."""
    seen: set[int] = set()
    stack, out = [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, (type, types.ModuleType)):
            continue
        if isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # empty cell
                    pass
            continue
        if isinstance(obj, types.MethodType):
            stack += [obj.__self__, obj.__func__]
            continue
        if isinstance(obj, np.ndarray):
            if obj.base is not None:
                stack.append(obj.base)
            if obj.dtype == object:
                stack += obj.ravel().tolist()
            continue
        stack += gc.get_referents(obj)
    return out


def _plaintext_held(session, ids: list[str], probs: np.ndarray) -> list[str]:
    """Descriptions of every member id or probability value reachable from `session`."""
    id_set, id_bytes = set(ids), [m.encode() for m in ids]
    values = set(probs.ravel().tolist())
    found = []
    for obj in _reachable(session):
        if isinstance(obj, str) and obj in id_set:
            found.append(f"id string {obj!r}")
        elif isinstance(obj, (bytes, bytearray)) and any(m in obj for m in id_bytes):
            found.append("bytes holding an id")
        elif isinstance(obj, float) and obj in values:
            found.append("a probability value")
        elif isinstance(obj, np.ndarray) and obj.dtype.kind == "f" and (
                np.shares_memory(obj, probs) or np.isin(obj, probs).any()):
            found.append(f"a probability array {obj.shape}")
    return found


def test_tester_drops_its_plaintext_table_as_soon_as_it_is_sent():
    """Step 2 (design §3.2, §7): once P1 has sent its encrypted rows it no longer holds any
    member id or probability in the clear; checked right after the HelloAck is
    processed, long before `close()`, over everything reachable from the session."""
    tester_df, client_df = make_inputs(40, 40, 30, seed=7)
    ids = tester_df.member_id.astype(str).tolist()
    probs = tester_df.drop(columns="member_id").to_numpy(np.float64)
    t = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=3), tester_df,
                      min_modulus_bits=TEST_BITS)
    c = _client(client_df)
    assert _plaintext_held(t, ids, probs)  # the search does find the table while it is held
    [hello] = t.start()
    [ack] = c.receive(hello)
    sent = list(t.receive(ack))
    assert _chunks(sent, pb.TESTER_ROWS)
    assert t._ids is None and t._probabilities is None
    assert _plaintext_held(t, ids, probs) == []
    t.close()
    c.close()


# ---------------------------------------------------------------- bootstrap draws (design §4.8)
def test_each_replicate_draws_exactly_m_buckets():
    """Random-bucket bootstrap (design §4.8): each replicate draws M buckets with replacement,
    like the row bootstrap draws n rows. Fewer draws shrink every replicate's Num and Den
    and understate the spread of the ratio."""
    rng = np.random.default_rng(0)
    for m in (1, 7, 128):
        counts = boot.resample_counts(m, 3000, rng)
        assert counts.shape == (3000, m)
        assert (counts.sum(axis=1) == m).all()
        assert (counts >= 0).all()
        assert np.abs(counts.mean(axis=0) - 1).max() < 0.15  # every bucket equally likely


# ---------------------------------------------------------------- rerandomisation (design §3.6)
@pytest.fixture(scope="module")
def key() -> paillier.PrivateKey:
    return paillier.generate_keypair(TEST_BITS, allow_insecure=True)


@pytest.mark.parametrize("variant", ["ratio", "additive"])
def test_replicates_are_rerandomised_before_they_leave_the_tester(key, variant):
    """Step 6 (design §3.6): every replicate ciphertext is rerandomised. Without it a
    replicate is a deterministic function of P2's own ciphertexts, the counts and the
    mask: P2, who knows the randomness of the ciphertexts it made, could test guesses of
    P1's weights and masks against it. The sent ciphertext must differ from that
    deterministic product while decrypting to the same plaintext."""
    pub = key.public
    n, n2 = pub.n, pub.n2
    cts = paillier.encrypt_chunk(n, pub.h, [3 + (5 << 200), 1 + (2 << 200), 7 << 200, 4])
    sums = aggregation.bucket_sums_chunk(n, [(cts[:2], [[2, 3], [1, 1]]), (cts[2:], [[4, 1], [0, 6]])])
    counts = [[1, 1], [2, 0], [2, 0], [0, 2]]
    if variant == "ratio":
        masks = [[(12345, 17 + (5 << 200)), (999, 3)] for _ in counts]  # identical masks
        pads = None
    else:
        masks = None
        pads = [[11 + (13 << 200), 0] for _ in counts]
    reps = aggregation.replicate_chunk(n, [[s[j] for s in sums] for j in range(2)], counts)
    out = aggregation.mask_chunk(n, pub.h, reps, [m for row in masks for m in row] if masks else None,
                                 [p for row in pads for p in row] if pads else None)
    deterministic = []
    for b, row in enumerate(counts):
        for j in range(2):
            x = paillier.multi_exp([s[j] for s in sums], row, n2)
            if masks:
                r, noise = masks[b][j]
                x = paillier.add_plain(n, paillier.scalar_pow(n, x, r), noise)
            else:
                x = paillier.add_plain(n, x, pads[b][j])
            deterministic.append(x)
    assert key.decrypt_mod_p(out) == key.decrypt_mod_p(deterministic)
    assert all(a != d for a, d in zip(out, deterministic))
    # replicates 1 and 2 have the same counts and masks: same plaintext, other ciphertext
    assert deterministic[2:4] == deterministic[4:6]
    assert out[2] != out[4] and out[3] != out[5]
    assert len(set(out)) == len(out)


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_identical_replicates_leave_the_tester_as_distinct_ciphertexts(monkeypatch, recipient):
    """The same property end to end (design §3.6): with one bucket every replicate has the
    same count, and with the mask pinned every replicate of a group encrypts the same
    plaintext; the ciphertexts on the wire must all differ all the same."""
    fixed_ratio = RatioMask.draw()
    fixed_pads = AdditiveMask((secrets.randbits(100), secrets.randbits(100)))
    monkeypatch.setattr(RatioMask, "draw", classmethod(lambda cls: fixed_ratio))
    monkeypatch.setattr(RatioMask, "noise", staticmethod(lambda r: fixed_ratio.e_num))
    monkeypatch.setattr(AdditiveMask, "draw", classmethod(lambda cls, n_slots, bound_bits: fixed_pads))
    tester, client = make_inputs(30, 30, 25, seed=8)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=6, seed=4, result_recipient=recipient)
    seen: list[pb.PeerMessage] = []
    result, _, _ = local_audit(tester, client, spec=spec, n_buckets=1,
                               tap=lambda direction, msg: seen.append(msg))
    assert result.n_matched == 25
    chunks = _chunks(seen, pb.AGGREGATES)
    width = len(chunks[0].ciphertexts) // chunks[0].rows
    packed = b"".join(c.ciphertexts for c in chunks)
    cts = [packed[i:i + width] for i in range(0, len(packed), width)]
    k = len(result.groups)
    zero_tests = k if recipient == "client" else 0  # the estimate's items, Enc(rho * X) each
    assert len(cts) == (spec.bootstrap + 1) * k + zero_tests
    cts = cts[:(spec.bootstrap + 1) * k]
    for j in range(k):
        column = cts[j::k]
        assert len(set(column)) == len(column), f"group {j}: replicates share a ciphertext"
    # and the pinned masks did give identical replicates: a zero-width interval
    for g in result.groups:
        if g.estimate is not None:
            assert g.ci_low == pytest.approx(g.ci_high, abs=1e-9)


def test_a_weak_randomizer_base_from_the_test_client_does_not_switch_rerandomisation_off(monkeypatch):
    """A Test-Client that announces h = n^2 - 1 (order 2: h^alpha takes two values) in its
    HelloAck: were the Tester to rerandomise with that h, replicates that encrypt the same
    plaintext would leave it as at most two distinct ciphertexts, so equal ones would be
    recognisable. The Tester rerandomises with a base of its own (design §3.6)."""
    fixed_ratio = RatioMask.draw()
    monkeypatch.setattr(RatioMask, "draw", classmethod(lambda cls: fixed_ratio))
    tester, client = make_inputs(30, 30, 25, seed=8)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=8, seed=4)
    session = exact_session(spec, tester, min_modulus_bits=TEST_BITS, n_buckets=1)
    peer = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True)
    original = peer.receive

    def weak_ack(msg):
        out = list(original(msg))
        for m in out:
            if m.WhichOneof("body") == "hello_ack":
                n = int.from_bytes(m.hello_ack.paillier_n, "big")
                m.hello_ack.paillier_h = (n * n - 1).to_bytes(len(m.hello_ack.paillier_h), "big")
        return out

    monkeypatch.setattr(peer, "receive", weak_ack)
    seen: list[pb.PeerMessage] = []
    try:
        run_sessions(session, peer, tap=lambda direction, msg: seen.append(msg))
    finally:
        session.close()
        peer.close()
    chunks = _chunks(seen, pb.AGGREGATES)
    width = len(chunks[0].ciphertexts) // chunks[0].rows
    packed = b"".join(c.ciphertexts for c in chunks)
    cts = [packed[i:i + width] for i in range(0, len(packed), width)]
    k = len(tester.columns) - 1
    for j in range(k):
        column = cts[j::k][1:]  # the replicates (one bucket: every count equal)
        assert len(set(column)) == len(column), f"group {j}: replicates share a ciphertext"


# ---------------------------------------------------------------- the metric catalog's steps
def test_client_sends_its_own_rows_in_random_order(monkeypatch):
    """Step 4: P2's own rows leave in a random order, never its file's (a file sorted by
    prediction or label would otherwise tell P1 which joined rows are which). The order in
    which P2 hashes its ids is the order of its rows on the wire."""
    from client_service import protocol as client_protocol
    calls: list[list[str]] = []
    real = client_protocol.commutative.hash_ids
    monkeypatch.setattr(client_protocol.commutative, "hash_ids",
                        lambda salt, ids: calls.append(list(ids)) or real(salt, ids))
    tester, client = make_inputs(200, 200, 150, seed=12)
    local_audit(tester, client, spec=AuditSpec(metric="ero", client_dataset="d", bootstrap=3, seed=1))
    # one hashing call each: P2 (as soon as the salt is known) and the Tester (step 2)
    seen = [c for c in calls if sorted(c) == sorted(client.member_id)]
    assert len(seen) == 1 and seen[0] != list(client.member_id)


def test_sampled_auc_pairs_hide_which_member_is_the_positive():
    """MQOS-AUC sampled (B.2.2): each pair's two members are in random order, so P1 (which
    sees the pair's ids in order) cannot tell the positive: the first member is the
    positive in about half of the pairs, not always."""
    import pandas as pd
    from common.metrics import get_metric
    rng = np.random.default_rng(5)
    n = 400
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "y_true": rng.integers(0, 2, n),
                          "score": rng.random(n)})
    metric = get_metric("mqos-auc").for_option("sampled")
    rows = metric.client_rows(frame, "d.csv", "sampled", metric.parse_params({"pairs": "20000"}), rng)
    positive = dict(zip(frame.member_id, frame.y_true))
    real = rows.values[:, 1] == 1  # the positive-negative pairs among the rows
    first_is_positive = np.mean([positive[i] for i in rows.ids[0][real]])
    assert abs(first_is_positive - 0.5) < 4 * 0.5 / np.sqrt(real.sum()), first_is_positive


def test_auc_square_requests_are_masked_beyond_the_sums(monkeypatch):
    """MQOS-AUC exact: P2 squares what P1 sends, so P1 sends Enc(T + r) with r 64 bits
    wider than any T: what P2 decrypts is statistically independent of T. Without the
    mask P2 would read each group's weighted count of positives."""
    import pandas as pd
    from client_service import protocol as client_protocol
    decrypted: list[int] = []
    real = client_protocol.paillier.ModPDecryption.__call__

    def spy(self, cts):
        out = real(self, cts)
        decrypted.extend(out)
        return out
    tester, _ = make_inputs(300, 10, 0, seed=13)
    rng = np.random.default_rng(13)
    client = pd.DataFrame({"member_id": tester.member_id[:250], "y_true": rng.integers(0, 2, 250),
                           "score": rng.random(250).round(2)})
    t_session = exact_session(AuditSpec(metric="mqos-auc", client_dataset="d", bootstrap=5), tester,
                              min_modulus_bits=TEST_BITS)
    c_session = _client(client)

    def tap(direction, msg):
        if msg.HasField("table_end") and msg.table_end.table == pb.SQUARE_REQUEST:
            monkeypatch.setattr(client_protocol.paillier.ModPDecryption, "__call__", spy)
        if msg.HasField("table_end") and msg.table_end.table == pb.SQUARES:
            monkeypatch.setattr(client_protocol.paillier.ModPDecryption, "__call__", real)
    run_sessions(t_session, c_session, tap=tap)
    largest_sum = 250 << encoding.PROBABILITY_BITS  # no T exceeds n * 2^32
    assert decrypted and min(decrypted) > largest_sum << 32
