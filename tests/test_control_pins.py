"""Tests that pin each control (design §8, §4.7, §7): every one fails when the control it
names is weakened (each was checked against a hand-made mutant of the production code).

Controls pinned here: the noise on the interval's random groups, suppression decided on
the noised size, the budget charged before anything leaves (and never overspent by
concurrent audits), the minimum intersection in distinct members, a mask noise per slot,
ciphertexts that are not units refused on every path the Tester reads them, exact
allow-lists, an audit-log link over every field, a table shorter than announced refused,
small-order points refused (enumerated here from the curve, not from the module), groups
suppressed by the controls left out of the correction's solve, and the verdict's
simultaneous band.
"""
from __future__ import annotations

import dataclasses
import math
import re
import threading
import time

import numpy as np
import pandas as pd
import pytest

from client_service.protocol import ClientSession
from common.protocol import validation
from common.crypto import encoding, paillier
from common.errors import ProtocolError
from common.races import RACES
from proto import ppre_pb2 as pb
from tester_service import protocol as tester_protocol
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import BudgetExhausted, IntersectionRefused, PrivacyAccountant, ReleasePolicy
from tests.helpers import TEST_BITS, make_inputs, run_sessions
from tests.curve25519 import small_order_u  # noqa: F401  tests/test_crypto_backends.py imports it from here
from tests.metric_data import random_ranked_lists

GROUPS = list(RACES)
#: noise on, every audit allowed, no intersection or size control in the way
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0, rho=1.0, budget=math.inf, max_refusals=None)


@pytest.fixture(scope="module")
def client_key():
    return paillier.generate_keypair(TEST_BITS, allow_insecure=True)


@pytest.fixture(autouse=True)
def fast_crypto(monkeypatch, client_key):
    """One cached key pair for the Test-Client (so a test can decrypt what it receives),
    inline chunks."""
    monkeypatch.setenv("PPRE_WORKERS", "1")
    monkeypatch.setattr("client_service.protocol.paillier.generate_keypair", lambda *a, **kw: client_key)


def _loader(frame: pd.DataFrame):
    def load(name, metric):
        out = frame.copy()
        out["member_id"] = out["member_id"].astype(str)
        return out
    return load


def _sessions(spec: AuditSpec, tester_df, client_df, release: ReleasePolicy, *, charge=None):
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS, release=release, charge=charge)
    client = ClientSession(_loader(client_df), modulus_bits=TEST_BITS, allow_insecure=True)
    return tester, client


def _run(spec, tester_df, client_df, release, *, charge=None, seen=None):
    """Both sessions to the end; `seen` collects (direction, message)."""
    tester, client = _sessions(spec, tester_df, client_df, release, charge=charge)
    tap = (lambda d, m: seen.append((d, m))) if seen is not None else None
    try:
        return run_sessions(tester, client, tap), tester, client
    finally:
        tester.close()
        client.close()


def _header(seen) -> pb.AggregatesHeader:
    return next(m.aggregates_header for d, m in seen if m.WhichOneof("body") == "aggregates_header")


def _decrypted_rows(seen, key) -> list[list[list[int]]]:
    """What the Test-Client decrypts: per released row, per item, its slots (signed)."""
    header = _header(seen)
    width = key.public.ciphertext_bytes
    packed = b"".join(m.chunk.ciphertexts for d, m in seen
                      if m.WhichOneof("body") == "chunk" and m.chunk.table == pb.AGGREGATES)
    cts = [int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)]
    cts = cts[:len(cts) - header.zero_tests]
    layout = encoding.SlotLayout(header.slot_bits, header.item_slots)
    values = [layout.unpack(v) for v in key.decrypt_task(signed=True)(cts)]
    return [values[r:r + header.items] for r in range(0, len(values), header.items)]


def _pot_frame(tester_df, rng) -> pd.DataFrame:
    ids = list(tester_df.member_id)
    return pd.DataFrame({"member_id": ids, "score": rng.random(len(ids)).round(3),
                         "outcome": rng.integers(0, 2, len(ids))})


