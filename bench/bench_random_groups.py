"""Benchmark: null flag rate of the intervals under the default release controls of POT and
MQOS-AUC exact (both from second moments), and of the forms measured against them.

    nice -n 10 .venv/bin/python bench/bench_random_groups.py [--metric pot,mqos-auc] [--sizes 10000,100000]
                                                          [--datasets 400] [--seed 1] [--save PREFIX]
                                                          [--form today|moments|separate|pooled]
                                                          [--shift-black D]
    .venv/bin/python bench/bench_random_groups.py --merge PREFIX.*     # one table from --save files
    nice -n 10 .venv/bin/python bench/bench_random_groups.py --check   # the twin against the sessions

Under release noise POT and MQOS-AUC exact take their interval from second moments (form (a),
`common.metrics.pot`, `common.metrics.mqos_auc`), and from G = 10 disjoint random groups of the
joined rows before (`tester_service.release`, form (b)). This is a plaintext twin of those
releases under the default `ReleasePolicy`, built from the real code wherever it can be:

* POT, second moments (`pot_moment_audit`, `--form moments`, today's): the Test-Client's rows
  and stated residual cross-moments (`Pot.client_rows`), the group items Σ q_ij·v_i at σ₀ and
  the pair items of `Pot.moment_plan` on `pair_weights` at σ_m (`ReleasePolicy.moment_sigmas`),
  "overall" the sum of the noised group items, a withheld group's items zeros; then the real
  `common.stats.moments.finish_release` and `finish` with percentile intervals of 1,000 draws.
  `--check` finds it equal to the real sessions to the last digit at zero noise.
* POT, random groups (`pot_audit`, `--form separate|pooled`): the Test-Client's rows (`Pot.client_rows`: deciles, the default
  bandwidth, K·(Y − c) and K) quantised by the metric's components; the Tester's canonical row
  order, `common.stats.bootstrap.assign_buckets` into `RELEASE_GROUPS` groups; per group and random
  group the sums Σ q_ij·v_i (q the quantised probabilities); the estimate's slots with noise
  σ₀·scale and every random group's with σ_b·scale (`ReleasePolicy.sigmas(β)`, β =
  `Pot.sensitivity_components`, scale = `Pot.slot_sensitivity`), "overall" the sum of the
  noised group items (its noise sd √k·scale, as the Tester notes it); then `Plan.cell_values`
  with the linearised pseudo-values (`pseudo_values`), as both parties decode it.
* MQOS-AUC exact, second moments (`auc_moment_audit`, `--form moments`, today's): the Test-Client's
  rows and stated placement variances (`ExactAuc.client_rows`), the Tester's canonical order; the
  cells' released (V, D) of the full sample (`mqos_auc.released_form`'s integers, or float64) at
  σ₀·`ExactAuc.squares_sensitivity` and the pair items of `ExactAuc.moment_plan`, (S1, S0) =
  (Σ w_ab·y, Σ w_ab − S1) on `pair_weights`, at σ_m·`ExactAuc.pair_sensitivity`
  (`ReleasePolicy.moment_sigmas(2, pair_components=1)`), a withheld cell's item zeros; then the
  real `finish_release` (`placement_covariance`) and `finish` with percentile intervals of 1,000
  draws. `--check` finds it equal to the real sessions to the last digit at zero noise.
* MQOS-AUC exact, random groups (`auc_audit`, `--form separate|pooled`): the released form (V, D)
  per cell (groups and overall) over every row and within each of the metric's 10 random groups (A within the
  group, `doubled_a_weights`), in float64 and then at the form's fixed point 2^(33+K); noise
  σ₀ (estimate) and σ_b (groups) from `ReleasePolicy.sigmas(2)` times
  `ExactAuc.squares_sensitivity` (½ and 1 member), on every cell; `Plan.cell_values` (each
  group's own ratio, undefined where its noised D is not above 3 sd of its noise).

Every form: the items whose effective size Σ_i p_ij plus N(0, threshold σ²) is below the
policy's minimum are withheld (`Plan.suppress`), the groups whose noised size is below
`common.stats.left_out.MIN_EFFECTIVE_SIZE` (or withheld) are left out of the verdict, as
`tester_service.release_items.suppress_small` decides; the random-group forms then finish with the real
`common.stats.results.finish()` at interval "random_groups" and `noisy=True` (est ±
t_{G−1}·sd/√G, the verdict's Bonferroni band). `--check` runs one small audit per metric
through the real sans-I/O sessions (Paillier, MQOS-AUC's masked squaring round trip) with the
Tester's noise draws set to 0 and compares its report with the twin's at zero noise (same seed,
so the same random groups, and in the second-moments form the same released slots, hence the
same draws), and the noise sd per released slot the Tester put in its header with the twin's.

Data (null: labels and scores independent of race): each dataset samples n rows of prepared
`ppre synth` BISG probabilities (`bench_intervals.pool_cached`); POT as `ppre synth` draws it
with no gap, score ~ Beta(2, 2) (4 decimals), outcome ~ Bernoulli(score); MQOS-AUC
y ~ Bernoulli(0.3), score = logistic(μ·y + N(0, 1)), μ = √2·Φ⁻¹(0.85) (AUC 0.85 for every
group). Truths: AUC 0.85 per group; a POT curve point's m(s_q) = E[K·S]/E[K] over the
Beta(2, 2) scores (the same for every group), every DTI 0.

`--form pooled` measures the alternative form (`FORM`): the estimate as the sum of the noised
groups, which makes the t interval calibrated at the price of a noisier estimate (design §8.4).
`--shift-black D` (MQOS-AUC) draws each member's true race from its probabilities and moves every
score of a true black member by D on the latent scale, so that the groups' negatives are scored
differently (`shifted_auc_frame`; truth: `shifted_truth`), against the pooled placement variances
the interval reads.
Each dataset is also finished without noise (the same rows and random groups), and the table
gives each estimate's distance from that noiseless value (rms and largest, over its cells).

Counted per setting: the verdict's flag rate (significant) with its Monte Carlo sd; the rate at
which the 95% simultaneous band (random groups, Bonferroni) of some gap between two groups
(POT: DTI a/b; AUC: AUC_a − AUC_b; among groups not left out) excludes 0; per group, the
coverage of its 95% random-group interval (POT: over its curve points), its median width, the
estimate's rms error about the truth (defined estimates; an interval that fits the estimate's
error is about 2·1.96 times it wide) and how often the interval is undefined.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.stats import bootstrap as boot  # noqa: E402
from common.stats import correction  # noqa: E402
from common.stats.moments import finish_release  # noqa: E402
from common.crypto import encoding  # noqa: E402
from common.metrics.base import SECOND_MOMENTS, Item  # noqa: E402
from common.metrics.mqos_auc import EXACT, SCORE_BINS, normaliser_bits, released_form, score_bins  # noqa: E402
from common.metrics.pot import METRIC as POT  # noqa: E402
from common.metrics.scoring import doubled_a_weights  # noqa: E402
from common.races import RACES  # noqa: E402
from common.stats.intervals import simultaneous_bands  # noqa: E402
from common.stats.left_out import MIN_EFFECTIVE_SIZE  # noqa: E402
from common.stats.results import DEFAULT_TAU, finish  # noqa: E402
from tester_service.release import RELEASE_GROUPS, ReleasePolicy  # noqa: E402

GROUPS = list(RACES)
K = len(GROUPS)
SCALE = float(1 << encoding.PROBABILITY_BITS)
CONFIDENCE = 0.95
MODULUS_BITS = 2048
POSITIVE_RATE, AUC = 0.30, 0.85
#: the release's form (`--form`): "today", what the product releases ("moments" for both metrics);
#: "moments" (second moments: POT `pot_moment_audit`, MQOS-AUC `auc_moment_audit`); "separate" (random
#: groups: the estimate released on its own at σ₀, every random group at σ_b); or "pooled" (only
#: the G groups are released, each at the σ of a release with no replicates, their parallel
#: composition costing one release; the estimate is their sum, post-processing, with noise sd
#: √G·σ per slot)
FORM = "today"
MU = math.sqrt(2.0) * NormalDist().inv_cdf(AUC)
#: the parametric draws of the second-moments form (the audits' default bootstrap count)
MOMENT_REPLICATES = 1000
#: MQOS-AUC (`--shift-black`): every score of a member whose true race (drawn from p) is black
#: moves by this much on the latent scale, positives and negatives alike, so the groups'
#: negatives are scored differently while each race's own AUC stays AUC (0: null data)
SHIFT_BLACK = 0.0
#: the shifted data's truth (`shifted_truth`): the mean over this many samples of this many members
TRUTH_SAMPLES, TRUTH_MEMBERS = 10, 400_000


@dataclass
class Audit:
    """One dataset's release as the finishing party decodes it, and its truths."""

    plan: object
    values: np.ndarray          # (G + 1, cells) after suppression
    small: list[str]
    report: object
    truth: dict                 # cell index -> true value
    noise_sd: list[float]


