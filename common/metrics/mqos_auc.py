"""MQOS-AUC, minimum quality of service by ROC AUC (design §5.6; paper appendix B.2).

Dataset: `member_id, y_true (0/1), score`. Both classes must be present. Cells: each
group and overall (the global AUC). Verdict: a group significantly below overall
(rule "below_overall"; flagged when AUC_global − AUC[j] > τ). Two algorithms
(`--metric-option`):

* `exact` (default; B.2.1 in the linear form of design §5.6). The paper's
  trapezoid multiplies two encrypted quantities, which additive HE cannot. Instead,
  with w(i,l) = 1 if s_i > s_l, ½ if tied, 0 otherwise: A_j(i) = Σ_{l≠i} w(i,l)·p_lj
  (plaintext, at the Tester, from the score order), L_j = Σ p_ij·A_j(i)·y_i,
  T_j = Σ p_ij·y_i, Q_j = Σ p_ij²·y_i, S_j = Σ p_ij, N_j = S_j − T_j and
  U_j = L_j − (T_j² − Q_j)/2 = Σ_{i pos, l neg} p_ij·p_lj·w(i,l) (the pairs of positives
  add (T_j² − Q_j)/2 to L_j since w(i,l) + w(l,i) = 1), AUC_j = U_j / (T_j·N_j).
  Without the release controls each row carries Enc(y_i) and its dense score rank in
  plaintext: the Tester learns the score order of the anonymous joined rows, as in the
  paper's design (the Test-Client goes on only on its operator's opt-in to noiseless
  releases). T_j² comes from a masked squaring round trip: the Tester sends
  Enc(T_j + r) with r uniform and 64 bits wider than T_j, the Test-Client returns
  Enc((T_j + r)²), the Tester removes 2rT_j + r² under encryption.

  **Score bins** (under the release controls, `BinnedAuc`). No stratum travels: each
  row carries its score bin inside its ciphertexts (K = `SCORE_BINS` bins of equal
  counts in the Test-Client's score order, or the levels themselves when there are at
  most K), A_j becomes Σ over the bins, and the products of two encrypted bin sums come
  from the same kind of masked round trip. The AUC is that of the binned score.

  **Released form** (what the release noise is added to, design §8.3). Per cell two
  normalised, centred sums: V_j = (U_j − T_j·N_j/2) / S_j and D_j = T_j·N_j / S_j, and
  AUC_j = ½ + V_j/D_j (`Cell.offset` ½). Under encryption V_j·S_j = L_j − T_j·S_j/2 + Q_j/2
  needs no square, D_j·S_j = T_j·S_j − T_j²; the Tester divides by its own plaintext
  S_j by multiplying with c = round(2^K/S_j) (`normaliser`, `released_slots`): the
  same c on both slots, so the ratio is exact, and the slots hold 2^(33+K) per member.

  **Sensitivity** (one member t's probability vector replaced; Test-Client's labels,
  scores and rows adversarial but fixed). Per group, with x = p_tj and the others' sums
  S0, T0, N0 = S0 − T0 (without t): U_j − T_j·N_j/2 = x·g + U0 with |g| ≤ N0/2 (t
  positive: g = Σ_{l neg}(w(t,l) − ½)p_l) or |g| ≤ T0/2 (t negative) and
  |U0| ≤ T0·N0/2; S = x + S0. Then dV/dx = (g·S0 − U0)/S² and
  |g·S0 − U0| ≤ N0·S0/2 + T0·N0/2 ≤ S0²/2 (the maximum over N0 + T0 = S0 is at N0 = S0),
  so |dV/dx| ≤ ½·(S0/S)² ≤ ½. D = (x + T0)·N0/(x + S0) (t positive) has
  dD/dx = N0²/S² ≤ 1, and T0·(x + N0)/(x + S0) (t negative) T0²/S² ≤ 1. By the mean
  value theorem a slot of group j moves by at most ½·|Δp_tj| (V) and |Δp_tj| (D)
  members: over the groups an L2 norm of at most ½·√2 and √2 (||Δp||₂ ≤ √2); the overall
  cell (p ≡ 1) does not move. The same holds in each random group (a member is in one).
  Rounding c moves a slot by at most 2^-35 member (`normaliser_bits`), which the noise
  scales cover with 2^-30 to spare (`ExactAuc.squares_sensitivity`). So the release is
  two components at bounds ½ and 1, and the noise is sized from nothing but this form
  and the row count: no group's size enters it (the earlier form's noise grew with
  S_j, which it revealed, while its denominator grew with S_j², and its cells left
  [0, 1] at realistic sizes). Centring V halves its bound against releasing U_j/S_j
  (whose bound is 1); the error of AUC_j is about σ·sqrt(¼ + (AUC_j − ½)²)/D_j with
  D_j ≈ S_j·π(1 − π) for a positive rate π: at the default ρ and 100,000 members
  within 0.003 (rms) for groups of 5,000 effective members (docs/metrics/mqos-auc.md).
  `tests/test_release.py` checks the bound by exhaustive and adversarial search, and
  that the encrypted path releases exactly `released_form`.

  Intervals without release noise: the statistic is not a sum over rows, so instead of
  the bootstrap the rows are split into G = 10 random groups; each group's AUC uses A
  within the group, and the interval is est ± t_{G−1}·sd/√G (coverage measured by a
  test: 0.95-0.97 at 95%, `tests/test_metric_scoring.py`).

  **Interval under release noise** (design §8.4). Random groups would each carry their
  own noise and count the estimate's noise many times over; instead the release is
  second moments, in one round trip as before and with no random groups:

  - the estimate's (V_j, D_j) per cell at σ₀ (`ReleasePolicy.moment_sigmas` with C = 2);
  - on the pair weights w_ab = p_a·p_b (a ≤ b, `common.stats.correction.pair_weights`)
    S1_ab = Σ w_ab·y and S0_ab = Σ w_ab·(1 − y), packed in one item per pair, at σ_m.
    The Tester aggregates S1 from the rows' Enc(y) and forms S0 = Σ w_ab − S1 with its
    own plaintext Σ w_ab (`tester_facts`, `combine`). A member's row moves only the pair
    slots of its own label, by ||Δ(p·pᵀ)|| ≤ 2·||Δp||₂ over a ≤ b: one component at the
    pair items' factor (β = 1, `pair_components`);
  - the Test-Client states from its own rows DeLong's placement variances σ1² (of the
    positives' fraction of negatives scored below, ties ½) and σ0² (of the negatives'
    fraction of positives scored above), `placement_variances`,
    `info["placement_variances"]` (under this release only: `stated_facts`): two numbers
    about its whole table, which one member moves by O(1/n).

  The finishing party reads the weighted DeLong covariance
  ``Cov(AUC_a, AUC_b) = σ1²·S1_ab/(P1_a·P1_b) + σ0²·S0_ab/(P0_a·P0_b)`` with the
  class totals P1_a = Σ_b S1_ab and P0_a = Σ_b S0_ab (a member's probabilities add up to
  1) and "overall" as one more group of weight 1 (`placement_covariance`), each cell's
  placement variances raised by the binormal model's v(AUC_a) − v(AUC_overall) where
  positive (a group whose AUC is lower spreads more: `binormal_spread`), adds each cell's
  release noise through its ratio, and draws the cells jointly
  (`common.stats.moments.covariance_draws`; percentile intervals). With one-hot groups
  this is DeLong's variance of each group's own AUC (`tests/test_auc_moments.py`; the
  placements' functions are `common.metrics.auc_placements`'); the
  null flag rate and coverage are measured on the plaintext twin
  (`bench/bench_random_groups.py`, bench/RESULTS.md).
* `sampled` (B.2.2). The Test-Client aims at `pairs` (default 100,000) positive-negative
  pairs drawn uniformly, no member in more than `pairs_per_member` (default 4) rows; each
  real pair carries Enc(1(s_pos > s_neg)) (½ for a tie) and Enc(1); the pair weight is
  p_ij·p_lj.

  **What the Tester sees** (docs/metrics/mqos-auc.md). The Tester opens its own
  probability vectors, so it can link each row's two members to its members
  (docs/threat-model.md); rows that were all positive-negative pairs would make the
  graph of rows bipartite by label, and two-colouring it would give every member's label.
  So the rows are a random graph drawn independently of labels and scores
  (`sample_pair_graph`): every member gets `cap` slots, E pairs of slots are drawn at
  random (self-pairs dropped), and an edge is a real pair when it joins a positive and a
  negative, else a dummy whose two values are Enc(0) (indistinguishable from Enc(1)
  under Paillier's semantic security); real pairs beyond the count kept become dummies
  too. E ≈ pairs/(2π(1 − π)) for a positive rate π, at most cap·n/2
  (`pair_graph_size`): the rows cost about 1/(2π(1 − π)) ≥ 2 encrypted rows per real
  pair. The Tester learns the number of rows and `info["pairs_kept"]`, both fixed by the
  table's size, its number of positives, `pairs` and `pairs_per_member` (the Test-Client's
  own aggregates, not a member's): the count kept is set 4 standard deviations below
  the real pairs expected, so the real count itself (the cut of the graph by the labels,
  which depends on each member's label) is hidden but in about 3·10^-5 of the draws,
  when fewer turn up and all are kept.

  Estimate and sensitivity: a dummy adds 0 to both sums and the weights are
  p_ij·p_lj as before, and the real pairs kept are uniform over the positive-negative
  pairs, so the estimator is the one of B.2.2. A member is in at most `cap` rows (the
  cap counts dummies too) and each row's weight moves by at most |Δp_j| (the other
  probability is at most 1), so the components' bounds are 2·cap (values at scale 2);
  the Tester sizes the noise from the declared cap and refuses a member counted in more
  rows (`SampledAuc.slot_sensitivity`).

  Under release noise this form is not usable for small groups: a pair counts for
  group j with p_ij·p_lj, so group j's denominator is about
  pairs·(T_j/#positives)·(N_j/#negatives) while the noise is σ·cap whatever the number
  of pairs; measured at 100,000 members, api (5,000 effective) errs by 0.07 rms against
  exact's 0.002. Pairs share members, so resampling pairs would ignore the members' own
  variation and give far too narrow intervals; instead the Test-Client puts its members
  in G = 10 random groups, drawn independently of labels and scores like the graph, and
  labels each row with its group (both members in group g) or "across"; the estimate
  uses all rows, the interval is the random-groups t interval
  over the G within-group estimates (conservative: their pair-sampling part is G times
  the full sample's).

  **Sampled against exact under release noise** (`sampled_release_note`). Both options
  estimate the same weighted AUC (exact's score bins aside, a few 10^-4): without noise
  the sampled estimate is unbiased for it, its error the pair sampling's
  (`tests/test_mqos_auc_sampled.py`). Under the release controls each of a group's two
  sums carries noise of sd σ_s = σ₀·C pair weights (the release's `sigma_estimate`),
  against a denominator W_j ≈ pairs_kept·(S_j/n)² (the pairs' weight, the product of two
  probabilities, dilutes a group by its share S_j/n twice), so the estimate errs by about
  σ_s·sqrt(1 + AUC_j²)/W_j, about 2·n/S_j times exact's σ₀·sqrt(¼ + (AUC_j − ½)²)/D_j
  (D_j ≈ S_j·π(1 − π), and with the cap binding pairs_kept ≈ C·n·π(1 − π)): at 10,000
  members with `pairs` 20,000 (8,190 kept) hispanic (S_j ≈ 1,700) errs by 0.07 (sd,
  measured) against exact's 0.006, black (S_j ≈ 1,160) by 0.18 against 0.01. The two options then
  differ by that noise, which no interval may cover: a random group holds about W_j/G² of
  the weight under noise of sd σ_b·C (σ_b/σ₀ = sqrt(0.7/0.2) ≈ 1.9 at the default shares,
  `tester_service.release.ReleasePolicy.sigmas`), so its ratio is undefined (its
  denominator not above 3 sd) unless W_j > 3·G²·σ_b·C, and a group with fewer than two
  defined random groups has no interval (at 10,000 members none but overall has one).
  The Test-Client states this in the result (`info["release_noise_note"]`, under release
  noise only: `RELEASE_NOISE`, which `he_under_noise` has both parties set).
"""
from __future__ import annotations

