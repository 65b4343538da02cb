"""The Tester's part of LOT's blind path (design §5.3, "The Tester blind to the pairs";
`common.metrics.lot`): its members' vectors under its own key, and the cells formed from
the Test-Client's masked sums without opening any member's.

With Enc_T(z + r)_as the Test-Client's masked sums of member a and rank pair s (one
value per slot j, `BlindPairs.sum_slots`) and w_a a head weight (p_ag, or
round(p_ag·p_ag'/2^32) for the second moments), the Tester forms the totals

    A_sw = Π_a Enc_T(z + r)_as^(w_a) = Enc_T(Σ_a w_a·(z + r)_asj, every j)

and decrypts them (its own key; each is Σ_a w_a·z plus Σ_a w_a·r, which hides it). The
Test-Client sends beside them B_sj = Enc_T(Σ_a w_a·r_asj + m_sjw, every w), from the
Tester's encrypted head weights and its own masks, and Enc(m) under its own key. So

    Enc(Σ_a w_a·z_asj) = Enc(A_sw[j] − B_sj[w]) · Enc(m_sjw):

for cell (g, h) of rank pair s, j = h (Σ ΔỸ·p_a·p_b, its num slot) and j = k + h (its
den slot) with w = g; for a second moment, j = 2k + its tail pair at the den slot with
its head weight; every p at the fixed-point scale 2^32 (`encoding.PROBABILITY_BITS`).
The Tester decrypts only these totals, never a member's sums.
"""
from __future__ import annotations

from typing import Sequence

import gmpy2
import numpy as np

from common.crypto import batch, encoding, paillier
from common.metrics.lot import BlindPairs

PROBABILITY_BITS = encoding.PROBABILITY_BITS
HALF = 1 << (PROBABILITY_BITS - 1)


def product_weight(x: int, y: int) -> int:
    """round(x·y / 2^32): a product of two fixed-point probabilities back at their scale."""
    return (x * y + HALF) >> PROBABILITY_BITS


def head_weights(plan: BlindPairs, q: np.ndarray) -> list[list[int]]:
    """Per member (rows of `q`, quantised), its `weights` head weights: q_ag per g, then
    round(q_ag·q_ag'/2^32) per head pair."""
    out = []
    for row in q.tolist():
        row = [int(x) for x in row]
        out.append(row + [product_weight(row[g], row[h]) for g, h in plan.head_pairs])
    return out


def vector_plaintexts(plan: BlindPairs, q: np.ndarray) -> list[int]:
    """Per member (rows of `q`, quantised; zeros for a member not held), its
    `member_cts` packed plaintexts: the delta block q_bh alone and the weight block alone
    (2^32·q_bh, 2^32·round(q_bh·q_bh'/2^32) per tail pair) in the sums layout (the
    Test-Client raises the first to ΔỸ and multiplies the second in), then its head
    weights in the weights layout."""
    sums = encoding.SlotLayout(plan.slot_bits, plan.slots)
    totals = encoding.SlotLayout(plan.total_bits, plan.total_slots)
    k = plan.groups
    out = []
    for row, weights in zip(q.tolist(), head_weights(plan, q)):
        row = [int(x) for x in row]
        weight = [x << PROBABILITY_BITS for x in row] + \
                 [product_weight(row[h], row[g]) << PROBABILITY_BITS for h, g in plan.tail_pairs]
        out += [sums.pack(block) for block in plan.sums_blocks(row)]
        out += [sums.pack(block) for block in plan.sums_blocks([0] * k + weight)]
        out += [totals.pack(block) for block in plan.weight_blocks(weights)]
    return out


