"""The Test-Client's part of LOT's blind path (design §5.3, "The Tester blind to the
pairs"; `common.metrics.lot`): per member and rank pair, the sums of its rows over the
Tester's encrypted vectors, masked; and per rank pair the totals that take the masks
out again, masked in their turn.

For member a and rank pair s, over its rows (a, b) there with gap ΔỸ (fixed point):

    z_as = Π Enc_T(delta_b)^ΔỸ · Enc_T(weight_b)      (every slot j of the sums layout)

returned as Enc_T(z + r) = z_as · Enc_T(r), r uniform below 2^mask_bits per slot, so that
the Tester, which holds the key, reads nothing of z (a member with no row in s sends
Enc_T(r) alone). Per rank pair s and slot j, from the Tester's encrypted head weights
U_a = Enc_T(w_a):

    B_sj = Π_a U_a^(r_asj) · Enc_T(m_sj) = Enc_T(Σ_a w_a·r_asj + m_sjw, every w)

with m uniform below 2^total_mask_bits, and Enc(m) under our own key per released item
(`Lot.blind_items`), so that the Tester can form each item without learning it
(`tester_service.blind_pairs`).
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
    (module docstring), unmasked: member b's vector is `vectors[b·member_cts:]`, its
    delta block then its weight block (`BlindPairs.member_cts`); each row's head, tail
    (member positions), rank pair and quantised gap."""
    n2 = gmpy2.mpz(tester.n2)
    per, stride = plan.vector_cts, plan.member_cts
    vec = [gmpy2.mpz(v) for v in vectors]
    sums: list = [None] * (n_members * plan.strata * per)
    for a, b, s, d in zip(heads.tolist(), tails.tolist(), strata.tolist(), gaps.tolist()):
        base = (a * plan.strata + s) * per
        for t in range(per):
            x = gmpy2.powmod(vec[stride * b + t], int(d), n2) * vec[stride * b + per + t] % n2
            sums[base + t] = x if sums[base + t] is None else sums[base + t] * x % n2
    return [1 if x is None else int(x) for x in sums]


def head_vectors(plan: BlindPairs, vectors: Sequence[int]) -> list[list[int]]:
    """Each member's encrypted head weights U_a (its last `weight_cts` ciphertexts)."""
    stride, first = plan.member_cts, 2 * plan.vector_cts
    return [list(vectors[a * stride + first:(a + 1) * stride]) for a in range(len(vectors) // stride)]


def draw(bits: int, count: int, length: int) -> list[list[int]]:
    """`count` lists of `length` values uniform below 2^bits."""
    return [[secrets.randbits(bits) for _ in range(length)] for _ in range(count)]


def add_masks(sums: Sequence[int], tester: paillier.PublicKey, plaintexts: Sequence[int]) -> list[int]:
    """Enc_T(z + r) = z · Enc_T(r), rerandomised by Enc_T's fresh randomness."""
    masks = paillier.encrypt_chunk(tester.n, tester.h, list(plaintexts))
    n2 = tester.n2
    return [int(gmpy2.mpz(z) * m % n2) for z, m in zip(sums, masks)]


def sums_plaintexts(plan: BlindPairs, masks: Sequence[Sequence[int]]) -> list[int]:
    """Masks r (`sum_slots` values each) packed in the sums layout (`vector_cts` each)."""
    layout = encoding.SlotLayout(plan.slot_bits, plan.slots)
    return [layout.pack(block) for r in masks for block in plan.sums_blocks(r)]


def totals_plaintexts(plan: BlindPairs, m: Sequence[Sequence[int]]) -> list[int]:
    """Masks m_sj (`weights` values each) packed in the weights layout (`weight_cts` each)."""
    layout = encoding.SlotLayout(plan.total_bits, plan.total_slots)
    return [layout.pack(block) for row in m for block in plan.weight_blocks(row)]


def own_mask_plaintexts(items: Sequence[tuple], groups: int, m: Sequence[Sequence[int]], num_offset: int,
                        den_offset: int) -> list[int]:
    """One rank pair's item masks as our own plaintexts (`Lot.blind_items` order):
    `m[j][w]` its m_sjw; a cell (g, h) m_s,h,g at `num_offset` and m_s,k+h,g at
    `den_offset`; a second moment (t, w) m_s,2k+t,w at `den_offset`."""
    out = []
    for kind, x, y in items:
        if kind == "cell":
            g, h = x, y
            out.append((m[h][g] << num_offset) + (m[groups + h][g] << den_offset))
        else:
            out.append(m[2 * groups + x][y] << den_offset)
    return out
