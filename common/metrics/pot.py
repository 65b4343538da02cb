"""POT, the pointwise outcome test (SPEC.md section 5; paper appendix B.1, eqs. 10-12).

Dataset: `member_id, score, outcome` (finite numbers; |outcome| <= 10^9). The
Test-Client picks the reference scores s_1..s_Q (the deciles of its scores by default,
or `reference_scores`), the Gaussian kernel's bandwidth h (Silverman's rule on the
scores by default, or `bandwidth`) and computes per row, in plaintext, the 2Q values
K_h(S_i − s_q)·Y_i and K_h(S_i − s_q) (unnormalised kernel: the 1/h cancels), packed
into as few ciphertexts as the slot plan allows. Cells: m_j(s_q) = Σ p_ij K Y / Σ p_ij K
per group (and overall) and reference score — the curves; derived from them per
replicate, DTI_ab = Σ_q w_q (m_a(s_q) − m_b(s_q)) for every ordered pair of groups,
with weights w_q uniform (1/Q, so DTI is the mean gap) unless `dti_weights` are given.
Verdict: a DTI significantly different from 0 (rule "nonzero_pairs").

A masked ciphertext holds several (Num, Den) cells of one group and one replicate, so
they share the mask's factor: the Test-Client can read ratios between those cells'
numerators (or denominators), i.e. how the group's kernel mass spreads over the
reference scores (README, "What each party learns").
"""
from __future__ import annotations

import math

import numpy as np

from common.metrics.base import Cell, ClientRows, Component, Item, Metric, Param, Plan, finite_column, float_list
from common.metrics.scoring import (DECILES, MAX_REFERENCE_SCORES, kernel_components, reference_scores,
                                    silverman_bandwidth)

SCALE_BITS = 24
MAX_OUTCOME = 1e9


def _bandwidth(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive number")
    return value


class Pot(Metric):
    name = "pot"
    corrects = True
    description = "pointwise outcome test: per-group kernel regression of the outcome on the score, and DTI"
    params = (
        Param("reference_scores", "comma-separated reference scores (default: the score deciles)", float_list),
        Param("bandwidth", "Gaussian kernel bandwidth (default: Silverman's rule on the scores)", _bandwidth),
        Param("dti_weights", "comma-separated weights w_q, one per reference score (default: 1/Q each)",
              float_list),
    )
    numeric_columns = ("score", "outcome")
    verdict_rule = "nonzero_pairs"

    def parse_params(self, given):
        """The parameters, with what can be checked before any data is read: the
        reference scores (at most MAX_REFERENCE_SCORES, all different) and the number of
        DTI weights (one per reference score; without given reference scores, at most
        one per decile)."""
        from common.errors import InputError
        params = super().parse_params(given)
        refs, weights = params.get("reference_scores"), params.get("dti_weights")
        if refs is not None:
            if len(refs) > MAX_REFERENCE_SCORES:
                raise InputError(f"gives {len(refs)} scores; at most {MAX_REFERENCE_SCORES} are allowed",
                                 parameter="reference_scores")
            if len(set(refs)) != len(refs):
                raise InputError("must all be different", parameter="reference_scores")
            if weights is not None and len(weights) != len(refs):
                raise InputError(f"gives {len(weights)} weights for {len(refs)} reference scores",
                                 parameter="dti_weights")
        elif weights is not None and len(weights) > len(DECILES):
            raise InputError(f"gives {len(weights)} weights; the default reference scores are at most "
                             f"{len(DECILES)} deciles", parameter="dti_weights")
        return params

    def components(self, option, params, info):
        q = len(info["reference_scores"])
        comps = []
        for i in range(q):
            comps += [Component(f"ky_{i}", SCALE_BITS, int(MAX_OUTCOME * (1 << SCALE_BITS)) + 1),
                      Component(f"k_{i}", SCALE_BITS, 1 << SCALE_BITS)]
        return tuple(comps)

    def client_rows(self, frame, file, option, params, rng):
        scores = finite_column(frame, "score", file)
        outcome = finite_column(frame, "outcome", file, limit=MAX_OUTCOME)
        refs = reference_scores(scores, params.get("reference_scores"))
        h = params.get("bandwidth") or silverman_bandwidth(scores, file)
        info = {"reference_scores": [float(r) for r in refs], "bandwidth": float(h)}
        self._weights(params, info)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),),
                          values=kernel_components(scores, outcome, refs, h), info=info)

    def check_info(self, info, strata_labels):
        refs = info["reference_scores"]
        if not 1 <= len(refs) <= MAX_REFERENCE_SCORES or not all(math.isfinite(float(r)) for r in refs):
            raise ValueError("reference scores")
        if not float(info["bandwidth"]) > 0:
            raise ValueError("bandwidth")

    @staticmethod
    def _weights(params, info) -> np.ndarray:
        from common.errors import InputError
        q = len(info["reference_scores"])
        given = params.get("dti_weights")
        if given is None:
            return np.full(q, 1.0 / q)
        if len(given) != q:
            raise InputError(f"gives {len(given)} weights for {q} reference scores", parameter="dti_weights")
        return np.asarray(given, dtype=np.float64)

    def plan(self, groups, strata_labels, layout, option, params, info):
        refs = info["reference_scores"]
        names = list(groups) + ["overall"]
        n_cts = layout.n_ciphertexts
        items = tuple(Item(w, ct) for w in range(len(names)) for ct in range(n_cts))
        cells = []
        for w, g in enumerate(names):
            for i, score in enumerate(refs):
                ct, num_slot = layout.position(2 * i)
                _, den_slot = layout.position(2 * i + 1)
                cells.append(Cell("curve", g, score=float(score), item=w * n_cts + ct, num_slot=num_slot,
                                  den_slot=den_slot))
        return Plan(tuple(cells), items, layout.slots)

    def derived(self, cells, values, params, info):
        weights = self._weights(params, info)
        curve = {}
        for c, cell in enumerate(cells):
            if cell.kind == "curve" and cell.group != "overall":
                curve.setdefault(cell.group, []).append(c)
        names = list(curve)
        out_cells, cols = [], []
        for a in names:
            for b in names:
                if a != b:
                    gap = values[:, curve[a]] - values[:, curve[b]]
                    cols.append(gap @ weights)
                    out_cells.append(Cell("pair", a, b))
        return out_cells, (np.column_stack(cols) if cols else np.empty((values.shape[0], 0)))


METRIC = Pot()
