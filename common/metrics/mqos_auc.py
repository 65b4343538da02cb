"""MQOS-AUC, minimum quality of service by ROC AUC (SPEC.md section 5; paper appendix B.2).

Dataset: `member_id, y_true (0/1), score`. Both classes must be present. Cells: each
group and overall (the global AUC). Verdict: a group significantly below overall
(rule "below_overall"; flagged when AUC_global − AUC[j] > τ). Two algorithms
(`--metric-option`):

* `exact` (default; B.2.1 in the linear form of SPEC 5, "Decision"). The paper's
  trapezoid multiplies two encrypted quantities, which additive HE cannot. Instead,
  with w(i,l) = 1 if s_i > s_l, ½ if tied, 0 otherwise: A_j(i) = Σ_{l≠i} w(i,l)·p_lj
  (plaintext, at the Tester, from the score order), L_j = Σ p_ij·A_j(i)·y_i,
  T_j = Σ p_ij·y_i, Q_j = Σ p_ij²·y_i, S_j = Σ p_ij and
  AUC_j = (L_j − (T_j² − Q_j)/2) / (T_j·(S_j − T_j)) (the pairs of positives add
  (T_j² − Q_j)/2 to L_j since w(i,l) + w(l,i) = 1). Each row carries Enc(y_i) and its
  dense score rank in plaintext: the Tester learns the score order of the anonymous
  joined rows, as in the paper's design. T_j² comes from a masked squaring round trip:
  the Tester sends Enc(T_j + r) with r uniform and 64 bits wider than T_j, the
  Test-Client returns Enc((T_j + r)²), the Tester removes 2rT_j + r² under encryption.
  Intervals: the statistic is not a sum over rows, so instead of the bootstrap the
  rows are split into G = 10 random groups; each group's AUC uses A within the group,
  and the interval is est ± t_{G−1}·sd/√G (coverage measured by a test: 0.95-0.97 at
  95%, `tests/test_metric_scoring.py`).
* `sampled` (B.2.2). The Test-Client draws `pairs` (default 100,000) positive-negative
  pairs with replacement, puts each pair's two members in random order (so the Tester
  cannot tell the positive) and encrypts 1(s_pos > s_neg) (½ for a tie); the pair
  weight is p_ij·p_lj. Pairs share members, so resampling pairs would ignore the
  members' own variation and give far too narrow intervals; instead the Test-Client
  puts its members in G = 10 random groups and labels each pair with its group (both
  members in group g) or "across"; the estimate uses all pairs, the interval is the
  random-groups t interval over the G within-group estimates (conservative: their
  pair-sampling part is G times the full sample's).
"""
from __future__ import annotations

import math
import secrets

import numpy as np

from common import paillier
from common.metrics.base import (NOISE_HEADROOM_BITS, Cell, ClientRows, Component, Item, Metric, Param, Plan,
                                 PROBABILITY_BITS, bits,
                                 finite_column, positive_int)
from common.metrics.scoring import DEFAULT_RANDOM_GROUPS, dense_score_rank, doubled_a_weights, sample_pairs
from common.tables import binary_column

DEFAULT_PAIRS = 100_000
MAX_PAIRS = 50_000_000
#: bits by which the squaring mask r is wider than the masked sum (statistical hiding)
SQUARE_MASK_BITS = 64


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
    option_help = "exact (default): linear form, random-groups intervals; sampled: Mann-Whitney pairs"
    params = (Param("pairs", f"sampled: positive-negative pairs to draw (default {DEFAULT_PAIRS})",
                    positive_int(MAX_PAIRS), DEFAULT_PAIRS),)
    numeric_columns = ("y_true", "score")
    verdict_rule = "below_overall"

    def for_option(self, option: str) -> Metric:
        return SAMPLED if option == "sampled" else EXACT


