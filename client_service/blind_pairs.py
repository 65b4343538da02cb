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

from common.crypto import batch, encoding, paillier
from common.execution import parallel
from common.metrics.lot import BlindPairs


def member_part(plan: BlindPairs, tester: paillier.PublicKey, base: int, heads: np.ndarray, strata: np.ndarray,
                gaps: Sequence[int], tail_cts: Sequence[Sequence[int]],
                head_weights: Sequence[Sequence[int]]) -> tuple[bytes, list[int]]:
    """One range of the member table (module docstring), as an executor task: its members'
    masked sums Enc_T(z + r) (per member, rank pair and `vector_cts`, in that order,
    packed at the Tester's ciphertext width) and
    its share of the masks' totals, Π_a U_a^(r_asj) per rank pair s, slot j and weights
    ciphertext t, flat in that order (the range's members only: the shares of all ranges
    multiply into the totals, `paillier.add_encrypted`).

    `heads` (each row's head, a position within the range), `strata`, `gaps` (quantised,
    signed) and `tail_cts` (each row's tail vector: its delta block then its weight block,
    `vector_cts` each) describe the rows the range's members head; `head_weights` are the
    range's U_a (`weight_cts` each). The masks r (`sum_slots` values per member and rank
    pair) are drawn here and never leave the task. A row's term Enc_T(delta_b)^|ΔỸ| comes from the lanes (`batch.powmod_many`);
    a (member, rank pair)'s terms of negative gaps are multiplied apart and inverted once.
    The masks are encrypted with `base`, a randomizer base of our own for the Tester's key
    (`paillier.randomizer_base`): a Tester that announced a weak h cannot switch the
    rerandomisation of our sums off."""
    n2 = gmpy2.mpz(tester.n2)
    per, n_strata, count = plan.vector_cts, plan.strata, len(head_weights)
    cells = count * n_strata
    pos: list = [None] * (cells * per)
    neg: list = [None] * (cells * per)
    if len(heads):
        gaps = [int(d) for d in gaps]
        bits = max(1, max(abs(d) for d in gaps).bit_length())
        powers = batch.powmod_many([row[t] for row in tail_cts for t in range(per)],
                                   [abs(d) for d in gaps for _ in range(per)], tester.n2, bits)
        for i, (a, s, d) in enumerate(zip(heads.tolist(), strata.tolist(), gaps)):
            base_at = (a * n_strata + s) * per
            for t in range(per):
                weight = gmpy2.mpz(tail_cts[i][per + t])
                at = base_at + t
                pos[at] = weight if pos[at] is None else pos[at] * weight % n2
                if d:
                    into = pos if d > 0 else neg
                    into[at] = gmpy2.mpz(powers[i * per + t]) if into[at] is None else into[at] * powers[i * per + t] % n2
    sums = [1 if p is None else p if q is None else p * gmpy2.invert(q, n2) % n2 for p, q in zip(pos, neg)]
    del pos, neg
    masks = draw(plan.mask_bits, cells, plan.sum_slots)
    masked = paillier.ciphertexts_to_bytes(add_masks(sums, tester, sums_plaintexts(plan, masks), base),
                                           tester.ciphertext_bytes)
    del sums
    columns = [[masks[a * n_strata + s][j] for a in range(count)] for s in range(n_strata) for j in range(plan.sum_slots)]
    per_weight_ct = [batch.multi_exp_wide([u[t] for u in head_weights], columns, tester.n2)
                     for t in range(plan.weight_cts)]  # the same bases for every column: all at once
    shares = [per_weight_ct[t][c] for c in range(len(columns)) for t in range(plan.weight_cts)]
    return masked, shares


def member_ranges(heads: np.ndarray, n_members: int, parts: int) -> list[tuple[int, int, np.ndarray]]:
    """The member table cut into `parts` ranges [first, stop) with the rows each range's
    members head (indices into the rows, the order `member_part` reads them in)."""
    order = np.argsort(heads, kind="stable")
    sorted_heads = heads[order]
    out = []
    for chunk in parallel.split(range(n_members), parts):
        first, stop = chunk.start, chunk.stop
        lo, hi = np.searchsorted(sorted_heads, [first, stop])
        out.append((first, stop, order[lo:hi]))
    return out


def head_vectors(plan: BlindPairs, vectors: Sequence[int]) -> list[list[int]]:
    """Each member's encrypted head weights U_a (its last `weight_cts` ciphertexts)."""
    stride, first = plan.member_cts, 2 * plan.vector_cts
    return [list(vectors[a * stride + first:(a + 1) * stride]) for a in range(len(vectors) // stride)]


def draw(bits: int, count: int, length: int) -> list[list[int]]:
    """`count` lists of `length` values uniform below 2^bits."""
    return [[secrets.randbits(bits) for _ in range(length)] for _ in range(count)]


def add_masks(sums: Sequence[int], tester: paillier.PublicKey, plaintexts: Sequence[int], base: int) -> list[int]:
    """Enc_T(z + r) = z · Enc_T(r), rerandomised by Enc_T's fresh randomness drawn with
    `base`, our own randomizer base for the Tester's key (`member_part`)."""
    masks = paillier.encrypt_chunk(tester.n, base, list(plaintexts))
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
