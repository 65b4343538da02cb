"""POT, the pointwise outcome test (design §5.5; paper appendix B.1, eqs. 10-12).

Dataset: `member_id, score, outcome` (finite numbers). The
Test-Client picks the reference scores s_1..s_Q (the deciles of its scores by default,
or `reference_scores`), the Gaussian kernel's bandwidth h_q per reference score (by
default `scoring.curve_bandwidths`: Silverman's rule for a group of n/50 rows, widened
where the scores are sparse so that every point's kernel holds about as many rows; or one
`bandwidth` for all) and computes per row, in plaintext, the 2Q values
K_q(S_i)·Y_i and K_q(S_i) with K_q(S) = exp(−((S − s_q)/h_q)²/2) (unnormalised kernel: the 1/h cancels), packed
into as few ciphertexts as the slot plan allows. Cells: m_j(s_q) = Σ p_ij K Y / Σ p_ij K
per group (and overall) and reference score — the curves; derived from them per
replicate, DTI_ab = Σ_q w_q (m_a(s_q) − m_b(s_q)) for every ordered pair of groups,
with weights w_q uniform (1/Q, so DTI is the mean gap) unless `dti_weights` are given.
Verdict: a DTI significantly different from 0 (rule "nonzero_pairs").

**Declared range and sensitivity.** The outcome's possible range [LO, HI] is declared
(`outcome_range`, `--outcome-range LO:HI`; default 0:1, a binary outcome). The
Test-Client clips every outcome into it before encryption, counting the rows clipped
(`info["rows_clipped"]`, sent with the other dataset facts: a count over its own rows,
before the join), or refuses the dataset (`out_of_range` refuse), and encodes
K_q·(Y − c) with the range's centre c = (LO + HI)/2 (|K_q·(Y − c)| ≤ (HI − LO)/2, since
0 < K_q ≤ 1); each curve cell adds c back (`Cell.offset`). Replacing one member's vector
(||Δp||₂ ≤ √2, member ids unique: m = 1 row) moves the numerator slot of reference
score q by Δp_j·K_q(Y − c) and its denominator slot by Δp_j·K_q in group j: per slot at
most √2·m times the component bounds (HI − LO)/2 and 1 (`Metric.slot_sensitivity`).
The release of all 2Q slots with noise σ·bound per slot is β/σ²-zCDP with
β = max over a row of Σ_q K_q²·(((Y − c)/((HI − LO)/2))² + 1) ≤ 2·max_S Σ_q
exp(−(S − s_q)²/h_q²) (`sensitivity_components`), which both parties compute from the
reference scores and the bandwidths (on a grid, plus the grid's largest possible miss
from the derivative bound), so well separated reference scores cost about 2
components instead of 2Q.

**Interval under release noise** (`common.stats.moments`, design §8.4). Released: the
curves' sums at σ₀ and, on the pair weights p_a·p_b, the second moments
``S^d_ab,q = Σ_i p_ia·p_ib·K_q`` (the pair items' k_q slots, also the correction's M).
A curve point m_a(s_q) = Num_aq/Den_aq moves to first order by r_aq/Den_aq, with the
residual sum ``r_aq = Σ_i p_ia·K_q·(Y_i − m_a(s_q))``, and
``Cov(r_aq, r_bq') = Σ_i p_ia·p_ib·K_q·K_q'·e_q·e_q'``: the kernels of neighbouring
reference scores overlap, so the DTI (a sum over q) needs the covariances across
reference scores as well as across groups. Released as they are these would be
Q(Q + 1)/2 more components per row on the pair weights. The Test-Client states instead,
from its own rows, the residual cross-moments per unit of kernel mass
``τ_qq' = Σ_i K_q·K_q'·e_q·e_q' / Σ_i K_q`` (e_q = Y − m̂(s_q) around its own overall
curve; `residual_cross_moments`, `info["residual_moments"]`, under this release only:
`stated_facts`), and the covariance is read
as ``½(S^d_ab,q·τ_qq' + S^d_ab,q'·τ_q'q)``: exact where a group's scores spread as all
the rows' do near s_q (under the null in particular), and a group whose curve differs
from the overall one gets a larger residual spread, so a wider interval, never a
narrower one. The finishing party draws every (group, reference score) residual jointly
(`common.stats.moments.joint_deviations`). Measured on the plaintext twin
(`bench/bench_random_groups.py --form moments`, bench/RESULTS.md).

A masked ciphertext holds several (Num, Den) cells of one group and one replicate, so
they share the mask's factor: the Test-Client can read ratios between those cells'
numerators (or denominators), i.e. how the group's kernel mass spreads over the
reference scores (design §9.4).
"""
from __future__ import annotations

