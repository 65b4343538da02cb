"""Prototype (plaintext twin only): MQOS-AUC exact's interval under release noise from second
moments and pooled DeLong placement variances, instead of 10 noised random groups.

Now built into the sessions (`common.metrics.mqos_auc`, "Interval under release noise"; its
twin is `bench_random_groups.auc_moment_audit`, checked against the sessions): the built form
takes the class totals from the pair items' row sums (not D and the noised sizes) and always
applies the "own" shift. This script keeps the variants' measurements reproducible
(bench/RESULTS.md, "MQOS-AUC exact from second moments: a plaintext prototype").

    nice -n 10 .venv/bin/python bench/proto_auc_moments.py [--sizes 10000,100000] [--datasets 400,60]
                                                         [--seed 1] [--variant delong] [--compare]
                                                         [--save PREFIX]
    .venv/bin/python bench/proto_auc_moments.py --merge PREFIX.*

Design context: docs/design.md §8.4 ("Why random-group intervals under noise err wide"). The
estimate and its noise are the twin's (`bench_random_groups.auc_audit`); only the interval's
release and its finish differ.

**Released** (Tester -> finishing party), shares of ρ 0.8 estimate / 0.1 moments / 0.1 sizes
(`ReleasePolicy.moment_sigmas`, `MOMENT_SHARE`):

1. per cell (6 groups, overall) the exact form's (V_j, D_j) over every row
   (`common.metrics.mqos_auc`, "Released form"), AUC_j = ½ + V_j/D_j, each slot with noise
   σ₀·`ExactAuc.squares_sensitivity` (½ and 1 member): C = 2 components, σ₀ = moment_sigmas(2)[0];
2. on the pair weights p_a·p_b (a ≤ b, 21 pairs) S1_ab = Σ_i p_ia·p_ib·y_i and
   S0_ab = Σ_i p_ia·p_ib·(1 − y_i), noise σ_m·1 member per slot;
3. the noised effective sizes Ŝ_j = Σ_i p_ij + N(0, threshold σ²) (already released today).

**Sensitivity of (2).** Replacing one member's vector p -> p' (one row per member) moves the
pair slots by Δ(p_a·p_b)·y_t (S1) and Δ(p_a·p_b)·(1 − y_t) (S0): for y_t ∈ {0, 1} exactly one of
the two families moves, so the L2 norm over all 42 slots is ||Δ(p·pᵀ)||_F over a ≤ b, at most
||p·pᵀ − p'·p'ᵀ||_F ≤ 2·||Δp||₂: one 0/1 component at PAIR_FACTOR = 4 (β = 1, not 2:
`Metric.sensitivity_components`' reasoning, y and 1 − y cannot both reach their bound). The
estimate's release is C = 2 components (V and D both move with Δp_j). Total
ρ = 2/σ₀² + 4·1/σ_m² + 1/σ_t² = 0.8ρ + 0.1ρ + 0.1ρ with σ₀ = moment_sigmas(2)[0] and
σ_m = moment_sigmas(1)[1] (at ρ = 0.2: 3.54 and 14.1 members; today's separate form
σ₀ = 3.78).

**Stated by the Test-Client** from all its own rows (it holds every label and score, not the
groups): the placement variances σ1² = Var_{i pos}(V10_i), V10_i the fraction of negatives
scored below i (ties ½), and σ0² = Var_{k neg}(V01_k), V01_k the fraction of positives scored
above k. Two numbers about its whole table (one member moves them by O(1/n)), as POT's
residual cross-moments.

**Finish** (post-processing; both parties hold the same numbers): the class totals per group
P1_j, P0_j from D_j = P1_j·P0_j/S_j and Ŝ_j (P1 + P0 = Ŝ, π_j(1 − π_j) = D_j/Ŝ_j, the root on
the side of the Test-Client's own positive rate; overall from its own D and Σ_j Ŝ_j). The
delta method (weighted DeLong):
    Cov(AUC_a, AUC_b) = σ1²·S1_ab/(P1_a·P1_b) + σ0²·S0_ab/(P0_a·P0_b)    (+ noise on the diagonal)
with "overall" (p ≡ 1) as one more group whose pair sums are S1_{o,b} = P1_b, S1_oo = Σ P1;
each cell's noise variance through the ratio (sd_V² + (V/D)²·sd_D²)/D². R = 1000 draws of
N(estimate, Cov) (projected onto the PSD cone; seeded from the released values), percentile
intervals and the verdict by the real `common.stats.results.finish(interval="percentile",
noisy=True)`.

`--variant`: "delong" as above; "binomial" releases the unlabelled S_ab = Σ p_a·p_b·1 instead of
S1 and S0 (one slot per pair at the same σ_m: β = 1 either way) and takes the label split from
the groups' positive rates (S1_ab ≈ S_ab·(π_a + π_b)/2,
the ERO form of `common.stats.moments.binomial_moments`), steadier where a group's S1_aa is
within its noise; "own" shifts each cell's placement variances by v(AUC_a) − v(AUC_overall)
where positive, v the equal-variance binormal placement variance at that AUC (`binormal_spread`):
a group whose AUC is lower than overall's has placements that spread more than the pooled ones
(v = 0.035 at AUC 0.85, 0.058 at 0.75), which pooled variances miss. `--alt AUC`: data in which
the members of true race black (drawn from their BISG probabilities) have this AUC, the others
0.85; each cell's truth is its weighted AUC given the dataset's probabilities,
Σ_r w_jr·AUC_r with w_jr = Σ_i p_ij·p_ir / Σ_i p_ij (overall: Σ_i p_ir / n), the negatives'
scores being alike in every race. `--compare` also runs today's separate form
(`bench_random_groups.auc_audit`) on the same datasets (same rows, same seeds).

Measured (2026-11-28; null: 400 datasets at 10,000 and 100,000 members; one-sided verdict,
nominal about 2.5%; two-sided bands, nominal 5%):

    nice -n 10 .venv/bin/python bench/proto_auc_moments.py --sizes 10000 --datasets 400 --seed 1 --compare --save S
    nice -n 10 .venv/bin/python bench/proto_auc_moments.py --sizes 100000 --datasets 200 --seed 1 --compare --save S
    nice -n 10 .venv/bin/python bench/proto_auc_moments.py --sizes 100000 --datasets 200 --seed 2 --save S
    (and --alt 0.75, --variant own likewise)

verdict 3.0% / 4.2%, bands 5.8% / 7.0%, coverage 0.93-0.97, widths 2.5-10 times narrower than
the separate form's (black at 10,000: 0.048 against 0.247), every group's interval defined;
under --alt 0.75 black's coverage at 100,000 is 0.91 pooled and 0.96 with "own".
"""
from __future__ import annotations