def canonical_units(q: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(order, units): the Tester's canonical row order (by probability vectors) and each
    row's random group in that order (`tester_service.release_items.sum_buckets`)."""
    order = np.lexsort([col for col in reversed(q.T)])
    units = np.empty(len(q), dtype=np.int64)
    for m, idx in enumerate(boot.assign_buckets(len(q), count, rng)):
        units[idx] = m
    return order, units


def suppression(q: np.ndarray, policy: ReleasePolicy, rng: np.random.Generator, noise: bool):
    """(withheld groups' indices, groups left out of the verdict): effective sizes Σ p_ij with
    threshold noise against the policy's minimum and MIN_EFFECTIVE_SIZE (`suppress_small`)."""
    sizes = q.sum(axis=0) / SCALE
    if noise:
        sizes = sizes + rng.normal(0.0, policy.threshold_sigma(), len(sizes))
    withheld = [j for j in range(K) if not sizes[j] >= policy.min_effective_size]
    small = [g for j, g in enumerate(GROUPS) if not sizes[j] >= MIN_EFFECTIVE_SIZE or j in withheld]
    return withheld, small


def release_sigmas(policy: ReleasePolicy, components: float) -> tuple[float, float]:
    """(σ of the estimate row, σ of each random group) for `FORM`: "separate" is
    `ReleasePolicy.sigmas`; "pooled" gives every group `single_sigma` (the groups are disjoint,
    so together they are one release) and the estimate, their sum, √G times it."""
    if FORM != "pooled":
        return policy.sigmas(components)
    sigma = policy.single_sigma(components)
    return math.sqrt(RELEASE_GROUPS) * sigma, sigma


def to_slots(rows: np.ndarray) -> list[list[int]]:
    """(replicates, items, slots) floats -> the decoded slots, row-major (replicate, item)."""
    return [[int(x) for x in item] for rep in np.rint(rows) for item in rep]


# ------------------------------------------------------------------ POT
def pot_frame(n: int, rng: np.random.Generator) -> pd.DataFrame:
    score = np.round(rng.beta(2.0, 2.0, n), 4)
    outcome = (rng.random(n) < score).astype(np.int8)
    return pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "score": score, "outcome": outcome})


