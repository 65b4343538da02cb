"""Homomorphic aggregation of ratio estimators, as chunk functions on raw integers.

SPEC.md sections 3.6 and 4: P1 holds Enc(v_i) with v_i = f_i + 2^S d_i (P2's packing,
so one ciphertext carries both the numerator and the denominator value) and the
fixed-point weights q_ij = round(2^F p_ij). For each random bucket m (see
`common.bootstrap`) and group j it forms C_mj = Enc(sum_{i in m} q_ij v_i); a
replicate with bucket counts c_b is X_bj = prod_m C_mj^(c_bm) (the point estimate is
the replicate with every count 1), then masked and rerandomised before it leaves P1.

Every function here is top-level and takes only integers and lists, so
`common.parallel.run_chunks` can send it to worker processes.
"""
from __future__ import annotations

from typing import Sequence

from common import paillier


def bucket_sums_chunk(n: int, buckets: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[list[int]]:
    """For each (ciphertexts, weight columns) bucket: [Enc(sum_i w_ij v_i) for each group j]."""
    n2 = n * n
    return [[paillier.multi_exp(cts, column, n2) for column in columns] for cts, columns in buckets]


def replicate_chunk(n: int, h: int, bucket_sums: Sequence[Sequence[int]], count_rows: Sequence[Sequence[int]],
                    ratio_masks: Sequence[Sequence[tuple[int, int]]] | None,
                    additive_pads: Sequence[Sequence[int]] | None) -> list[int]:
    """Masked, rerandomised replicate ciphertexts, row-major (replicate, group).

    ratio_masks[b][j] = (r, noise): Enc(r * X + noise); additive_pads[b][j] = pad:
    Enc(X + pad). Exactly one of the two is given.
    """
    n2 = n * n
    k = len(bucket_sums[0])
    columns = [[row[j] for row in bucket_sums] for j in range(k)]
    out = []
    for b, counts in enumerate(count_rows):
        for j in range(k):
            x = paillier.multi_exp(columns[j], counts, n2)
            if ratio_masks is not None:
                r, noise = ratio_masks[b][j]
                x = paillier.add_plain(n, paillier.scalar_pow(n, x, r), noise)
            else:
                x = paillier.add_plain(n, x, additive_pads[b][j])
            out.append(x)
    return paillier.rerandomize_chunk(n, h, out)