import math
import secrets
from dataclasses import replace
from functools import partial

import numpy as np

from common.crypto import paillier
from common.metrics.auc_placements import placement_covariance, placement_variances
from common.metrics.base import (NOISE_HEADROOM_BITS, Cell, ClientRows, Component, Item, Layout, Metric, Param,
                                 Plan, PROBABILITY_BITS, RELEASE_NOISE, SECOND_MOMENTS, bits, choose_layout,
                                 finite_column, positive_int)
from common.metrics.scoring import DEFAULT_RANDOM_GROUPS, dense_score_rank, doubled_a_weights, sample_pair_graph
from common.tables import binary_column

DEFAULT_PAIRS = 100_000
MAX_PAIRS = 50_000_000
#: sampled: the most rows (pairs and dummy pairs) one member may be in (the release noise is sized from it)
DEFAULT_PAIRS_PER_MEMBER = 4
MAX_PAIRS_PER_MEMBER = 1000
#: bits by which the squaring mask r is wider than the masked sum (statistical hiding)
SQUARE_MASK_BITS = 64
#: exact, under the release controls: the score bins the rows carry inside their ciphertexts (`BinnedAuc`)
SCORE_BINS = 32
#: the Test-Client's statement of the bins (the result's `info`: the estimate is the binned score's AUC)
SCORE_BINS_INFO = "score_bins"
#: the normaliser's bits beyond 2·bits(n) (`normaliser_bits`)
NORMALISER_EXTRA_BITS = 64
#: the Test-Client's statement the interval under release noise reads (`placement_variances`)
PLACEMENT_INFO = "placement_variances"
#: sampled under release noise: the result's statement of the estimate's noise and of when
#: a group has an interval (`sampled_release_note`)
SAMPLED_NOISE_INFO = "release_noise_note"


