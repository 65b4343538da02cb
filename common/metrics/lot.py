"""LOT, the listwise outcome test (design §5.3; paper eqs. 7-8, section 5.2).

Dataset: `query_id, member_id, rank, relevance` (ranks 1..n within a query; a member
appears at most once per query, in any number of queries). The Test-Client forms, in
plaintext, one row per adjacent pair of positions (r, r+1) of every list: both
members' ids, the signed difference ΔỸ = Ỹ_r − Ỹ_{r+1} and the rank pair (a plaintext
stratum). Ỹ = relevance / IDCG(query) (option `idcg`: gain 2^rel − 1, discount
log2(position + 1), as in MQOS-NDCG) or the relevance as given (option `raw`, for
scores already normalised; |relevance| <= 2^20). Queries with one item have no pair
and, in `idcg` mode, queries whose relevances are all 0 have no Ỹ: both are skipped
and counted (`info`).

The Tester weights a row for the ordered group pair (a, b) by p_ra·p_(r+1)b. Cells:
every ordered pair of different groups (same-group pairs with the parameter
`same_group_pairs`), per rank pair and pooled over rank pairs:
LOT_ab = Σ ΔỸ·p_ra·p_(r+1)b / Σ p_ra·p_(r+1)b. The bootstrap resamples whole
queries: the Test-Client maps each query to a random bucket, so a query's pairs stay
together and the Tester never sees a query id. Verdict: a cell significantly below 0
(the lower-ranked member measurably more relevant) is a disparity (rule
"negative_cells"). Usually run on the coarsened hsm/non_hsm split.

**Declared bounds.** What drives LOT's noise is the most one row's ΔỸ can be:
* `idcg`: 0 ≤ Ỹ_i = rel_i / IDCG ≤ R/(2^R − 1) for a query whose largest relevance is
  R (the top item alone gives IDCG ≥ 2^R − 1), which is at most 1 for whole-number
  grades (2^R − 1 ≥ R for whole R ≥ 1), so |ΔỸ| ≤ 1: nothing to declare. Fractional
  grades below 1 can reach Ỹ = 1/ln 2 (x/(2^x − 1) falls from 1/ln 2 at 0); their
  gaps are clipped to [−1, 1] before encryption and counted (`info["rows_clipped"]`),
  or refused with `out_of_range` refuse;
* `raw`: the relevances' range [LO, HI] is declared (`relevance_range`,
  `--relevance-range LO:HI`; default 0:1, scores already normalised); the Test-Client
  clips every relevance into it before differencing, counting the rows clipped
  (`info["rows_clipped"]`, a count over its own rows before the join), or refuses
  (`out_of_range` refuse); then |ΔỸ| ≤ HI − LO.

**Sensitivity** (`tester_service.release`; design §8.3). A row's weight for cell (a, b) is
p_ra·p_(r+1)b. Replacing one member's vector p by p' (||Δp||₂ ≤ √2) changes, for each
row it is in, the cells (a, b) by Δp_a·p_(r+1)b·ΔỸ (or p_ra·Δp_b·ΔỸ): over all cells of
that row's stratum an L2 change of at most ||Δp||₂·||p_other||₂·|ΔỸ| ≤ √2·bound
(||p_other||₂ ≤ 1). The released items are the per-rank-pair cells only (the pooled
cells are their sums, formed by the Tester: post-processing, no noise of their own),
so a member with n_is rows in rank pair s moves them by an L2 norm of at most
√2·bound·sqrt(Σ_s n_is²). With at most c rows per member (below) that is at most
√2·bound·c, reached by a member at rank 1 of c lists (all c rows in rank pair 1-2), so
`Metric.slot_sensitivity` multiplies the bound by c, the cap the Tester declares,
never by a count the Test-Client states or the Tester reads off the data; the noisy
sizes that decide suppression (`tester_service.release`) are sized by the same c.

**Rows per member** (design §8.3). A member may be in any number of lists, and each
row it is in moves the cells: the Tester's audit spec declares c, the most rows one
member may be in (`rows_per_member`, `--metric-param rows_per_member=C`; default
`DEFAULT_ROWS_PER_MEMBER` = 4: a member inside two lists, or at an end of four), which
reaches the Test-Client with the other parameters and is checked among the value bounds
of its HelloAck. The Test-Client keeps its rows within it before anything is encrypted
(`rows_within_cap`): its rows in order (the lists in the order their query ids first
appear in the dataset, each from its top rank down), a row kept only while both of its
members are still below c, the others dropped and counted (`info["rows_over_cap"]`, a
count over its own rows before the join, shown beside the result). The noise's sd grows
in proportion to c: declare about the most rows members really have (`ppre synth`'s
lists put a member in 2 lists, up to 4 rows: the default; one list per member, as in
the paper's validation data, needs c = 2 and halves the noise), and raise it when the
result reports many rows dropped. Where the Tester sees the rows (without the release
controls) it counts them itself and refuses a table with a member above c
(`ProtocolError`); on the blind path (below) it cannot, as it cannot check encrypted
values: a Test-Client that exceeds c there is out of this threat model, as one that
exceeds the value bounds is (docs/threat-model.md, "Declared value bounds").

**Interval under release noise** (`common.stats.moments`, design §8.4). Released: the cells'
sums per rank pair (as above) and, per rank pair s, the second moments of its cells
S_cc' = Σ_i w_ci·w_c'i over its rows (one item per pair of cells c ≤ c' on the weights
w_c·w_c', at the cells' scale; above `FULL_MOMENTS_CELLS` cells the diagonal alone,
which only widens the simultaneous band). A row's "one" component is 1, so these are
sums of the Tester's own weights over the joined rows, released under encryption with
the second moments' noise σ_m: per row the vector w of its cells has ||Δw|| ≤ ||Δp||
and its outer product moves by at most 2·||Δw|| (the pair items' PAIR_FACTOR, with the
same L2 count over rank pairs as the cells). The delta method
``Var(Num_c − R_c·Den_c) = σ_s²·S_cc`` then needs the spread of the gaps per rank pair,
σ_s² = Σ (ΔỸ − mean_s)²/n_s over all the Test-Client's rows of rank pair s, which it
sends with its dataset facts under this release only (`info["gap_spread"]`,
`stated_facts`, validated; the Tester learns these nine numbers of the Test-Client's
table, design §9.1; the spread around the rank pair's mean rather than each cell's own
only widens the interval). Each rank pair is
one family of `common.stats.moments` whose "groups" are its cells, drawn independently of the
others; a pooled cell's draws are the sums of its rank pairs' draws, as its release is
the sum of theirs. Rows of one query in neighbouring rank pairs share a member's
relevance with opposite signs (ΔỸ_r and ΔỸ_(r+1) both hold Ỹ_(r+1)), so their
covariance, taken as 0, is mostly negative: the pooled interval errs wide. Measured:
`bench/bench_intervals.py --metric lot` (bench/RESULTS.md).

**The Tester blind to the pairs** (design §5.3; under the release controls, which is when
the interval comes from second moments). A row names two members, so rows that reach the
Tester with both ids chain into each list and give every member's ranks, whatever hides
the rank pair. Under the controls no row reaches it. The Test-Client sends each of its
members once (`wire.member_points`); the Tester answers each, under a Paillier key of
its own (zeros for a member it does not hold), with its delta block p_bh and its weight
block 2^32·p_bh, 2^32·p_bh·p_bh' (the tail pairs the second moments need), and its head
weights w_a (p_ag, and p_ag·p_ag' for the head pairs) (`BlindPairs`). The Test-Client
forms, per member a and rank pair s, z_as = Π over its rows (a, b) in s of
Enc_T(delta_b)^ΔỸ · Enc_T(weight_b) and returns Enc_T(z + r) for every member in the
member table's order (r per slot, `STATISTICAL_BITS` wider than any z: statistically
hiding, so a member that heads no row of s looks like any other; Enc_T(r) drawn with a
randomizer base of the Test-Client's own, so that a Tester announcing a weak h cannot
read which sums are products of its own vectors); then per rank pair the masks' totals Enc_T(Σ_a w_a·r + m), from the Tester's encrypted head weights, and
Enc(m) per released item under its own key. The Tester multiplies the members' sums by
their head weights under its key (A = Enc_T(Σ_a w_a·(z + r))), decrypts the totals
alone, and forms each item as Enc(A − (Σ_a w_a·r + m)) · Enc(m) = Enc(Σ_rows p_ag·p_bh·
(ΔỸ, 1)): the items the plaintext path would have formed, exactly (the second moments up
to rounding), with the same noise, masking and finish (`tester_service.blind_pairs`,
`client_service.blind_pairs`). The Tester opens the vectors of members it holds (it
learns the intersection, inherent to the design) and never sees a row, a pair or a rank,
nor decrypts any member's sums; the Test-Client sees only ciphertexts under the Tester's
key. It cannot count the rows per member here, and needs no count: the noise is sized
from the cap c (above), which both parties read from the audit's parameters; the masks r
are sized from it too (a member's sums in one rank pair fold at most c rows:
`BlindPairs.derive`). The Test-Client states only the gaps' spreads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from common.crypto.masking import STATISTICAL_BITS
from common.errors import InputError
from common.metrics.base import (OUT_OF_RANGE_PARAM, PROBABILITY_BITS, SECOND_MOMENTS, Cell, ClientRows, Component,
                                 Item, Metric, Param, Plan, bounded_column, boolean, finite_column, positive_int,
                                 value_range)
from common.metrics.ranking import lot_rows, ranked_lists

#: raw relevances may be declared up to this magnitude (differences encoded with 32 fractional bits)
MAX_RAW_RELEVANCE = float(1 << 20)
VALUE_BITS = 32
#: the raw relevances' range when none is declared: scores already normalised
DEFAULT_RELEVANCE_RANGE = (0.0, 1.0)
#: |ΔỸ| in idcg mode (module docstring: whole-number grades never exceed it)
IDCG_GAP_BOUND = 1.0
#: the Test-Client's fact the interval under release noise reads: the spread of ΔỸ per rank pair
SPREAD_INFO = "gap_spread"
#: the largest spread a gap can have: (2·2^20)² for raw relevances at their widest range
MAX_GAP_SPREAD = (2.0 * MAX_RAW_RELEVANCE) ** 2
#: up to this many cells per rank pair the second moments hold every pair of cells, above
#: it the diagonal alone (6 groups: 30 cells, 465 pairs against 30 items)
FULL_MOMENTS_CELLS = 6
#: a probability's fixed-point scale (2^32): a cell's weight, a product of two, is at its square
PAIR_WEIGHT_SCALE = float(1 << PROBABILITY_BITS)
#: the rows one member may be in when none is declared (`rows_per_member`, module docstring
#: "Rows per member"): two lists, each with the member inside (a head and a tail row)
DEFAULT_ROWS_PER_MEMBER = 4
#: the most rows per member an operator may declare
MAX_ROWS_PER_MEMBER = 1 << 20
#: the Test-Client's count of the rows it dropped to keep every member within the cap
OVER_CAP_INFO = "rows_over_cap"


#: the fewest members in one range of the member table on the blind path: below about
#: this the lanes' multi-exponentiation spends more on its buckets than on its bases
#: (1.3 µs per base, pass and exponent bit over 2,500-16,000 bases, 1.7-3.3 µs over
#: 625-1,250 on this project's 2-core IFMA machine)
RANGE_MEMBERS = 2500


@dataclass(frozen=True)
class BlindPairs:
    """The slot plan of the blind path (module docstring, "The Tester blind to the pairs"),
    which both parties derive once the member table is known: `groups` (k), `strata` (the
    rank pairs), `tail_pairs` (the (h, h') whose products the second moments need on the
    tail side) and `head_pairs` (the (g, g') of their weights on the head side).

    Two layouts of signed slots under the Tester's key (it decrypts only totals, in full:
    `PrivateKey.decrypt_signed`). The *sums* layout (`slot_bits`, `slots`): a member's
    delta block (k slots), then its weight block (k + len(tail_pairs)), the `sum_slots`
    values j of one (member, rank pair), each masked below 2^mask_bits and wide enough for
    the Tester's weighted total over all members. The *weights* layout (`total_bits`,
    `total_slots`): a member's head weights, p_ag for each g then round(p_ag·p_ag'/2^32)
    per head pair (`weights` values w), and the Test-Client's masked totals
    Σ_a w_a·r_asj + m_sjw, m below 2^total_mask_bits."""

    groups: int
    strata: int
    tail_pairs: tuple[tuple[int, int], ...]
    head_pairs: tuple[tuple[int, int], ...]
    mask_bits: int
    slot_bits: int
    slots: int
    total_mask_bits: int
    total_bits: int
    total_slots: int

    @classmethod
    def derive(cls, groups: int, strata: int, tail_pairs, head_pairs, *, rows_per_member: int, n_members: int,
               gap_bound: float, tester_modulus_bits: int) -> "BlindPairs":
        """r `STATISTICAL_BITS` wider than a member's sums in one rank pair, which fold at
        most `rows_per_member` rows (the cap both parties read from the audit's parameters;
        module docstring, "Rows per member"), each slot at most max(gap, 1)·2^32·2^32; the
        sums' slots wide enough for Σ_a w_a·(z + r) over all members (w ≤ 2^32); m
        `STATISTICAL_BITS` wider than that; as many slots per ciphertext as fit below a
        third of the Tester's n."""
        delta = int(math.ceil(gap_bound * (1 << VALUE_BITS))) + 1
        z_bits = (max(1, rows_per_member) * max(delta, 1 << VALUE_BITS) * (1 << PROBABILITY_BITS)).bit_length()
        mask_bits = z_bits + STATISTICAL_BITS
        total = mask_bits + PROBABILITY_BITS + max(1, n_members).bit_length() + 1
        capacity = tester_modulus_bits - 3
        slot_bits, total_bits = total + 2, total + STATISTICAL_BITS + 2
        if capacity // total_bits < 1:
            raise ValueError(f"the Tester's key of {tester_modulus_bits} bits cannot hold a slot of {total_bits}")
        return cls(groups, strata, tuple(tail_pairs), tuple(head_pairs), mask_bits, slot_bits,
                   capacity // slot_bits, total + STATISTICAL_BITS, total_bits, capacity // total_bits)

    @staticmethod
    def range_count(n_members: int, chunks: int) -> int:
        """Into how many ranges the parties cut the member table for their executor tasks
        (`client_service.blind_pairs.member_part`, `tester_service.blind_pairs.weighted_share`):
        `chunks`, but no range under `RANGE_MEMBERS` members."""
        return max(1, min(chunks, n_members // RANGE_MEMBERS))

    @property
    def sum_slots(self) -> int:
        """The values j of one (member, rank pair): Σ ΔỸ·p_bh, then 2^32·Σ p_bh, then
        2^32·Σ round(p_bh·p_bh'/2^32) per tail pair."""
        return 2 * self.groups + len(self.tail_pairs)

    @property
    def vector_cts(self) -> int:
        """Tester ciphertexts of the sums layout: a member's vector is two of them (its
        delta block alone, its weight block alone), a (member, rank pair)'s masked sums one."""
        return -(-self.sum_slots // self.slots)

    @property
    def weights(self) -> int:
        return self.groups + len(self.head_pairs)

    @property
    def weight_cts(self) -> int:
        """Tester ciphertexts of the weights layout (a member's head weights, one total)."""
        return -(-self.weights // self.total_slots)

    @property
    def member_cts(self) -> int:
        """`MEMBER_VECTORS`' ciphertexts per member: delta block, weight block, head weights."""
        return 2 * self.vector_cts + self.weight_cts

    def sums_blocks(self, values: Sequence[int]) -> list[list[int]]:
        """`sum_slots` values cut into the sums layout's ciphertexts (zeros after the last)."""
        return _cut(values, self.slots, self.vector_cts)

    def weight_blocks(self, values: Sequence[int]) -> list[list[int]]:
        """`weights` values cut into the weights layout's ciphertexts (zeros after the last)."""
        return _cut(values, self.total_slots, self.weight_cts)


def _cut(values: Sequence[int], slots: int, count: int) -> list[list[int]]:
    padded = list(values) + [0] * (slots * count - len(values))
    return [padded[t * slots:(t + 1) * slots] for t in range(count)]


def gap_spreads(delta: np.ndarray, rank_pair: np.ndarray, n_pairs: int) -> list[float]:
    """Per rank pair, the spread of the gaps around their mean, Σ (ΔỸ − mean)²/n over all
    the Test-Client's rows of that rank pair (module docstring, "Interval under release
    noise")."""
    counts = np.maximum(np.bincount(rank_pair, minlength=n_pairs), 1).astype(np.float64)  # empty: spread 0
    means = np.bincount(rank_pair, weights=delta, minlength=n_pairs) / counts
    spread = np.bincount(rank_pair, weights=delta * delta, minlength=n_pairs) / counts - means ** 2
    return [round(float(x), 9) for x in np.clip(spread, 0.0, None)]


def rows_within_cap(higher, lower, cap: int) -> np.ndarray:
    """Which rows to keep so that no member is in more than `cap` of them (module
    docstring, "Rows per member"): the rows in their order (the lists in the order their
    query ids first appear in the dataset, each from its top rank down), a row kept only
    while both its members are still below the cap. Deterministic: the same table keeps
    the same rows."""
    import pandas as pd
    higher, lower = np.asarray(higher, dtype=object), np.asarray(lower, dtype=object)
    codes, _ = pd.factorize(pd.Series(np.concatenate([higher, lower]), dtype=object))
    heads, tails = codes[:len(higher)], codes[len(higher):]
    keep = np.ones(len(heads), dtype=bool)
    if not len(heads) or int(np.bincount(codes).max()) <= cap:  # nobody above the cap: every row
        return keep
    used = np.zeros(int(codes.max()) + 1, dtype=np.int64)
    for r, (a, b) in enumerate(zip(heads.tolist(), tails.tolist())):
        if used[a] < cap and used[b] < cap:
            used[a] += 1
            used[b] += 1
        else:
            keep[r] = False
    return keep


def _relevance_range(text: str) -> tuple[float, float]:
    lo, hi = value_range(text)
    if max(abs(lo), abs(hi)) > MAX_RAW_RELEVANCE:
        raise ValueError(f"must lie within ±{MAX_RAW_RELEVANCE:g}")
    return lo, hi


class Lot(Metric):
    name = "lot"
    description = "listwise outcome test: signed relevance gaps between adjacent ranks, per group pair"
    options = ("idcg", "raw")
    option_help = "idcg (default): Ỹ = relevance / IDCG(query); raw: Ỹ = relevance"
    params = (Param("same_group_pairs", "also report same-group cells (a, a): true or false", boolean, False),
              Param("relevance_range", "raw: LO:HI, the relevances' possible range; relevances outside it are "
                    "clipped (or refused: out_of_range); the release noise is sized from HI − LO (default 0:1)",
                    _relevance_range, DEFAULT_RELEVANCE_RANGE),
              Param("rows_per_member", f"c: the most rows (adjacent pairs) one member may be in, about twice "
                    f"the lists it is in; rows beyond it are dropped (counted: rows_over_cap); the release noise "
                    f"grows in proportion to c (default {DEFAULT_ROWS_PER_MEMBER})",
                    positive_int(MAX_ROWS_PER_MEMBER), DEFAULT_ROWS_PER_MEMBER),
              OUT_OF_RANGE_PARAM)
    numeric_columns = ("rank", "relevance")
    text_columns = ("query_id",)
    unique_ids = False
    n_ids = 2
    resampling = "unit"
    strata_cells = True
    uses_strata = True
    moment_interval = True
    stated_facts = (SPREAD_INFO,)
    verdict_rule = "negative_cells"
    #: under the release controls the Tester never sees a row (module docstring)
    blind_pairs = True

    def tester_blind(self, params) -> bool:
        """The blind path (module docstring): under the release controls, when the
        interval comes from second moments."""
        return self.blind_pairs and bool(params.get(SECOND_MOMENTS))

    def row_strata(self, params) -> bool:
        """No stratum beside a row on the blind path (no row at all reaches the Tester)."""
        return not self.tester_blind(params)

    member_rows_cap_name = "rows_per_member"

    def member_rows_cap(self, params) -> int:
        """c, the audit's `rows_per_member` (module docstring, "Rows per member"): the
        noise's m and its L2 count over the rank pairs alike (a member at rank 1 of c
        lists has all its c rows in one rank pair)."""
        return int(params.get("rows_per_member") or DEFAULT_ROWS_PER_MEMBER)

    def withheld_by_size(self, plan, row, min_size, params) -> list[int]:
        """On the blind path the Tester knows no cell's size: a cell (per rank pair or
        pooled) whose noised size, its released denominator Σ p_a·p_b (at 2^(64 + 32)),
        is below the controls' minimum is withheld by whoever finishes, from the release
        itself (no draw of its own: the size is already charged)."""
        if not self.tester_blind(params) or not min_size > 0:
            return []
        scale = float(1 << (2 * PROBABILITY_BITS + VALUE_BITS))
        return sorted({cell.item for cell in plan.cells if cell.kind == "pair"
                       and not float(row[cell.item][cell.den_slot]) / scale >= min_size})

    def tail_pairs(self, groups, params) -> tuple[tuple[int, int], ...]:
        """The tail groups (h, h') whose products p_bh·p_bh' the second moments of
        `moment_plan` need, each once (h ≤ h')."""
        return self._moment_group_pairs(groups, params, 1)

    def head_pairs(self, groups, params) -> tuple[tuple[int, int], ...]:
        """The head groups (g, g') whose weights round(p_ag·p_ag'/2^32) the second moments
        need, each once (g ≤ g')."""
        return self._moment_group_pairs(groups, params, 0)

    def _moment_group_pairs(self, groups, params, end: int) -> tuple[tuple[int, int], ...]:
        """The pairs of one end's groups (0 the head, 1 the tail) over `moment_plan`'s pairs of cells."""
        cells = self.cell_pairs(groups, params)
        return tuple(sorted({tuple(sorted((cells[c][end], cells[d][end]))) for c, d in self.moment_pairs(len(cells))}))

    def blind_plan(self, groups, strata: int, option, params, *, n_members: int,
                   tester_modulus_bits: int) -> BlindPairs:
        """The blind path's slot plan (`BlindPairs.derive`), from what both parties know
        alike: the groups, the rank pairs, the audit's parameters (the cap on rows per
        member among them), the member table's size and the Tester's key."""
        return BlindPairs.derive(len(groups), strata, self.tail_pairs(groups, params), self.head_pairs(groups, params),
                                 rows_per_member=self.member_rows_cap(params), n_members=n_members,
                                 gap_bound=self.gap_bound(option, params), tester_modulus_bits=tester_modulus_bits)

    def blind_items(self, groups, params) -> list[tuple]:
        """The blind path's items of one rank pair, in the plan's order (`plan`, then
        `moment_plan`'s second moments): ("cell", g, h) per cell, then ("moment", t, w)
        per pair of cells, t its tail pair and w its head weight (k + its head pair's index)."""
        cells = self.cell_pairs(groups, params)
        tails = {pair: i for i, pair in enumerate(self.tail_pairs(groups, params))}
        heads = {pair: i for i, pair in enumerate(self.head_pairs(groups, params))}
        out = [("cell", g, h) for g, h in cells]
        for c, d in self.moment_pairs(len(cells)):
            (g, h), (g2, h2) = cells[c], cells[d]
            out.append(("moment", tails[tuple(sorted((h, h2)))], len(groups) + heads[tuple(sorted((g, g2)))]))
        return out

    @staticmethod
    def gap_bound(option, params) -> float:
        """The most |ΔỸ| of one row can be (module docstring)."""
        if option == "raw":
            lo, hi = params.get("relevance_range") or DEFAULT_RELEVANCE_RANGE
            return float(hi - lo)
        return IDCG_GAP_BOUND

    def value_bounds(self, option, params):
        """The bounds the noise is sized from: the gap's, and the rows per member."""
        cap = {"rows_per_member": float(self.member_rows_cap(params))}
        if option != "raw":
            return {"gap": IDCG_GAP_BOUND, **cap}
        lo, hi = params.get("relevance_range") or DEFAULT_RELEVANCE_RANGE
        return {"relevance_lo": float(lo), "relevance_hi": float(hi), "gap": float(hi - lo), **cap}

    def value_range(self, option, params):
        """The range of Ỹ (a cell, a difference of two Ỹ, lies in [lo − hi, hi − lo])."""
        if option == "raw":
            return tuple(params.get("relevance_range") or DEFAULT_RELEVANCE_RANGE)
        return (0.0, IDCG_GAP_BOUND)

    def components(self, option, params, info):
        top = self.gap_bound(option, params)
        return (Component("delta", VALUE_BITS, int(math.ceil(top * (1 << VALUE_BITS))) + 1),
                Component("one", VALUE_BITS, 1 << VALUE_BITS))

    def client_rows(self, frame, file, option, params, rng):
        clipped = {"rows_clipped": 0}
        if option == "raw":
            lo, hi = params.get("relevance_range") or DEFAULT_RELEVANCE_RANGE
            relevance = bounded_column(finite_column(frame, "relevance", file), lo, hi, params, clipped,
                                       file=file, column="relevance", bound="relevance_range")
            frame = frame.assign(relevance=relevance)
        rows = lot_rows(ranked_lists(frame, file), option)
        keep = rows_within_cap(rows.higher_ids, rows.lower_ids, self.member_rows_cap(params))
        delta = np.asarray(rows.delta, dtype=np.float64)[keep]
        if option != "raw":
            delta = self._bounded_gaps(delta, params, clipped, file)
        values = np.column_stack([delta, np.ones_like(delta)])
        rank_pair = np.asarray(rows.rank_pair)[keep]
        info = {"queries": rows.n_queries, "pairs": int(keep.sum()), "skipped_single_item": rows.skipped_single_item,
                "skipped_zero_idcg": rows.skipped_zero_idcg, **clipped, OVER_CAP_INFO: int((~keep).sum())}
        if params.get(SECOND_MOMENTS):  # stated for the interval under release noise alone
            info[SPREAD_INFO] = gap_spreads(delta, rank_pair, len(rows.rank_pair_labels))
        return ClientRows(ids=(np.asarray(rows.higher_ids, dtype=object)[keep],
                               np.asarray(rows.lower_ids, dtype=object)[keep]),
                          values=values, units=np.asarray(rows.query)[keep], strata=rank_pair,
                          strata_labels=tuple(rows.rank_pair_labels), info=info)

    @staticmethod
    def _bounded_gaps(delta: np.ndarray, params, clipped: dict, file: str) -> np.ndarray:
        """idcg gaps inside [−IDCG_GAP_BOUND, IDCG_GAP_BOUND] (module docstring): only
        fractional grades below 1 can fall outside; clipped and counted, or refused."""
        outside = np.abs(delta) > IDCG_GAP_BOUND
        if outside.any() and params.get("out_of_range", "clip") == "refuse":
            raise InputError(f"{int(outside.sum())} adjacent pairs have a normalised relevance gap beyond "
                             f"{IDCG_GAP_BOUND:g} (fractional grades below 1; use whole-number grades, option raw "
                             f"with --relevance-range LO:HI, or --out-of-range clip)", file=file, column="relevance")
        clipped["rows_clipped"] = int(clipped.get("rows_clipped", 0)) + int(outside.sum())
        return np.clip(delta, -IDCG_GAP_BOUND, IDCG_GAP_BOUND)

    def check_info(self, info, strata_labels):
        if not 1 <= len(strata_labels):
            raise ValueError("no rank pairs")
        if int(info.get("rows_clipped", 0)) < 0 or int(info.get(OVER_CAP_INFO, 0)) < 0:
            raise ValueError("clipped rows")
        if SPREAD_INFO not in info:  # stated only for second moments (`Metric.stated_facts`)
            return
        spreads = info[SPREAD_INFO]
        if not isinstance(spreads, list) or len(spreads) != len(strata_labels) or \
                not all(isinstance(x, (int, float)) and 0.0 <= float(x) <= MAX_GAP_SPREAD for x in spreads):
            raise ValueError("gap spreads per rank pair")

    # ------------------------------------------------------------- interval under release noise
    def moment_plan(self, plan, groups, option, params, info, layout):
        """The second moments of LOT's cells (module docstring, "Interval under release
        noise"): per rank pair, one family whose "groups" are its cells (the ordered group
        pairs), with items on the products w_c·w_c' of the cells' weights (every pair
        c ≤ c' up to `FULL_MOMENTS_CELLS` cells, else the diagonal alone); the pooled cells
        are sums of their rank pairs' cells."""
        from common.stats.correction import CorrectionPlan, Family
        comps = self.components(option, params, info)
        labels = [f"{groups[a]}>{groups[b]}" for a, b in self.cell_pairs(groups, params)]
        k = len(labels)
        moment_pairs = self.moment_pairs(k)
        spreads = info.get(SPREAD_INFO) or []
        items, families, pooled = list(plan.items), [], []
        for s in range(len({c.rank_pair for c in plan.cells if c.rank_pair is not None})):
            cells = tuple(c for c, cell in enumerate(plan.cells) if plan.items[cell.item].stratum == s)
            first = len(items)
            items.extend(Item(k + p, plan.items[plan.cells[cells[0]].item].ciphertext, s)
                         for p in range(len(moment_pairs)))
            cell = plan.cells[cells[0]]
            families.append(Family(cells, tuple(range(first, len(items))), cell.num_slot, cell.den_slot,
                                   cell.scale_shift, unit=float(1 << comps[1].scale_bits) * PAIR_WEIGHT_SCALE,
                                   span=2.0 * self.gap_bound(option, params),
                                   spread=float(spreads[s]) if s < len(spreads) else None))
        for c, cell in enumerate(plan.cells):
            if plan.items[cell.item].stratum is None:
                pooled.append((c, tuple(f.cells[j] for f in families for j in range(k)
                                        if plan.items[plan.cells[f.cells[j]].item].weight
                                        == plan.items[cell.item].weight)))
        return (Plan(plan.cells, tuple(items), plan.item_slots),
                CorrectionPlan(tuple(labels), tuple(families), len(plan.items), tuple(pooled)))

    def moment_weights(self, q, groups, option, params):
        """``w_c·w_c' / 2^64`` per row for `moment_plan`'s pairs of cells (w_c = q_ra·q_(r+1)b
        at 2^64; the product rounded back to that scale, in floating point: these weights
        only size the interval, and any rounding the Tester makes is in what it releases)."""
        qa, qb = (np.asarray(x, dtype=np.float64) / PAIR_WEIGHT_SCALE for x in q)
        cells = [qa[:, a] * qb[:, b] for a, b in self.cell_pairs(groups, params)]
        top = float(1 << (2 * PROBABILITY_BITS))
        return [np.minimum(np.rint(cells[a] * cells[b] * top), top - 2048.0).astype(np.uint64).astype(object)
                for a, b in self.moment_pairs(len(cells))]

    @staticmethod
    def moment_pairs(k: int) -> list[tuple[int, int]]:
        """The pairs of a rank pair's k cells whose second moments are released: every
        c ≤ c' up to `FULL_MOMENTS_CELLS` cells, else the diagonal alone."""
        from common.stats.correction import pairs
        return pairs(k) if k <= FULL_MOMENTS_CELLS else [(j, j) for j in range(k)]

    @staticmethod
    def cell_pairs(groups, params):
        k = len(groups)
        return [(a, b) for a in range(k) for b in range(k) if a != b or params.get("same_group_pairs")]

    def weights(self, q, strata, units, groups, option, params):
        qa, qb = (x.astype(object) for x in q)
        return [qa[:, a] * qb[:, b] for a, b in self.cell_pairs(groups, params)]

    def plan(self, groups, strata_labels, layout, option, params, info):
        ct, num_slot = layout.position(0)
        _, den_slot = layout.position(1)
        items, cells = [], []
        for s, label in [(None, None)] + list(enumerate(strata_labels)):
            for w, (a, b) in enumerate(self.cell_pairs(groups, params)):
                cells.append(Cell("pair", groups[a], groups[b], rank_pair=label, item=len(items),
                                  num_slot=num_slot, den_slot=den_slot))
                items.append(Item(w, ct, s))
        return Plan(tuple(cells), tuple(items), layout.slots)


METRIC = Lot()
