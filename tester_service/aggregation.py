"""The Tester's homomorphic aggregation, as chunk functions on raw integers.

Design §3.6 and §4. The Tester holds, per joined row, the Test-Client's
ciphertexts (each packs several signed value slots) and plaintext integer weights (one
column per weight kind of the metric: a group's q_ij, a pair's q_ia·q_lb, ...). For each
resampling bucket m (and stratum) it forms C[m, w, t] = Π_i Enc(v_it)^(W_iw) =
Enc(Σ_i W_iw·v_it); a bootstrap replicate with bucket counts c_b is
X[b] = Π_m C[m]^(c_bm) (the point estimate is the replicate with every count 1); every
value is masked and rerandomised before it leaves the Tester (`mask_chunk`).

Every function here is top-level and takes only integers and lists, so
an executor (`common.execution.parallel`) can send it to worker processes.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import gmpy2
import numpy as np
from gmpy2 import mpz

from common.stats import bootstrap as boot
from common.crypto import batch, ifma_lanes, masking, paillier
from common.crypto.commutative import POINT_BYTES
from tester_service.release import RELEASE_GROUPS, IntersectionRefused

if TYPE_CHECKING:  # a worker process imports no metric catalogue (tester_service.join)
    from common.metrics.base import Derivation


def bucket_sums_chunk(n: int, jobs: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[list[int]]:
    """For each (ciphertexts, weight columns) job: [Enc(Σ_i w_i·v_i) for each weight column];
    the columns without a negative weight as one batch (`batch.multi_exp_many`: eight at a
    time on the IFMA backend), the others through `signed_multi_exp`."""
    n2 = n * n
    out = []
    for cts, columns in jobs:
        plain = [i for i, column in enumerate(columns) if all(w >= 0 for w in column)]
        sums: list = [None] * len(columns)
        for i, value in zip(plain, batch.multi_exp_many(cts, [columns[i] for i in plain], n2)):
            sums[i] = value
        out.append([s if s is not None else signed_multi_exp(cts, column, n2) for s, column in zip(sums, columns)])
    return out


def signed_multi_exp(bases: Sequence[int], exponents: Sequence[int], n2: int) -> int:
    """Π bases[i]^exponents[i] mod n² for exponents of either sign: the negative ones'
    product inverted (every base is a unit mod n², `common.protocol.validation`). A pair
    weight may be a few units below 0 (`common.stats.correction.pair_weights`)."""
    if all(e >= 0 for e in exponents):
        return paillier.multi_exp(bases, exponents, n2)
    positive = paillier.multi_exp(bases, [max(int(e), 0) for e in exponents], n2)
    negative = paillier.multi_exp(bases, [max(-int(e), 0) for e in exponents], n2)
    return int(mpz(positive) * gmpy2.invert(mpz(negative), mpz(n2)) % n2)


def bucket_sums_packed(n: int, width: int, jobs: Sequence[tuple[bytes, Sequence[Sequence[int]]]]) -> list[list[int]]:
    """`bucket_sums_chunk` on packed ciphertexts (`width` bytes each, big-endian) and
    weight columns as arrays: both travel to the worker as buffers (no list of a million
    Python integers pickled on the Tester's own thread) and become integers there (the
    ciphertexts were checked as they arrived, `tester_service.join.double_client_chunk`).
    Where the IFMA kernel runs, a job whose weights are non-negative integers below 2^62
    goes to it as buffers, cut into lanes by `lane_plan` (`lane_sums`); the same integers."""
    n2 = n * n
    lanes = _lane_modulus(n2)
    out = []
    for packed, columns in jobs:
        arrays = _lane_columns(columns) if lanes is not None else None
        if arrays is not None and width <= 8 * lanes[1].words:
            out.append(lane_sums(*lanes, packed, width, arrays))
            continue
        out += bucket_sums_chunk(n, [([int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)],
                                      [column.tolist() if isinstance(column, np.ndarray) else column
                                       for column in columns])])
    return out


# ------------------------------------------------------------------ the kernel's lanes
#: the widest weight `lane_sums` takes (the kernel reads exponents of up to 64 bits)
LANE_WEIGHT_BITS = 62
#: the kernel's eight lanes
LANES = 8


def _lane_modulus(n2: int):
    """(the IFMA kernel, n²'s form) where this process runs the kernel and n² fits it, else None."""
    kernel = batch._kernel()
    if kernel is None or int(n2).bit_length() > ifma_lanes.MAX_MODULUS_BITS:
        return None
    return kernel, batch._modulus_form(kernel, int(n2))


def _lane_columns(columns: Sequence) -> list[np.ndarray] | None:
    """The weight columns as uint64 arrays, or None where one is not integers in
    [0, 2^LANE_WEIGHT_BITS) (signed pair weights, wider ones: `bucket_sums_chunk`)."""
    out = []
    for column in columns:
        array = np.asarray(column)
        if array.dtype.kind not in "iu" or array.ndim != 1:
            return None
        if len(array) and (int(array.min()) < 0 or int(array.max()) >> LANE_WEIGHT_BITS):
            return None
        out.append(array.astype(np.uint64, copy=False))
    return out


#: a lane piece: (weight column, its first w-bit digit, digits)
Piece = tuple[int, int, int]


def lane_cost(window: int, call: Sequence[Piece], rows: int) -> float:
    """Estimated time (µs, 2048-bit keys, this repository's Xeon) of one `ppre_multi_exp_mb8`
    call over `rows` bases with windows of `window` bits, as many as its longest piece has
    digits: per window, one product into a bucket per base (dearer as the buckets outgrow
    the caches: 7.3 µs at w = 1, 9.3 at 11, 11.7 at 16), two per bucket (7.7 µs each) and
    the squarings between windows; and its digits' array (about 0.2 µs a base). A base
    whose eight digits are all 0 is skipped, which this does not count (bench/RESULTS.md,
    2026-12-06)."""
    insert = 7.3 + 0.15 * window + 0.04 * max(0, window - 8) ** 2
    span = max(digits for _, _, digits in call)
    return span * (rows * insert + (2 << window) * 7.7 + window * 7.7) + rows * 0.2


def _whole_call(columns: Sequence[int], bits: Sequence[int], rows: int) -> tuple[float, tuple[int, list[Piece]]]:
    """Up to eight whole columns in one call, at the window that costs least."""
    options = []
    for w in range(1, 17):
        call = [(c, 0, -(-bits[c] // w)) for c in columns]
        if max(d for _, _, d in call) * w <= 64:
            options.append((lane_cost(w, call, rows), w, call))
    cost, w, call = min(options, key=lambda option: option[:2])
    return cost, (w, call)


def _cut_calls(columns: Sequence[int], bits: Sequence[int], rows: int) -> tuple[float, list[tuple[int, list[Piece]]]]:
    """Columns cut into pieces of at most `size` digits of w bits, eight pieces to a call
    (the longest together), at the window and size that cost least."""
    best: tuple[float, list] = (0.0, [])
    for w in range(1, 17):
        digits = {c: -(-bits[c] // w) for c in columns}
        if not columns or max(digits.values()) * w > 64:
            continue
        for size in sorted(set(digits.values()) | {1}):  # one-digit pieces even where no column is one digit
            pieces = sorted(((c, first, min(size, digits[c] - first)) for c in columns
                             for first in range(0, digits[c], size)), key=lambda piece: -piece[2])
            calls = [(w, pieces[i:i + LANES]) for i in range(0, len(pieces), LANES)]
            cost = sum(lane_cost(w, call, rows) for w, call in calls)
            if not best[1] or (cost, len(calls)) < (best[0], len(best[1])):
                best = (cost, calls)
    return best


def lane_plan(bits: Sequence[int], rows: int) -> list[tuple[int, list[Piece]]]:
    """How `lane_sums` cuts weight columns of `bits` bits (their largest value's) over
    `rows` bases into the kernel's calls: each call a window w and up to eight lane
    pieces (column, first digit, digits), a piece being the column's w-bit digits from
    its first on; a column is the product of its pieces' results, each raised to
    2^(w·first). The kernel runs every lane of a call through as many windows as its
    longest piece, so whole columns fill the first calls, eight at a time, the widest
    first, each call at its own best window (ERO's 30-bit pair weights at w = 10, its
    32-bit ones at 11), and the columns left over go into the remaining lanes cut into
    shorter pieces where that takes fewer windows (21 columns of 3 digits: 8 windows,
    not 9). The plan of the least estimated time (`lane_cost`); a column of zeros has no
    piece (its sum is Enc(0), 1)."""
    order = sorted((c for c in range(len(bits)) if bits[c]), key=lambda c: -bits[c])
    best: tuple[float, list] | None = None
    for whole in range(0, -(-len(order) // LANES) + 1):
        head = [_whole_call(order[i:i + LANES], bits, rows) for i in range(0, min(whole * LANES, len(order)), LANES)]
        tail = _cut_calls(order[whole * LANES:], bits, rows)
        cost = sum(c for c, _ in head) + tail[0]
        plan = [call for _, call in head] + tail[1]
        if best is None or (cost, len(plan)) < (best[0], len(best[1])):
            best = (cost, plan)
    return best[1] if best is not None else []


def lane_sums(kernel, modulus, packed: bytes, width: int, columns: Sequence[np.ndarray]) -> list[int]:
    """[Enc(Σ_i w_i·v_i) for each weight column] over packed ciphertexts (`width` bytes
    each, big-endian) in the IFMA kernel: the bases converted to its form once, from the
    buffer, and the columns' digits handed to it as uint64 arrays (`lane_plan`), with no
    Python integer per row but where a base is not below n² (reduced, as `multi_exp_many`
    does). The same integers as `bucket_sums_chunk`."""
    m = modulus.value
    count = len(packed) // width if width else 0
    if count == 0 or not columns:
        return [1 % m] * len(columns)
    words, digits_n = modulus.words, modulus.n
    size = 8 * words  # the kernel's input: `words` little-endian 64-bit words per base
    raw = np.frombuffer(packed, dtype=np.uint8, count=count * width).reshape(count, width)
    little = np.zeros((count, size), dtype=np.uint8)
    little[:, :width] = raw[:, ::-1]
    # a base not below m (only where its top byte is at least m's) is reduced first
    for i in np.flatnonzero(raw[:, 0] >= (m >> (8 * (width - 1)))):
        value = int.from_bytes(raw[i].tobytes(), "big")
        if value >= m:
            little[i] = np.frombuffer((value % m).to_bytes(size, "little"), dtype=np.uint8)
    mont = np.empty(count * digits_n, dtype=np.uint64)
    if kernel._montgomery(little.ctypes.data, count, words, digits_n, modulus.digits, modulus.k0,
                          modulus.r2_digits, mont.ctypes.data):
        raise ValueError("the IFMA kernel refused the sizes")
    bits = [int(column.max()).bit_length() if len(column) else 0 for column in columns]
    calls = lane_plan(bits, count)
    buckets = np.empty((1 << max((w for w, _ in calls), default=1)) * digits_n * LANES, dtype=np.uint64)
    out = np.empty(LANES * words, dtype=np.uint64)
    exps = np.empty((count, LANES), dtype=np.uint64)
    n2 = gmpy2.mpz(m)
    sums: list = [gmpy2.mpz(1)] * len(columns)
    for window, call in calls:
        span = max(d for _, _, d in call)
        exps[:] = 0
        for lane, (c, first, d) in enumerate(call):
            piece = columns[c] >> np.uint64(first * window) if first else columns[c]
            exps[:, lane] = piece & np.uint64((1 << (d * window)) - 1) if d * window < 64 else piece
        if kernel._multi(mont.ctypes.data, count, words, exps.ctypes.data, min(span * window, 64), window, digits_n,
                         modulus.digits, modulus.k0, modulus.r_digits, buckets.ctypes.data, out.ctypes.data):
            raise ValueError("the IFMA multi-exponentiation refused the sizes")
        for (c, first, _), value in zip(call, modulus.numbers(out.tobytes(), len(call))):
            value = gmpy2.mpz(value)
            if first:
                value = gmpy2.powmod(value, 1 << (first * window), n2)
            sums[c] = sums[c] * value % n2
    return [int(s) for s in sums]


#: largest subset size `replicate_chunk` considers (a table of 2^k products per subset)
MAX_SUBSET = 8
#: at most this many bytes of extra products in one item's tables
MAX_TABLE_BYTES = 32 << 20
#: above this many counts in a chunk, `replicate_chunk` does not weigh the tables at all
MAX_SHARED_COUNTS = 1 << 22


def _table_products(k: int, m: int) -> int:
    """Products that build the tables of all sub-subsets of m bases cut into subsets of k."""
    full, rest = divmod(m, k)
    return full * ((1 << k) - k - 1) + (((1 << rest) - rest - 1) if rest else 0)


def _subset_cost(k: int, planes: np.ndarray) -> float:
    """Modular products for one item of `replicate_chunk` with subsets of k bases: building
    the tables, plus per replicate and bit plane one product per subset with a bit set,
    and a squaring between planes. `planes`: (rows, bit planes, bases) 0/1."""
    rows, n_planes, m = planes.shape
    groups = -(-m // k)
    padded = np.zeros((rows, n_planes, groups * k), dtype=bool)
    padded[:, :, :m] = planes
    occupied = int(padded.reshape(rows, n_planes, groups, k).any(axis=3).sum())
    return _table_products(k, m) + occupied + rows * (n_planes - 1)


def _subset_indices(planes: np.ndarray, k: int) -> list:
    """[row][plane][subset]: which bases of each subset of k have the plane's bit set, as a
    k-bit index into that subset's table."""
    rows, n_planes, m = planes.shape
    groups = -(-m // k)
    padded = np.zeros((rows, n_planes, groups * k), dtype=np.int64)
    padded[:, :, :m] = planes
    return (padded.reshape(rows, n_planes, groups, k) << np.arange(k, dtype=np.int64)).sum(axis=3).tolist()


def replicate_chunk(n: int, columns: Sequence[Sequence[int]], count_rows: Sequence[Sequence[int]]) -> list[int]:
    """Replicate ciphertexts, row-major (replicate, item): Π_m columns[item][m]^(counts[m]).

    All replicates of a chunk raise the same bases (an item's bucket ciphertexts) to small
    counts (multinomial: mostly 0 to 3), so they share their products: the bases are cut
    into subsets of k, each subset's 2^k sub-products are tabulated once per item and
    chunk, and a replicate takes, per bit plane of its counts (high to low, squaring in
    between), one table entry per subset with a bit set. With a few dozen replicates per
    chunk this is about a third fewer modular products than one multi-exponentiation per
    replicate (`paillier.multi_exp`), which stays for chunks where the tables would not
    pay (k is chosen from the chunk's own counts). Where the IFMA kernel runs
    (`batch.has_lanes`), each item's replicates are instead one multi-exponentiation per
    replicate, eight replicates to the kernel's lanes (`batch.multi_exp_many`): about a
    quarter fewer CPU-seconds than the tables on gmpy2 (bench/RESULTS.md). The same
    integers either way."""
    if not count_rows or not columns:
        return []
    n2 = mpz(n) * n
    if batch.has_lanes() and all(len(column) == len(count_rows[0]) for column in columns) \
            and all(len(row) == len(count_rows[0]) for row in count_rows):
        per_item = [batch.multi_exp_many(column, count_rows, n2) for column in columns]
        return [int(per_item[item][r]) for r in range(len(count_rows)) for item in range(len(columns))]
    try:
        counts = np.asarray(count_rows, dtype=np.int64)
    except (ValueError, OverflowError):  # ragged rows, or counts beyond 64 bits
        counts = np.zeros(0, dtype=np.int64)
    rows, m = counts.shape if counts.ndim == 2 else (0, 0)
    if (counts.ndim != 2 or counts.size == 0 or counts.size > MAX_SHARED_COUNTS or counts.min() < 0 or counts.max() >= 1 << 16
            or any(len(column) != m for column in columns)):
        return [paillier.multi_exp(column, row, n2) for row in count_rows for column in columns]
    n_planes = max(1, int(counts.max()).bit_length())
    planes = np.stack([(counts >> j) & 1 for j in reversed(range(n_planes))], axis=1).astype(bool)
    width = (int(n2).bit_length() + 7) // 8
    sizes = [k for k in range(1, min(MAX_SUBSET, m) + 1) if _table_products(k, m) * width <= MAX_TABLE_BYTES]
    k = min(sizes, key=lambda size: _subset_cost(size, planes))
    # one multi-exponentiation per replicate: a product per non-zero count, ~2 per bucket value
    if _subset_cost(k, planes) >= np.count_nonzero(counts) + 2 * float(counts.max(axis=1).sum()):
        return [paillier.multi_exp(column, row, n2) for row in count_rows for column in columns]
    indices = _subset_indices(planes, k)
    items = len(columns)
    out: list[int] = [1] * (rows * items)
    for item, column in enumerate(columns):
        tables = []
        for start in range(0, m, k):
            table = [mpz(1)] * (1 << min(k, m - start))
            for bit, base in enumerate(column[start:start + k]):
                table[1 << bit] = mpz(base)
            for index in range(3, len(table)):
                low = index & -index
                if index != low:
                    table[index] = table[index ^ low] * table[low] % n2
            tables.append(table)
        for r, row in enumerate(indices):
            acc = None
            for plane in row:
                if acc is not None:
                    acc = acc * acc % n2
                for table, index in zip(tables, plane):
                    if index:
                        acc = table[index] if acc is None else acc * table[index] % n2
            if acc is not None:
                out[r * items + item] = int(acc)
    return out


def mask_chunk(n: int, h: int, ciphertexts: Sequence[int], ratio_masks: Sequence[tuple[int, int]] | None,
               additive_pads: Sequence[int] | None) -> list[int]:
    """Masked and rerandomised ciphertexts: ratio_masks[i] = (r, noise): Enc(r·X + noise),
    the factors r as one batch read at the mask's full width (`masking.R_MAX_BITS`);
    additive_pads[i] = pad: Enc(X + pad). Exactly one of the two is given."""
    if ratio_masks is not None:
        scaled = paillier.scalar_pow_many(n, ciphertexts, [r for r, _ in ratio_masks], masking.R_MAX_BITS)
        out = [paillier.add_plain(n, x, noise) for x, (_, noise) in zip(scaled, ratio_masks)]
    else:
        out = [paillier.add_plain(n, x, pad) for x, pad in zip(ciphertexts, additive_pads)]
    return paillier.rerandomize_chunk(n, h, out)


# ------------------------------------------------------------------ the steps of step 6
# Pure steps of the Tester's aggregation (`tester_service.release_items`, design §3.6 and §8),
# in the order step 6 runs them; each takes arrays, integers and lists only.

def distinct_points(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For 32-byte points (dtype S32): each one's index among the distinct points and
    each distinct point's count, as `np.unique(..., return_inverse, return_counts)` gives
    them up to the order of the distinct points. Sorted by their first 8 bytes as
    integers (a tenth of the time of sorting the byte strings); where two different
    points share those bytes (no peer can aim at it: the points are multiplied by our
    secret key), the byte strings themselves."""
    if points.dtype.itemsize != POINT_BYTES or not len(points):
        _, member, counts = np.unique(points, return_inverse=True, return_counts=True)
        return member, counts
    keys = np.ascontiguousarray(points).view(np.uint64).reshape(len(points), -1)[:, 0]
    order = np.argsort(keys)
    sorted_keys, sorted_points = keys[order], points[order]
    same_key = sorted_keys[1:] == sorted_keys[:-1]
    if bool((same_key & (sorted_points[1:] != sorted_points[:-1])).any()):
        _, member, counts = np.unique(points, return_inverse=True, return_counts=True)
        return member, counts
    starts = np.concatenate(([True], ~same_key))
    group = np.cumsum(starts) - 1
    member = np.empty(len(points), dtype=np.int64)
    member[order] = group
    return member, np.bincount(group)


def exact_sum(values: np.ndarray) -> int:
    """Σ of integer weights, exactly: in int64 where no partial sum can overflow it
    (non-negative weights below 2^63 / rows), else as Python integers."""
    if values.dtype.kind in "iu" and len(values):
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high <= ((1 << 63) - 1) // len(values):
            return int(values.sum(dtype=np.int64))
    return sum(int(v) for v in values)


def canonical_order(q: Sequence[np.ndarray]) -> np.ndarray:
    """Design §3.6: the joined rows' order of our own, by their quantized probability
    vectors (`q`: one (rows, k) array per id slot); a stable sort, so rows with identical
    vectors keep the order they came in."""
    return np.lexsort([col for qs in reversed(q) for col in reversed(qs.T)])


def resampling_units(resampling: str, units: np.ndarray | None, n: int, rng: np.random.Generator, *,
                     estimate_only: bool, groups_instead: bool, random_groups: int,
                     n_buckets: int) -> tuple[np.ndarray | None, int]:
    """Design §4.8 and §8.4: each of the `n` rows' resampling unit, and the number of units.
    "unit": the Test-Client's units (queries), renumbered 0..; one unit when the estimate
    is released alone (`estimate_only`: second moments, or an exact interval); under
    release noise (`groups_instead`) the units go at random to `RELEASE_GROUPS` disjoint
    groups, and fewer units than that is a refusal
    (`IntersectionRefused`). "client_groups": the Test-Client's own groups (`units` as
    they are) and the estimate's. Otherwise: random buckets of the rows (`random_groups`
    for a random-groups metric, else `RELEASE_GROUPS` under noise, one for the estimate
    alone, or `n_buckets`)."""
    if resampling == "unit":
        used = np.unique(units)
        units = np.searchsorted(used, units)
        n_units = len(used)
        if estimate_only:  # the estimate alone: one unit (`common.stats.moments`)
            units, n_units = np.zeros_like(units), 1
        elif groups_instead:
            if n_units < RELEASE_GROUPS:
                # the count itself stays here: it moves with who joined (design §8)
                # and it counts as a refused audit (`PrivacyAccountant.refuse`): one yes/no answer
                raise IntersectionRefused(f"the joined rows fall in fewer than {RELEASE_GROUPS} resampling units "
                                          f"(queries); an interval under release noise needs {RELEASE_GROUPS} "
                                          f"or more")
            units = (rng.permutation(n_units) % RELEASE_GROUPS)[units]
            n_units = min(n_units, RELEASE_GROUPS)
    elif resampling == "client_groups":
        n_units = random_groups + 1
    else:
        count = 1 if estimate_only else random_groups if resampling == "random_groups" else \
            (RELEASE_GROUPS if groups_instead else n_buckets)
        buckets = boot.assign_buckets(n, count, rng)
        units = np.empty(n, dtype=np.int64)
        for m, idx in enumerate(buckets):
            units[idx] = m
        n_units = len(buckets)
    return units, n_units


def bucket_rows(units: np.ndarray, strata: np.ndarray | None, n_strata: int,
                strata_cells: bool) -> tuple[list[np.ndarray], list[int]]:
    """Design §3.6: the rows of each (unit, stratum) bucket (positions in the canonical
    order, ascending within a bucket) and each bucket's key, unit·`n_strata` + stratum
    (the stratum 0 unless the metric keeps its strata apart, `strata_cells`)."""
    key = units * n_strata + (strata if strata_cells else 0)
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    groups_idx = np.split(order, bounds)
    keys = [int(key[idx[0]]) for idx in groups_idx]
    return groups_idx, keys


def split_buckets(groups_idx: Sequence[np.ndarray], max_rows: int) -> tuple[list[np.ndarray], list[int]]:
    """Design §3.6: each bucket's rows in pieces of at most `max_rows`, and each piece's
    bucket. A bucket's sum is the product of its pieces' sums (`merge_piece_sums`), so a
    bucket as large as the table (the one unit of a release of second moments) is
    aggregated on every worker and never held whole by one task; buckets within the cap
    stay whole."""
    pieces: list[np.ndarray] = []
    owner: list[int] = []
    for b, idx in enumerate(groups_idx):
        for piece in np.array_split(idx, -(-len(idx) // max(1, max_rows))):
            pieces.append(piece)
            owner.append(b)
    return pieces, owner


def merge_piece_sums(sums: Sequence[Sequence[int]], owner: Sequence[int], n_buckets: int, n_cts: int,
                     n2: int) -> list[list[int]]:
    """`bucket_sums_packed`'s rows per bucket from its pieces' rows (`split_buckets`): one
    row per bucket and row ciphertext t, each slot the product mod n² of the pieces' (the
    ciphertext of the summed values); the rows as they are where every bucket is one piece."""
    if len(owner) == n_buckets:
        return list(sums)
    merged: list[list[int] | None] = [None] * (n_buckets * n_cts)
    for piece, bucket in enumerate(owner):
        for t in range(n_cts):
            row, k = sums[piece * n_cts + t], bucket * n_cts + t
            merged[k] = list(row) if merged[k] is None else [int(mpz(a) * b % n2) for a, b in zip(merged[k], row)]
    return merged  # type: ignore[return-value]


def weight_kinds(weights: Sequence, derived: Mapping[int, Derivation] | None = None) -> tuple[list[int], list[int]]:
    """Design §3.6: the weight columns given row by row and exponentiated (explicit), and
    the constant ones (an int: the constant times the bucket's Enc(Σ v)); a tuple is a
    sum of others, and a `derived` column is formed from others (`verified_derivations`)."""
    derived = derived or {}
    explicit = [w for w, col in enumerate(weights) if not isinstance(col, (int, tuple)) and w not in derived]
    const = [w for w, col in enumerate(weights) if isinstance(col, int)]
    return explicit, const


def needs_ones(weights: Sequence, derived: Mapping[int, Derivation] | None = None) -> bool:
    """Whether the buckets' plain Enc(Σ v) is needed: by a constant column, or a
    derivation from a constant."""
    return bool(weight_kinds(weights, derived)[1]) or any(d.total is None for d in (derived or {}).values())


def verified_derivations(weights: Sequence, candidates: Mapping[int, Derivation]) -> dict[int, Derivation]:
    """Design §4.2 ("Derived columns"): the `candidates` (a metric's declared
    `Derivation`s) whose identity holds exactly, row by row, on the columns' values, and
    whose parts are columns given row by row (exponentiated or derived before them): the
    rest are exponentiated."""
    out: dict[int, Derivation] = {}
    for w in sorted(candidates):
        d = candidates[w]
        parts = list(d.minus) + ([] if d.total is None else [d.total])
        if not 0 <= w < len(weights) or isinstance(weights[w], (int, tuple)) or not all(
                0 <= p < w and not isinstance(weights[p], (int, tuple)) for p in parts):
            continue
        column = np.asarray(weights[w])
        expected = np.asarray(weights[d.total]) if d.total is not None else np.full(len(column), d.constant)
        for p in d.minus:
            expected = expected - np.asarray(weights[p])
        if column.shape == expected.shape and bool(np.all(column == expected)):
            out[w] = d
    return out


def derive_sums(per_w: list, derived: Mapping[int, Derivation], ones: Sequence[int] | None, n: int,
                n2: int) -> None:
    """Design §4.2 ("Derived columns"): fill each derived column's bucket sums in `per_w`
    (per row ciphertext t): Enc(Σ total·v) · Π Enc(Σ minus·v)^−1, where Enc(Σ total·v) is
    the constant times the plain `ones` sums for a derivation from a constant; in column
    order, so that a derivation's parts are there first."""
    modulus = mpz(n2)
    for w in sorted(derived):
        d = derived[w]
        base = per_w[d.total] if d.total is not None else [paillier.scalar_pow(n, c, d.constant) for c in ones]
        out = []
        for t, c in enumerate(base):
            minus = mpz(1)
            for p in d.minus:
                minus = minus * per_w[p][t] % modulus
            out.append(int(mpz(c) * gmpy2.invert(minus, modulus) % modulus))
        per_w[w] = out


def columns_per_ciphertext(explicit: Sequence[int], only: Mapping[int, Sequence[int]] | None,
                           n_cts: int) -> list[list[int]]:
    """Per row ciphertext t, the positions (in `explicit`) of the explicit columns
    aggregated over it: all of them, but a column of `only` (`Metric.column_ciphertexts`)
    over its own ciphertexts alone."""
    only = only or {}
    return [[e for e, w in enumerate(explicit) if w not in only or t in only[w]] for t in range(n_cts)]


def combine_bucket_sums(sums: Sequence[Sequence[int]], keys: Sequence[int], weights: Sequence, n: int, n2: int,
                        n_cts: int, derived: Mapping[int, Derivation] | None = None,
                        per_ct: Sequence[Sequence[int]] | None = None) -> dict[int, list[list[int]]]:
    """Design §3.6: agg[key][w][t] from `bucket_sums_packed`'s rows (one per bucket and
    row ciphertext t: the sums of the explicit columns aggregated over t (`per_ct`, from
    `columns_per_ciphertext`; default all of them), then the plain Enc(Σ v) where a constant column or a
    derivation needs it): every weight column, explicit, constant, derived (`derive_sums`)
    or a sum of others; an explicit column's sum over a ciphertext it skips is 1."""
    derived = derived or {}
    explicit, const = weight_kinds(weights, derived)
    ones_needed = needs_ones(weights, derived)
    per_ct = per_ct if per_ct is not None else columns_per_ciphertext(explicit, None, n_cts)
    # agg[key][w][t]: every weight column, explicit, constant, derived or a sum of others
    agg: dict[int, list[list[int]]] = {}
    for g, kk in enumerate(keys):
        per_w: list[list[int] | None] = [None] * len(weights)
        for w in explicit:
            per_w[w] = [1] * n_cts
        ones = []
        for t in range(n_cts):
            row = sums[g * n_cts + t]
            for pos, e in enumerate(per_ct[t]):
                per_w[explicit[e]][t] = row[pos]
            if ones_needed:
                ones.append(row[-1])
            for w in const:
                per_w[w] = (per_w[w] or []) + [paillier.scalar_pow(n, row[-1], weights[w])]
        derive_sums(per_w, derived, ones, n, n2)
        for w, col in enumerate(weights):
            if isinstance(col, tuple):
                prod = [mpz(1)] * n_cts
                for other in col:
                    prod = [a * b % n2 for a, b in zip(prod, per_w[other])]
                per_w[w] = [int(x) for x in prod]
        agg[kk] = per_w
    return agg


def count_rows(n_units: int, replicates: int, bootstrap: int, rng: np.random.Generator, *,
               estimate_only: bool, groups: bool) -> list[list[int]]:
    """Design §4.8 and §8.4: each released row's count of every unit. Row 0 is the
    estimate (every unit once); the estimate released alone (`estimate_only`: second
    moments, or an exact interval) has no other row; random
    groups (`groups`) have each of the `replicates` groups alone; a bootstrap draws
    `bootstrap` rows of multinomial counts from `rng`."""
    if estimate_only:  # the estimate alone: its interval is exact or from its second moments
        return np.ones((1, n_units), dtype=np.int64).tolist()
    if groups:
        # row 0 every unit (the estimate), then each of the G groups alone
        return np.vstack([np.ones((1, n_units), dtype=np.int64),
                          np.eye(replicates, n_units, dtype=np.int64)]).tolist()
    # bootstrap: replicate r draws the units with multinomial counts (row 0: all ones)
    counts = boot.resample_counts(n_units, bootstrap, rng)
    return np.vstack([np.ones((1, n_units), dtype=np.int64), counts]).tolist()


def direct_columns(plan_items: Sequence, direct: Sequence[int], agg: dict[int, list[list[int]]], n_units: int,
                   n_strata: int, strata_cells: bool, n2: int) -> list[list[int]]:
    """Design §3.6: per direct item (one formed by no others), its ciphertext in every
    unit: the product over the unit's buckets of the item's strata (all of them for a
    pooled item of a metric with `strata_cells`); 1 (Enc(0)) for a unit without rows."""
    columns = []
    for i in direct:
        item = plan_items[i]
        col = []
        for u in range(n_units):
            c = mpz(1)
            strata_range = range(n_strata) if (strata_cells and item.stratum is None) else \
                [item.stratum if strata_cells else 0]
            for s in strata_range:
                part = agg.get(u * n_strata + s)
                if part is not None:
                    c = c * part[item.weight][item.ciphertext] % n2
            col.append(int(c))
        columns.append(col)
    return columns


def composite_scales(scales: Sequence[Sequence[float]], direct: Sequence[int], parts_of: dict[int, list[int]],
                     n_items: int) -> list:
    """Design §8.3: every item's slot scales of its noise; a direct item's own, and an item
    made of others the root of the sum of their squares."""
    # an item made of others (overall) carries the sum of their noises
    by_item = {i: scales[d] for d, i in enumerate(direct)}
    for i, parts in parts_of.items():
        by_item[i] = [math.sqrt(sum(float(by_item[p][k]) ** 2 for p in parts)) for k in range(len(scales[0]))]
    return [by_item[i] for i in range(n_items)]


def compose_items(computed: Sequence[int], n_rows: int, direct: Sequence[int], parts_of: dict[int, list[int]],
                  n_items: int, n2: int) -> list[int]:
    """Design §3.6: every row's items in the plan's order, from the rows of direct items
    (`computed`: `n_rows` rows of len(direct)): an item made of others is the product of
    its parts in the same row (gmpy2's products: a sixth of Python's at this size)."""
    slot = {i: d for d, i in enumerate(direct)}
    modulus = mpz(n2)
    items = []
    for r in range(n_rows):
        row = computed[r * len(direct):(r + 1) * len(direct)]
        for i in range(n_items):
            if i in parts_of:
                c = mpz(1)
                for p in parts_of[i]:
                    c = c * row[slot[p]] % modulus
                items.append(int(c))
            else:
                items.append(row[slot[i]])
    return items