import argparse
import copy
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

import bench_random_groups as rg  # noqa: E402
from bench_random_groups import (AUC, CONFIDENCE, GROUPS, K, SCALE, Audit, auc_frame, record,  # noqa: E402
                                 summary, table, to_slots)
from common.crypto import encoding  # noqa: E402
from common.metrics.base import SECOND_MOMENTS  # noqa: E402
from common.metrics.mqos_auc import EXACT, normaliser_bits  # noqa: E402
from common.metrics.scoring import doubled_a_weights  # noqa: E402
from common.stats.moments import draw_seed, gaussian_draws  # noqa: E402
from common.stats.left_out import MIN_EFFECTIVE_SIZE  # noqa: E402
from common.stats.results import DEFAULT_TAU, finish  # noqa: E402
from tester_service.release import ReleasePolicy  # noqa: E402

REPLICATES = 1000
VARIANT = "delong"


# ------------------------------------------------------------------ the Test-Client's statement
def midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties at their mean rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts
    return (start + (counts + 1) / 2.0)[inverse]


def placement_spreads(y: np.ndarray, score: np.ndarray) -> tuple[float, float, float]:
    """(σ1², σ0², positive rate) over all the Test-Client's rows: the variances of the
    positives' V10 (fraction of negatives below, ties ½) and the negatives' V01 (fraction of
    positives above, ties ½)."""
    y = np.asarray(y).astype(bool)
    r_all = midranks(score)
    n1, n0 = int(y.sum()), int((~y).sum())
    v10 = (r_all[y] - midranks(score[y])) / n0
    v01 = 1.0 - (r_all[~y] - midranks(score[~y])) / n1
    return float(np.var(v10, ddof=1)), float(np.var(v01, ddof=1)), n1 / len(y)


# ------------------------------------------------------------------ the release
def moment_sigmas(policy: ReleasePolicy) -> tuple[float, float]:
    """(σ₀, σ_m) sized for what is released (module docstring): C = 2 estimate components,
    β = 1 pair component (S1/S0 exclusive per row)."""
    return policy.moment_sigmas(2)[0], policy.moment_sigmas(1)[1]