import math

import numpy as np

from common.metrics.base import (OUT_OF_RANGE_PARAM, SECOND_MOMENTS, Cell, ClientRows, Component, Item, Metric,
                                 Param, Plan, bounded_column, finite_column, float_list)
from common.metrics.output import DEFAULT_OUTCOME_RANGE, OUTCOME_RANGE_PARAM, centred_bound, fixed_bound
from common.metrics.scoring import (DECILES, MAX_REFERENCE_SCORES, curve_bandwidths, kernel_components,
                                    reference_scores)

SCALE_BITS = 24
#: grid points at most over the reference scores' span when bounding Σ_q K_q² (`kernel_energy`)
ENERGY_GRID = 200_001
#: the Test-Client's fact the interval under release noise reads (`residual_cross_moments`)
RESIDUAL_INFO = "residual_moments"
#: significant digits of the stated residual cross-moments
RESIDUAL_DIGITS = 9


def kernel_energy(refs, h) -> float:
    """An upper bound on max_S Σ_q K_q(S)² = max_S Σ_q exp(−(S − s_q)²/h_q²) (``h`` one
    bandwidth or one per reference score): the largest value on a grid over
    [min s_q, max s_q] (outside it every term falls), plus the most the function can rise
    between grid points (|d/dS| ≤ Q·√2·e^(−1/2)/min h_q), capped at Q."""
    r = np.asarray(refs, dtype=np.float64)
    hq = np.broadcast_to(np.asarray(h, dtype=np.float64), r.shape)
    order = np.argsort(r)
    r, hq = r[order], hq[order]
    q, h_min = len(r), float(hq.min())
    span = float(r[-1] - r[0])
    points = int(min(ENERGY_GRID, max(2, math.ceil(span / (h_min / 1000.0)) + 1)))
    grid = np.linspace(r[0], r[-1], points)
    best = 0.0
    for chunk in np.array_split(grid, max(1, points // 20_000)):
        best = max(best, float(np.exp(-(((chunk[:, None] - r[None, :]) / hq[None, :]) ** 2)).sum(axis=1).max()))
    step = span / (points - 1) if points > 1 else 0.0
    slack = step / 2.0 * q * math.sqrt(2.0) * math.exp(-0.5) / h_min
    return min(float(q), best + slack)


def residual_cross_moments(values: np.ndarray) -> list[list[float]]:
    """τ_qq' = Σ_i K_q·K_q'·e_q·e_q' / Σ_i K_q (module docstring) from the rows' 2Q
    components [K_1·(Y − c), K_1, ...]: e_q = Y − m̂(s_q) with m̂(s_q) = Σ K_q·Y / Σ K_q over
    these rows, so that K_q·e_q = K_q·(Y − c) − (m̂(s_q) − c)·K_q. Rounded to
    RESIDUAL_DIGITS significant digits; 0 where a reference score has no kernel mass."""
    f, d = values[:, 0::2], values[:, 1::2]
    mass = d.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        centre = np.where(mass > 0, f.sum(axis=0) / np.where(mass > 0, mass, 1.0), 0.0)
        u = f - centre[None, :] * d
        tau = np.where(mass[:, None] > 0, (u.T @ u) / np.where(mass > 0, mass, 1.0)[:, None], 0.0)
    return [[float(f"{x:.{RESIDUAL_DIGITS}g}") for x in row] for row in tau]


def _bandwidth(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive number")
    return value


class Pot(Metric):
    name = "pot"
    corrects = True
    moment_interval = True
    stated_facts = (RESIDUAL_INFO,)
    description = "pointwise outcome test: per-group kernel regression of the outcome on the score, and DTI"
    params = (
        Param("reference_scores", "comma-separated reference scores (default: the score deciles)", float_list),
        Param("bandwidth", "Gaussian kernel bandwidth at every reference score (default: one per reference score, "
              "from the scores' spread and local spacing)", _bandwidth),
        Param("dti_weights", "comma-separated weights w_q, one per reference score (default: 1/Q each)",
              float_list),
        OUTCOME_RANGE_PARAM, OUT_OF_RANGE_PARAM,
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

    def value_bounds(self, option, params):
        lo, hi = self.value_range(option, params)
        return {"outcome_lo": float(lo), "outcome_hi": float(hi)}

    def value_range(self, option, params):
        return tuple(params.get("outcome_range") or DEFAULT_OUTCOME_RANGE)

    def components(self, option, params, info):
        q = len(info["reference_scores"])
        _, half = centred_bound(*self.value_range(option, params))
        comps = []
        for i in range(q):
            comps += [Component(f"ky_{i}", SCALE_BITS, fixed_bound(half, SCALE_BITS)),
                      Component(f"k_{i}", SCALE_BITS, 1 << SCALE_BITS)]
        return tuple(comps)

    def sensitivity_components(self, option, params, info):
        return min(2.0 * len(info["reference_scores"]),
                   2.0 * kernel_energy(info["reference_scores"], info["bandwidth"]))

    def client_rows(self, frame, file, option, params, rng):
        scores = finite_column(frame, "score", file)
        lo, hi = self.value_range(option, params)
        info = {"rows_clipped": 0}
        outcome = bounded_column(finite_column(frame, "outcome", file), lo, hi, params, info, file=file,
                                 column="outcome", bound="outcome_range")
        refs = reference_scores(scores, params.get("reference_scores"))
        given = params.get("bandwidth")
        h = np.full(refs.shape, float(given)) if given else curve_bandwidths(scores, refs, file)
        info.update({"reference_scores": [float(r) for r in refs], "bandwidth": [float(x) for x in h]})
        self._weights(params, info)
        centre, _ = centred_bound(lo, hi)
        values = kernel_components(scores, outcome - centre, refs, h)
        if params.get(SECOND_MOMENTS):  # stated for the interval under release noise alone
            info[RESIDUAL_INFO] = residual_cross_moments(values)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=values, info=info)

    def check_info(self, info, strata_labels):
        refs = info["reference_scores"]
        if not 1 <= len(refs) <= MAX_REFERENCE_SCORES or not all(math.isfinite(float(r)) for r in refs):
            raise ValueError("reference scores")
        h = info["bandwidth"]
        if not isinstance(h, list) or len(h) != len(refs) or not all(math.isfinite(float(x)) and float(x) > 0
                                                                   for x in h):
            raise ValueError("bandwidth")
        if int(info.get("rows_clipped", 0)) < 0:
            raise ValueError("clipped rows")
        if RESIDUAL_INFO not in info:  # stated only for second moments (`Metric.stated_facts`)
            return
        tau = np.asarray(info[RESIDUAL_INFO], dtype=np.float64)
        if tau.shape != (len(refs), len(refs)) or not np.all(np.isfinite(tau)) or np.any(np.diag(tau) < 0):
            raise ValueError("residual moments")

    def moment_shape(self, option, params, info, layout):
        """The residual cross-moments τ the Test-Client states (module docstring), by
        which the finishing party reads the curves' covariances off S^d (`cross`)."""
        shape = super().moment_shape(option, params, info, layout)
        shape["cross"] = info.get(RESIDUAL_INFO, ())  # without it (no release noise) nothing reads it
        return shape

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
        centre, _ = centred_bound(*self.value_range(option, params))
        names = list(groups) + ["overall"]
        n_cts = layout.n_ciphertexts
        items = tuple(Item(w, ct) for w in range(len(names)) for ct in range(n_cts))
        cells = []
        for w, g in enumerate(names):
            for i, score in enumerate(refs):
                ct, num_slot = layout.position(2 * i)
                _, den_slot = layout.position(2 * i + 1)
                cells.append(Cell("curve", g, score=float(score), item=w * n_cts + ct, num_slot=num_slot,
                                  den_slot=den_slot, offset=centre))
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
