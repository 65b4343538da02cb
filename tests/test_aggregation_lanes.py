"""The aggregation's planned kernel lanes (`tester_service.aggregation`, design §3.6 and
§4.9): `lane_plan` cuts a job's weight columns into the IFMA kernel's calls (eight lanes
each, a window per call; whole columns fill the first calls, the columns left over go into
the remaining lanes in shorter pieces) and `lane_sums` runs those calls and joins each
column's pieces back into its sum; `bucket_sums_packed` sends a job there where the kernel
runs and its weights fit.

The planner's half needs no kernel and runs everywhere. The sums' half compares every
result with the plain product Π_i c_i^(w_i) mod n² (gmpy2's powmod, one base at a time):
`lane_sums` itself only where the IFMA backend runs (it is the kernel's caller; elsewhere
those tests skip and say why, `tests.test_crypto_backends.ifma_missing`), and
`bucket_sums_packed` on each backend the machine has (`on_each_backend`), which is the
portable path alone where the CPU has no IFMA. 1024-bit test keys (n² of 2048 bits).
"""
from __future__ import annotations

import random

import gmpy2
import numpy as np
import pytest

from common.crypto import batch, paillier
from tester_service import aggregation
from tester_service.aggregation import LANES, lane_cost, lane_plan
from tests.helpers import TEST_BITS
from tests.test_crypto_backends import HAS_IFMA, backend_restored, needs_ifma, on_each_backend  # noqa: F401

#: `ppre_multi_exp_mb8`'s limits (ifma_lanes.c: it refuses a window outside 1..16 and
#: exponents wider than 64 bits; `lane_sums` hands it min(span·w, 64) bits, so a call whose
#: longest piece spans more than 64 bits would silently lose its top digits)
KERNEL_WINDOWS = range(1, 17)
KERNEL_EXP_BITS = 64


# ------------------------------------------------------------------ helpers
def span(call) -> int:
    """Windows the kernel runs a call through: its longest piece's digits."""
    return max(d for _, _, d in call)


def windows(plan) -> int:
    """Windows per row of a plan (what the docstrings count: 8, not 9)."""
    return sum(span(call) for _, call in plan)


def plan_cost(plan, rows: int) -> float:
    return sum(lane_cost(w, call, rows) for w, call in plan)


def bit_ranges(plan) -> dict[int, list[tuple[int, int]]]:
    """Per column, the exponent bits its pieces cover: [w·first, w·(first + digits))."""
    out: dict[int, list[tuple[int, int]]] = {}
    for w, call in plan:
        for c, first, d in call:
            out.setdefault(c, []).append((w * first, w * (first + d)))
    return out


def check_plan(bits, plan) -> None:
    """The invariants every plan keeps, whatever its cost: each call a kernel window and 1..8
    pieces of at least one digit, spanning no more than 64 bits; every column with a set
    bit is covered, each of its bits by exactly one piece (its (column, digit)s exactly
    once, with no piece wholly above its width), and a column of zeros by none."""
    for w, call in plan:
        assert w in KERNEL_WINDOWS, (w, call)
        assert 1 <= len(call) <= LANES, (w, call)
        assert all(first >= 0 and d >= 1 for _, first, d in call), (w, call)
        assert span(call) * w <= KERNEL_EXP_BITS, (w, call)
    ranges = bit_ranges(plan)
    assert set(ranges) == {c for c, b in enumerate(bits) if b}, (bits, plan)
    for c, pieces in ranges.items():
        pieces.sort()
        assert pieces[0][0] == 0, (c, bits[c], pieces)
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), (c, bits[c], pieces)  # no gap, no overlap
        assert pieces[-1][1] >= bits[c] > pieces[-1][0], (c, bits[c], pieces)