def estimate_form(q_ext: np.ndarray, y: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(cells, 2): (V, D) over every row, in members (`bench_random_groups.auc_form`'s row 0)."""
    p = q_ext / SCALE
    a2 = doubled_a_weights(rank, q_ext) / SCALE
    yr = y.astype(np.float64)[:, None]
    big_l, t, qq, s = (p * a2 * yr).sum(0) / 2.0, (p * yr).sum(0), (p * p * yr).sum(0), p.sum(0)
    u = big_l - (t * t - qq) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(np.column_stack([(u - t * (s - t) / 2.0) / s, t * (s - t) / s]))


def pair_sums(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S1, S0), (k, k) symmetric, in members."""
    yy = y.astype(np.float64)[:, None]
    return (p * yy).T @ p, (p * (1.0 - yy)).T @ p


def noised_pairs(m: np.ndarray, sd: float, rng: np.random.Generator, noise: bool) -> np.ndarray:
    """The a ≤ b entries with independent noise, mirrored."""
    if not noise:
        return m.copy()
    iu = np.triu_indices(m.shape[0])
    out = np.zeros_like(m)
    out[iu] = m[iu] + rng.normal(0.0, sd, len(iu[0]))
    return np.triu(out) + np.triu(out, 1).T


def sizes_and_suppression(q: np.ndarray, policy: ReleasePolicy, rng: np.random.Generator, noise: bool):
    """`bench_random_groups.suppression`, also returning the noised sizes Ŝ_j."""
    sizes = q.sum(axis=0) / SCALE
    if noise:
        sizes = sizes + rng.normal(0.0, policy.threshold_sigma(), len(sizes))
    withheld = [j for j in range(K) if not sizes[j] >= policy.min_effective_size]
    small = [g for j, g in enumerate(GROUPS) if not sizes[j] >= MIN_EFFECTIVE_SIZE or j in withheld]
    return sizes, withheld, small


# ------------------------------------------------------------------ the finish
def class_totals(d: np.ndarray, sizes: np.ndarray, own_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(P1, P0) per cell from D = P1·P0/S and Ŝ: π(1 − π) = D/Ŝ, the root on the side of
    the Test-Client's own positive rate."""
    s = np.clip(sizes, 1.0, None)
    disc = np.sqrt(np.clip(0.25 - np.clip(d, 0.0, None) / s, 0.0, None))
    rate = 0.5 - disc if own_rate <= 0.5 else 0.5 + disc
    rate = np.clip(rate, 1.0 / s, 1.0 - 1.0 / s)
    return rate * s, (1.0 - rate) * s


def with_overall(m: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """(k + 1, k + 1): overall (p ≡ 1) as one more group: its pair sums with b are b's total."""
    k = m.shape[0]
    out = np.zeros((k + 1, k + 1))
    out[:k, :k] = m
    out[k, :k] = out[:k, k] = totals[:k]
    out[k, k] = totals[:k].sum()
    return out


def binormal_spread(auc: np.ndarray) -> np.ndarray:
    """The placement variance of an equal-variance binormal pair of classes with this AUC
    (both classes alike): Φ₂(x, x; ½) − A², x = Φ⁻¹(A); symmetric about ½."""
    from scipy.stats import multivariate_normal, norm
    a = np.clip(np.abs(np.nan_to_num(np.asarray(auc, dtype=np.float64), nan=0.5) - 0.5) + 0.5, 0.5, 0.9999)
    bvn = multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, 0.5], [0.5, 1.0]])
    return np.array([bvn.cdf([x, x]) for x in norm.ppf(a)]) - a * a


def sampling_cov(s1, s0, p1, p0, v1, v0, auc=None):
    """The delta method's (weighted DeLong) covariance of the cells' AUCs. Variant "own": each
    cell's placement variances shifted by the binormal model's difference between its own
    AUC and overall's, v(A_a) − v(A_o), where positive (never narrower than pooled);
    a pair's by the geometric mean of its two cells'."""
    if VARIANT == "own" and auc is not None:
        spread = binormal_spread(auc)
        shift = np.clip(spread - spread[-1], 0.0, None)
        v1 = np.sqrt(np.outer(v1 + shift, v1 + shift))
        v0 = np.sqrt(np.outer(v0 + shift, v0 + shift))
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = v1 * s1 / np.outer(p1, p1) + v0 * s0 / np.outer(p0, p0)
    return np.nan_to_num(cov)