class ExactAuc(MqosAuc):
    params = ()
    resampling = "random_groups"
    random_groups = DEFAULT_RANDOM_GROUPS
    interval = "random_groups"
    needs_squares = True
    uses_strata = True

    def for_option(self, option):
        return self

    def components(self, option, params, info):
        return (Component("y", 0, 1),)

    def client_rows(self, frame, file, option, params, rng):
        y, scores = _labels_and_scores(frame, file)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=y[:, None].astype(np.float64),
                          strata=dense_score_rank(scores))

    def weight_bits(self, n_rows):
        return 2 * PROBABILITY_BITS + 1 + bits(n_rows)

    def item_bits(self, n_rows, n_units, components):
        return 2 * bits(n_rows) + 2 * PROBABILITY_BITS + 2 + NOISE_HEADROOM_BITS

    def tester_facts(self, q, strata, units):
        """S_j over all rows and per random group (plaintext: Σ of the Tester's own weights)."""
        ext = _with_overall(q)
        g = int(units.max()) + 1
        per_group = np.zeros((g, ext.shape[1]), dtype=object)
        for u in range(g):
            per_group[u] = [int(v) for v in ext[units == u].sum(axis=0)]
        return {"S": [int(v) for v in ext.sum(axis=0)], "S_group": per_group.tolist()}

    def weights(self, q, strata, units, groups, option, params):
        """Per cell (groups, then overall): W_L = q·2A over all rows, W_Lg = q·2A within the
        row's random group, W_T = q, W_Q = q² (2A keeps ties' half weights integral)."""
        ext = _with_overall(q)
        full = doubled_a_weights(strata, ext)
        within = doubled_a_weights(strata, ext, groups=units)
        cols = []
        for j in range(ext.shape[1]):
            qj = ext[:, j].astype(object)
            cols += [qj * full[:, j].astype(object), qj * within[:, j].astype(object), ext[:, j], qj * qj]
        return cols

    def square_requests(self, agg, n_units, pub, facts):
        """Enc(T + r) for the full sample and each random group, per cell."""
        n, n2 = pub.n, pub.n2
        cells = len(facts["S"])
        t_full = []
        for j in range(cells):
            prod = 1
            for u in range(n_units):
                prod = prod * agg[u][4 * j + 2][0] % n2
            t_full.append(prod)
        t_rows = [t_full] + [[agg[u][4 * j + 2][0] for j in range(cells)] for u in range(n_units)]
        r_bits = max(bits(s) for s in facts["S"]) + SQUARE_MASK_BITS
        masks = [[secrets.randbits(r_bits) for _ in range(cells)] for _ in t_rows]
        h = paillier.randomizer_base(n)
        requests = paillier.rerandomize_chunk(n, h, [paillier.add_plain(n, t, r) for row, mrow in zip(t_rows, masks)
                                                     for t, r in zip(row, mrow)])
        state = {"agg": agg, "n_units": n_units, "t": t_rows, "r": masks, "facts": facts, "cells": cells}
        return state, requests

    def combine(self, state, squares, pub, layout):
        """Items (Enc(Num + 2^S·Den)) per replicate (full sample, then each random group) and cell:
        Num = L − T² + Q and Den = 2(T·S − T²), both at scale 2^65."""
        from common.errors import ProtocolError
        n, n2 = pub.n, pub.n2
        agg, n_units, cells = state["agg"], state["n_units"], state["cells"]
        if len(squares) != (n_units + 1) * cells:
            raise ProtocolError(f"{len(squares)} squares received, {(n_units + 1) * cells} expected")
        shift = 1 << layout.slot_bits
        items = []
        for rep in range(n_units + 1):
            for j in range(cells):
                t = state["t"][rep][j]
                r = state["r"][rep][j]
                sq = squares[rep * cells + j]
                t2 = sq * paillier.scalar_pow(n, t, (-2 * r) % n) % n2
                t2 = paillier.add_plain(n, t2, -r * r)
                if rep == 0:
                    lsum, qsum = 1, 1
                    for u in range(n_units):
                        lsum = lsum * agg[u][4 * j][0] % n2
                        qsum = qsum * agg[u][4 * j + 3][0] % n2
                    s = state["facts"]["S"][j]
                else:
                    lsum, qsum = agg[rep - 1][4 * j + 1][0], agg[rep - 1][4 * j + 3][0]
                    s = state["facts"]["S_group"][rep - 1][j]
                minus_t2 = paillier.scalar_pow(n, t2, n - 1)
                num = lsum * minus_t2 % n2 * qsum % n2
                den = paillier.scalar_pow(n, paillier.scalar_pow(n, t, s) * minus_t2 % n2, 2)
                items.append(num * paillier.scalar_pow(n, den, shift) % n2)
        return items

    def size_weight(self, item):
        return item.weight + 2  # W_T = q: the effective size S_j

    def squares_sensitivity(self, state, multiplicity):
        """Per cell, the (Num, Den) slots' sensitivity to one member's probability vector
        (per unit of ||Δp||₂, in fixed-point units of 2^65: Num = L − (T² − Q)/2 and
        Den = T·(S − T)). Changing p_t moves L_j by at most (A_j(t) + Σ_i p_ij·y_i·w(i,t))
        ·|Δp_tj| ≤ 2·S_j·|Δp_tj|, T_j²/2 by T_j·|Δp_tj|, Q_j/2 by |Δp_tj|, and Den by
        (S + 3T)·|Δp_tj|; with T ≤ S: Num ≤ 3S + 1, Den ≤ 4S. S_j is rounded up to a power
        of 2^(1/4), so that the noise scale says little about it (at most 19% more noise)."""
        scale = 1 << 65
        out = []
        for s_fixed in state["facts"]["S"]:
            s_members = max(1.0, int(s_fixed) / float(1 << PROBABILITY_BITS))
            s_hat = 2.0 ** (math.ceil(4.0 * math.log2(s_members)) / 4.0)
            out.append([math.ceil((3 * s_hat + 1) * multiplicity) * scale,
                        math.ceil(4 * s_hat * multiplicity) * scale])
        return out

    def plan(self, groups, strata_labels, layout, option, params, info):
        names = list(groups) + ["overall"]
        return Plan(tuple(Cell("group", g, item=j, num_slot=0, den_slot=1) for j, g in enumerate(names)),
                    tuple(Item(4 * j, 0) for j in range(len(names))), 2)


