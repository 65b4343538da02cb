"""Benchmark: how close POT's curve points can come to the noiseless ones under the default
release controls, by the kernel mass of a point, for the alternatives that would change it.

A curve point m_j(s_q) = c + Σ p_ij·K_q·(Y − c) / Σ p_ij·K_q is a ratio whose denominator, the
point's kernel mass D, is far below its group's effective size (Silverman's bandwidth on all
100,000 members is about 0.02 on scores in [0, 1], so a point sees a few per cent of the
group; the default, `scoring.curve_bandwidths`, is Silverman's rule for n/50 rows scaled by
each reference score's local spacing). The release adds Gaussian noise σ·(HI − LO)/2 to the numerator and σ to the
denominator (`tester_service.release`, β from `common.metrics.pot.kernel_energy`), so the
point moves by about σ·sqrt(((HI − LO)/2)² + (m − c)²)/D. This script takes the masses of
one group's points from `ppre synth` data (true races as the weights: a close stand-in for
the BISG-weighted mass) and prints, per alternative, the worst point's noise sd and the
Monte Carlo distribution of the largest error over the Q points of `--runs` audits.

    .venv/bin/ppre synth --members 100000 --seed 1 --out /tmp/p100
    .venv/bin/python bench/pot_curve_noise.py --data /tmp/p100 [--group api] [--runs 2]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.metrics.pot import kernel_energy  # noqa: E402
from common.metrics.scoring import curve_bandwidths, reference_scores, silverman_bandwidth  # noqa: E402
from tester_service.release import REPLICATE_SHARE, THRESHOLD_SHARE, MOMENT_SHARE, ReleasePolicy  # noqa: E402

HALF = 0.5  # a binary outcome: declared range 0:1


def alternative(scores, outcome, members, h, share, runs, rho):
    refs = reference_scores(scores)
    h = np.broadcast_to(np.asarray(h, dtype=np.float64), refs.shape)
    k = np.exp(-((scores[:, None] - refs[None, :]) / h[None, :]) ** 2 / 2)
    mass = k[members].sum(axis=0)
    mean = (k[members] * outcome[members, None]).sum(axis=0) / mass
    beta = 2.0 * kernel_energy(refs, h)
    sigma = math.sqrt(beta / (rho * share))
    sd = sigma * np.sqrt(HALF ** 2 + (mean - 0.5) ** 2) / mass
    worst = np.abs(np.random.default_rng(0).normal(size=(20000, runs * len(sd))) * np.tile(sd, runs)).max(axis=1)
    return beta, mass, sd, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a `ppre synth` output directory")
    ap.add_argument("--group", default="api")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)
    pot = pd.read_csv(Path(args.data) / "client" / "pot.csv")
    truth = pd.read_csv(Path(args.data) / "truth.csv")
    frame = pot.merge(truth, on="member_id")
    scores, outcome = frame["score"].to_numpy(float), frame["outcome"].to_numpy(float)
    members = frame["race"].to_numpy() == args.group
    h0 = silverman_bandwidth(scores, "pot.csv")
    rho = ReleasePolicy().rho
    moments = 1 - MOMENT_SHARE - THRESHOLD_SHARE
    rows = [("Silverman's bandwidth, random-group interval (estimate share 0.7)", h0,
             1 - REPLICATE_SHARE - THRESHOLD_SHARE),
            ("Silverman's bandwidth, second moments (estimate share 0.8)", h0, moments),
            ("Silverman's bandwidth, the whole rho on the estimate (a bound)", h0, 1.0),
            ("2x Silverman's bandwidth, share 0.8", 2 * h0, moments),
            ("3x Silverman's bandwidth, share 0.8", 3 * h0, moments),
            ("the default: Silverman's rule for n/50 rows by local spacing, share 0.8",
             curve_bandwidths(scores, reference_scores(scores), "pot.csv"), moments)]
    print(f"{args.group}: {int(members.sum())} members; Silverman's bandwidth {h0:.4f}; rho {rho}")
    print(f"| alternative | bandwidth | beta | {args.group}'s kernel mass per point | worst point's noise sd "
          f"| median largest error ({args.runs} runs) | P(every point within 0.01) |")
    print("|---|---|---|---|---|---|---|")
    for name, h, share in rows:
        beta, mass, sd, worst = alternative(scores, outcome, members, h, share, args.runs, rho)
        h = np.atleast_1d(h)
        width = f"{h.min():.4f}" if h.min() == h.max() else f"{h.min():.4f}-{h.max():.4f}"
        print(f"| {name} | {width} | {beta:.2f} | {int(mass.min())}-{int(mass.max())} | {sd.max():.4f} "
              f"| {np.median(worst):.4f} | {np.mean(worst < 0.01):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
