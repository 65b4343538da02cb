"""The pure steps of the Tester's aggregation (`tester_service.aggregation`, design §3.6
and §8), one at a time and without a session: the session's `_aggregate` runs them in
this order, and the seeded end-to-end tests pin what they make together."""
from __future__ import annotations

import math

import numpy as np
import pytest

from common.stats import bootstrap as boot
from common.crypto import paillier
from common.metrics.base import Item
from tester_service import aggregation
from tester_service.release import RELEASE_GROUPS, IntersectionRefused

#: a modulus so large that the products below never wrap: they read as plain products
BIG = 1 << 4096


def _state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


# ------------------------------------------------------------------ canonical order
def test_canonical_order_sorts_by_the_vectors_first_column_first_and_keeps_ties_stable():
    q = [np.array([[2, 1], [1, 5], [2, 1], [1, 0]])]
    order = aggregation.canonical_order(q)
    assert order.tolist() == [3, 1, 0, 2]  # (1,0) (1,5) (2,1)#0 (2,1)#2: the tie keeps its order


def test_canonical_order_breaks_ties_of_the_first_id_by_the_second():
    first = np.array([[1, 1], [1, 1], [0, 9]])
    second = np.array([[5, 0], [2, 0], [7, 7]])
    assert aggregation.canonical_order([first, second]).tolist() == [2, 1, 0]


# ------------------------------------------------------------------ resampling units
def _units(resampling: str, units, n: int, seed: int = 3, **kw):
    options = dict(estimate_only=False, groups_instead=False, random_groups=0, n_buckets=4)
    options.update(kw)
    rng = np.random.default_rng(seed)
    return (*aggregation.resampling_units(resampling, units, n, rng, **options), rng)


def test_query_units_are_renumbered_in_order_without_a_draw():
    units, n_units, rng = _units("unit", np.array([10, 30, 10, 20]), 4)
    assert units.tolist() == [0, 2, 0, 1] and n_units == 3
    assert _state(rng) == _state(np.random.default_rng(3))


def test_the_moments_form_has_one_unit():
    units, n_units, _ = _units("unit", np.array([10, 30, 10, 20]), 4, estimate_only=True)
    assert units.tolist() == [0, 0, 0, 0] and n_units == 1
    units, n_units, _ = _units("bucket", None, 9, estimate_only=True)
    assert units.tolist() == [0] * 9 and n_units == 1


def test_random_groups_of_queries_keep_a_query_together_and_are_the_seeded_draw():
    queries = np.repeat(np.arange(3 * RELEASE_GROUPS + 1) * 7, 2)  # every query has two rows
    units, n_units, _ = _units("unit", queries, len(queries), groups_instead=True)
    assert n_units == RELEASE_GROUPS
    assert set(units.tolist()) == set(range(RELEASE_GROUPS))
    for query in np.unique(queries):
        assert len(set(units[queries == query].tolist())) == 1  # one query, one group
    per_group = np.bincount(units[::2], minlength=RELEASE_GROUPS)
    assert per_group.max() - per_group.min() <= 1  # the queries dealt round the groups
    expected = (np.random.default_rng(3).permutation(len(np.unique(queries))) % RELEASE_GROUPS)
    assert units.tolist() == expected[np.searchsorted(np.unique(queries), queries)].tolist()


def test_too_few_queries_for_random_groups_are_refused():
    with pytest.raises(IntersectionRefused, match=f"fewer than {RELEASE_GROUPS} resampling units"):
        _units("unit", np.arange(RELEASE_GROUPS - 1), RELEASE_GROUPS - 1, groups_instead=True)


def test_the_test_clients_groups_are_kept_with_one_unit_more_for_the_estimate():
    given = np.array([0, 2, 1, 2])
    units, n_units, rng = _units("client_groups", given, 4, random_groups=5)
    assert units is given and n_units == 6
    assert _state(rng) == _state(np.random.default_rng(3))


@pytest.mark.parametrize("kw, count", [
    (dict(), 4),  # the bootstrap's buckets
    (dict(groups_instead=True), RELEASE_GROUPS),
])
def test_random_buckets_cover_every_row_once_in_near_equal_sizes(kw, count):
    n = 3 * count + 2
    units, n_units, _ = _units("bucket", None, n, **kw)
    assert n_units == count and units.shape == (n,)
    assert units.min() == 0 and units.max() == count - 1
    sizes = np.bincount(units, minlength=count)
    assert sizes.sum() == n and sizes.max() - sizes.min() <= 1
    for m, idx in enumerate(boot.assign_buckets(n, count, np.random.default_rng(3))):
        assert (units[idx] == m).all()  # the seeded partition, unit m its m-th bucket


def test_a_random_groups_metric_makes_its_own_number_of_groups():
    units, n_units, _ = _units("random_groups", None, 20, random_groups=7, groups_instead=True)
    assert n_units == 7 and sorted(set(units.tolist())) == list(range(7))