def all_whole(bits, rows: int):
    """The plan `multi_exp_many` amounts to, at each call's cheapest window: every column
    whole, eight to a call, the widest together."""
    order = sorted((c for c, b in enumerate(bits) if b), key=lambda c: -bits[c])
    plan = []
    for i in range(0, len(order), LANES):
        group = order[i:i + LANES]
        options = [(w, [(c, 0, -(-bits[c] // w)) for c in group]) for w in KERNEL_WINDOWS]
        options = [o for o in options if span(o[1]) * o[0] <= KERNEL_EXP_BITS]
        plan.append(min(options, key=lambda o: lane_cost(o[0], o[1], rows)))
    return plan


def plain_products(bases, columns, n2: int) -> list[int]:
    """The reference: Π_i bases[i]^column[i] mod n² by one powmod per base (a negative
    weight through the inverse, a base not below n² as it is)."""
    m = gmpy2.mpz(n2)
    out = []
    for column in columns:
        acc = gmpy2.mpz(1)
        for b, e in zip(bases, column):
            acc = acc * gmpy2.powmod(gmpy2.mpz(b), int(e), m) % m
        out.append(int(acc % m))
    return out


def column(rng: random.Random, rows: int, bits: int) -> list[int]:
    """`rows` random weights below 2^bits whose largest has exactly `bits` bits (the width
    `lane_sums` plans by), or zeros for 0 bits."""
    if not bits or not rows:
        return [0] * rows
    values = [rng.getrandbits(bits) for _ in range(rows)]
    values[rng.randrange(rows)] = (1 << bits) - 1
    return values


def packed(bases, width: int) -> bytes:
    return b"".join(int(b).to_bytes(width, "big") for b in bases)


def run_lane_sums(n2: int, width: int, bases, columns) -> list[int]:
    """`lane_sums` as `bucket_sums_packed` calls it (the IFMA backend must be selected)."""
    lanes = aggregation._lane_modulus(n2)
    assert lanes is not None, "the IFMA kernel does not take this modulus"
    arrays = [np.asarray(col, dtype=np.uint64) for col in columns]
    return aggregation.lane_sums(*lanes, packed(bases, width), width, arrays)


@pytest.fixture(scope="module")
def small_key():
    return paillier.generate_keypair(TEST_BITS, allow_insecure=True)


@pytest.fixture
def recorded_plans(monkeypatch):
    """The plans `lane_sums` ran, as (bits, rows, plan)."""
    seen = []
    real = aggregation.lane_plan

    def spy(bits, rows):
        plan = real(bits, rows)
        seen.append((list(bits), rows, plan))
        return plan

    monkeypatch.setattr(aggregation, "lane_plan", spy)
    return seen


# ------------------------------------------------------------------ the planner
def shapes() -> list[tuple[list[int], int]]:
    """Column widths (bits of the largest weight) and row counts: every column count 0..30
    at rows from 1 to 100k, widths 0..64 with the ones that matter (1, 30-32, 62, 64) often,
    and the uniform and ERO/B = 1000 shapes; and 1M and 10M rows, where the cost model
    would prefer windows wider than the kernel takes (a 17-bit column in one digit of 17)."""
    rng = random.Random(20261206)
    rows_set = [1, 2, 3, 7, 40, 100, 999, 3906, 31250, 100_000, 1_000_000, 10_000_000]
    favoured = [0, 1, 2, 16, 30, 31, 32, 33, 62, 63, 64]
    out = []
    for count in range(31):
        for rows in rows_set:
            bits = [rng.choice(favoured) if rng.random() < 0.5 else rng.randint(0, 64) for _ in range(count)]
            out.append((bits, rows))
    for rows in (1, 40, 3906, 31250, 100_000):
        for width in (1, 4, 11, 30, 32, 62, 64):
            out += [([width] * count, rows) for count in (1, 7, 8, 9, 16, 17, 21, 30)]
        out += [([32] * 5 + [30] * 15 + [1], rows), ([32] * 5 + [1], rows), ([62] + [0] * 9 + [1], rows)]
    return out


SHAPES = shapes()


def test_every_bit_of_every_column_is_in_exactly_one_lane_piece():
    """`lane_plan`: for every shape, each column with a set bit has its w-bit digits
    covered by its pieces exactly once (no digit dropped, none twice, none above its
    width), so that `lane_sums`' product of the pieces raised to 2^(w·first) is the
    column's sum; a column of zeros has no piece."""
    for bits, rows in SHAPES:
        plan = lane_plan(bits, rows)
        ranges = bit_ranges(plan)
        assert set(ranges) == {c for c, b in enumerate(bits) if b}, (bits, rows, plan)
        for c, pieces in ranges.items():
            covered = sorted(pieces)
            assert covered[0][0] == 0 and covered[-1][0] < bits[c] <= covered[-1][1], (bits, rows, c, covered)
            assert all(a[1] == b[0] for a, b in zip(covered, covered[1:])), (bits, rows, c, covered)


def test_every_call_fits_the_kernel():
    """`lane_plan` (`_whole_call`, `_cut_calls`): no call has more than the kernel's eight
    lanes or none, every window is one `ppre_multi_exp_mb8` takes (1..16), every piece has
    a digit, and no call's longest piece spans more than the 64 exponent bits the kernel
    reads (`lane_sums` passes min(span·w, 64): more would drop digits silently)."""
    for bits, rows in SHAPES:
        plan = lane_plan(bits, rows)
        for w, call in plan:
            assert w in KERNEL_WINDOWS, (bits, rows, w)
            assert 1 <= len(call) <= LANES, (bits, rows, call)
            assert all(first >= 0 and d >= 1 for _, first, d in call), (bits, rows, call)
            assert span(call) * w <= KERNEL_EXP_BITS, (bits, rows, w, call)


def test_no_plan_costs_more_than_the_whole_columns():
    """`lane_plan`: the plan it picks never costs more (`lane_cost`) than the columns whole,
    eight to a call at each call's cheapest window (what `multi_exp_many` runs): the whole
    plan is one it weighs, so a plan above it is a search that lost its best."""
    for bits, rows in SHAPES:
        plan = lane_plan(bits, rows)
        assert plan_cost(plan, rows) <= plan_cost(all_whole(bits, rows), rows) + 1e-6, (bits, rows)


def test_no_columns_or_only_zero_columns_take_no_call():
    """`lane_plan`: no column, or only columns of zeros, is no kernel call at all (each
    such column's sum is Enc(0) = 1 without one), at any row count."""
    for rows in (1, 31250):
        assert lane_plan([], rows) == []
        assert lane_plan([0, 0, 0], rows) == []
    plan = lane_plan([0, 32, 0, 0, 5], 100)
    assert {c for _, call in plan for c, _, _ in call} == {1, 4}


def test_eros_default_columns_take_8_windows_per_row_not_9():
    """`lane_plan` (commits 4443118, 845c454; bench/RESULTS.md 2026-12-06): ERO's 21
    default columns at 31,250 rows (5 group weights of 32 bits, 15 pair weights of 30, the
    plain Enc(Σ v)'s ones): the 8 widest columns whole in the first call at w = 11, the
    next 8 whole at w = 10, the rest cut into one-digit pieces at w = 10: 8 windows per
    row where 21 whole columns of 3 digits take 9, and cheaper by the cost model. The
    same with all 20 weights of 32 bits."""
    bits = [32] * 5 + [30] * 15 + [1]
    plan = lane_plan(bits, 31250)
    check_plan(bits, plan)
    assert windows(plan) == 8
    assert windows(all_whole(bits, 31250)) == 9
    assert plan_cost(plan, 31250) < plan_cost(all_whole(bits, 31250), 31250)
    first_w, first = plan[0]
    assert first_w == 11 and sorted(c for c, _, _ in first) == list(range(8))
    assert all(f == 0 and d == 3 for _, f, d in first)  # whole, 3 digits of 11 bits
    assert plan[1][0] == 10 and all(f == 0 and d == 3 for _, f, d in plan[1][1])
    cut = plan[2:]
    assert cut and all(w == 10 and span(call) == 1 for w, call in cut)
    assert {c for _, call in cut for c, _, _ in call} == set(range(16, 21))
    assert windows(lane_plan([32] * 20 + [1], 31250)) == 8


def test_b1000s_columns_take_three_one_digit_calls():
    """`lane_plan` (commit 4443118; bench/RESULTS.md 2026-12-06): B = 1000's bucket of 3,906
    rows, 5 columns of 32 bits (4 digits at w = 8) and the ones of Enc(Σ v): 3 calls of
    one-digit pieces at w = 8 (21 pieces), not one call of 4 windows with 2 lanes idle."""
    bits = [32] * 5 + [1]
    plan = lane_plan(bits, 3906)
    check_plan(bits, plan)
    assert len(plan) == 3
    assert all(w == 8 and span(call) == 1 for w, call in plan)
    assert sum(len(call) for _, call in plan) == 5 * 4 + 1
    assert windows(plan) == 3 < windows(all_whole(bits, 3906)) == 4


@pytest.mark.parametrize("bits, rows, most", [([32] * 21, 31250, 8), ([32] * 6, 3906, 3)], ids=["21x32", "6x32"])
def test_leftover_columns_of_one_width_are_cut_too(bits, rows, most):
    """`lane_plan`'s docstring and commit 4443118 as written: "21 columns of 3 digits: 8
    windows, not 9"; "B = 1000's 6 columns of 4 digits: 3 one-digit calls, not one of 4"
    (without the 1-bit column of ones that the passing tests above have)."""
    assert windows(lane_plan(bits, rows)) <= most


# ------------------------------------------------------------------ the sums
def sums_cases():
    """(name, rows, widths): the edge cases the sums must survive."""
    return [
        ("one_row", 1, [32, 7, 62, 1, 0]),
        ("more_columns_than_lanes_ero_like", 40, [32] * 5 + [30] * 15 + [1]),
        ("a_62_bit_column", 17, [62, 3, 62, 20]),
        ("widest_32_bit_weights", 25, "max32"),
        ("zero_columns_among_others", 12, [0, 32, 0, 1, 0]),
        ("only_zero_columns", 12, [0, 0, 0]),
        ("no_columns", 10, []),
        ("empty_job", 0, [32, 1, 0, 62]),
        ("thirty_columns_of_random_widths", 120, None),
    ]


@needs_ifma
@pytest.mark.parametrize("name, rows, widths", sums_cases(), ids=[c[0] for c in sums_cases()])
def test_lane_sums_are_the_plain_products(name, rows, widths, small_key, recorded_plans, backend_restored):
    """`lane_sums`: for each column, Π_i c_i^(w_i) mod n², the integer a plain powmod per
    base gives, over the edge cases (one row, more columns than lanes with leftover columns
    cut into pieces, a 62-bit column, every weight 2^32 − 1, columns of zeros (1 = Enc(0)),
    no column, an empty job); every plan it ran keeps `check_plan`'s invariants."""
    assert batch.select("ifma") == "ifma"
    rng = random.Random(name)
    n2 = small_key.public.n2
    width = small_key.public.ciphertext_bytes
    bases = [rng.randrange(n2) for _ in range(rows)]
    if widths == "max32":
        columns = [[(1 << 32) - 1] * rows for _ in range(9)]
    elif widths is None:
        widths = [rng.choice([1, 62, rng.randint(1, 62)]) for _ in range(30)]
        columns = [column(rng, rows, b) for b in widths]
        columns[3] = [0] * rows
        columns[4] = [0] * (rows - 1) + [(1 << 62) - 1]  # one weight, the widest, in the last row
    else:
        columns = [column(rng, rows, b) for b in widths]
    assert run_lane_sums(n2, width, bases, columns) == plain_products(bases, columns, n2)
    for bits, _, plan in recorded_plans:
        check_plan(bits, plan)
    if name == "more_columns_than_lanes_ero_like":
        assert any(first > 0 for _, _, plan in recorded_plans for _, call in plan for _, first, _ in call), \
            "no column was cut into pieces: the case no longer tests the joining of pieces"


def hand_plans():
    """Plans `lane_sums` must join correctly whatever `lane_plan` prefers, for a 62-bit
    column (0), a 32-bit one (1), a 1-bit one (2) and a column of zeros (3)."""
    return {
        # the 62-bit column whole at w = 16: 4 digits, 64 bits (the unmasked branch)
        "whole_at_16": [(16, [(0, 0, 4), (1, 0, 2), (2, 0, 1)])],
        "one_digit_pieces_at_16": [(16, [(0, 3, 1), (1, 1, 1), (0, 0, 1), (2, 0, 1), (0, 2, 1), (1, 0, 1), (0, 1, 1)])],
        "two_digit_pieces_at_8": [(8, [(0, 0, 2), (0, 2, 2), (0, 4, 2), (0, 6, 2), (1, 0, 2), (1, 2, 2), (2, 0, 1)])],
        # a column's pieces at two windows: bits 0-15 at w = 8, the rest at w = 16
        "mixed_windows": [(8, [(0, 0, 2), (1, 0, 2)]), (16, [(0, 1, 3), (1, 1, 1), (2, 0, 1)])],
        # 9 one-digit pieces of 7 bits over two calls, last first, then a whole call at w = 11
        "pieces_over_two_calls": [(7, [(0, f, 1) for f in range(8, 0, -1)]), (7, [(0, 0, 1)]),
                                  (11, [(1, 0, 3), (2, 0, 1)])],
        "bit_by_bit": [(1, [(0, 0, 62)]), (1, [(1, 0, 32), (2, 0, 1)])],
    }


@needs_ifma
@pytest.mark.parametrize("name", list(hand_plans()))
def test_lane_sums_join_any_valid_plan(name, small_key, monkeypatch, backend_restored):
    """`lane_sums`' joining of pieces, apart from which plan `lane_plan` picks: each piece's
    digits cut from its column (shifted down w·first bits, masked to w·digits, whole at 64),
    its result raised to 2^(w·first), a column the product of its pieces (in any call, at
    any window, in any order), a column of zeros 1: the plain products for every plan
    that keeps `check_plan`'s invariants."""
    assert batch.select("ifma") == "ifma"
    rng = random.Random(name)
    n2, width = small_key.public.n2, small_key.public.ciphertext_bytes
    rows = 9
    bases = [rng.randrange(n2) for _ in range(rows)]
    columns = [column(rng, rows, 62), column(rng, rows, 32), column(rng, rows, 1), [0] * rows]
    plan = hand_plans()[name]
    check_plan([62, 32, 1, 0], plan)
    monkeypatch.setattr(aggregation, "lane_plan", lambda bits, count: plan)
    assert run_lane_sums(n2, width, bases, columns) == plain_products(bases, columns, n2)


def wide_bases(n2: int, width: int, rng: random.Random) -> list[int]:
    """Ciphertexts not below n² (n², n² + c, the largest `width` bytes hold) among ones below."""
    top = (1 << (8 * width)) - 1
    return [n2 + rng.randrange(n2), top, n2, n2 - 1, rng.randrange(n2), 0, 1, top - rng.randrange(1 << 64)]


@needs_ifma
def test_lane_sums_reduce_bases_not_below_n2(small_key, backend_restored):
    """`lane_sums`' docstring: a base not below n² is reduced (as `multi_exp_many` does),
    so the products are those of the integers as packed: n² itself, n² + c, the widest
    value the ciphertext's bytes hold."""
    assert batch.select("ifma") == "ifma"
    rng = random.Random(7)
    n2, width = small_key.public.n2, small_key.public.ciphertext_bytes
    bases = wide_bases(n2, width, rng)
    assert max(bases) >= n2 and max(bases).bit_length() <= 8 * width
    columns = [column(rng, len(bases), b) for b in (32, 62, 1, 0)] + [[(1 << 32) - 1] * len(bases)]
    columns += [column(rng, len(bases), 30) for _ in range(LANES)]
    assert run_lane_sums(n2, width, bases, columns) == plain_products(bases, columns, n2)


def test_bucket_sums_packed_are_the_plain_products_on_each_backend(small_key, monkeypatch, backend_restored):
    """`bucket_sums_packed` over several jobs at once, on each backend: every job's sums are
    the plain products (bases not below n² too, an empty job, a job without columns, one
    row); on the IFMA backend the jobs whose weights are integers in [0, 2^62) go through
    `lane_sums` and the others (a 63-bit weight, a negative one, a float column) do not,
    and on the portable backend none does; both backends give the same integers."""
    rng = random.Random(11)
    n2, width = small_key.public.n2, small_key.public.ciphertext_bytes
    jobs, expected, lane_jobs = [], [], []

    def add(bases, columns, to_lanes: bool, as_array=True):
        cols = [np.asarray(c, dtype=np.int64) if as_array and isinstance(c, list) and c else c for c in columns]
        lane_jobs.append(to_lanes)
        jobs.append((packed(bases, width), cols))
        expected.append(plain_products(bases, columns, n2))

    rows = 30
    bases = [rng.randrange(n2) for _ in range(rows)]
    add(bases, [column(rng, rows, b) for b in [32] * 5 + [30] * 15 + [1]], True)
    add(bases, [column(rng, rows, 62), [0] * rows, [(1 << 32) - 1] * rows], True)
    add(wide_bases(n2, width, rng), [column(rng, 8, 62), column(rng, 8, 1)], True)
    add(bases[:1], [[5], [(1 << 62) - 1], [0]], True)
    add([], [[], [], []], False, as_array=False)  # an empty list has no integer dtype: the portable path
    add([], [np.zeros(0, dtype=np.uint64)] * 2, True)
    add(bases, [], True)
    add(bases, [column(rng, rows, 63), column(rng, rows, 32)], False)  # wider than LANE_WEIGHT_BITS
    add(bases, [[-3] + [5] * (rows - 1), column(rng, rows, 32)], False)  # a signed pair weight
    add(bases[:4], [np.asarray([1.0, 2.0, 0.0, 3.0])], False)  # not integers: the portable path

    calls = []
    real = aggregation.lane_sums

    def spy(kernel, modulus, job_packed, job_width, columns):
        calls.append(job_packed)
        return real(kernel, modulus, job_packed, job_width, columns)

    monkeypatch.setattr(aggregation, "lane_sums", spy)
    results = {}
    for name in ("portable", "ifma") if HAS_IFMA else ("portable",):
        assert batch.select(name) == name
        calls.clear()
        results[name] = aggregation.bucket_sums_packed(small_key.public.n, width, jobs)
        assert results[name] == expected, name
        routed = [job[0] for job, lanes in zip(jobs, lane_jobs) if lanes]
        assert calls == (routed if name == "ifma" else []), name


def test_the_sums_decrypt_to_the_weighted_sums(small_key, backend_restored):
    """`bucket_sums_packed` on real ciphertexts, on each backend: the sums decrypt to
    Σ_i w_i·v_i for ERO-like columns (more than eight, the widest 32-bit weights, a
    62-bit column, a column of zeros), and they are the same integers on both backends."""
    rng = random.Random(3)
    n = small_key.public.n
    rows = 50
    values = [rng.getrandbits(20) for _ in range(rows)]
    cts = paillier.encrypt_chunk(n, small_key.public.h, values)
    width = small_key.public.ciphertext_bytes
    columns = [column(rng, rows, b) for b in [32] * 5 + [30] * 6 + [62, 0, 1]] + [[(1 << 32) - 1] * rows]
    out = on_each_backend(lambda: aggregation.bucket_sums_packed(
        n, width, [(packed(cts, width), [np.asarray(c, dtype=np.uint64) for c in columns])]))
    assert len({repr(v) for v in out.values()}) == 1
    assert small_key.decrypt_signed(out["portable"][0]) == [sum(w * v for w, v in zip(col, values))
                                                            for col in columns]