def _auc_frame(tester_df, rng) -> pd.DataFrame:
    ids = list(tester_df.member_id)
    y = rng.integers(0, 2, len(ids))
    return pd.DataFrame({"member_id": ids, "y_true": y, "score": (rng.random(len(ids)) + 0.5 * y).round(3)})


# ---------------------------------------------------------------- noise on every released row
def _noisy_and_exact(monkeypatch, client_key, name: str, option: str):
    """One audit under noise and the same audit with the draws set to 0 (same seed, same
    groups, the same suppression): (header, rows decrypted under noise, rows without)."""
    tester_df, _ = make_inputs(200, 200, 200, seed=31)
    rng = np.random.default_rng(31)
    client_df = _pot_frame(tester_df, rng) if name == "pot" else _auc_frame(tester_df, rng)
    spec = AuditSpec(metric=name, metric_option=option, client_dataset="d", bootstrap=10, seed=4,
                     result_recipient="client")
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: 0.0)
    noisy_seen: list = []
    _run(spec, tester_df, client_df, NOISY, seen=noisy_seen)
    real_slots = tester_protocol.gaussian_slots
    exact_seen: list = []
    with monkeypatch.context() as m:
        m.setattr(tester_protocol, "gaussian_slots", lambda scales, bits: 0)
        _run(spec, tester_df, client_df, NOISY, seen=exact_seen)
    assert tester_protocol.gaussian_slots is real_slots
    return _header(noisy_seen), _decrypted_rows(noisy_seen, client_key), _decrypted_rows(exact_seen, client_key)


def test_auc_exact_releases_every_slot_with_its_own_noise(monkeypatch, client_key):
    """MQOS-AUC exact under noise releases one row: each cell's (V, D) at σ₀ and each pair
    of groups' (S1, S0) at σ_m, no random groups. Every slot the Test-Client decrypts
    differs from the noiseless audit's, the header's noise sd is σ₀ times the form's
    bounds (½ and 1 member) on the cells and σ_m times a pair weight's 2^32 on the pair
    items (whose S1 and S0, without noise, are sums of non-negative weights)."""
    from common.metrics.mqos_auc import normaliser_bits
    header, noisy, exact = _noisy_and_exact(monkeypatch, client_key, "mqos-auc", "exact")
    assert header.interval == "parametric" and header.plain_rows == 1 and len(noisy) == len(exact) == 1
    cells, n_pairs = len(GROUPS) + 1, len(GROUPS) * (len(GROUPS) + 1) // 2
    assert header.items == cells + n_pairs
    sigma0, sigma_m = NOISY.moment_sigmas(2, pair_components=1)
    sd = np.array(header.noise_sd).reshape(2, header.items, header.item_slots)
    unit = 2.0 ** (33 + normaliser_bits(200))
    assert sd[0, :cells, 0] == pytest.approx(sigma0 * unit / 2, rel=1e-6)
    assert sd[0, :cells, 1] == pytest.approx(sigma0 * unit, rel=1e-6)
    assert sd[0, cells:] == pytest.approx(sigma_m * 2.0 ** 32, rel=1e-12) and not sd[1].any()
    for i in range(header.items):
        if i in header.suppressed_items:
            continue
        for s in range(header.item_slots):
            assert noisy[0][i][s] != exact[0][i][s], (i, s)
    assert all(min(exact[0][cells + p]) >= 0 for p in range(n_pairs))