# ------------------------------------------------------------------ buckets
def test_bucket_rows_group_rows_by_unit_and_stratum():
    units, strata = np.array([1, 0, 1, 0]), np.array([0, 1, 1, 1])
    rows, keys = aggregation.bucket_rows(units, strata, 2, True)
    assert keys == [1, 2, 3] and [r.tolist() for r in rows] == [[1, 3], [0], [2]]
    rows, keys = aggregation.bucket_rows(units, strata, 1, False)  # strata not kept apart
    assert keys == [0, 1] and [r.tolist() for r in rows] == [[1, 3], [0, 2]]


def test_weight_kinds_tell_explicit_from_constant_columns():
    weights = [np.array([1, 2]), 3, (0, 1), [4, 5]]
    assert aggregation.weight_kinds(weights) == ([0, 3], [1])


@pytest.fixture(scope="module")
def key():
    return paillier.generate_keypair(1024, allow_insecure=True)


def test_bucket_sums_combine_to_every_weight_columns_sum(key):
    """Each bucket's explicit, constant and summed columns decrypt to Σ w·v."""
    pub = key.public
    values = [[3, 10], [4, 20], [5, 30]]  # rows x 2 row ciphertexts
    explicit = np.array([2, 7, 1])
    weights = [explicit, 5, (0, 1)]
    buckets = [[0, 2], [1]]
    cts = [paillier.encrypt_chunk(pub.n, pub.h, row) for row in values]
    width = pub.ciphertext_bytes
    jobs = [(paillier.ciphertexts_to_bytes([cts[i][t] for i in idx], width), [explicit[idx].tolist(), [1] * len(idx)])
            for idx in buckets for t in range(2)]
    sums = aggregation.bucket_sums_packed(pub.n, width, jobs)
    agg = aggregation.combine_bucket_sums(sums, [4, 9], weights, pub.n, pub.n2, 2)
    assert sorted(agg) == [4, 9]
    for k, idx in zip([4, 9], buckets):
        for t in range(2):
            v = [values[i][t] for i in idx]
            wv = sum(int(explicit[i]) * values[i][t] for i in idx)
            got = key.decrypt_mod_p([agg[k][w][t] for w in range(3)])
            assert got == [wv, 5 * sum(v), wv + 5 * sum(v)]



def test_a_bucket_larger_than_the_cap_is_cut_into_pieces_and_small_ones_stay_whole():
    """The one unit of a release of second moments holds every row: cut into pieces of at
    most the cap it spreads over the workers (it went to one task: one core, and the
    whole table in one message); buckets within the cap are unchanged."""
    whole = [np.arange(10), np.arange(10, 13)]
    pieces, owner = aggregation.split_buckets(whole, 4)
    assert [len(x) for x in pieces] == [4, 3, 3, 3] and owner == [0, 0, 0, 1]
    assert np.concatenate(pieces).tolist() == list(range(13))
    same, owner = aggregation.split_buckets(whole, 10)
    assert [x.tolist() for x in same] == [x.tolist() for x in whole] and owner == [0, 1]


def test_pieces_sums_merge_to_the_whole_buckets_ciphertexts(key):
    """Summing a bucket in pieces and multiplying the pieces' ciphertexts gives exactly the
    ciphertexts of the bucket summed whole (the products are the same, in another order)."""
    pub = key.public
    width = pub.ciphertext_bytes
    rng = np.random.default_rng(4)
    values = rng.integers(0, 1000, size=(9, 2)).tolist()
    weights = rng.integers(1, 1 << 32, size=9)
    cts = [paillier.encrypt_chunk(pub.n, pub.h, row) for row in values]
    buckets = [np.arange(7), np.arange(7, 9)]

    def sums_of(groups):
        jobs = [(paillier.ciphertexts_to_bytes([cts[i][t] for i in idx], width), [weights[idx].tolist()])
                for idx in groups for t in range(2)]
        return aggregation.bucket_sums_packed(pub.n, width, jobs)

    pieces, owner = aggregation.split_buckets(buckets, 3)
    assert len(pieces) == 4
    merged = aggregation.merge_piece_sums(sums_of(pieces), owner, len(buckets), 2, pub.n2)
    assert [list(map(int, r)) for r in merged] == [list(map(int, r)) for r in sums_of(buckets)]
    got = key.decrypt_mod_p([merged[0][0], merged[3][0]])  # (bucket 0, ciphertext 0), (bucket 1, ciphertext 1)
    assert got == [sum(int(weights[i]) * values[i][0] for i in range(7)),
                   sum(int(weights[i]) * values[i][1] for i in range(7, 9))]


# ------------------------------------------------------------------ count rows
def test_count_rows_of_random_groups_are_the_estimate_then_each_group_alone():
    rng = np.random.default_rng(1)
    rows = aggregation.count_rows(4, 4, 50, rng, estimate_only=False, groups=True)
    assert rows[0] == [1, 1, 1, 1]
    assert rows[1:] == np.eye(4, dtype=int).tolist()
    assert _state(rng) == _state(np.random.default_rng(1))  # no draw


def test_count_rows_of_the_moments_form_are_the_estimate_alone():
    assert aggregation.count_rows(3, 0, 50, np.random.default_rng(1), estimate_only=True, groups=False) == [[1, 1, 1]]


