"""Intervals under release noise from released second moments (design §8.4).

Under the release controls the Tester releases noised aggregates, never a bootstrap (a
bootstrap reuses every member in every replicate). For a ratio metric whose value
components are 0/1 with ``f ≤ d`` (ERO: ``f = 1(ŷ=1, y=0)``, ``d = 1(y=0)`` or 1), the
release is:

(a) the estimate's aggregates ``Num_j = Σ_i p_ij·f_i`` and ``Den_j = Σ_i p_ij·d_i`` per
    group (and overall, their sum), noised with σ₀;
(b) the second moments ``S^f_ab = Σ_i p_ia·p_ib·f_i`` and ``S^d_ab = Σ_i p_ia·p_ib·d_i``
    for every pair a ≤ b, noised with σ_m: the items of `common.stats.correction.extend` on
    the pair weights ``w_ab = q_a·q_b / 2^32`` (whose ``S^d`` is the correction's M).
    Since ``f² = f``, ``f·d = f`` and ``d² = d``, they are exactly the Poisson-bootstrap
    (uncentred) covariances of the aggregates: ``Cov(Num_a, Num_b) = Cov(Num_a, Den_b)
    = 2^32·S^f_ab`` and ``Cov(Den_a, Den_b) = 2^32·S^d_ab`` in the slots' fixed-point
    units (a probability is 2^32). Their sensitivity is in `tester_service.release`.

A metric with a real-valued f and d = 1 (the output metric, f the outcome minus its
range's centre) has rows that carry f² as a third component under this form
(`Metric.moment_squares`): its pair items add ``S^ff_ab = Σ_i p_ia·p_ib·f_i²``, and the
covariances are ``Cov(Num_a, Num_b) = S^ff_ab``, ``Cov(Num_a, Den_b) = S^f_ab``,
``Cov(Den_a, Den_b) = S^d_ab`` (f·d = f, d² = d), each times 2^32 and the slots'
fixed-point scale (`Family.unit`); the weighted interval uses them
(`aggregate_moments`, in a form steadier than a small group's released pair items: S^d
and the groups' means with one spread σ² for all groups, read off the overall sums,
`pooled_spread`) and the corrected one ``V = S^d·σ²`` (`residual_moments`).

A family's "groups" need not be races: LOT (`common.metrics.lot`, `Lot.moment_plan`)
makes one family per rank pair whose members are its cells (ordered group pairs), with
the spread of the gaps per rank pair as the Test-Client states it, and its pooled cells
are sums of other cells (`CorrectionPlan.pooled`), drawn as the sums of their parts'
draws, as "overall" is for the groups.

From them the finishing party (the Test-Client, or the Tester when only it learns the
result) forms, with no further release (post-processing):

* the **weighted** estimate's interval: R parametric draws of the aggregates,
  ``(Num, Den)* ~ N(released, 2^32·[[F, F], [F, S^d]] + noise²)`` with the binomial
  form ``F_ab = S^d_ab·(R_a + R_b)/2`` of ``S^f`` (`binomial_moments`; the
  covariance projected onto the positive semidefinite cone), each giving the ratios of
  every group and of overall (overall's draw is the sum of the groups' deviations, as
  its release is the sum of theirs). To first order this is the delta-method interval
  ``Var(R_j) = S^d_jj·R_j(1 − R_j) / Den_j² + noise`` with the
  covariances between groups that the differences and the max-|t| bands need; the
  draws keep `common.stats.results.finish`'s contract (row 0 the estimate, rows 1..R the
  replicates), so percentile intervals and bands work unchanged;
* the **corrected** estimate's interval (`common.stats.correction`): draws of
  ``Num* ~ N(Num, 2^32·V + noise²)`` with ``V_ab = S^f_ab − (S^f_ab)²/S^d_ab`` (the
  residual second moment ``Σ_i p_ia·p_ib·(f_i − c·d_i)²`` at its best constant c, which
  over-states the linearised variance ``Σ_i p_ia·p_ib·d_i·m_i(1 − m_i)`` of
  ``M⁻¹(Num − M·μ)`` by the spread of the members' ``m_i = p_i·μ`` only), and of
  ``M* = M + noise`` (its sampling part is in V), each solved with the range as a
  constraint (`common.stats.correction.bounded_solve`).

The draws' generator is seeded from the released values themselves (`draw_seed`), so
that both parties finish the same release to the same numbers. Coverage and widths
are measured in `bench/bench_intervals.py` (bench/RESULTS.md).
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence

import numpy as np

from common.stats.correction import WEIGHT_SCALE, finish_corrected, noise_of, pair_matrix, pairs, psd

#: the AggregatesHeader's interval for this release form (the report's intervals are the
#: draws' percentile intervals: `common.stats.intervals` reads them as "percentile")
FORM = "parametric"


def estimate_bounds(metric, option: str, params: dict) -> tuple[float, float] | None:
    """The range a group's estimate lies in, a constraint of the corrected solve: the
    metric's declared value range, else its fixed one (ERO's rates: [0, 1])."""
    declared = metric.value_range(option, params) if hasattr(metric, "value_range") else None
    return tuple(declared) if declared is not None else metric.estimate_range


def draw_seed(row: Sequence[Sequence[int]]) -> int:
    """A seed for the parametric draws from the released values (both parties hold them)."""
    digest = hashlib.sha256(repr([list(map(int, s)) for s in row]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def gaussian_draws(cov: np.ndarray, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """(replicates, n) draws of N(0, cov), cov projected onto the PSD cone first."""
    sym = psd(cov)
    vals, vecs = np.linalg.eigh(sym)
    root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    return rng.standard_normal((replicates, len(cov))) @ root.T


def moment_matrices(row, family, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(S^f, S^d), post-processed into what they can be: S^d ≥ 0 and 0 ≤ S^f ≤ S^d."""
    sd = np.clip(pair_matrix(row, family, family.den_slot, k), 0.0, None)
    sf = np.clip(pair_matrix(row, family, family.num_slot, k), 0.0, sd)
    return sf, sd


