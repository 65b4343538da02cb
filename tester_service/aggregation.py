"""The Tester's homomorphic aggregation, as chunk functions on raw integers.

SPEC.md sections 3.6 and 4. The Tester holds, per joined row, the Test-Client's
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

from common import paillier


def bucket_sums_chunk(n: int, jobs: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[list[int]]:
    """For each (ciphertexts, weight columns) job: [Enc(Σ_i w_i·v_i) for each weight column]."""
    n2 = n * n
    return [[paillier.multi_exp(cts, column, n2) for column in columns] for cts, columns in jobs]


def replicate_chunk(n: int, columns: Sequence[Sequence[int]], count_rows: Sequence[Sequence[int]]) -> list[int]:
    """Replicate ciphertexts, row-major (replicate, item): Π_m columns[item][m]^(counts[m])."""
    n2 = n * n
    return [paillier.multi_exp(column, counts, n2) for counts in count_rows for column in columns]


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