def auc_moment_audit(p: np.ndarray, frame, policy: ReleasePolicy, rng: np.random.Generator,
                     unit_rng: np.random.Generator = None, noise: bool = True) -> Audit:
    n = len(frame)
    rows = EXACT.client_rows(frame, "mqos_auc.csv", "exact", {SECOND_MOMENTS: True}, rng)
    y, rank = rows.values[:, 0], np.asarray(rows.strata)
    v1, v0, own_rate = placement_spreads(y, frame["score"].to_numpy())
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    q_ext = np.hstack([q, np.full((n, 1), 1 << encoding.PROBABILITY_BITS, dtype=np.int64)])
    form = estimate_form(q_ext, y, rank)                                          # (cells, 2) members
    unit = 2.0 ** (33 + normaliser_bits(n))
    scales = np.array(EXACT.squares_sensitivity({"facts": {"n": n}}, 1), dtype=np.float64)
    sigma0, sigma_m = moment_sigmas(policy)
    sd = sigma0 * scales
    slots = form * unit + (rng.normal(0.0, 1.0, form.shape) * sd if noise else 0.0)
    pm = q / SCALE
    s1, s0 = pair_sums(pm, y)
    if VARIANT == "binomial":
        sd_pair = noised_pairs(s1 + s0, sigma_m, rng, noise)  # one slot per pair instead of two (β = 1)
    else:
        s1, s0 = noised_pairs(s1, sigma_m, rng, noise), noised_pairs(s0, sigma_m, rng, noise)
    sizes, withheld, small = sizes_and_suppression(q, policy, rng, noise)
    noise_sd = [float(x) for _ in range(K + 1) for x in sd] if noise else []
    noise_sd = noise_sd + [0.0] * len(noise_sd)
    plan = EXACT.plan(GROUPS, (), None, "exact", {}, {})
    estimate = plan.suppress(plan.cell_values(to_slots(slots[None]), lambda a, b: None, plain_rows=1,
                                              noise_sd=noise_sd), withheld)[0]
    # finish: from released values only
    v_rel, d_rel = slots[:, 0] / unit, slots[:, 1] / unit                         # members
    sizes_ext = np.append(sizes, sizes.sum())
    p1, p0 = class_totals(d_rel, sizes_ext, own_rate)
    if VARIANT == "binomial":
        rate = p1[:K] / (p1[:K] + p0[:K])
        mid = (rate[:, None] + rate[None, :]) / 2.0
        sd_pair = np.clip(sd_pair, 0.0, None)
        s1, s0 = sd_pair * mid, sd_pair * (1.0 - mid)
    s1x = with_overall(np.clip(s1, 0.0, None), p1)
    s0x = with_overall(np.clip(s0, 0.0, None), p0)
    cov = sampling_cov(s1x, s0x, p1, p0, v1, v0, estimate)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = v_rel / d_rel
        noise_var = ((sd[0] / unit) ** 2 + r ** 2 * (sd[1] / unit) ** 2) / d_rel ** 2 if noise else 0.0 * r
    cov = cov + np.diag(np.nan_to_num(noise_var))
    ok = np.isfinite(estimate)
    values = np.full((REPLICATES + 1, K + 1), np.nan)
    values[0] = estimate
    if ok.any():
        gen = np.random.default_rng(draw_seed(to_slots(slots[None])))
        draws = gaussian_draws(cov[np.ix_(ok, ok)], REPLICATES, gen)
        values[1:, ok] = estimate[ok] + draws
    report = finish(EXACT, plan, values, option="exact", confidence=CONFIDENCE, tau=DEFAULT_TAU, params={},
                    info=rows.info, replicates=REPLICATES, result_recipient="client", small_groups=small,
                    interval="percentile", noisy=True)
    return Audit(plan, values, small, report, {c: AUC for c in range(K + 1)}, noise_sd)


# ------------------------------------------------------------------ the measurement
ALT_GROUP = GROUPS.index("black")


