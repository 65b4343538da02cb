"""MQOS-AUC under the default release noise, in plaintext (docs/metrics/mqos-auc.md).

Reads a `ppre synth` population, computes the Tester's probabilities as an audit does
(`tester_service.demographics.preparation.prepare`) and joins the Test-Client's `mqos_auc.csv`.
Then, per group, the exact form's released sums (`common.metrics.mqos_auc`, "Released
form": V = (U − T·N/2)/S with noise sd σ₀/2, D = T·N/S with σ₀, AUC = ½ + V/D; the 10
random groups with σ_b) and the sampled form's (pairs capped per member, noise σ₀·cap
on both sums) are drawn `--draws` times. Printed: the noiseless estimate, the rms and
largest |noised − noiseless|, and the median width of the random-groups interval,
beside the noiseless one. σ₀ = sqrt(2/(ρ·0.7)) and σ_b = sqrt(2/(ρ·0.2)): the release
controls' shares (`tester_service.release`) at ρ = 0.2. Usage::

    .venv/bin/ppre synth --members 100000 --seed 1 --out /tmp/pop100k
    .venv/bin/python bench/mqos_auc_noise.py /tmp/pop100k --draws 200
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.crypto.encoding import quantize_probabilities  # noqa: E402
from common.metrics.scoring import dense_score_rank, doubled_a_weights, sample_pair_graph  # noqa: E402
from common.stats.intervals import marginal_intervals  # noqa: E402
from tester_service.demographics.preparation import prepare, read_members, read_self_id  # noqa: E402

RHO = 0.2
SIGMA0 = math.sqrt(2 / (RHO * 0.7))
SIGMA_B = math.sqrt(2 / (RHO * 0.2))
GROUPS = 10


def joined(folder: Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Group names (and overall), probabilities (n, k + 1), labels and scores."""
    probs = prepare(read_members(folder / "members.csv"), read_self_id(folder / "self_id.csv"))
    client = pd.read_csv(folder / "client" / "mqos_auc.csv", dtype={"member_id": str})
    df = probs.merge(client, on="member_id")
    races = [c for c in probs.columns if c != "member_id"]
    p = quantize_probabilities(df[races].to_numpy(float)) / 2.0 ** 32
    return races + ["overall"], np.hstack([p, np.ones((len(p), 1))]), df.y_true.to_numpy(float), \
        df.score.to_numpy(float)


def exact_sums(p, y, rank, rows, units=None) -> tuple[np.ndarray, np.ndarray]:
    """(V, D) per cell over `rows` (A within each unit when `units` is given)."""
    q = np.rint(p[rows] * 2.0 ** 32).astype(np.int64)
    a = doubled_a_weights(rank[rows], q, groups=units) / 2.0 ** 33
    pr, yr = p[rows], y[rows][:, None]
    big_l, t, qq, s = (pr * a * yr).sum(0), (pr * yr).sum(0), (pr ** 2 * yr).sum(0), pr.sum(0)
    u = big_l - (t ** 2 - qq) / 2
    return (u - t * (s - t) / 2) / s, t * (s - t) / s


def noised(v, d, vg, dg, scale_v, scale_d, rng, offset) -> np.ndarray:
    """(1 + G, cells) estimates offset + V/D from independently noised V and D (the
    estimate with σ₀, each random group with σ_b), undefined where D is not above 3 sd
    of its noise (`Plan.cell_values`)."""
    out = []
    for (vv, dd, sigma) in ((v[None], d[None], SIGMA0), (vg, dg, SIGMA_B)):
        nv = vv + rng.normal(0, sigma * scale_v, vv.shape)
        nd = dd + rng.normal(0, sigma * scale_d, dd.shape)
        out.append(np.where(nd > 3 * sigma * scale_d, offset + nv / np.where(nd > 0, nd, 1.0), np.nan))
    return np.vstack(out)


def report(title, names, clean, draws) -> None:
    lo, hi = marginal_intervals(clean, 0.95, "random_groups")
    errors = np.array([d[0] - clean[0] for d in draws])
    widths = np.array([np.subtract(*marginal_intervals(d, 0.95, "random_groups")[::-1]) for d in draws])
    print(title)
    print(f"  {'group':9s} {'noiseless':>9s} {'rms':>7s} {'max':>7s} {'width':>7s} {'noiseless':>9s} undefined")
    for j, name in enumerate(names):
        e = errors[:, j][np.isfinite(errors[:, j])]
        rms, top = (math.sqrt(float(np.mean(e ** 2))), float(np.max(np.abs(e)))) if e.size else (math.nan, math.nan)
        width = float(np.nanmedian(widths[:, j])) if np.isfinite(widths[:, j]).any() else math.nan
        print(f"  {name:9s} {clean[0, j]:9.4f} {rms:7.4f} {top:7.4f} {width:7.4f} {hi[j] - lo[j]:9.4f} "
              f"{np.mean(~np.isfinite(widths[:, j])):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("population", type=Path)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    names, p, y, s = joined(args.population)
    rank = dense_score_rank(s)
    units = rng.permutation(len(y)) % GROUPS
    v, d = exact_sums(p, y, rank, np.arange(len(y)))
    vg, dg = (np.array(x) for x in zip(*[exact_sums(p, y, rank, np.flatnonzero(units == g)) for g in range(GROUPS)]))
    clean = np.vstack([0.5 + v / d, 0.5 + vg / dg])
    print(f"{len(y)} joined members, {args.draws} draws, rho {RHO}; effective sizes "
          + ", ".join(f"{n} {x:.0f}" for n, x in zip(names, p.sum(0))))
    report("exact (released V, D; sensitivities 1/2, 1)", names, clean,
           [noised(v, d, vg, dg, 0.5, 1.0, rng, 0.5) for _ in range(args.draws)])
    for pairs, cap in ((100_000, 4), (400_000, 16), (30_000, 1)):
        # the Test-Client's rows: the pairs among dummy rows valued (0, 0)
        first, second, values, kept = sample_pair_graph(y, s, pairs, cap, rng, "mqos_auc.csv")
        ind, one = values[:, 0], values[:, 1]
        w = p[first] * p[second]
        member_group = rng.permutation(len(y)) % GROUPS
        unit = np.where(member_group[first] == member_group[second], member_group[first], GROUPS)
        num, den = (w * ind[:, None]).sum(0), (w * one[:, None]).sum(0)
        numg = np.array([(w[unit == g] * ind[unit == g, None]).sum(0) for g in range(GROUPS)])
        deng = np.array([(w[unit == g] * one[unit == g, None]).sum(0) for g in range(GROUPS)])
        sampled_clean = np.vstack([num / den, numg / deng])
        report(f"sampled ({kept} pairs in {len(first)} rows, at most {cap} per member; noise sd sigma*{cap} "
               "on both sums)",
               names, sampled_clean,
               [noised(num, den, numg, deng, cap, cap, rng, 0.0) for _ in range(args.draws)])


if __name__ == "__main__":
    main()
