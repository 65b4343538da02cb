"""The Test-Client's part of LOT's blind path (design §5.3, "The Tester blind to the
pairs"; `common.metrics.lot`): per member and rank pair, the sums of its rows over the
Tester's encrypted vectors, masked, and the masks under its own key.

For member a and rank pair s, over its rows (a, b) there with gap ΔỸ (fixed point):

    z_as = Π Enc_T(delta_b)^ΔỸ · Enc_T(weight_b)      (every slot of the vector)

returned as Enc_T(z + r) = z_as · Enc_T(r), r uniform below 2^mask_bits per slot
(`BlindPairs.mask_bits`: STATISTICAL_BITS above the largest |z|), with Enc(r) under our
key: per tail group h, r's delta and weight slots h at the cells' num and den slots; per
tail pair, its weight slot at the den slot. A member with no row in s gets Enc_T(r) alone.
"""
from __future__ import annotations

import secrets
from typing import Sequence

import gmpy2
import numpy as np

from common.crypto import encoding, paillier
from common.metrics.lot import BlindPairs


def masked_sums(plan: BlindPairs, vectors: Sequence[int], tester: paillier.PublicKey, n_members: int,
                heads: np.ndarray, tails: np.ndarray, strata: np.ndarray, gaps: np.ndarray) -> list[int]:
    """Per member (the member table's order) and rank pair, its `vector_cts` sums z_as
    (module docstring), unmasked: member b's vector is `vectors[2·per·b:2·per·(b + 1)]`,
    the delta block then the weight block (`BlindPairs.blocks`, per = vector_cts); each
    row's head, tail (member positions), rank pair and quantised gap."""
    n2 = gmpy2.mpz(tester.n2)
    per = plan.vector_cts
    vec = [gmpy2.mpz(v) for v in vectors]
    sums: list = [None] * (n_members * plan.strata * per)
    for a, b, s, d in zip(heads.tolist(), tails.tolist(), strata.tolist(), gaps.tolist()):
        base = (a * plan.strata + s) * per
        for t in range(per):
            x = gmpy2.powmod(vec[2 * per * b + t], int(d), n2) * vec[2 * per * b + per + t] % n2
            sums[base + t] = x if sums[base + t] is None else sums[base + t] * x % n2
    return [1 if x is None else int(x) for x in sums]


def draw_masks(plan: BlindPairs, count: int) -> list[list[int]]:
    """`count` masks: per (member, rank pair), one value below 2^mask_bits per slot of its
    `vector_cts` ciphertexts."""
    return [[secrets.randbits(plan.mask_bits) for _ in range(plan.vector_cts * plan.slots)] for _ in range(count)]


def mask_plaintexts(plan: BlindPairs, masks: Sequence[Sequence[int]]) -> list[int]:
    """The masks packed as the Tester's plaintexts (`vector_cts` per mask)."""
    layout = encoding.SlotLayout(plan.slot_bits, plan.slots)
    s = plan.slots
    return [layout.pack(list(r[t * s:(t + 1) * s])) for r in masks for t in range(plan.vector_cts)]


def own_mask_plaintexts(plan: BlindPairs, masks: Sequence[Sequence[int]], num_offset: int,
                        den_offset: int) -> list[int]:
    """The masks as our own plaintexts (`mask_cts` per mask): per tail group h, r of delta
    slot h at `num_offset` and of weight slot h at `den_offset`; per tail pair, its weight
    slot at `den_offset` (module docstring)."""
    out = []
    k = plan.groups
    for r in masks:
        delta, weight = plan.split(list(r))
        out += [(delta[h] << num_offset) + (weight[h] << den_offset) for h in range(k)]
        out += [weight[k + t] << den_offset for t in range(len(plan.tail_pairs))]
    return out


def add_masks(sums: Sequence[int], tester: paillier.PublicKey, plaintexts: Sequence[int]) -> list[int]:
    """Enc_T(z + r) = z · Enc_T(r), rerandomised by Enc_T's fresh randomness."""
    masks = paillier.encrypt_chunk(tester.n, tester.h, list(plaintexts))
    n2 = tester.n2
    return [int(gmpy2.mpz(z) * m % n2) for z, m in zip(sums, masks)]