def pooled_spread(plan, family, row, k: int, noise_sd: Sequence[float] = ()) -> float:
    """σ², the outcome's spread around its mean over all joined rows (f² units), from the
    overall sums: ``Σ f²/n − (Σ f/n)²`` with Σ f² the overall item's f² slot where it
    shares the group items' ciphertext, else the pair items' ``Σ_a≤b c_ab·S^ff_ab``
    (c = 1 on the diagonal, 2 off it: Σ_i f_i²·(Σ_a p_ia)² = Σ_i f_i²); plus one sd of
    that estimate's own release noise (`noise_sd`: Σ f²'s noise over n), then clipped to
    [0, (span/2)²], the most a value in the declared range can spread. The noise on Σ f²
    is sized for f²'s bound (span/2)², so at small sizes it is a large share of the
    spread (at 1,000 members about 40% of an outcome's with sd 0.5 in a range of width 4),
    and an interval that took σ² as known would cover too little whenever the noise
    pulled it low (white's intervals 0.88 at 1,000 members, bench/RESULTS.md); one sd
    more costs nothing where the noise is small (0.4% of σ² at 100,000 members). Where the
    Test-Client states the spread from its own rows (`Family.spread`: MQOS-NDCG), that."""
    if family.spread is not None:
        return float(family.spread)
    cell = next((c for c in plan.cells if c.group == "overall" and c.kind == "group"
                 and (c.num_slot, c.den_slot) == (family.num_slot, family.den_slot)), None)
    if cell is None or family.sq_slot is None:
        return 0.0
    n, total = float(row[cell.item][family.den_slot]), float(row[cell.item][family.num_slot])
    if family.sq_items == family.pair_items:  # f² shares the group items' ciphertext
        squares = float(row[cell.item][family.sq_slot])
        squares_sd = noise_of(noise_sd, cell.item, family.sq_slot, plan.item_slots)
    else:
        weights = [(1.0 if a == b else 2.0, family.sq_items[p]) for p, (a, b) in enumerate(pairs(k))]
        squares = sum(c * float(row[i][family.sq_slot]) for c, i in weights)
        squares_sd = float(np.sqrt(sum((c * noise_of(noise_sd, i, family.sq_slot, plan.item_slots)) ** 2
                                       for c, i in weights)))
    if not n > 0:
        return 0.0
    return float(np.clip(squares / n - (total / n) ** 2 + squares_sd / n, 0.0, (family.span / 2.0) ** 2))