class SampledAuc(MqosAuc):
    n_ids = 2

    def for_option(self, option):
        return self

    def components(self, option, params, info):
        return (Component("win", 1, 2), Component("two", 1, 2))

    resampling = "client_groups"
    interval = "random_groups"
    random_groups = DEFAULT_RANDOM_GROUPS

    def client_rows(self, frame, file, option, params, rng):
        """Pairs drawn uniformly from all positive-negative pairs (B.2.2). For the interval,
        every member is put in one of G random groups; a pair of two members of group g is
        in unit g, any other pair in unit G. The estimate uses every pair; the interval is
        the random-groups t interval over the G within-group estimates, which vary with
        the members (G groups of n/G members each), not only with the pairs."""
        y, scores = _labels_and_scores(frame, file)
        m = int(params["pairs"])
        first, second, indicator = sample_pairs(y, scores, m, rng, file)
        group = rng.permutation(len(y)) % self.random_groups
        units = np.where(group[first] == group[second], group[first], self.random_groups)
        ids = frame["member_id"].to_numpy(dtype=object)
        return ClientRows(ids=(ids[first], ids[second]), values=np.column_stack([indicator, np.ones_like(indicator)]),
                          units=units.astype(np.int64), info={"pairs": m})

    def weights(self, q, strata, units, groups, option, params):
        qa, qb = (x.astype(object) for x in q)
        return [qa[:, j] * qb[:, j] for j in range(len(groups))] + [1 << (2 * PROBABILITY_BITS)]


METRIC = MqosAuc()
EXACT = ExactAuc()
SAMPLED = SampledAuc()