def test_every_random_group_row_carries_its_own_noise(monkeypatch, client_key):
    """Under noise MQOS-AUC sampled's interval comes from disjoint random groups, released
    next to the estimate. Every group row the Test-Client decrypts differs from the
    noiseless one (the same audit with the draws set to 0: same seed, same groups) in
    every slot the header says is noised."""
    header, noisy, exact = _noisy_and_exact(monkeypatch, client_key, "mqos-auc", "sampled")
    assert header.interval == "random_groups" and header.plain_rows == header.replicates + 1 >= 3
    assert len(noisy) == len(exact) == header.replicates + 1
    sd = np.array(header.noise_sd).reshape(2, header.items, header.item_slots)
    noised = [(i, s) for i in range(header.items) for s in range(header.item_slots)
              if sd[1, i, s] > 0 and i not in header.suppressed_items]
    assert noised
    for r in range(1, len(noisy)):
        for i, s in noised:
            assert noisy[r][i][s] != exact[r][i][s], (r, i, s)


# ---------------------------------------------------------------- suppression on the noised size
def _small_aian(seed: int, members: int = 8):
    """One-hot probabilities with `members` aian members (effective size `members`)."""
    tester, client = make_inputs(500, 500, 500, seed=seed, one_hot=True)
    aian = GROUPS.index("aian")
    arg = tester[GROUPS].to_numpy().argmax(axis=1)
    keep = sorted(np.flatnonzero(arg != aian).tolist() + np.flatnonzero(arg == aian)[:members].tolist())
    return tester.iloc[keep].reset_index(drop=True), client.iloc[keep].reset_index(drop=True)


def test_suppression_follows_the_noised_size_not_the_exact_one(monkeypatch):
    """With the threshold's draw forced to +1000 a group of 8 members (min 30) is
    released; forced to −150 every race group is suppressed (each holds 60 or more
    members) while overall (500) is not: the decision is the noised size's. An exact
    comparison would do neither."""
    tester_df, client_df = _small_aian(32)
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    aian = GROUPS.index("aian")
    suppressed = {}
    sizes = tester_df[GROUPS].sum()
    assert sizes.drop("aian").min() >= 60 and sizes["aian"] == 8
    for draw in (1000.0, -150.0):
        monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma, draw=draw: draw)
        seen: list = []
        result, _, _ = _run(spec, tester_df, client_df, policy, seen=seen)
        suppressed[draw] = set(_header(seen).suppressed_items)
        if draw > 0:
            assert "suppressed" not in result.release
    assert aian not in suppressed[1000.0] and not suppressed[1000.0]
    assert suppressed[-150.0] == set(range(len(GROUPS)))  # every race group, not overall


def test_an_audit_whose_every_cell_is_suppressed_still_ends_with_a_result(monkeypatch):
    """Noised sizes that suppress every cell, overall included: the header names the race
    groups as small (never "overall", which the Test-Client would refuse as no group) and
    the result says every estimate is unknown."""
    tester_df, client_df = _small_aian(32)
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: -10_000.0)
    seen: list = []
    result, _, _ = _run(spec, tester_df, client_df, policy, seen=seen)
    assert set(_header(seen).small_groups) == set(GROUPS)
    assert all(g.estimate is None for g in result.groups) and not result.verdict.significant


def test_a_probabilistic_count_pool_is_suppressed_on_its_noised_size(monkeypatch):
    """The count metric, aggregated under encryption, is withheld on noised values at both
    of its steps. The Tester decides per group on its noised size: a −1000 draw withholds
    every group's items (named in the header), a +1000 draw none. The result recipient
    decides per cell on the noised count: a one-member pool's cells are withheld, and
    with +1000 members of noise forced into every slot they are released (1000 and more),
    which a decision on the exact count (under 1) would never do."""
    tester_df, client_df = make_inputs(500, 500, 500, seed=33)
    pools = pd.DataFrame({"member_id": client_df.member_id, "pool": ["big"] * 499 + ["one"]})
    policy = dataclasses.replace(NOISY, min_effective_size=30.0)
    spec = AuditSpec(metric="prob-count", client_dataset="d", result_recipient="tester")
    seen: list = []
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: -1000.0)
    down, _, _ = _run(spec, tester_df, pools, policy, seen=seen)
    assert len(_header(seen).suppressed_items) == _header(seen).items  # every group, and overall
    assert all(p.expected_count is None for p in down.pools)
    assert set(down.release["suppressed"]) >= {f"{pool}/{g}" for pool in ("big", "one") for g in GROUPS}
    seen.clear()
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: 1000.0)
    up, _, _ = _run(spec, tester_df, pools, policy, seen=seen)
    assert not _header(seen).suppressed_items and not up.release.get("suppressed")
    assert all(p.expected_count is None for p in up.pools if p.pool == "one")
    assert all(p.expected_count is not None for p in up.pools if p.pool == "big")

    def thousand(scales, slot_bits):
        return sum((1000 << 32) << (s * slot_bits) for s, x in enumerate(scales) if x > 0)

    monkeypatch.setattr(tester_protocol, "gaussian_slots", thousand)
    forced, _, _ = _run(spec, tester_df, pools, policy)
    one = [p for p in forced.pools if p.pool == "one"]
    assert one and all(p.expected_count is not None and p.expected_count >= 1000 for p in one)