def alt_frame(p: np.ndarray, alt: float, rng: np.random.Generator):
    """(frame, truth per cell): true race r_i ~ p_i; y ~ Bernoulli(0.3); score =
    logistic(μ_r·y + N(0, 1)) with AUC `alt` for race black, 0.85 for the others."""
    from statistics import NormalDist
    n = len(p)
    race = rg.true_races(p, rng)
    race_auc = np.full(K, AUC)
    race_auc[ALT_GROUP] = alt
    mu = np.sqrt(2.0) * np.array([NormalDist().inv_cdf(a) for a in race_auc])
    y = (rng.random(n) < rg.POSITIVE_RATE).astype(np.int8)
    score = np.round(1.0 / (1.0 + np.exp(-(mu[race] * y + rng.normal(0.0, 1.0, n)))), 6)
    frame = rg.pd.DataFrame({"member_id": [f"m{i}" for i in range(n)], "y_true": y, "score": score})
    w = np.vstack([(p.T @ p) / p.sum(axis=0)[:, None], p.mean(axis=0)[None]])   # (cells, races)
    return frame, dict(enumerate(w @ race_auc))


def run(pool, n: int, datasets: int, seed: int, policy: ReleasePolicy, compare: bool, save: str | None,
        alt: float | None = None):
    out = {"moments": [], "moments_clean": [], "separate": []}
    for i in range(datasets):
        rng = np.random.default_rng([seed, n, i])
        p = pool[rng.choice(len(pool), size=n, replace=False)]
        if alt is None:
            frame, truth = auc_frame(n, rng), {c: AUC for c in range(K + 1)}
        else:
            frame, truth = alt_frame(p, alt, rng)
        a, b = copy.deepcopy(rng), copy.deepcopy(rng)
        noisy = auc_moment_audit(p, frame, policy, a)
        clean = auc_moment_audit(p, frame, policy, b, noise=False)
        noisy.truth = clean.truth = truth
        out["moments"].append(record("mqos-auc", noisy, clean))
        out["moments_clean"].append(record("mqos-auc", clean))
        if compare:
            c, d = copy.deepcopy(rng), copy.deepcopy(rng)
            sep = rg.auc_audit(p, frame, policy, c, c)
            sep.truth = truth
            out["separate"].append(record("mqos-auc", sep, rg.auc_audit(p, frame, policy, d, d, noise=False)))
        if save and ((i + 1) % 20 == 0 or i + 1 == datasets):
            Path(save).write_bytes(pickle.dumps({"members": n, "variant": VARIANT + (f"@{alt}" if alt else ""),
                                                 "records": out}))
    return out


def rows_of(n: int, out: dict, alt=None) -> list:
    name = {"moments": VARIANT, "moments_clean": f"{VARIANT} (no noise)", "separate": "separate"}
    tag = f"@{alt}" if alt else ""
    return [(name[k] + tag, n, summary(recs)) for k, recs in out.items() if recs]


def main(argv=None) -> int:
    global VARIANT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--datasets", default="400,60")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variant", choices=("delong", "binomial", "own"), default="delong")
    ap.add_argument("--compare", action="store_true", help="also today's separate form on the same datasets")
    ap.add_argument("--alt", type=float, help="black's race-level AUC (module docstring); default: null data")
    ap.add_argument("--save")
    ap.add_argument("--merge", nargs="+")
    args = ap.parse_args(argv)
    VARIANT = args.variant
    if args.merge:
        pooled: dict = {}
        for path in args.merge:
            saved = pickle.loads(Path(path).read_bytes())
            VARIANT = saved["variant"]
            for k, recs in saved["records"].items():
                pooled.setdefault((saved["variant"], saved["members"], k), []).extend(recs)
        rows = [((v if k != "separate" else "separate") + (" (no noise)" if k == "moments_clean" else ""), n,
                 summary(r)) for (v, n, k), r in pooled.items() if r]
        print("\n".join(table(rows)))
        return 0
    policy = ReleasePolicy()
    pool = rg._pool()
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(c) for c in args.datasets.split(",")]
    counts = counts * len(sizes) if len(counts) == 1 else counts
    rows = []
    for n, m in zip(sizes, counts):
        t = time.time()
        save = f"{args.save}.{VARIANT}{'@' + str(args.alt) if args.alt else ''}.{n}" if args.save else None
        new = rows_of(n, run(pool, n, m, args.seed, policy, args.compare, save, args.alt), args.alt)
        print("\n".join(table(new)[2:]), f"({time.time() - t:.0f} s)", flush=True)
        rows += new
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
