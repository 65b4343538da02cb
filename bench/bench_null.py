"""Benchmark: how often the bootstrap verdict flags a disparity that is not there, and how
often it finds one that is (ERO, release controls off).

    .venv/bin/python bench/bench_null.py [--sizes 10000,100000] [--datasets 400] [--bootstrap 1000]
                                         [--power 10000:0.05,100000:0.02] [--seed 1] [--markdown]

A plaintext twin of the protocol's bootstrap (`tester_service.release_items`, step 6
without release noise): the joined rows go into `common.stats.bootstrap.DEFAULT_BUCKETS` random buckets
(`assign_buckets`), the bucket sums of q_ij·f and q_ij·d are formed per group (q the quantised
probabilities, 2^32 per row, `common.crypto.encoding.quantize_probabilities`; "overall" the sum of the
groups' columns, as its weight column is), a replicate is the multinomial count-weighted sum of the
bucket sums (`resample_counts`; row 0 every count 1) and a cell's value is Num/Den, as the
Test-Client decodes the masked ratio. The (B+1, cells) matrix then goes through the real
`common.stats.results.finish()` with the real ERO metric (option `fpr`) and its plan, `noisy=False`, and
the groups the Tester leaves out of a verdict without release noise (`common.stats.left_out.small_for_verdict`:
Kish effective sample size below `MIN_KISH_SIZE`) passed as `small_groups`, as the Tester does.

Data: race probabilities are those `ppre synth` members get from the Tester's preparation:
`ppre.synth.draw_population` (2010 Census surnames and ZCTAs), `tester_service.demographics.bisg.bisg` on surname and
ZIP, then `tester_service.demographics.clipping.clip` at the 90% rule's threshold (`threshold_from_rule`), without the
Self-ID rows. One pool of `POOL` members is drawn once per run; every dataset samples its members
from it without replacement (a fresh sample, fresh outcomes and a fresh bootstrap per dataset).
Outcomes: y_true ~ Bernoulli(0.3), y_pred ~ Bernoulli(0.8) for positives and Bernoulli(0.1) for
negatives, independent of the probabilities (the null); for power, a member's negative is
predicted positive with 0.1 + gap when their *true* race (drawn from their probability row,
so that the probabilities are calibrated) is black.

Counted per setting: the share of datasets whose verdict is significant (severity low, moderate
or high) with its Monte Carlo standard deviation sqrt(p(1-p)/N), the share of the false positives
whose compared difference involves aian or multiple, and the share of inconclusive verdicts; for
the power rows, the share of datasets whose verdict is significant with black in the compared
difference.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from common.stats import bootstrap as boot  # noqa: E402
from common.crypto import encoding  # noqa: E402
from common.metrics.base import Layout  # noqa: E402
from common.metrics.ero import METRIC as ERO  # noqa: E402
from common.races import RACES  # noqa: E402
from common.stats.left_out import small_for_verdict  # noqa: E402
from common.stats.results import DEFAULT_TAU, finish  # noqa: E402

#: members in the probability pool the datasets are sampled from
POOL = 300_000
POSITIVE_RATE, TPR, BASE_FPR = 0.30, 0.80, 0.10
SMALL = ("aian", "multiple")


def probability_pool(size: int = POOL, seed: int = 12345) -> np.ndarray:
    """(size, 6) prepared BISG probabilities of `ppre synth` members (module docstring)."""
    from tester_service.demographics import bisg, clipping
    from ppre import synth
    rng = np.random.default_rng(seed)
    _, surname, zipcode = synth.draw_population(size, rng)
    p = bisg.bisg(surname, zipcode).probabilities
    return clipping.clip(p, clipping.threshold_from_rule(p), rng)


@dataclass
class Outcome:
    significant: bool
    severity: str
    label: str
    involves_small: bool
    black_detected: bool


def dataset(pool: np.ndarray, n: int, rng: np.random.Generator, gap: float = 0.0):
    """(q, f, d): quantised probabilities of n members sampled from `pool` and their ERO rows."""
    p = pool[rng.choice(len(pool), size=n, replace=False)]
    y = rng.random(n) < POSITIVE_RATE
    fpr = np.full(n, BASE_FPR)
    if gap:
        true_race = (np.cumsum(p, axis=1) <= rng.random(n)[:, None] * p.sum(axis=1)[:, None]).sum(axis=1)
        fpr = fpr + gap * (true_race == RACES.index("black"))
    yhat = np.where(y, rng.random(n) < TPR, rng.random(n) < fpr)
    f = (yhat & ~y).astype(np.float64)
    d = (~y).astype(np.float64)
    return encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS), f, d


def replicate_values(q: np.ndarray, f: np.ndarray, d: np.ndarray, bootstrap: int,
                     rng: np.random.Generator) -> np.ndarray:
    """(B+1, groups + 1) cell ratios as the protocol forms them (module docstring)."""
    n, k = q.shape
    buckets = boot.assign_buckets(n, boot.DEFAULT_BUCKETS, rng)
    qf = q.astype(np.float64)
    num = np.array([qf[idx].T @ f[idx] for idx in buckets])           # (M, k)
    den = np.array([qf[idx].T @ d[idx] for idx in buckets])
    num = np.hstack([num, num.sum(axis=1, keepdims=True)])              # overall: the sum of the groups
    den = np.hstack([den, den.sum(axis=1, keepdims=True)])
    counts = np.vstack([np.ones((1, len(buckets))), boot.resample_counts(len(buckets), bootstrap, rng)])
    rn, rd = counts @ num, counts @ den
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(rd != 0, rn / np.where(rd != 0, rd, 1.0), np.nan)


def audit(q, f, d, bootstrap: int, rng: np.random.Generator, tau: float = DEFAULT_TAU):
    """The real `finish()` on the twin's replicates: the AuditReport."""
    groups = list(RACES)
    plan = ERO.plan(groups, (), Layout(64, 2, 2), "fpr", {}, {})
    values = replicate_values(q, f, d, bootstrap, rng)
    return finish(ERO, plan, values, option="fpr", confidence=0.95, tau=tau, params={}, info={},
                  replicates=bootstrap, small_groups=small_for_verdict(q, groups, ERO.name), noisy=False)