# ---------------------------------------------------------------- the budget
class _Refuse:
    """A charge that refuses (a spent budget) and records when it was asked."""

    def __init__(self, seen: list) -> None:
        self.seen = seen
        self.calls: list[int] = []

    def __call__(self, rho: float) -> float:
        self.calls.append(len(self.seen))
        raise BudgetExhausted("spent")


def _released(seen) -> list[str]:
    """What left the Tester that carries the audit's outcome."""
    out = []
    for d, m in seen:
        kind = m.WhichOneof("body")
        if d != "to_client":
            continue
        if kind == "aggregates_header" or (kind == "chunk" and m.chunk.table == pb.AGGREGATES) or kind == "result":
            out.append(kind)
    return out


@pytest.mark.parametrize("metric, recipient", [("ero", "tester"), ("ero", "client"), ("pot", "client"),
                                               ("mqos-auc:exact", "client"), ("prob-count", "tester"),
                                               ("prob-count", "client")])
def test_the_budget_is_charged_before_anything_leaves(metric, recipient):
    """A refused charge stops the audit before any aggregate or result leaves the Tester,
    on every path (HE metrics, the squares round of MQOS-AUC exact, the probabilistic
    count computed at the Tester), and the Tester keeps no result either."""
    name, _, option = metric.partition(":")
    tester_df, client_df = make_inputs(300, 300, 300, seed=34)
    rng = np.random.default_rng(34)
    if name == "pot":
        client_df = _pot_frame(tester_df, rng)
    elif name == "mqos-auc":
        client_df = _auc_frame(tester_df, rng)
    elif name == "prob-count":
        client_df = pd.DataFrame({"member_id": client_df.member_id, "pool": rng.choice(["a", "b"], len(client_df))})
    spec = AuditSpec(metric=name, metric_option=option, client_dataset="d", bootstrap=10, seed=1,
                     result_recipient=recipient)
    seen: list = []
    charge = _Refuse(seen)
    tester, client = _sessions(spec, tester_df, client_df, NOISY, charge=charge)
    try:
        with pytest.raises(BudgetExhausted):
            run_sessions(tester, client, lambda d, m: seen.append((d, m)))
        assert charge.calls, "the budget was never charged"
        assert _released(seen) == [] and tester.result is None and client.result is None
    finally:
        tester.close()
        client.close()


class _SlowSpent(dict):
    """A ledger whose reads take a moment: two charges that are not serialised both read
    the old value before either writes."""

    def get(self, *args):
        value = super().get(*args)
        time.sleep(0.05)
        return value