def pot_truth(refs, h) -> np.ndarray:
    """m(s_q) = E[K·S]/E[K] over Beta(2, 2) scores on their 4-decimal grid."""
    s = np.linspace(0.0, 1.0, 10_001)
    w = s * (1.0 - s)
    hq = np.broadcast_to(np.asarray(h, dtype=np.float64), np.shape(refs))
    k = np.exp(-0.5 * ((s[:, None] - np.asarray(refs)[None, :]) / hq[None, :]) ** 2) * w[:, None]
    return (k * s[:, None]).sum(axis=0) / k.sum(axis=0)


def pot_client(frame: pd.DataFrame, rng: np.random.Generator, n_units: int):
    """The Test-Client's side of a POT audit: (params, info, layout, its rows'
    quantised slots (n, cts·slots), the slots' sensitivity per ciphertext (cts, slots))."""
    params = POT.parse_params({})
    params[SECOND_MOMENTS] = True  # the residual moments are stated (the random-group forms never read them)
    rows = POT.client_rows(frame, "pot.csv", "default", params, rng)
    info = rows.info
    comps = POT.components("default", params, info)
    n = len(frame)
    layout = POT.layout("default", params, info, n_rows=n, n_units=n_units, recipient="client",
                        modulus_bits=MODULUS_BITS)
    fixed = np.column_stack([c.quantize(rows.values[:, i]) for i, c in enumerate(comps)]).astype(np.float64)
    fixed = np.hstack([fixed, np.zeros((n, layout.n_ciphertexts * layout.slots - len(comps)))])
    scale = np.array([POT.slot_sensitivity(Item(0, ct), layout, comps, 1) for ct in range(layout.n_ciphertexts)],
                     dtype=np.float64)
    return params, info, layout, fixed, scale


def pot_audit(p: np.ndarray, frame: pd.DataFrame, policy: ReleasePolicy, rng: np.random.Generator,
              unit_rng: np.random.Generator, noise: bool = True) -> Audit:
    params, info, layout, fixed, scale = pot_client(frame, rng, RELEASE_GROUPS)
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    order, units = canonical_units(q, RELEASE_GROUPS, unit_rng)
    q, fixed = q[order].astype(np.float64), fixed[order]
    plan = POT.plan(GROUPS, (), layout, "default", params, info)
    # per random group, group and ciphertext: the slots Σ q_ij·v_i
    sums = np.stack([q[units == u].T @ fixed[units == u] for u in range(RELEASE_GROUPS)])  # (G, k, cts·slots)
    sums = sums.reshape(RELEASE_GROUPS, K, layout.n_ciphertexts, layout.slots)
    sigma0, sigma_b = release_sigmas(policy, POT.sensitivity_components("default", params, info))
    draw = (lambda shape, sd: rng.normal(0.0, 1.0, shape) * sd) if noise else (lambda shape, sd: 0.0)
    groups = sums + draw(sums.shape, sigma_b * scale)
    point = groups.sum(axis=0) if FORM == "pooled" else sums.sum(axis=0) + draw((K,) + scale.shape, sigma0 * scale)
    reps = np.concatenate([point[None], groups])                                    # (G + 1, k, cts, slots)
    reps = np.concatenate([reps, reps.sum(axis=1, keepdims=True)], axis=1)          # overall: their sum
    items = reps.reshape(RELEASE_GROUPS + 1, (K + 1) * layout.n_ciphertexts, layout.slots)
    item_scale = [scale[ct] * (math.sqrt(K) if w == K else 1.0) for w in range(K + 1)
                  for ct in range(layout.n_ciphertexts)]
    noise_sd = [float(s * x) for s in (sigma0, sigma_b) for row in item_scale for x in row]
    withheld, small = suppression(q, policy, rng, noise)
    hidden = [i for i, item in enumerate(plan.items) if item.weight in withheld]
    values = plan.suppress(plan.cell_values(to_slots(items), lambda a, b: None, plain_rows=RELEASE_GROUPS + 1,
                                            noise_sd=noise_sd, pseudo_values=True), hidden)
    report = finish(POT, plan, values, option="default", confidence=CONFIDENCE, tau=DEFAULT_TAU, params=params,
                    info=info, replicates=RELEASE_GROUPS, result_recipient="client", small_groups=small,
                    interval="random_groups", noisy=True)
    truth = dict(enumerate(np.tile(pot_truth(info["reference_scores"], info["bandwidth"]), K + 1)))
    return Audit(plan, values, small, report, truth, noise_sd)