def aggregate_moments(row, family, k: int, num: np.ndarray, den: np.ndarray,
                      spread: float = 0.0) -> list[list[np.ndarray]]:
    """The Poisson-bootstrap covariance blocks [[Num, Num], [Num, Den]; [Den, Num],
    [Den, Den]] of a family's aggregates, in members' units (× `unit` of the slots),
    from S^d and the groups' means R (`binomial_moments`' reasoning: a member in groups
    a and b has a mean near (R_a + R_b)/2):

    * 0/1 components: ``S^f_ab = S^d_ab·(R_a + R_b)/2`` and S^ff = S^f (f² = f);
    * a real f with d = 1 (the rows carry f²): ``S^f_ab = S^d_ab·R̄_ab`` and
      ``S^ff_ab = S^d_ab·(σ² + R̄_ab²)``, R̄_ab = (R_a + R_b)/2 and σ² the pooled spread
      (`pooled_spread`), so that ``Var(Num_a − R_a·Den_a) = σ²·S^d_aa``: the delta
      method with one spread for every group;
    * a real f over a count d (MQOS-NDCG: a viewer's NDCG sum over its queries), with
      the spread σ² per unit of d that the Test-Client states (`Family.spread`:
      residuals of independent queries add up, E[e²|d] = σ²·d) and S^dd = κ·S^d
      (κ = Σ d²/Σ d, `Family.den_square`), ``S^fd = R̄·S^dd`` and
      ``S^ff = σ²·S^d + R̄²·S^dd``: again ``Var(Num_a − R_a·Den_a) = σ²·S^d_aa``, κ
      entering only the covariances across groups, at second order. The released S^ff_ab themselves are
      not used for a group's own spread: their noise is sized for f²'s bound, (span/2)²,
      and swamps a small group's Σ p²·f² (at 100,000 members aian's is about 64 against a
      noise sd of 102), whose intervals then swing from audit to audit and took the null
      flag rate to 9-11% (bench/RESULTS.md, "The output metric")."""
    _, sd = moment_matrices(row, family, k)
    if family.sq_slot is None and family.spread is None:
        sf = binomial_moments(sd, num, den)
        return [[sf, sf], [sf, sd]]
    rate = group_means(num, den, -family.span / 2.0, family.span / 2.0)
    mid = (rate[:, None] + rate[None, :]) / 2.0
    sdd = sd * family.den_square
    sf = sdd * mid
    return [[sd * spread + sdd * mid ** 2, sf], [sf, sdd]]


def residual_moments(row, family, k: int, spread: float = 0.0) -> np.ndarray:
    """``V_ab = S^ff_ab − (S^f_ab)²/S^d_ab`` (module docstring): for 0/1 values with the
    released S^f (S^ff = S^f); for a real f with the pooled spread, ``S^d_ab·σ²``
    (`aggregate_moments`)."""
    sf, sd = moment_matrices(row, family, k)
    if family.sq_slot is not None or family.spread is not None:
        return sd * spread
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > 0, sf - sf ** 2 / np.where(sd > 0, sd, 1.0), 0.0)