def test_concurrent_charges_cannot_overspend_even_when_they_overlap():
    """Two audits of one identity charge at the same moment with room for one: exactly
    one is charged, the other refused; the ledger never exceeds the budget."""
    acc = PrivacyAccountant(1.0)
    acc._spent = _SlowSpent()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def audit():
        barrier.wait()
        try:
            acc.charge("c", 1.0)
            outcomes.append("charged")
        except BudgetExhausted:
            outcomes.append("refused")

    threads = [threading.Thread(target=audit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["charged", "refused"]
    assert acc.spent("c") == pytest.approx(1.0)


# ---------------------------------------------------------------- the minimum intersection
def test_the_minimum_intersection_counts_distinct_members_not_rows():
    """LOT's rows are pairs of members: fewer than 100 distinct members in far more than
    100 rows are refused under a minimum of 100; the count is exact (passes at the
    number of distinct members, refused at one more)."""
    tester_df, _ = make_inputs(300, 300, 300, seed=35)
    lists = random_ranked_lists(60, np.random.default_rng(35), min_len=3, max_len=5, n_members=60)
    distinct = lists.member_id.nunique()
    assert distinct < 100 and len(lists) > 200
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1)
    off = ReleasePolicy.off()
    for refused in (100, distinct + 1):
        with pytest.raises(IntersectionRefused):
            _run(spec, tester_df, lists, dataclasses.replace(off, min_intersection=refused))
    result, _, _ = _run(spec, tester_df, lists, dataclasses.replace(off, min_intersection=distinct))
    assert result is not None


# ---------------------------------------------------------------- masks
@pytest.mark.parametrize("correction", ["none", "calibration"])
def test_each_slot_of_a_masked_item_gets_its_own_mask_noise(monkeypatch, correction):
    """(r·Num + e1, r·Den + e2): with e1 = e2 the Test-Client would read r·(Num − Den) as
    A − B and factor it; every masked item's slots get distinct draws below r (with the
    correction too, where the items of a replicate share r)."""
    from tester_service import aggregation
    tester_df, client_df = make_inputs(300, 300, 300, seed=36)
    masks: list = []
    original = aggregation.mask_chunk

    def recording(n, h, items, ratio, pads):
        masks.extend(ratio or [])
        return original(n, h, items, ratio, pads)

    monkeypatch.setattr(aggregation, "mask_chunk", recording)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=2, result_recipient="client",
                     correction=correction)
    seen: list = []
    _run(spec, tester_df, client_df, ReleasePolicy.off(), seen=seen)
    header = _header(seen)
    shift, slots = header.slot_bits, header.item_slots
    masked = [(r, noise) for r, noise in masks if r != 1]
    assert len(masked) >= 6 * header.items
    for r, noise in masked:
        draws = [(noise >> (s * shift)) & ((1 << shift) - 1) for s in range(slots)]
        assert all(0 <= e < r for e in draws)
        assert len(set(draws)) == slots, "slots share one mask draw"


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