def pot_moment_audit(p: np.ndarray, frame: pd.DataFrame, policy: ReleasePolicy, rng: np.random.Generator,
                     unit_rng: np.random.Generator, noise: bool = True, exact: bool = False) -> Audit:
    """POT's release in the second-moments form (`--form moments`, `common.metrics.pot`): the
    group items at σ₀ and the pair items (`Pot.moment_plan`, weights `pair_weights`) at σ_m of
    `ReleasePolicy.moment_sigmas`, "overall" the sum of the noised group items; finished by the
    real `common.stats.moments.finish_release` (with the Test-Client's stated residual
    cross-moments from `Pot.client_rows`) and `finish` with percentile intervals. `exact`: the
    sums in integers (as the Tester's), else in float64 (within 1e-15 of them: the draws'
    seed, a digest of the released slots, then differs)."""
    params, info, layout, fixed, scale = pot_client(frame, rng, 1)
    fixed = fixed.reshape(len(frame), layout.n_ciphertexts, layout.slots)
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    plan, moments = POT.moment_plan(POT.plan(GROUPS, (), layout, "default", params, info), GROUPS, "default",
                                    params, info, layout)
    pair_w = np.column_stack(correction.pair_weights(q)).astype(np.float64)            # (n, pairs)
    sigma0, sigma_m = policy.moment_sigmas(POT.sensitivity_components("default", params, info))
    draw = (lambda sd: rng.normal(0.0, 1.0, sd.shape) * sd) if noise else (lambda sd: 0)
    kind = object if exact else np.float64
    fixed, q, pair_w = fixed.astype(np.int64).astype(kind), q.astype(kind), pair_w.astype(np.int64).astype(kind)
    group_sums = np.tensordot(q.T, fixed, axes=1)                                    # (k, cts, slots)
    row, est_sd = [], []
    for item in plan.items:
        sd = scale[item.ciphertext]
        if item.weight < K:
            value, sd = group_sums[item.weight, item.ciphertext] + draw(sigma0 * sd), sigma0 * sd
        elif item.weight == K:  # overall: the sum of the noised group items
            value, sd = np.sum([row[i] for i, it in enumerate(plan.items[:len(row)]) if it.weight < K
                                and it.ciphertext == item.ciphertext], axis=0), sigma0 * math.sqrt(K) * sd
        else:
            value = pair_w[:, item.weight - K - 1] @ fixed[:, item.ciphertext] + draw(sigma_m * sd)
            sd = sigma_m * sd
        row.append(value if exact else np.rint(value))
        est_sd.extend(float(x) for x in sd)
    noise_sd = est_sd + [0.0] * len(est_sd)  # the header's form: the estimate's, then no groups
    withheld, small = suppression(q, policy, rng, noise)
    hidden = [i for i, item in enumerate(plan.items) if item.weight in withheld]  # cells only, not M's items
    # a withheld item reaches the finishing party as zeros (`tester_service.release_items.mask_items`)
    row = [[0 if i in hidden else int(x) for x in slots] for i, slots in enumerate(row)]
    values, _ = finish_release(plan, moments, row, noise_sd, MOMENT_REPLICATES, withheld=hidden)
    report = finish(POT, plan, values, option="default", confidence=CONFIDENCE, tau=DEFAULT_TAU, params=params,
                    info=info, replicates=MOMENT_REPLICATES, result_recipient="client", small_groups=small,
                    interval="percentile", noisy=True)
    truth = dict(enumerate(np.tile(pot_truth(info["reference_scores"], info["bandwidth"]), K + 1)))
    return Audit(plan, values, small, report, truth, noise_sd)


# ------------------------------------------------------------------ MQOS-AUC exact
def auc_frame(n: int, rng: np.random.Generator) -> pd.DataFrame:
    y = (rng.random(n) < POSITIVE_RATE).astype(np.int8)
    score = np.round(1.0 / (1.0 + np.exp(-(MU * y + rng.normal(0.0, 1.0, n)))), 6)
    return pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "y_true": y, "score": score})


