"""The Tester's part of LOT's blind path (design §5.3, "The Tester blind to the pairs";
`common.metrics.lot`): its members' vectors under its own key, and the cells formed from
the Test-Client's masked sums without seeing a row.

For cell (g, h) of rank pair s, with (z + r)_ash the decrypted masked sums of member a
and Enc(r_ash) the Test-Client's encryption of their masks (one ciphertext per tail group
h, r at the cell's num and den slots):

    Enc(Num, Den) = Enc(Σ_a p_ag·(z + r)_ash) · (Π_a Enc(r_ash)^(p_ag))^-1

and for a second-moment item of cells (g, h), (g', h') the same with the weight
e_a = round(p_ag·p_ag'/2^32) and the tail pair (h, h')'s sums, at the den slot only (the
num slot of a second-moment item is not read for LOT: its spread is stated,
`common.stats.moments`). Every p at the fixed-point scale 2^32 (`encoding.PROBABILITY_BITS`).
"""
from __future__ import annotations

from typing import Sequence

import gmpy2
import numpy as np

from common.crypto import encoding, paillier
from common.metrics.lot import BlindPairs

PROBABILITY_BITS = encoding.PROBABILITY_BITS
HALF = 1 << (PROBABILITY_BITS - 1)


def product_weight(x: int, y: int) -> int:
    """round(x·y / 2^32): a product of two fixed-point probabilities back at their scale."""
    return (x * y + HALF) >> PROBABILITY_BITS


def vector_plaintexts(plan: BlindPairs, q: np.ndarray) -> list[int]:
    """Per member (rows of `q`, quantised; zeros for a member not held), its 2·`vector_cts`
    packed plaintexts in the block layout (`BlindPairs.blocks`): the delta block q_bh
    alone, then the weight block alone, 2^32·q_bh and 2^32·round(q_bh·q_bh'/2^32) per
    tail pair (the Test-Client raises the first to ΔỸ and multiplies the second in)."""
    layout = encoding.SlotLayout(plan.slot_bits, plan.slots)
    k, rest = plan.groups, plan.weight_slots
    out = []
    for row in q.tolist():
        row = [int(x) for x in row]
        weight = [x << PROBABILITY_BITS for x in row] + \
                 [product_weight(row[h], row[g]) << PROBABILITY_BITS for h, g in plan.tail_pairs]
        out += [layout.pack(block) for block in plan.blocks(row, [0] * rest)]
        out += [layout.pack(block) for block in plan.blocks([0] * k, weight)]
    return out


def cell_items(plan: BlindPairs, q: np.ndarray, masked: Sequence[Sequence[int]], masks: Sequence[int],
               cells: Sequence[tuple[int, int]], moment_pairs: Sequence[tuple[int, int]], pub: paillier.PublicKey,
               num_offset: int, den_offset: int) -> dict[int, list[list[int]]]:
    """The bucket sums the plaintext path would have formed, as `{stratum: [[item] per
    weight column]}` (one unit; `TesterSession._bucket_sums`' shape): the cells' columns,
    then the second moments'. `q` (joined members, k) quantised; `masked[a·S + s]` member
    a's decrypted slots for rank pair s (`BlindPairs.split` order); `masks[(a·S + s)·
    mask_cts + j]` its Enc(r) ciphertexts, j < k the tail groups', then the tail pairs'.
    `num_offset`, `den_offset`: the bit offsets of the cells' num and den slots in the
    Test-Client's packing."""
    n, n2 = pub.n, pub.n2
    k, strata, per = plan.groups, plan.strata, plan.mask_cts
    tails = {pair: i for i, pair in enumerate(plan.tail_pairs)}
    rows = q.tolist()
    members = range(len(rows))
    agg: dict[int, list[list[int]]] = {}
    for s in range(strata):
        parts = [plan.split(list(masked[a * strata + s])) for a in members]
        columns = []

        def item(plain: int, exponents: list[int], j: int) -> int:
            bases = [masks[(a * strata + s) * per + j] for a in members]
            removed = paillier.multi_exp(bases, exponents, n2)
            own = paillier.encrypt_chunk(n, pub.h, [plain % n])[0]
            return int(gmpy2.mpz(own) * gmpy2.invert(removed, n2) % n2)

        for g, h in cells:
            weights = [int(rows[a][g]) for a in members]
            num = sum(w * parts[a][0][h] for a, w in zip(members, weights))
            den = sum(w * parts[a][1][h] for a, w in zip(members, weights))
            columns.append([item((num << num_offset) + (den << den_offset), weights, h)])
        for c, d in moment_pairs:
            (g, h), (g2, h2) = cells[c], cells[d]
            t = tails[tuple(sorted((h, h2)))]
            weights = [product_weight(int(rows[a][g]), int(rows[a][g2])) for a in members]
            den = sum(w * parts[a][1][k + t] for a, w in zip(members, weights))
            columns.append([item(den << den_offset, weights, k + t)])
        agg[s] = columns
    return agg