# ---------------------------------------------------------------- ciphertexts that are not units
def _non_unit(key, salt: int) -> int:
    """A ciphertext in range but sharing the factor p with n (gcd(c, n) = p)."""
    pub = key.public
    return key.p * (salt % (pub.n2 // key.p - 2) + 2) % pub.n2


def test_a_test_clients_row_ciphertext_that_is_not_a_unit_is_refused(client_key):
    """A Test-Client that sends a multiple of a factor of n would learn membership from
    non-unit aggregates through any amount of noise: its rows are refused."""
    tester_df, client_df = make_inputs(60, 60, 60, seed=37)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=1)
    tester, client = _sessions(spec, tester_df, client_df, ReleasePolicy.off())
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


def test_a_square_that_is_not_a_unit_is_refused(client_key):
    """MQOS-AUC exact: the squares the Test-Client returns are ciphertexts the Tester
    reads too; a non-unit among them is refused."""
    tester_df, _ = make_inputs(200, 200, 200, seed=38)
    client_df = _auc_frame(tester_df, np.random.default_rng(38))
    spec = AuditSpec(metric="mqos-auc", metric_option="exact", client_dataset="d", seed=1)
    tester, client = _sessions(spec, tester_df, client_df, ReleasePolicy.off())
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


# ---------------------------------------------------------------- tables shorter than announced
def _drop_last_row(chunk: pb.TableChunk) -> None:
    rows = chunk.rows
    for column in ("points", "sealed", "ciphertexts", "units", "strata"):
        data = getattr(chunk, column)
        if data:
            setattr(chunk, column, data[:len(data) - len(data) // rows])
    chunk.rows = rows - 1


@pytest.mark.parametrize("table", [pb.SHUFFLED_ROWS, pb.CLIENT_ROWS])
def test_a_table_that_ends_with_fewer_rows_than_announced_is_refused(table):
    """The Test-Client's table is one row short and its end says so consistently: the
    Tester refuses it (it announced, or was sent, one row more)."""
    tester_df, client_df = make_inputs(40, 40, 40, seed=39)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=1)
    tester, client = _sessions(spec, tester_df, client_df, ReleasePolicy.off())
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


# ---------------------------------------------------------------- the correction's solve
@pytest.mark.slow
def test_groups_suppressed_by_the_controls_leave_the_corrections_solve():
    """A group suppressed for its size has its cell replaced (its masked Num is noise):
    the other groups' corrected values must not use it. They equal the plaintext solve
    over the kept groups, in two audits with fresh masks."""
    from common.stats import correction
    from tests.test_correction import calibrated_population
    tester_df, client_df, p, _ = calibrated_population(1000, 40, alpha=1.0)
    aian = GROUPS.index("aian")
    p = p.copy()
    p[:, aian] *= 0.05
    p /= p.sum(axis=1, keepdims=True)
    tester_df[GROUPS] = p
    assert p[:, aian].sum() < 30 and p.sum(axis=0).min() < 30 <= np.delete(p.sum(axis=0), aian).min()
    policy = dataclasses.replace(ReleasePolicy.off(), min_effective_size=30.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=2, correction="calibration",
                     result_recipient="client")
    f = ((client_df.y_pred == 1) & (client_df.y_true == 0)).to_numpy(float)
    d = (client_df.y_true == 0).to_numpy(float)
    m, num = correction.plain_matrix(p, d), p.T @ f
    kept = [j for j in range(len(GROUPS)) if j != aian]
    twin = np.linalg.solve(m[np.ix_(kept, kept)], num[kept])
    for _ in range(2):
        report, _, _ = _run(spec, tester_df, client_df, policy)
        assert report.release["suppressed"] == ["aian"]
        got = np.array([report.group(GROUPS[j]).corrected_estimate for j in kept], dtype=float)
        assert np.allclose(got, twin, atol=1e-6, rtol=0), (got, twin)


# ---------------------------------------------------------------- found by the mutation audit
def test_second_moments_refuse_noise_beyond_the_slots_headroom_naming_the_flag():
    """`moment_sigmas` refuses like `sigmas` (bench/RESULTS.md, mutation audit): a rho so
    small that the noise would overflow its slot is an error naming --noise-rho, never a
    release with clipped noise."""
    from common.errors import InputError
    policy = ReleasePolicy(rho=1e-15, budget=1.0)
    with pytest.raises(InputError, match="headroom") as refused:
        policy.moment_sigmas(2.0, squares=1)
    assert refused.value.parameter == "noise rho"
    assert "parameter 'noise rho'" in str(refused.value) and "use a larger rho" in str(refused.value)


def test_noise_slots_with_no_scale_add_nothing():
    """A slot whose noise scale is 0 (a release without noise, or a slot the plan keeps
    exact) gets exactly 0: no offset, not even one fixed-point unit."""
    from tester_service.release import gaussian_slots
    assert gaussian_slots([0.0, 0.0, 0.0], 40) == 0


def test_a_new_identity_has_spent_nothing_and_may_spend_the_whole_budget():
    """The pre-check a Tester service runs before any work (`check`) and the spent rho it
    reports start at 0 for an identity it has not seen, and one charge is counted once."""
    accountant = PrivacyAccountant(budget=1.0)
    assert accountant.spent("new") == 0.0 and accountant.remaining("new") == 1.0
    accountant.check("new", 1.0)
    assert accountant.charge("other", 0.25) == 0.75
    assert accountant.spent("other") == 0.25 and accountant.spent("new") == 0.0