def one(pool, n, bootstrap, rng, gap=0.0) -> Outcome:
    v = audit(*dataset(pool, n, rng, gap), bootstrap, rng).verdict
    label = (v.compared or {}).get("label", "")
    sig = bool(v.significant)
    return Outcome(sig, v.severity, label, any(s in label.split(" - ") for s in SMALL),
                   sig and "black" in label.split(" - "))


def run(pool, n, datasets, bootstrap, seed, gap=0.0) -> list[Outcome]:
    rng = np.random.default_rng([seed, n, int(round(gap * 1e6))])
    return [one(pool, n, bootstrap, rng, gap) for _ in range(datasets)]


def summary(outcomes: list[Outcome]) -> dict:
    n = len(outcomes)
    flags = [o for o in outcomes if o.significant]
    rate = len(flags) / n
    return {"datasets": n, "rate": rate, "mc_sd": math.sqrt(max(rate * (1 - rate), 1e-12) / n),
            "small_share": (sum(o.involves_small for o in flags) / len(flags)) if flags else float("nan"),
            "inconclusive": sum(o.severity == "inconclusive" for o in outcomes) / n,
            "black": sum(o.black_detected for o in outcomes) / n}


def simulation_arguments(doc: str, argv=None, parents=()) -> argparse.Namespace:
    """The flags of the null-data simulations (this bench and bench_intervals.py), with
    those of `parents` (a bench's own flags, shown in its --help too)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], parents=list(parents))
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--datasets", type=int, default=400)
    ap.add_argument("--bootstrap", type=int, default=boot.DEFAULT_REPLICATES)
    ap.add_argument("--power", default="10000:0.05,100000:0.02", help="SIZE:GAP,... ('' for none)")
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = simulation_arguments(__doc__, argv)
    t0 = time.time()
    pool = probability_pool()
    print(f"pool of {len(pool)} prepared probability rows in {time.time() - t0:.1f} s; effective shares "
          + ", ".join(f"{g} {s:.4f}" for g, s in zip(RACES, pool.mean(axis=0))), flush=True)
    rows = ["| members | true black gap | datasets | B | flagged (significant) | MC sd | flags with aian/multiple "
            "| inconclusive | black gap detected |", "|---|---|---|---|---|---|---|---|---|"]
    settings = [(int(s), 0.0) for s in args.sizes.split(",") if s]
    settings += [(int(s), float(g)) for s, g in (x.split(":") for x in args.power.split(",") if x)]
    for n, gap in settings:
        t = time.time()
        s = summary(run(pool, n, args.datasets, args.bootstrap, args.seed, gap))
        rows.append(f"| {n:,} | {gap:g} | {s['datasets']} | {args.bootstrap} | {s['rate']:.1%} | {s['mc_sd']:.1%} "
                    f"| {s['small_share']:.0%} | {s['inconclusive']:.1%} | {s['black']:.1%} |")
        print(rows[-1], f"({time.time() - t:.0f} s)", flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