def weighted_share(plan: BlindPairs, sums: Sequence[int], weights: Sequence[Sequence[int]], modulus: int) -> list[int]:
    """One range of our members' share of the totals A_sw (module docstring), as an
    executor task: Π_a Enc_T(z + r)_ast^(w_a) per rank pair s, head weight w and
    ciphertext t, flat in that order, over the range's members only (the shares of all
    ranges multiply into the totals, `paillier.add_encrypted`). `sums` are the range's
    masked sums (per member, rank pair and `vector_cts`), `weights` its head weights
    (`head_weights`, below 2^32: the lanes' exponents, `batch.multi_exp_many`)."""
    per, strata = plan.vector_cts, plan.strata
    stride = strata * per
    columns = [[w[c] for w in weights] for c in range(plan.weights)]
    out = []
    for s in range(strata):
        per_ct = [batch.multi_exp_many([sums[a * stride + s * per + t] for a in range(len(weights))], columns, modulus)
                  for t in range(per)]
        out += [per_ct[t][c] for c in range(plan.weights) for t in range(per)]
    return out


def decoded(plan: BlindPairs, key: paillier.PrivateKey, cts: Sequence[int], layout: str) -> list[int]:
    """Totals decrypted in full and unpacked: the sums layout's slots (`layout` "sums",
    cut to `sum_slots`) or the weights layout's (cut to `weights`); EncodingOverflowError
    for a plaintext outside its slot plan."""
    bits, slots, keep = (plan.slot_bits, plan.slots, plan.sum_slots) if layout == "sums" else \
        (plan.total_bits, plan.total_slots, plan.weights)
    unpack = encoding.SlotLayout(bits, slots).unpack
    return [x for m in key.decrypt_signed(cts) for x in unpack(m)][:keep]


def cell_items(items: Sequence[tuple], groups: int, totals: Sequence[Sequence[int]], masked: Sequence[Sequence[int]],
               masks: Sequence[int], pub: paillier.PublicKey, num_offset: int, den_offset: int) -> list[int]:
    """One rank pair's items (`Lot.blind_items` order) under the Test-Client's key:
    `totals[w]` the decoded A_sw, `masked[j]` the decoded B_sj, `masks[i]` its Enc(m) per
    item; `num_offset`, `den_offset` the bit offsets of the cells' num and den slots in
    its packing."""
    n, n2 = pub.n, pub.n2
    out = []
    for (kind, x, y), mask in zip(items, masks):
        if kind == "cell":
            g, h = x, y
            num = totals[g][h] - masked[h][g]
            den = totals[g][groups + h] - masked[groups + h][g]
            plain = (num << num_offset) + (den << den_offset)
        else:
            t, w = x, y
            plain = (totals[w][2 * groups + t] - masked[2 * groups + t][w]) << den_offset
        own = paillier.encrypt_chunk(n, pub.h, [plain % n])[0]
        out.append(int(gmpy2.mpz(own) * mask % n2))
    return out


def rank_pair_items(plan: BlindPairs, key: paillier.PrivateKey, pub: paillier.PublicKey, layout, items: Sequence[tuple],
                    totals: Sequence[Sequence[Sequence[int]]], masked_totals: Sequence[int],
                    item_masks: Sequence[int]) -> dict[int, list[list[int]]]:
    """Per rank pair s, the items the plaintext path would have formed, as its bucket
    sums agg[s][item][t] (module docstring): `totals[s]` the weighted totals A_sw of the
    masked sums (per weight, under our key), `masked_totals` the Test-Client's B_sj
    (per rank pair and slot, under our key), `item_masks` its Enc(m) per rank pair and
    item (under its key, `pub`); an item sits in the ciphertext of its den slot, every
    other ciphertext of the row is Enc(0). A total that does not decode is an
    `EncodingOverflowError`."""
    _, num_slot = layout.position(0)
    ct, den_slot = layout.position(1)
    bits, w = layout.slot_bits, plan.weight_cts
    per_row = plan.sum_slots * w
    agg = {}
    for s, per_weight in enumerate(totals):
        row = masked_totals[s * per_row:(s + 1) * per_row]
        masked = [decoded(plan, key, row[j * w:(j + 1) * w], "weights") for j in range(plan.sum_slots)]
        sums_of = [decoded(plan, key, cts, "sums") for cts in per_weight]
        column = cell_items(items, plan.groups, sums_of, masked, item_masks[s * len(items):(s + 1) * len(items)],
                            pub, num_slot * bits, den_slot * bits)
        agg[s] = [[item if t == ct else 1 for t in range(layout.n_ciphertexts)] for item in column]
    return agg
