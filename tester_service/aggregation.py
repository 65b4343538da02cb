"""The Tester's homomorphic aggregation, as chunk functions on raw integers.

Design §3.6 and §4. The Tester holds, per joined row, the Test-Client's
ciphertexts (each packs several signed value slots) and plaintext integer weights (one
column per weight kind of the metric: a group's q_ij, a pair's q_ia·q_lb, ...). For each
resampling bucket m (and stratum) it forms C[m, w, t] = Π_i Enc(v_it)^(W_iw) =
Enc(Σ_i W_iw·v_it); a bootstrap replicate with bucket counts c_b is
X[b] = Π_m C[m]^(c_bm) (the point estimate is the replicate with every count 1); every
value is masked and rerandomised before it leaves the Tester (`mask_chunk`).

Every function here is top-level and takes only integers and lists, so
an executor (`common.parallel`) can send it to worker processes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from gmpy2 import mpz

from common import paillier


def bucket_sums_chunk(n: int, jobs: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[list[int]]:
    """For each (ciphertexts, weight columns) job: [Enc(Σ_i w_i·v_i) for each weight column]."""
    n2 = n * n
    return [[paillier.multi_exp(cts, column, n2) for column in columns] for cts, columns in jobs]


def bucket_sums_packed(n: int, width: int, jobs: Sequence[tuple[bytes, Sequence[Sequence[int]]]]) -> list[list[int]]:
    """`bucket_sums_chunk` on packed ciphertexts (`width` bytes each, big-endian): they
    travel to the worker as bytes and become integers there."""
    return bucket_sums_chunk(n, [([int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)],
                                  columns) for packed, columns in jobs])


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
    pay (k is chosen from the chunk's own counts). The same integers either way."""
    if not count_rows or not columns:
        return []
    n2 = mpz(n) * n
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
    """Masked and rerandomised ciphertexts: ratio_masks[i] = (r, noise): Enc(r·X + noise);
    additive_pads[i] = pad: Enc(X + pad). Exactly one of the two is given."""
    out = []
    for i, x in enumerate(ciphertexts):
        if ratio_masks is not None:
            r, noise = ratio_masks[i]
            x = paillier.add_plain(n, paillier.scalar_pow(n, x, r), noise)
        else:
            x = paillier.add_plain(n, x, additive_pads[i])
        out.append(x)
    return paillier.rerandomize_chunk(n, h, out)