def weighted_draws(plan, moments, row: Sequence[Sequence[int]], estimate: np.ndarray, noise_sd: Sequence[float],
                   replicates: int, rng: np.random.Generator, withheld: Sequence[int] = ()) -> np.ndarray:
    """(replicates + 1, cells): row 0 `estimate` (the released ratios), then the
    parametric draws (module docstring) of every group cell and of "overall"; NaN where
    the estimate is (withheld, or a denominator within its noise of 0)."""
    k = len(moments.groups)
    out = np.full((replicates + 1, len(plan.cells)), np.nan)
    out[0] = estimate
    if moments.covariance is not None:
        return covariance_draws(plan, moments, row, out, noise_sd, replicates, rng, withheld)
    hidden = set(withheld)
    deviations: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # cell -> its draws' (Num, Den) deviations
    joint = joint_deviations(plan, moments, row, noise_sd, replicates, rng) if moments.cross else None
    for f, family in enumerate(moments.families):
        items = [plan.cells[c].item for c in family.cells]
        num = np.array([float(row[i][family.num_slot]) for i in items])
        den = np.array([float(row[i][family.den_slot]) for i in items])
        if joint is not None:
            d_num, d_den = joint[f]
        else:
            noise_n, noise_d = _family_noise(plan, family, noise_sd)
            blocks = aggregate_moments(row, family, k, num, den, pooled_spread(plan, family, row, k, noise_sd))
            cov = WEIGHT_SCALE * family.unit * np.block(blocks) + np.diag(np.concatenate([noise_n, noise_d]) ** 2)
            delta = gaussian_draws(cov, replicates, rng)
            d_num, d_den = delta[:, :k], delta[:, k:]
        shift = 2.0 ** family.scale_shift
        for j, c in enumerate(family.cells):
            deviations[c] = (d_num[:, j], d_den[:, j])
            if items[j] in hidden or not np.isfinite(estimate[c]):
                continue
            out[1:, c] = _ratios(num[j] + d_num[:, j], den[j] + d_den[:, j]) * shift + plan.cells[c].offset
        where = (plan.items[items[0]].ciphertext, plan.items[items[0]].stratum)
        for c, cell in enumerate(plan.cells):  # overall: its release is the groups' sum
            if cell.group != "overall" or cell.kind not in ("group", "curve") or not np.isfinite(estimate[c]) \
                    or (cell.num_slot, cell.den_slot, cell.scale_shift, cell.score) != \
                    (family.num_slot, family.den_slot, family.scale_shift, plan.cells[family.cells[0]].score) \
                    or (plan.items[cell.item].ciphertext, plan.items[cell.item].stratum) != where \
                    or cell.item in hidden:
                continue
            out[1:, c] = _summed_draws(row, cell, d_num.sum(axis=1), d_den.sum(axis=1))
    for c, parts in moments.pooled:  # a sum of other cells' releases: the sum of their deviations
        cell = plan.cells[c]
        if cell.item in hidden or not np.isfinite(estimate[c]) or not all(p in deviations for p in parts):
            continue
        out[1:, c] = _summed_draws(row, cell, sum(deviations[p][0] for p in parts),
                                   sum(deviations[p][1] for p in parts))
    return out


def covariance_draws(plan, moments, row, out: np.ndarray, noise_sd: Sequence[float], replicates: int,
                     rng: np.random.Generator, withheld: Sequence[int] = ()) -> np.ndarray:
    """`out` (row 0 the estimate) with rows 1.. the draws of a metric that states its
    cells' sampling covariance (`CorrectionPlan.covariance`): ``N(estimate, C + noise)``
    over the defined cells, the noise of a cell's ratio Num/Den to first order
    ``(sd_Num² + (Num/Den)²·sd_Den²)/Den²`` in reported units. NaN where the estimate is."""
    cells, cov = moments.covariance(plan, moments, row)
    hidden = set(withheld)
    noise = np.zeros(len(cells))
    for j, c in enumerate(cells):
        cell = plan.cells[c]
        num, den = float(row[cell.item][cell.num_slot]), float(row[cell.item][cell.den_slot])
        sd_n = noise_of(noise_sd, cell.item, cell.num_slot, plan.item_slots)
        sd_d = noise_of(noise_sd, cell.item, cell.den_slot, plan.item_slots)
        if den > 0:
            noise[j] = (sd_n ** 2 + (num / den) ** 2 * sd_d ** 2) / den ** 2 * 4.0 ** cell.scale_shift
    ok = np.array([plan.cells[c].item not in hidden and np.isfinite(out[0, c]) for c in cells], dtype=bool)
    if ok.any():
        full = np.nan_to_num(np.asarray(cov, dtype=np.float64)) + np.diag(noise)
        picked = [c for c, keep in zip(cells, ok) if keep]
        out[1:, picked] = out[0, picked] + gaussian_draws(full[np.ix_(ok, ok)], replicates, rng)
    return out