def sampled_release_note(pairs_kept: int, random_groups: int = DEFAULT_RANDOM_GROUPS) -> str:
    """What the result of MQOS-AUC sampled says under release noise (module docstring,
    "Sampled against exact under release noise"): how far its estimates may lie from
    exact's, and when a group has no interval. From the count of real pairs kept and G
    alone (the Tester checks it, `SampledAuc.check_info`)."""
    g = int(random_groups)
    return (f"sampled under release noise: each group's two pair sums carry noise of sd release.sigma_estimate "
            f"(sigma_s) pair weights against the group's weight of real pairs W_j, about {int(pairs_kept)} pairs "
            f"times (S_j/n)^2 (S_j the group's effective size, n the members), so its estimate errs by about "
            f"sigma_s*sqrt(1 + AUC^2)/W_j (sd), about 2*n/S_j times the exact option's, and may differ from it by "
            f"that much; the interval is the t interval over {g} random groups, each with about 1/{g * g} of "
            f"W_j under noise of sd sigma_b (about 1.9*sigma_s at the default privacy shares), so a group has "
            f"none (n/a) unless W_j exceeds about {3 * g * g}*sigma_b; the exact option (the default) is the one "
            f"to use under the release controls")


def bin_mask_bits(n_rows: int) -> int:
    """Bits of a score bin's mask (`BinnedAuc.square_requests`): a bin's sum is at most
    n·2^33 (weights 2^32, values at most 2), and the mask SQUARE_MASK_BITS wider."""
    return square_mask_bits(n_rows) + 1


def square_mask_bits(n_rows: int) -> int:
    """Bits of the squaring mask r on T_j ≤ S_j ≤ n·2^32 for n the bound on the rows: a
    width fixed in advance, where the largest S_j's own would show in T_j + r's length."""
    return PROBABILITY_BITS + bits(n_rows) + SQUARE_MASK_BITS


def normaliser_bits(n_rows: int) -> int:
    """K of the normaliser c = round(2^K / S): the released slots hold 2^(33+K) per member.
    Rounding c moves a slot by at most |X|/2 with |X| ≤ 2^65·n²/4 (X = L − T·S + Q or
    2(T·S − T²) at 2^65), that is by at most 2^(62 − 33 − K)·n² ≤ 2^-35 of a member."""
    return 2 * bits(n_rows) + NORMALISER_EXTRA_BITS


def normaliser(s_fixed: int, k_bits: int) -> int:
    """c = round(2^K / S) for S at 2^32 (0 for an empty cell: nothing to release)."""
    s_fixed = int(s_fixed)
    return ((1 << (k_bits + 1)) + s_fixed) // (2 * s_fixed) if s_fixed > 0 else 0


def unmask_square(pub, square: int, t: int, r: int) -> int:
    """Enc(T²) from the Test-Client's Enc((T + r)²) and Enc(T): the mask's 2rT + r² removed
    under encryption."""
    n, n2 = pub.n, pub.n2
    return paillier.add_plain(n, square * paillier.scalar_pow(n, t, (-2 * r) % n) % n2, -r * r)


def released_slots(l_dbl: int, t: int, q: int, s: int, k_bits: int) -> tuple[int, int]:
    """(V, D), the exact released form's two slots before noise, from a cell's sums in
    fixed point (L_dbl = Σ q·2A·y at 2^64, T = Σ q·y at 2^32, Q = Σ q²·y at 2^64, S = Σ q
    at 2^32): V = c·(L_dbl − T·S + Q) ≈ 2^(33+K)·(U − T·N/2)/S and
    D = c·2(T·S − T²) ≈ 2^(33+K)·T·N/S, c = `normaliser`(S). The encrypted path
    (`ExactAuc.combine`) computes the same integers under encryption."""
    c = normaliser(s, k_bits)
    return (l_dbl - t * s + q) * c, 2 * (t * s - t * t) * c