def true_races(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each member's true race, an index into GROUPS, drawn from its probabilities p_i."""
    return (rng.random(len(p))[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, K - 1)


def shifted_auc_frame(p: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    """`auc_frame` with every score of a true black member (race r_i ~ p_i) moved by
    SHIFT_BLACK on the latent scale."""
    n = len(p)
    race = true_races(p, rng)
    y = (rng.random(n) < POSITIVE_RATE).astype(np.int8)
    latent = MU * y + rng.normal(0.0, 1.0, n) + SHIFT_BLACK * (race == GROUPS.index("black"))
    score = np.round(1.0 / (1.0 + np.exp(-latent)), 6)
    return pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "y_true": y, "score": score})


def shifted_truth(pool: np.ndarray, seed: int) -> dict:
    """Each cell's weighted AUC on `shifted_auc_frame` data: the mean of the estimator over
    TRUTH_SAMPLES samples of TRUTH_MEMBERS (it is consistent; a member's pairs across races no
    longer have AUC 0.85, and one sample of 400,000 still errs by 0.001-0.003)."""
    rng = np.random.default_rng([seed, TRUTH_MEMBERS, 99])
    samples = []
    for _ in range(TRUTH_SAMPLES):
        p = pool[rng.choice(len(pool), size=TRUTH_MEMBERS, replace=True)]
        rows = EXACT.client_rows(shifted_auc_frame(p, rng), "mqos_auc.csv", "exact", {}, rng)
        q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
        cells = auc_cell_slots(q, rows.values[:, 0].astype(np.int64), np.asarray(rows.strata), False)
        samples.append([0.5 + v / d for v, d in cells])
    return dict(enumerate(np.mean(samples, axis=0)))


def auc_form(q_ext: np.ndarray, y: np.ndarray, rank: np.ndarray, units: np.ndarray | None) -> np.ndarray:
    """(G + 1, cells, 2): the released form's (V, D) in members (`mqos_auc.released_form`,
    float64): every row with A over all rows, then each random group with A within it
    (`units` None: the first alone)."""
    p = q_ext / SCALE
    out = []
    groups_of = [] if units is None else [(units, units == u) for u in range(int(units.max()) + 1)]
    for groups, rows in [(None, slice(None))] + groups_of:
        a2 = doubled_a_weights(rank, q_ext, groups=groups)[rows] / SCALE    # 2A in members
        pr, yr = p[rows], y[rows].astype(np.float64)[:, None]
        big_l, t, qq, s = (pr * a2 * yr).sum(0) / 2.0, (pr * yr).sum(0), (pr * pr * yr).sum(0), pr.sum(0)
        u = big_l - (t * t - qq) / 2.0
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(np.column_stack([(u - t * (s - t) / 2.0) / s, t * (s - t) / s]))
    return np.nan_to_num(np.stack(out))


def auc_audit(p: np.ndarray, frame: pd.DataFrame, policy: ReleasePolicy, rng: np.random.Generator,
              unit_rng: np.random.Generator, noise: bool = True) -> Audit:
    n = len(frame)
    rows = EXACT.client_rows(frame, "mqos_auc.csv", "exact", {}, rng)
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    order, units = canonical_units(q, EXACT.random_groups, unit_rng)
    q, y, rank = q[order], rows.values[order, 0], np.asarray(rows.strata)[order]
    q_ext = np.hstack([q, np.full((n, 1), 1 << encoding.PROBABILITY_BITS, dtype=np.int64)])
    form = auc_form(q_ext, y, rank, units)                                        # (G + 1, cells, 2)
    unit = 2.0 ** (33 + normaliser_bits(n))
    scales = np.array(EXACT.squares_sensitivity({"facts": {"n": n}}, 1), dtype=np.float64)
    sigma0, sigma_b = release_sigmas(policy, 2)
    sd = np.where(np.arange(len(form))[:, None, None] == 0, sigma0, sigma_b) * scales[None, None, :]
    slots = form * unit + (rng.normal(0.0, 1.0, form.shape) * sd if noise else 0.0)
    if FORM == "pooled":  # the estimate: the groups' sum (within-group pairs only)
        slots[0] = slots[1:].sum(axis=0)
    noise_sd = [float(s * x) for s in (sigma0, sigma_b) for _ in range(K + 1) for x in EXACT.slot_noise(scales)]
    plan = EXACT.plan(GROUPS, (), None, "exact", {}, {})
    withheld, small = suppression(q, policy, rng, noise)
    values = plan.suppress(plan.cell_values(to_slots(slots), lambda a, b: None, plain_rows=len(form),
                                            noise_sd=noise_sd, pseudo_values=False), withheld)
    report = finish(EXACT, plan, values, option="exact", confidence=CONFIDENCE, tau=DEFAULT_TAU, params={},
                    info=rows.info, replicates=EXACT.random_groups, result_recipient="client", small_groups=small,
                    interval="random_groups", noisy=True)
    return Audit(plan, values, small, report, {c: AUC for c in range(K + 1)}, noise_sd)


def auc_moment_audit(p: np.ndarray, frame: pd.DataFrame, policy: ReleasePolicy, rng: np.random.Generator,
                     unit_rng: np.random.Generator, noise: bool = True, exact: bool = False) -> Audit:
    """MQOS-AUC exact's release in the second-moments form (`--form moments`, today's;
    `ExactAuc.moment_plan`, `ExactAuc.combine` with one unit): the cells' (V, D) of the full
    sample at σ₀·`squares_sensitivity` and per pair a ≤ b (S1, S0) = (Σ w_ab·y, Σ w_ab − S1)
    on `pair_weights` at σ_m·`pair_sensitivity` (`ReleasePolicy.moment_sigmas(2,
    pair_components=1)`), a withheld cell's item zeros; finished by the real
    `finish_release` (the covariance of `placement_covariance` with the Test-Client's stated
    placement variances from `ExactAuc.client_rows`) and `finish` with percentile intervals.
    `exact`: the cells' slots as `mqos_auc.released_form`'s integers (the Tester's), else
    float64 (the draws' seed, a digest of the released slots, then differs). Under the
    controls the score is the Test-Client's score bins (`mqos_auc.BinnedAuc`, `score_bins`),
    which take the place of the ranks."""
    n = len(frame)
    metric = EXACT.for_release({SECOND_MOMENTS: True})
    rows = metric.client_rows(frame, "mqos_auc.csv", "exact", {SECOND_MOMENTS: True}, rng)
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    order, _ = canonical_units(q, 1, unit_rng)
    bins = score_bins(frame["score"].to_numpy(dtype=np.float64), SCORE_BINS)
    q, y, rank = q[order], rows.values[order, 0].astype(np.int64), bins[order]
    cells = auc_cell_slots(q, y, rank, exact)                                        # (k + 1) x (V, D)
    plan, moments = metric.moment_plan(metric.plan(GROUPS, (), None, "exact", {}, {}), GROUPS, "exact", {},
                                       rows.info, None)
    scales = metric.squares_sensitivity({"facts": {"n": n}}, 1)
    pair = metric.pair_sensitivity(1)
    sigma0, sigma_m = policy.moment_sigmas(2, pair_components=1)
    draw = (lambda sd: int(np.rint(rng.normal(0.0, sd)))) if noise else (lambda sd: 0)
    row = [[v + draw(sigma0 * scales[0]), d + draw(sigma0 * scales[1])] for v, d in cells]
    row += [[s1 + draw(sigma_m * pair), s0 + draw(sigma_m * pair)] for s1, s0 in auc_pair_slots(q, y)]
    est_sd = [sigma0 * x for _ in cells for x in metric.slot_noise(scales)]
    est_sd += [sigma_m * float(pair)] * 2 * (len(row) - len(cells))
    noise_sd = est_sd + [0.0] * len(est_sd)  # the header's form: the estimate's, then no groups
    withheld, small = suppression(q, policy, rng, noise)
    hidden = [i for i, item in enumerate(plan.items[:len(cells)]) if i in withheld]  # cell j is item j
    # a withheld item reaches the finishing party as zeros (`tester_service.release_items.mask_items`)
    row = [[0, 0] if i in hidden else slots for i, slots in enumerate(row)]
    values, _ = finish_release(plan, moments, row, noise_sd, MOMENT_REPLICATES, withheld=hidden)
    report = finish(metric, plan, values, option="exact", confidence=CONFIDENCE, tau=DEFAULT_TAU, params={},
                    info=rows.info, replicates=MOMENT_REPLICATES, result_recipient="client", small_groups=small,
                    interval="percentile", noisy=True)
    return Audit(plan, values, small, report, {c: AUC for c in range(K + 1)}, noise_sd)


def auc_cell_slots(q: np.ndarray, y: np.ndarray, rank: np.ndarray, exact: bool) -> list[tuple[int, int]]:
    """Per cell (groups, then overall) the released (V, D) of the full sample before noise:
    `mqos_auc.released_form`'s integers (`exact`), else `auc_form` in float64 at the form's
    fixed point 2^(33+K), rounded."""
    n = len(q)
    if exact:
        return [(int(v), int(d)) for v, d in released_form(q, y, rank, None, n_rows=n)[0]]
    q_ext = np.hstack([q, np.full((n, 1), 1 << encoding.PROBABILITY_BITS, dtype=np.int64)])
    form = auc_form(q_ext, y, rank, None)[0] * 2.0 ** (33 + normaliser_bits(n))
    return [(int(v), int(d)) for v, d in np.rint(form)]


def auc_pair_slots(q: np.ndarray, y: np.ndarray) -> list[tuple[int, int]]:
    """Per pair a ≤ b (S1, S0): S1 = Σ w_ab·y and S0 = Σ w_ab − S1 on `pair_weights` (exact in
    int64: Σ w_ab ≤ n·2^32)."""
    w = np.column_stack(correction.pair_weights(q))                                   # (n, pairs), int64
    s1, total = y.astype(np.int64) @ w, w.sum(axis=0)
    return [(int(a), int(t - a)) for a, t in zip(s1, total)]


# ------------------------------------------------------------------ the measurement
def pot_release(*args, **kwargs) -> Audit:
    """POT's release in `FORM`: second moments ("today", "moments") or random groups."""
    return (pot_moment_audit if FORM in ("today", "moments") else pot_audit)(*args, **kwargs)


def auc_release(*args, **kwargs) -> Audit:
    """MQOS-AUC exact's release in `FORM`: second moments ("today", "moments") or random groups."""
    if FORM in ("today", "moments"):
        return auc_moment_audit(*args, **kwargs)
    kwargs.pop("exact", None)
    return auc_audit(*args, **kwargs)


SETTINGS = {"pot": (pot_frame, pot_release), "mqos-auc": (auc_frame, auc_release)}


def gap_columns(metric: str, audit: Audit) -> np.ndarray:
    """(G + 1, pairs): the gaps between two groups not left out, both estimates defined."""
    v, cells = audit.values, list(audit.plan.cells)
    if metric == "pot":
        extra_cells, extra = POT.derived(cells, v, {}, audit.report.info)
        keep = [c for c, cell in enumerate(extra_cells) if cell.group < cell.other
                and cell.group not in audit.small and cell.other not in audit.small and np.isfinite(extra[0, c])]
        return extra[:, keep]
    cols = [j for j, cell in enumerate(cells) if cell.group in GROUPS and cell.group not in audit.small
            and np.isfinite(v[0, j])]
    return np.column_stack([v[:, a] - v[:, b] for i, a in enumerate(cols) for b in cols[i + 1:]]) \
        if len(cols) > 1 else np.empty((v.shape[0], 0))


def band_flag(metric: str, audit: Audit) -> bool:
    fam = gap_columns(metric, audit)
    if fam.shape[1] == 0:
        return False
    low, high = simultaneous_bands(fam, CONFIDENCE, audit.report.interval)
    return bool(np.any((low > 0) | (high < 0)))


def group_intervals(metric: str, audit: Audit):
    """Per group (and overall): [(low, high, truth, estimate)] of its cells (AUC: one; POT:
    its curve points)."""
    rep = audit.report
    out = {g: [] for g in GROUPS + ["overall"]}
    for c, e in enumerate(rep.curves if metric == "pot" else rep.groups):
        out[e.group].append((e.ci_low, e.ci_high, audit.truth[c], e.estimate))
    return out


def record(metric: str, audit: Audit, clean: Audit | None = None) -> dict:
    """One dataset's outcome: the verdict, the band, every group's intervals, and (with the
    same release without noise, `clean`) each estimate's distance from its noiseless value."""
    v = audit.report.verdict
    out = {"flag": bool(v.significant), "inconclusive": v.severity == "inconclusive",
           "band": band_flag(metric, audit), "cells": group_intervals(metric, audit),
           "significant": list(v.significant_comparisons),
           "pairs": {f"{c.higher}>{c.lower}": (c.estimate, c.ci_low, c.ci_high) for c in audit.report.cells}}
    if clean is not None:
        noisy, plain = out["cells"], group_intervals(metric, clean)
        out["noise"] = {g: [a[3] - b[3] for a, b in zip(noisy[g], plain[g]) if a[3] is not None and b[3] is not None]
                        for g in noisy}
    return out


def summary(records: list[dict]) -> dict:
    names = GROUPS + ["overall"]
    count = len(records)
    cells = {g: [c for r in records for c in r["cells"][g]] for g in names}
    defined = {g: [(lo, hi, t) for lo, hi, t, _ in cells[g] if lo is not None and hi is not None] for g in names}
    errors = {g: [e - t for _, _, t, e in cells[g] if e is not None] for g in names}
    return {"datasets": count, **{k: sum(r[k] for r in records) / count for k in ("flag", "band", "inconclusive")},
            "coverage": [np.mean([lo <= t <= hi for lo, hi, t in defined[g]]) if defined[g] else math.nan
                         for g in names],
            "width": [float(np.median([hi - lo for lo, hi, _ in defined[g]])) if defined[g] else math.nan
                      for g in names],
            "rms": [math.sqrt(float(np.mean(np.square(errors[g])))) if errors[g] else math.nan for g in names],
            "undefined": [1.0 - len(defined[g]) / len(cells[g]) if cells[g] else math.nan for g in names],
            "noise": [_rms([x for r in records for x in r.get("noise", {}).get(g, [])]) for g in names],
            "noise_max": [max((abs(x) for r in records for x in r.get("noise", {}).get(g, [])), default=math.nan)
                          for g in names]}


def _rms(xs: list[float]) -> float:
    return math.sqrt(float(np.mean(np.square(xs)))) if xs else math.nan


def run(metric: str, pool: np.ndarray, n: int, datasets: int, seed: int, policy: ReleasePolicy,
        save: str | None = None) -> list[dict]:
    """`datasets` records; with `save`, all so far pickled there every 25 datasets (`--merge`)."""
    import pickle
    rng = np.random.default_rng([seed, n, list(SETTINGS).index(metric)])
    frame_of, audit_of = SETTINGS[metric]
    shifted = metric == "mqos-auc" and SHIFT_BLACK != 0.0
    truth = shifted_truth(pool, seed) if shifted else None
    records = []
    for i in range(datasets):
        p = pool[rng.choice(len(pool), size=n, replace=False)]
        frame = shifted_auc_frame(p, rng) if shifted else frame_of(n, rng)
        twin = copy.deepcopy(rng)  # the same rows and random groups, without the noise
        audit = audit_of(p, frame, policy, rng, rng)
        if truth is not None:
            audit.truth = truth
        records.append(record(metric, audit, audit_of(p, frame, policy, twin, twin, noise=False)))
        if save and ((i + 1) % 25 == 0 or i + 1 == datasets):
            Path(save).write_bytes(pickle.dumps({"metric": metric, "members": n, "records": records}))
    return records


def table(rows: list[tuple[str, int, dict]]) -> list[str]:
    head = " / ".join(GROUPS + ["overall"])
    out = [f"| metric | members | datasets | verdict flagged | MC sd | some band excludes 0 | MC sd | inconclusive "
           f"| coverage ({head}) | median width ({head}) | estimate's rms error ({head}) | interval undefined "
           f"| estimate − noiseless, rms / largest ({head}) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for metric, n, s in rows:
        datasets = s["datasets"]
        sd = [math.sqrt(max(x * (1 - x), 1e-12) / datasets) for x in (s["flag"], s["band"])]
        fmt = lambda xs, f: " / ".join("—" if not math.isfinite(x) else format(x, f) for x in xs)  # noqa: E731
        out.append(f"| {metric} | {n:,} | {datasets} | {s['flag']:.1%} | {sd[0]:.1%} | {s['band']:.1%} "
                   f"| {sd[1]:.1%} | {s['inconclusive']:.0%} | {fmt(s['coverage'], '.3f')} "
                   f"| {fmt(s['width'], '.3f')} | {fmt(s['rms'], '.4f')} | {fmt(s['undefined'], '.0%')} "
                   f"| {fmt(s.get('noise', [math.nan] * K), '.4f')} / {fmt(s.get('noise_max', [math.nan] * K), '.4f')} |")
    return out


# ------------------------------------------------------------------ the twin against the sessions
def check(n: int = 4000, seed: int = 7) -> int:
    """One audit per metric through the real sans-I/O sessions with the Tester's Gaussian draws
    set to 0 (the release's form unchanged: second moments, or random groups and pseudo-values;
    3-sd floors), against
    the twin at zero noise with the same seed; and the header's noise sd per slot against the
    twin's. Prints the largest differences."""
    import pytest

    from tests.helpers import local_audit
    from tester_service.protocol import AuditSpec
    pool = _pool()
    rng = np.random.default_rng(seed)
    # distinct probability rows, so that the Tester's canonical order is the twin's
    p = pool[rng.choice(len(pool), size=n, replace=False)]
    p = 0.99 * p + 0.01 * rng.dirichlet(np.ones(K), n)
    tester = pd.DataFrame(p, columns=GROUPS)
    tester.insert(0, "member_id", [f"m{i}" for i in range(n)])
    status = 0
    for metric, option in (("pot", "default"), ("mqos-auc", "exact")):
        frame_of, audit_of = SETTINGS[metric]
        frame = frame_of(n, rng)
        spec = AuditSpec(metric=metric, client_dataset="d", metric_option=option, seed=seed)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("tester_service.protocol.gaussian_slots", lambda scales, bits: 0)
            mp.setattr("tester_service.protocol.gaussian", lambda sigma: 0.0)
            real, session, _ = local_audit(tester, frame, spec=spec, release=ReleasePolicy(),
                                           modulus_bits=MODULUS_BITS)
        exact = {"exact": True} if FORM in ("today", "moments") else {}  # the draws' seed: the slots' digest
        twin = audit_of(p, frame, ReleasePolicy(), np.random.default_rng(0), np.random.default_rng(seed), noise=False,
                        **exact)
        mine = twin.report
        pairs = [(a.estimate, b.estimate) for a, b in zip(real.groups, mine.groups)]
        pairs += [(x, y) for a, b in zip(real.groups, mine.groups) for x, y in ((a.ci_low, b.ci_low),
                                                                                (a.ci_high, b.ci_high))]
        pairs += [(x, y) for a, b in zip(real.curves + real.cells, mine.curves + mine.cells)
                  for x, y in ((a.estimate, b.estimate), (a.ci_low, b.ci_low), (a.ci_high, b.ci_high))]
        both_none = sum(x is None and y is None for x, y in pairs)
        diff = max((abs(x - y) for x, y in pairs if x is not None and y is not None), default=0.0)
        mismatch = sum((x is None) != (y is None) for x, y in pairs)
        sd_real, sd_twin = np.array(session._released.noise_sd), np.array(twin.noise_sd)
        # the twin's slots are per cell's item; the real header's per item slot of its layout
        sd_rel = float(np.max(np.abs(np.sort(sd_real[sd_real > 0]) / np.sort(sd_twin[sd_twin > 0]) - 1))) \
            if len(sd_real[sd_real > 0]) == len(sd_twin[sd_twin > 0]) else math.inf
        same = (real.interval == mine.interval and real.bootstrap == mine.bootstrap
                and real.verdict.severity == mine.verdict.severity and real.verdict.message == mine.verdict.message)
        print(f"{metric}: {len(pairs)} reported values ({both_none} undefined in both), largest |real - twin| "
              f"{diff:.2e}, defined in one only {mismatch}; interval {real.interval} x {real.bootstrap} groups, "
              f"verdict and message identical: {same}; noise sd per slot ({int((sd_real > 0).sum())} slots) "
              f"largest relative difference {sd_rel:.1e}; sigma_estimate {real.release.get('sigma_estimate'):.4f}")
        status |= not (diff < 1e-9 and mismatch == 0 and same and sd_rel < 1e-6)
    return status


def _pool() -> np.ndarray:
    from bench_intervals import pool_cached
    return pool_cached()


def merged(paths: list[str]) -> list[tuple[str, int, dict]]:
    """The table's rows from `--save` files: the records of one metric and size pooled."""
    import pickle
    pooled: dict[tuple[str, int], list[dict]] = {}
    for path in paths:
        saved = pickle.loads(Path(path).read_bytes())
        pooled.setdefault((saved["metric"], saved["members"]), []).extend(saved["records"])
    return [(metric, n, summary(records)) for (metric, n), records in pooled.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metric", default="pot,mqos-auc")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--datasets", default="400", help="one count, or one per size (comma-separated)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", help="pickle each setting's records to SAVE.<metric>.<members> as they come")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="print the table of --save files (pooled), then stop")
    ap.add_argument("--check", action="store_true", help="compare the twin with the real sessions, then stop")
    ap.add_argument("--check-members", type=int, default=4000, help="the members of --check's audits")
    ap.add_argument("--form", choices=("today", "separate", "pooled", "moments"), default="today",
                    help="the release's form (module docstring, FORM)")
    ap.add_argument("--shift-black", type=float, default=0.0, metavar="D",
                    help="MQOS-AUC: true black members' scores moved by D on the latent scale (SHIFT_BLACK)")
    args = ap.parse_args(argv)
    global FORM, SHIFT_BLACK
    FORM, SHIFT_BLACK = args.form, args.shift_black
    if args.check:
        return check(args.check_members)
    if args.merge:
        print("\n".join(table(merged(args.merge))))
        return 0
    policy = ReleasePolicy()
    pool = _pool()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    counts = [int(c) for c in args.datasets.split(",")]
    counts = counts * len(sizes) if len(counts) == 1 else counts
    rows = []
    for metric in args.metric.split(","):
        for n, datasets in zip(sizes, counts):
            t = time.time()
            save = f"{args.save}.{metric}.{n}" if args.save else None
            rows.append((metric, n, summary(run(metric, pool, n, datasets, args.seed, policy, save))))
            print(table(rows[-1:])[-1], f"({time.time() - t:.0f} s)", flush=True)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