def _family_noise(plan, family, noise_sd: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The estimate's noise sd of a family's numerator and denominator slots, per group."""
    items = [plan.cells[c].item for c in family.cells]
    return (np.array([noise_of(noise_sd, i, family.num_slot, plan.item_slots) for i in items]),
            np.array([noise_of(noise_sd, i, family.den_slot, plan.item_slots) for i in items]))


def cross_covariance(moments, row, k: int) -> np.ndarray:
    """The covariance of the residual sums r_(f,a) = Σ_i p_ia·(num_f − R_fa·den_f) over
    every family f and group a (index f·k + a), in the slots' units, from the pair items'
    S^d and the stated cross-moments τ (`CorrectionPlan.cross`; `common.metrics.pot`):
    ``½(S^d_ab,f·τ_fg + S^d_ab,g·τ_gf)`` times 2^32 and the slots' scale."""
    sd = np.stack([np.clip(pair_matrix(row, fam, fam.den_slot, k), 0.0, None) for fam in moments.families])
    tau = np.asarray(moments.cross, dtype=np.float64)
    x = np.einsum("fab,fg->fagb", sd, tau)
    cov = 0.5 * (x + x.transpose(2, 3, 0, 1))
    n = len(moments.families) * k
    return WEIGHT_SCALE * moments.families[0].unit * cov.reshape(n, n)


def joint_deviations(plan, moments, row, noise_sd: Sequence[float], replicates: int,
                     rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per family, the (replicates, k) deviations of its (Num, Den) when the families'
    residuals are correlated (`cross_covariance`): Num's the joint residual draws plus its
    noise, Den's its noise alone (the delta method: a ratio moves by r/Den to first order,
    its denominator's own sampling spread entering at second order only)."""
    k = len(moments.groups)
    noise = [_family_noise(plan, family, noise_sd) for family in moments.families]
    noise_n = np.concatenate([n for n, _ in noise])
    d_num = gaussian_draws(cross_covariance(moments, row, k) + np.diag(noise_n ** 2), replicates, rng)
    return [(d_num[:, f * k:(f + 1) * k], rng.standard_normal((replicates, k)) * noise_d)
            for f, (_, noise_d) in enumerate(noise)]


def _summed_draws(row, cell, d_num: np.ndarray, d_den: np.ndarray) -> np.ndarray:
    """The draws of a cell whose release is a sum of others' ("overall", a pooled cell):
    its released (Num, Den) plus the sums of its parts' deviations, as a ratio."""
    n0, d0 = float(row[cell.item][cell.num_slot]), float(row[cell.item][cell.den_slot])
    return _ratios(n0 + d_num, d0 + d_den) * 2.0 ** cell.scale_shift + cell.offset


def binomial_moments(sd: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``S^d_ab·(R_a + R_b)/2``: the second moments of f that a rate R_j among each
    group's rows gives, ``E[Σ_i p_ia·p_ib·f_i | d] = Σ_i p_ia·p_ib·d_i·m_i`` with m_i
    near the two groups' rates (R the released Num/Den in [0, 1], overall's where a
    group's is undefined). The weighted interval uses these rather than the released
    S^f: with them ``Var(Num_j − R_j·Den_j) = S^d_jj·R_j(1 − R_j)``, the expectation of
    the plug-in ``Σ p²(f − R·d)²`` when R is the p²·d-weighted mean of m_i, and far
    steadier where a group's rate rests on a few rows with large p_ij, whose handful
    of events make S^f_jj swing (it under-stated small groups' variance and took the
    null flag rate at 100,000 members to 7.5-8%, against 5.0-5.2% with these;
    bench/RESULTS.md)."""
    rate = group_means(num, den, 0.0, 1.0)
    return np.clip(sd * (rate[:, None] + rate[None, :]) / 2.0, 0.0, sd)


def group_means(num: np.ndarray, den: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Num_j/Den_j per group (overall's where a group's is undefined), clipped to [lo, hi]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = num / den
        pooled = float(np.nansum(num) / np.nansum(den)) if np.nansum(den) > 0 else 0.0
    return np.clip(np.where(np.isfinite(rate) & (den > 0), rate, pooled), lo, hi)


def _ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def corrected_rows(plan, moments, row: Sequence[Sequence[int]], noise_sd: Sequence[float], replicates: int,
                   rng: np.random.Generator) -> list[list[float]]:
    """R + 1 rows of item slots (row 0 the release as it is, then the draws of the
    module docstring: Num* with variance V + noise, M* and Den* with their noise) for
    `CorrectionPlan.values` to solve one by one."""
    k = len(moments.groups)
    rows = [[list(map(float, s)) for s in row] for _ in range(replicates + 1)]
    drawn: set[int] = set()  # families on one ciphertext share their pair items
    joint = joint_deviations(plan, moments, row, noise_sd, replicates, rng) if moments.cross else None
    for f, family in enumerate(moments.families):
        items = [plan.cells[c].item for c in family.cells]
        if joint is not None:
            d_num, d_den = joint[f]
        else:
            v = residual_moments(row, family, k, pooled_spread(plan, family, row, k, noise_sd))
            noise_n, noise_d = _family_noise(plan, family, noise_sd)
            d_num = gaussian_draws(WEIGHT_SCALE * family.unit * v + np.diag(noise_n ** 2), replicates, rng)
            d_den = rng.standard_normal((replicates, k)) * noise_d
        pair_sd = [noise_of(noise_sd, i, family.den_slot, plan.item_slots) for i in family.pair_items]
        d_m = rng.standard_normal((replicates, len(pair_sd))) * np.array(pair_sd)
        for r in range(1, replicates + 1):
            for j, i in enumerate(items):
                rows[r][i][family.num_slot] += d_num[r - 1, j]
                rows[r][i][family.den_slot] += d_den[r - 1, j]
            for p, i in enumerate(family.pair_items):
                if i not in drawn:
                    rows[r][i][family.den_slot] += d_m[r - 1, p]
        drawn |= set(family.pair_items)
    return rows


def finish_release(plan, moments, row: Sequence[Sequence[int]], noise_sd: Sequence[float], replicates: int, *,
                   withheld: Sequence[int] = (), correct: bool = False,
                   bounds: tuple[float, float] | None = None):
    """Both parties' finish of a release in this form: (values, corrected) for
    `common.stats.results.finish` ((R+1, cells), row 0 the estimate; `corrected` a
    `common.stats.correction.Corrected` or None). `row`: the decoded slots of every item of
    the one released row (the plan's cells, then the pair items); `withheld`: items
    suppressed or found empty, NaN in every row; `correct`: the corrected values too,
    solved within `bounds` for groups identifiable at this noise (`noise_threshold`)."""
    estimate = plan.suppress(plan.cell_values(row, lambda num, den: None, plain_rows=1, noise_sd=noise_sd),
                             withheld)[0]
    rng = np.random.default_rng(draw_seed(row))
    values = weighted_draws(plan, moments, row, estimate, noise_sd, replicates, rng, withheld)
    if not correct and not _of_groups(plan, moments):
        return values, None
    rows = corrected_rows(plan, moments, row, noise_sd, replicates, rng)  # row 0: the release as it is
    corrected = finish_corrected(moments, [s for r in rows for s in r], plan, withheld, (), noise_sd, bounds=bounds)
    return values, corrected if correct else replace(corrected, reported=False)


def _of_groups(plan, moments) -> bool:
    """Whether the released M is over the audit's groups (the rates of ERO, the output
    metric, MQOS-NDCG: families of group cells, drawn independently), so that the
    corrected gap and the mixing serve the verdict's attenuation statement even where no
    correction was asked for (post-processing of the release: `finish_release`)."""
    cells = {plan.cells[c].kind for family in moments.families for c in family.cells}
    return (cells == {"group"} and not moments.cross and not moments.pooled and moments.covariance is None)