def released_form(q: np.ndarray, y: np.ndarray, rank: np.ndarray, units: np.ndarray | None = None,
                  *, n_rows: int | None = None) -> list[list[tuple[int, int]]]:
    """The exact form's released slots in plaintext, [replicate][cell] -> (V, D): replicate
    0 over every row, then one per random group (`units`); cells: q's columns, then overall.
    For tests and measurements (the protocol never holds y in plaintext)."""
    ext = _with_overall((np.asarray(q, dtype=np.int64),))
    k_bits = normaliser_bits(n_rows or ext.shape[0])
    yy = np.asarray(y).astype(np.int64)
    reps = [(None, np.ones(ext.shape[0], dtype=bool))]
    if units is not None:
        reps += [(units, units == u) for u in range(int(units.max()) + 1)]
    out = []
    for groups, rows in reps:
        a2 = doubled_a_weights(rank, ext, groups=groups)
        cells = []
        for j in range(ext.shape[1]):
            qj = [int(v) for v in ext[rows, j]]
            aj = [int(v) for v in a2[rows, j]]
            yj = [int(v) for v in yy[rows]]
            l_dbl = sum(a * b * c for a, b, c in zip(qj, aj, yj))
            t = sum(a * c for a, c in zip(qj, yj))
            qq = sum(a * a * c for a, c in zip(qj, yj))
            cells.append(released_slots(l_dbl, t, qq, sum(qj), k_bits))
        out.append(cells)
    return out


def _labels_and_scores(frame, file):
    y = binary_column(frame, "y_true", file)
    scores = finite_column(frame, "score", file)
    if not (y == 1).any() or not (y == 0).any():
        missing = "positive (1)" if not (y == 1).any() else "negative (0)"
        from common.errors import InputError
        raise InputError(f"has no {missing} outcome; the AUC needs both classes", file=file, column="y_true")
    return y, scores


def _with_overall(q) -> np.ndarray:
    """The rows' weights per group, then the overall cell's (2^32 for every row)."""
    (q1,) = q
    return np.hstack([q1, np.full((q1.shape[0], 1), 1 << PROBABILITY_BITS, dtype=np.int64)])


class MqosAuc(Metric):
    """The registry's entry: the option picks the algorithm (`for_option`)."""

    name = "mqos-auc"
    description = "minimum quality of service: per-group ROC AUC against the global AUC"
    options = ("exact", "sampled")
    option_help = ("exact (default): linear form, the AUC of the score in 32 bins under the release controls; "
                   "sampled: Mann-Whitney pairs (under release noise usable only for large groups)")
    params = (Param("pairs", f"sampled: positive-negative pairs to aim at (default {DEFAULT_PAIRS})",
                    positive_int(MAX_PAIRS), DEFAULT_PAIRS),
              Param("pairs_per_member", "sampled: the most rows (pairs and dummy pairs) one member may be in "
                    f"(default {DEFAULT_PAIRS_PER_MEMBER}); pairs beyond what it allows are not drawn, counted in "
                    "the result; the release noise is sized from it", positive_int(MAX_PAIRS_PER_MEMBER),
                    DEFAULT_PAIRS_PER_MEMBER))
    numeric_columns = ("y_true", "score")
    verdict_rule = "below_overall"

    def value_range(self, option, params):
        return (0.0, 1.0)

    def for_option(self, option: str) -> Metric:
        return SAMPLED if option == "sampled" else EXACT