def test_count_rows_of_a_bootstrap_draw_every_unit_count_times():
    rows = aggregation.count_rows(5, 0, 30, np.random.default_rng(2), estimate_only=False, groups=False)
    assert len(rows) == 31 and rows[0] == [1] * 5
    assert all(sum(r) == 5 and min(r) >= 0 for r in rows[1:])
    assert rows[1:] == boot.resample_counts(5, 30, np.random.default_rng(2)).tolist()
    assert len({tuple(r) for r in rows[1:]}) > 1  # drawn, not one row repeated


# ------------------------------------------------------------------ items
def test_direct_columns_multiply_a_units_buckets_of_the_items_strata():
    # agg[key][weight][ciphertext]; key = unit * 2 + stratum
    agg = {0: [[2, 3]], 1: [[5, 7]], 3: [[11, 13]]}  # unit 0: strata 0, 1; unit 1: stratum 1
    items = [Item(0, 0, 0), Item(0, 1, 1), Item(0, 0, None)]
    columns = aggregation.direct_columns(items, [0, 1, 2], agg, 3, 2, True, BIG)
    assert columns == [[2, 1, 1], [7, 13, 1], [2 * 5, 11, 1]]  # unit 2 has no rows: Enc(0) = 1
    # strata not kept apart: every item reads stratum 0's bucket (key = unit)
    flat = {0: [[2, 3]], 1: [[5, 7]]}
    assert aggregation.direct_columns([Item(0, 1, None)], [0], flat, 2, 1, False, BIG) == [[3, 7]]


def test_composite_scales_add_their_parts_noise_in_quadrature():
    scales = [[3.0, 0.0], [4.0, 1.0]]
    got = aggregation.composite_scales(scales, [0, 2], {1: [0, 2]}, 3)
    assert got[0] == [3.0, 0.0] and got[2] == [4.0, 1.0]
    assert got[1] == [5.0, pytest.approx(math.sqrt(1.0))]


def test_compose_items_put_every_row_in_plan_order_with_products_of_parts():
    computed = [2, 3, 5, 7]  # two rows of the direct items 0 and 2
    items = aggregation.compose_items(computed, 2, [0, 2], {1: [0, 2]}, 3, BIG)
    assert items == [2, 6, 3, 5, 35, 7]


# ------------------------------------------------------------------ derived weight columns
def test_derived_columns_give_the_very_ciphertexts_of_their_exponentiation():
    """ERO's weights under the default controls: the six groups' q, "overall", and the 21
    pair weights. Formed from the others (the last group from 2^32·Enc(Σ v), the pairs
    with it from their group and the other pairs), the 7 derived columns' bucket sums are
    the same integers mod n² as exponentiating them row by row, in every bucket and row
    ciphertext; so is every other column's."""
    from common.crypto.encoding import quantize_probabilities
    from common.metrics.base import Metric
    from common.stats import correction
    key = paillier.generate_keypair(1024, allow_insecure=True)
    pub = key.public
    rng = np.random.default_rng(9)
    n, n_cts, buckets = 40, 2, 3
    q = quantize_probabilities(rng.dirichlet(np.full(6, 0.5), size=n))
    weights = [q[:, j] for j in range(6)] + [tuple(range(6))] + correction.pair_weights(q)
    candidates = {**Metric().weight_derivations(6), **Metric().moment_derivations(6, 7)}
    derived = aggregation.verified_derivations(weights, candidates)
    assert len(derived) == 7 and min(int(np.min(weights[w])) for w in derived) >= -12
    cts = [paillier.encrypt_chunk(pub.n, pub.h, rng.integers(0, 50, size=n).tolist()) for _ in range(n_cts)]
    units = rng.integers(0, buckets, size=n)

    def sums(derivations):
        explicit, _ = aggregation.weight_kinds(weights, derivations)
        ones = aggregation.needs_ones(weights, derivations)
        rows = []
        for b in range(buckets):
            idx = np.flatnonzero(units == b)
            columns = [np.asarray(weights[w])[idx].tolist() for w in explicit] + ([[1] * len(idx)] if ones else [])
            rows += aggregation.bucket_sums_chunk(pub.n, [([cts[t][i] for i in idx], columns) for t in range(n_cts)])
        return aggregation.combine_bucket_sums(rows, list(range(buckets)), weights, pub.n, pub.n2, n_cts,
                                               derivations)

    assert sums(derived) == sums({})


def test_a_negative_weight_is_exponentiated_through_the_inverse():
    key = paillier.generate_keypair(1024, allow_insecure=True)
    pub = key.public
    cts = paillier.encrypt_chunk(pub.n, pub.h, [5, 7, 11])
    total = aggregation.signed_multi_exp(cts, [3, -2, 0], pub.n2)
    assert key.decrypt_mod_p([total]) == [3 * 5 - 2 * 7]
    assert aggregation.signed_multi_exp(cts, [3, 2, 1], pub.n2) == paillier.multi_exp(cts, [3, 2, 1], pub.n2)