class ExactAuc(MqosAuc):
    params = ()
    resampling = "random_groups"
    random_groups = DEFAULT_RANDOM_GROUPS
    interval = "random_groups"
    needs_squares = True
    uses_strata = True
    #: under release noise the interval comes from the pair items and the stated placement
    #: variances (module docstring, "Interval under release noise"), one unit, no random groups
    moment_interval = True
    stated_facts = (PLACEMENT_INFO,)

    #: weight columns per cell (W_L, W_Lg, W_T, W_Q), the pair items' columns after them
    columns_per_cell = 4
    #: a cell's effective size is its column this far from its item's (W_T = q)
    size_column = 2

    def for_option(self, option):
        return self

    def for_release(self, params):
        """Under the release controls (second moments) the rows carry their score bin inside
        the ciphertexts (`BinnedAuc`); without, their score rank beside them."""
        return BINNED if params.get(SECOND_MOMENTS) else self

    def components(self, option, params, info):
        return (Component("y", 0, 1),)

    def client_rows(self, frame, file, option, params, rng):
        y, scores = _labels_and_scores(frame, file)
        stated = {PLACEMENT_INFO: placement_variances(y, scores)} if params.get(SECOND_MOMENTS) else {}
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=y[:, None].astype(np.float64),
                          strata=dense_score_rank(scores), info=stated)

    def check_info(self, info, strata_labels):
        if PLACEMENT_INFO not in info:  # stated only for second moments (`Metric.stated_facts`)
            return
        stated = info[PLACEMENT_INFO]
        if not isinstance(stated, list) or len(stated) != 2 or \
                not all(isinstance(x, (int, float)) and math.isfinite(x) and 0.0 <= x <= 0.25 for x in stated):
            raise ValueError("placement variances")

    def weight_bits(self, n_rows):
        return 2 * PROBABILITY_BITS + 1 + bits(n_rows)

    def item_bits(self, n_rows, n_units, components):
        """|V|, |D| ≤ S/4 members ≤ n/4 at 2^(33+K) each (K from the joined rows, at most
        n_rows), plus the noise's headroom."""
        return 33 + normaliser_bits(n_rows) + bits(n_rows) + 2 + NOISE_HEADROOM_BITS

    def tester_facts(self, q, strata, units, row_bound=None):
        """S_j over all rows and per random group (plaintext: Σ of the Tester's own weights),
        and "n", the row count the released form's scale 2^(33+K) and the squaring mask's
        width are sized from: the Test-Client's whole table (`row_bound`), not the joined
        rows, whose count would show in the noise scales and the masked T_j + r."""
        ext = _with_overall(q)
        g = int(units.max()) + 1
        per_group = np.zeros((g, ext.shape[1]), dtype=object)
        for u in range(g):
            per_group[u] = [int(v) for v in ext[units == u].sum(axis=0)]
        facts = {"S": [int(v) for v in ext.sum(axis=0)], "S_group": per_group.tolist(),
                 "n": max(int(row_bound or 0), int(ext.shape[0]))}
        if g == 1:  # one unit: the release of second moments, whose S0 is Σ w_ab − S1 (`combine`)
            from common.stats.correction import pair_weights
            facts["pair_totals"] = [int(col.sum()) for col in pair_weights(q[0])]
        return facts

    def weights(self, q, strata, units, groups, option, params):
        """Per cell (groups, then overall): W_L = q·2A over all rows, W_Lg = q·2A within the
        row's random group (with one unit, the release of second moments, W_L itself: a
        sum of one column, not aggregated again), W_T = q, W_Q = q² (2A keeps ties' half
        weights integral). Overall's W_T and W_Q are the constants 2^32 and 2^64 (times
        the bucket's Enc(Σ y), no column of their own)."""
        ext = _with_overall(q)
        full = doubled_a_weights(strata, ext)
        single = len(units) == 0 or int(units.max()) == 0
        within = None if single else doubled_a_weights(strata, ext, groups=units)
        cols = []
        overall = ext.shape[1] - 1
        for j in range(ext.shape[1]):
            qj = ext[:, j].astype(object)
            w_t, w_q = (1 << PROBABILITY_BITS, 1 << (2 * PROBABILITY_BITS)) if j == overall else (ext[:, j], qj * qj)
            cols += [qj * full[:, j].astype(object), (4 * j,) if single else qj * within[:, j].astype(object),
                     w_t, w_q]
        return cols

    def moment_plan(self, plan, groups, option, params, info, layout):
        """`plan` with one item per pair of groups a ≤ b on the pair weights q_a·q_b/2^32
        (`moment_weights`, after the 4 columns per cell), its slots (S1_ab, S0_ab), and a
        `common.stats.correction.CorrectionPlan` whose covariance is `placement_covariance`
        with the Test-Client's stated placement variances."""
        from common.stats import correction
        k = len(groups)
        first = len(plan.items)
        pair_items = tuple(Item(self.columns_per_cell * (k + 1) + p, 0) for p in range(len(correction.pairs(k))))
        family = correction.Family(tuple(range(k)), tuple(range(first, first + len(pair_items))), 0, 1, 0)
        stated = tuple(float(x) for x in info[PLACEMENT_INFO])
        return (replace(plan, items=plan.items + pair_items),
                correction.CorrectionPlan(tuple(groups), (family,), first,
                                          covariance=partial(placement_covariance, variances=stated)))

    def square_requests(self, agg, n_units, pub, facts, layout):
        """Enc(T + r) for the full sample and each random group, per cell."""
        n, n2 = pub.n, pub.n2
        cells = len(facts["S"])
        t_full = []
        for j in range(cells):
            prod = 1
            for u in range(n_units):
                prod = prod * agg[u][4 * j + 2][0] % n2
            t_full.append(prod)
        t_rows = [t_full]
        if n_units > 1:  # random groups (one unit: the release of second moments, no groups)
            t_rows += [[agg[u][4 * j + 2][0] for j in range(cells)] for u in range(n_units)]
        r_bits = square_mask_bits(facts["n"])  # n: the bound on the rows (`tester_facts`)
        masks = [[secrets.randbits(r_bits) for _ in range(cells)] for _ in t_rows]
        h = paillier.randomizer_base(n)
        requests = paillier.rerandomize_chunk(n, h, [paillier.add_plain(n, t, r) for row, mrow in zip(t_rows, masks)
                                                     for t, r in zip(row, mrow)])
        state = {"agg": agg, "n_units": n_units, "t": t_rows, "r": masks, "facts": facts, "cells": cells}
        return state, requests

    def combine(self, state, squares, pub, layout, noise=None):
        """Items per replicate (full sample, then each random group) and cell: Enc(V + 2^slot·D),
        the released form (module docstring): V = c·(L − T·S + Q) and D = c·2(T·S − T²)
        with c = round(2^K/S) (`released_slots`), each carrying its release noise
        (`noise(ciphertext, component, replicate)`: component 0 is V, 1 is D) before they
        are packed. The cell's ratio is V/D + ½ (`Cell.offset`). With one unit and the pair
        weights aggregated (the release of second moments, `moment_plan`): the full sample
        alone, then per pair a ≤ b Enc(S1 + 2^slot·S0) with S1 = Σ w_ab·y and
        S0 = Σ w_ab − S1 (Σ w_ab the Tester's plaintext `facts["pair_totals"]`),
        components 2 and 3 of `noise`."""
        from common.errors import ProtocolError
        n, n2 = pub.n, pub.n2
        agg, n_units, cells = state["agg"], state["n_units"], state["cells"]
        reps = 1 if n_units == 1 else n_units + 1
        if len(squares) != reps * cells:
            raise ProtocolError(f"{len(squares)} squares received, {reps * cells} expected")
        items = []
        for rep in range(reps):
            for j in range(cells):
                lsum, t, t2, qsum, s = self._sums(state, squares, pub, rep, j)
                items.append(self._released_item(pub, layout, state, lsum * qsum % n2, t, t2, s,
                                                 None if noise is None else partial(noise, replicate=rep)))
        return items + self._pair_items(state, pub, layout, noise)

    @staticmethod
    def _released_item(pub, layout, state, x, t, t2, s: int, noise) -> int:
        """A cell's released item Enc(V + 2^slot·D) (`released_slots`) from Enc(X) with
        X = L_dbl + Q (X − T·S is V's sum before c), Enc(T), Enc(T²) and the plaintext S:
        V = c·(X − T·S), D = c·2(T·S − T²), c = `normaliser`(S), each noised
        (`noise(ciphertext, component)`: 0 is V, 1 is D) before they are packed."""
        n, n2 = pub.n, pub.n2
        c = normaliser(s, normaliser_bits(state["facts"]["n"]))
        v = paillier.scalar_pow(n, x * paillier.scalar_pow(n, t, (-s) % n) % n2, c)
        d = paillier.scalar_pow(n, paillier.scalar_pow(n, t, s) * paillier.scalar_pow(n, t2, n - 1) % n2, 2 * c)
        if noise is not None:
            v, d = noise(v, 0), noise(d, 1)
        return v * paillier.scalar_pow(n, d, 1 << layout.release_slot_bits) % n2

    def _pair_items(self, state, pub, layout, noise) -> list[int]:
        """With one unit and the pair weights aggregated (the release of second moments,
        `moment_plan`): per pair a ≤ b Enc(S1 + 2^slot·S0), S1 = Σ w_ab·y (from the
        ciphertext holding y alone) and S0 = Σ w_ab − S1, components 2 and 3 of `noise`."""
        n, n2 = pub.n, pub.n2
        agg, cells = state["agg"], state["cells"]
        first = self.columns_per_cell * cells
        if state["n_units"] != 1 or len(agg[0]) <= first:
            return []
        shift = 1 << layout.release_slot_bits
        items = []
        for p, total in enumerate(state["facts"]["pair_totals"]):
            s1 = agg[0][first + p][0]
            s0 = paillier.add_plain(n, paillier.scalar_pow(n, s1, n - 1), total)
            if noise is not None:
                s1, s0 = noise(s1, 2, 0), noise(s0, 3, 0)
            items.append(s1 * paillier.scalar_pow(n, s0, shift) % n2)
        return items

    def square_answers(self, plain: list[int], layout, n: int) -> list[int]:
        """The Test-Client's answers to the decrypted requests: each t + r squared."""
        return [m * m % n for m in plain]

    def square_answer_count(self, requests: int, layout) -> int:
        """How many answers the Tester expects to its `requests`: one square each."""
        return requests

    @staticmethod
    def _sums(state, squares, pub, rep, j):
        """Enc(L_dbl), Enc(T), Enc(T²) (the mask removed), Enc(Q) and the plaintext S of cell
        j in replicate `rep` (0: every row, with L over all rows; g + 1: random group g)."""
        n, n2 = pub.n, pub.n2
        agg, n_units, cells = state["agg"], state["n_units"], state["cells"]
        t = state["t"][rep][j]
        r = state["r"][rep][j]
        t2 = unmask_square(pub, squares[rep * cells + j], t, r)
        if rep == 0:
            lsum, qsum = 1, 1
            for u in range(n_units):
                lsum = lsum * agg[u][4 * j][0] % n2
                qsum = qsum * agg[u][4 * j + 3][0] % n2
            return lsum, t, t2, qsum, state["facts"]["S"][j]
        return (agg[rep - 1][4 * j + 1][0], t, t2, agg[rep - 1][4 * j + 3][0],
                state["facts"]["S_group"][rep - 1][j])

    def size_weight(self, item):
        return item.weight + self.size_column  # W_T = q: the effective size S_j

    def squares_sensitivity(self, state, multiplicity):
        """The noise scales of the released form's two components (V, D), in their slots'
        fixed-point units, per unit of ||Δp||₂: ½ and 1 member (module docstring,
        "Sensitivity"), at 2^(33+K) per member, plus 2^-30 of a member for the rounding of
        c. From the declared form and the row count alone: the same for every cell, and
        nothing about any group's size."""
        unit = 1 << (33 + normaliser_bits(state["facts"]["n"]))
        slack = unit >> 30
        return [multiplicity * (unit // 2 + slack), multiplicity * (unit + slack)]

    def pair_sensitivity(self, multiplicity):
        """The noise scale of a pair item's slots (S1, S0) per unit of ||Δp||₂: a member moves
        w_ab = p_a·p_b by |Δ(p_a·p_b)| at 2^32, in one of the two (its label's), times the
        rows it is in; the pair items' factor 2 is in σ_m (`ReleasePolicy.moment_sigmas`)."""
        return multiplicity << PROBABILITY_BITS

    @staticmethod
    def slot_noise(scales):
        """Per slot of a packed item (V, D): the noise's sd per unit of σ."""
        return [float(scales[0]), float(scales[1])]

    def plan(self, groups, strata_labels, layout, option, params, info):
        names = list(groups) + ["overall"]
        return Plan(tuple(Cell("group", g, item=j, num_slot=0, den_slot=1, offset=0.5) for j, g in enumerate(names)),
                    tuple(Item(self.columns_per_cell * j, 0) for j in range(len(names))), 2)


def score_bins(scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's score bin 0..k−1 (`BinnedAuc`): its dense rank when the scores have at
    most k levels (each level its own bin: the binned AUC is the exact one), else
    ⌊k·(rows scored strictly below)/n⌋, bins of equal counts in the Test-Client's own
    score order with tied scores in one bin."""
    s = np.asarray(scores, dtype=np.float64)
    rank = dense_score_rank(s)
    if len(s) == 0 or int(rank.max()) < k:
        return rank
    below = np.searchsorted(np.sort(s), s, side="left")
    return (below * k // len(s)).astype(np.int64)


def binned_values(y: np.ndarray, bins: np.ndarray, k: int) -> np.ndarray:
    """The rows' values under score bins (`BinnedAuc`), (n, 2k + 1): y; y·1(bin = b) for
    b < k; and 2·1(bin < b) + 1(bin = b) for b < k, whose sums weighted by p_j are P1_b
    and G_b = 2·Σ_{b'<b} S_b' + S_b."""
    yy = np.asarray(y, dtype=np.float64)
    b = np.asarray(bins, dtype=np.int64)[:, None]
    levels = np.arange(k, dtype=np.int64)[None, :]
    positive = (b == levels) * yy[:, None]
    weight = 2.0 * (b < levels) + 1.0 * (b == levels)
    return np.hstack([yy[:, None], positive, weight])


class BinnedAuc(ExactAuc):
    """MQOS-AUC exact under the release controls: the score order inside the ciphertexts
    (design §5.6, "Score bins").

    The Test-Client cuts its rows into K = `SCORE_BINS` bins of equal counts by its own
    score order (`score_bins`; ties in one bin) and encrypts per row y alone in one
    ciphertext and, packed in the next ones, the one-hot y·1(bin = b) and the
    thermometer 2·1(bin < b) + 1(bin = b) (`binned_values`); no stratum travels. The
    Tester weights every ciphertext with q_j as for any ratio metric, which gives per
    cell T_j = Σ q·y and per bin P1_b = Σ_{i in b} q·y and G_b = 2·Σ_{b'<b} S_b' + S_b,
    and (ciphertext 0 alone, `column_ciphertexts`) the pair items' Σ w_ab·y. With
    w(i,l) = 1 above, ½ in the same bin, 0 below (the AUC of the binned score), the
    released form's V numerator is L_dbl − T·S + Q = Σ_b P1_b·G_b − T·S: the self-pairs'
    Q cancels. The products P1_b·G_b of two encrypted sums come from one masked round
    trip (`square_requests`): every bin slot masked with its own r, 64 bits wider than
    the sum; the Test-Client returns Enc(T'²), Enc(Σ_b P1'_b·G'_b) and each masked bin
    alone (`square_answers`), from which the Tester removes the masks:
    P1·G = P1'·G' − s·P1' − r·G' + r·s. The released items, their noise (the binned w
    is a w of the same kind, so the sensitivity argument holds as it stands) and the
    interval are those of `ExactAuc`. The AUC is that of the score in K quantile bins:
    exact for a score with at most K levels, else below the exact AUC by the pairs
    within a bin's departure from ½ (measured: 3-6·10^-4 at K = 32,
    docs/metrics/mqos-auc.md)."""

    uses_strata = False
    columns_per_cell = 1
    size_column = 0
    weights = Metric.weights  # q_j per group, overall their sum: the default derivations apply

    def client_rows(self, frame, file, option, params, rng):
        y, scores = _labels_and_scores(frame, file)
        values = binned_values(y, score_bins(scores, SCORE_BINS), SCORE_BINS)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=values,
                          info={PLACEMENT_INFO: placement_variances(y, scores), SCORE_BINS_INFO: SCORE_BINS})

    def check_info(self, info, strata_labels):
        super().check_info(info, strata_labels)
        if info.get(SCORE_BINS_INFO) != SCORE_BINS:
            raise ValueError("score bins")

    def components(self, option, params, info):
        """y (alone in ciphertext 0), then per bin y·1(bin = b) and 2·1(bin < b) + 1(bin = b)."""
        return ((Component("y", 0, 1),) + tuple(Component(f"positive in bin {b}", 0, 1) for b in range(SCORE_BINS))
                + tuple(Component(f"bin weight {b}", 0, 2) for b in range(SCORE_BINS)))

    def layout(self, option, params, info, *, n_rows, n_units, recipient, modulus_bits):
        """Rows: y alone, then the bins in slots wide enough for a bin's sum (at most
        n·2^33) plus its mask (64 bits wider); the released items keep `ExactAuc`'s width."""
        from common.crypto.masking import mask_bits
        from common.errors import EncodingOverflowError
        release = choose_layout(self.item_bits(n_rows, n_units, ()), mask_bits(recipient), 2, modulus_bits)
        slot_bits = bin_mask_bits(n_rows) + 3
        fit = (modulus_bits // 2 - 2) // slot_bits
        if fit < 2:
            raise EncodingOverflowError(f"a masked score bin may need {slot_bits} bits; the key's plaintext space "
                                        f"holds {modulus_bits // 2 - 2} (use a larger key)")
        comps = len(self.components(option, params, info))
        return Layout(slot_bits, min(fit, comps - 1), comps, release_bits=release.slot_bits, first_alone=True)

    def column_ciphertexts(self, k, n_weights, layout):
        """The pair items' columns (after a column per group and overall's) over ciphertext
        0 alone, the one holding y: they need Σ w_ab·y and nothing of the bins."""
        return {w: (0,) for w in range(k + 1, n_weights)}

    @staticmethod
    def _bin_positions(layout) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Per bin, the (ciphertext, slot) of P1_b and of G_b."""
        return [(layout.position(1 + b), layout.position(1 + SCORE_BINS + b)) for b in range(SCORE_BINS)]

    def square_requests(self, agg, n_units, pub, facts, layout):
        """Per cell: Enc(T + r) and each bin ciphertext with every slot masked by its own
        uniform r, 64 bits wider than a bin's sum (`bin_mask_bits`)."""
        from common.errors import ProtocolError
        if n_units != 1:
            raise ProtocolError("score bins are released with second moments alone (one unit)")
        n = pub.n
        cells = len(facts["S"])
        t_bits = square_mask_bits(facts["n"])
        r_bits = bin_mask_bits(facts["n"])
        n_cts = len(agg[0][0])
        slots, width = layout.slots, layout.slot_bits
        masks, plain = [], []
        for j in range(cells):
            t_mask = secrets.randbits(t_bits)
            slot_masks = [[secrets.randbits(r_bits) for _ in range(slots)] for _ in range(n_cts - 1)]
            masks.append((t_mask, slot_masks))
            plain.append(paillier.add_plain(n, agg[0][j][0], t_mask))
            plain += [paillier.add_plain(n, agg[0][j][1 + t], sum(m << (s * width) for s, m in enumerate(row)))
                      for t, row in enumerate(slot_masks)]
        requests = paillier.rerandomize_chunk(n, paillier.randomizer_base(n), plain)
        state = {"agg": agg, "n_units": 1, "masks": masks, "facts": facts, "cells": cells, "layout": layout}
        return state, requests

    def square_answers(self, plain, layout, n):
        """Per cell (`layout.n_ciphertexts` requests): (T + r)², Σ_b P1'_b·G'_b over the
        masked bins, then each P1'_b and each G'_b alone."""
        n_cts, width, slots = layout.n_ciphertexts, layout.slot_bits, layout.slots
        if len(plain) % n_cts:
            raise ValueError(f"{len(plain)} requests, not whole cells of {n_cts}")
        top = 1 << (width * slots)
        answers = []
        for start in range(0, len(plain), n_cts):
            t, *bin_cts = plain[start:start + n_cts]
            if any(v >= top for v in bin_cts):
                raise ValueError("a masked bin ciphertext does not decode")
            slot = [[(v >> (s * width)) & ((1 << width) - 1) for s in range(slots)] for v in bin_cts]
            p1, g = zip(*[(slot[pt - 1][ps], slot[gt - 1][gs]) for (pt, ps), (gt, gs) in self._bin_positions(layout)])
            answers += [t * t % n, sum(a * b for a, b in zip(p1, g)) % n, *p1, *g]
        return answers

    def square_answer_count(self, requests, layout):
        return requests // layout.n_ciphertexts * (2 + 2 * SCORE_BINS)

    def combine(self, state, squares, pub, layout, noise=None):
        """Items per cell: `ExactAuc._released_item` with X = Σ_b P1_b·G_b (the masks
        removed: P1'·G' − s·P1' − r·G' + r·s), then the pair items."""
        from common.errors import ProtocolError
        n, n2 = pub.n, pub.n2
        agg, cells = state["agg"], state["cells"]
        per_cell = 2 + 2 * SCORE_BINS
        if len(squares) != cells * per_cell:
            raise ProtocolError(f"{len(squares)} answers received, {cells * per_cell} expected")
        positions = self._bin_positions(layout)
        items = []
        for j in range(cells):
            t_mask, slot_masks = state["masks"][j]
            answers = squares[j * per_cell:(j + 1) * per_cell]
            t = agg[0][j][0]
            t2 = unmask_square(pub, answers[0], t, t_mask)
            x, constant = answers[1], 0
            for b, ((pt, ps), (gt, gs)) in enumerate(positions):
                r, s_ = slot_masks[pt - 1][ps], slot_masks[gt - 1][gs]
                x = x * paillier.scalar_pow(n, answers[2 + b], (-s_) % n) % n2
                x = x * paillier.scalar_pow(n, answers[2 + SCORE_BINS + b], (-r) % n) % n2
                constant += r * s_
            x = paillier.add_plain(n, x, constant)
            items.append(self._released_item(pub, layout, state, x, t, t2, state["facts"]["S"][j],
                                             None if noise is None else partial(noise, replicate=0)))
        return items + self._pair_items(state, pub, layout, noise)


class SampledAuc(MqosAuc):
    n_ids = 2

    def for_option(self, option):
        return self

    @staticmethod
    def _cap(params) -> int:
        return int(params.get("pairs_per_member") or DEFAULT_PAIRS_PER_MEMBER)

    def components(self, option, params, info):
        """Per real pair 2·indicator and 2, per dummy row 0 and 0 (at scale 2^1); the bounds
        are one member's most, over the at most `pairs_per_member` rows it is in: 2·cap."""
        cap = self._cap(params)
        return (Component("win", 1, 2 * cap), Component("two", 1, 2 * cap))

    resampling = "client_groups"
    interval = "random_groups"
    random_groups = DEFAULT_RANDOM_GROUPS
    #: encrypted either way; set so that both parties learn whether the release carries
    #: noise (`RELEASE_NOISE`), which the result's `SAMPLED_NOISE_INFO` is stated under
    he_under_noise = True

    def value_bounds(self, option, params):
        return {"pairs_per_member": float(self._cap(params))}

    def client_rows(self, frame, file, option, params, rng):
        """The rows of a label-independent random graph over all members (`sample_pair_graph`,
        module docstring "What the Tester sees"): no member in more than `pairs_per_member`
        rows; a row joining a positive and a negative is a real pair valued
        (1(s_pos > s_neg), ½ for a tie; 1), any other row a dummy valued (0; 0). About
        `pairs` real pairs are kept (fewer when the cap allows fewer: the shortfall is
        `info["pairs_dropped"]`). For the interval, every member is put in one of G random
        groups; a row of two members of group g is in unit g, any other row in unit G.
        The estimate uses every row; the interval is the random-groups t interval over
        the G within-group estimates, which vary with the members (G groups of n/G members
        each), not only with the pairs. Under release noise `info` also states how far the
        estimates may lie from exact's and when a group has no interval
        (`sampled_release_note`, module docstring "Sampled against exact under release
        noise")."""
        y, scores = _labels_and_scores(frame, file)
        m = int(params["pairs"])
        first, second, values, kept = sample_pair_graph(y, scores, m, self._cap(params), rng, file)
        group = rng.permutation(len(y)) % self.random_groups
        units = np.where(group[first] == group[second], group[first], self.random_groups)
        ids = frame["member_id"].to_numpy(dtype=object)
        info = {"pairs": m, "pairs_kept": kept, "pairs_dropped": m - kept}
        if params.get(RELEASE_NOISE):
            info[SAMPLED_NOISE_INFO] = sampled_release_note(kept, self.random_groups)
        return ClientRows(ids=(ids[first], ids[second]), values=values, units=units.astype(np.int64), info=info)

    def check_info(self, info, strata_labels):
        """The pair counts add up; the note under release noise, if any, is the one the
        counts give (`sampled_release_note`): no free text reaches the Tester."""
        counts = [int(info.get(k, 0)) for k in ("pairs", "pairs_kept", "pairs_dropped")]
        if min(counts) < 0 or counts[1] + counts[2] != counts[0]:
            raise ValueError("pair counts")
        if SAMPLED_NOISE_INFO in info and info[SAMPLED_NOISE_INFO] != sampled_release_note(counts[1],
                                                                                          self.random_groups):
            raise ValueError("release noise note")

    def slot_sensitivity(self, item, layout, components, multiplicity):
        """The noise is sized from the declared cap on pairs per member, not from the rows
        the Tester counted: a member in at most `cap` pairs moves each pair's weight
        p_fj·p_sj by at most |Δp_j| (the other member's probability is at most 1), so a
        slot by at most 2·cap·|Δp_j| (the components' bounds). A count above the cap is a
        Test-Client that broke its declaration: refused."""
        from common.errors import ProtocolError
        cap = components[0].bound // 2
        if multiplicity > cap:
            raise ProtocolError(f"a member is in {multiplicity:g} sampled pairs; the declared pairs_per_member "
                                f"is {cap}")
        return super().slot_sensitivity(item, layout, components, 1)

    def weights(self, q, strata, units, groups, option, params):
        qa, qb = (x.astype(object) for x in q)
        return [qa[:, j] * qb[:, j] for j in range(len(groups))] + [1 << (2 * PROBABILITY_BITS)]


METRIC = MqosAuc()
EXACT = ExactAuc()
BINNED = BinnedAuc()
SAMPLED = SampledAuc()
