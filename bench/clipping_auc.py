"""Can a classifier tell Self-ID rows from BISG rows after clipping? (design §2.4)

Builds a synthetic population (`ppre.synth`, Census-grounded), computes BISG, replaces
the Self-ID members' rows by their randomized-response one-hot vectors (ε = 4.5),
clips every row with the 90% rule threshold, and looks at the clipped band (rows whose
largest probability exceeded T). Two attackers, both on the sorted clipped
probabilities (the category labels are ignored, as an attacker would compare shapes):

* a logistic regression (numpy, Newton/IRLS with a small L2 penalty) on the six
  sorted probabilities and their logarithms, fitted on one half, AUC on the other;
* the best single sorted feature, rank-based AUC (``max(AUC, 1 − AUC)``).

AUC 0.5 means indistinguishable. Usage::

    .venv/bin/python bench/clipping_auc.py                 # default concentration
    .venv/bin/python bench/clipping_auc.py --grid          # sweep the concentration α
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tester_service.demographics import bisg, clipping, randomized_response  # noqa: E402
from common.races import RACE_INDEX  # noqa: E402
from ppre.synth import SynthConfig, synthesize  # noqa: E402


def rank_auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s))
    # average ranks of ties
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    pos = label.astype(bool)
    n1, n0 = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def logistic_auc(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, l2: float = 1e-3) -> float:
    """Held-out AUC of an L2-regularised logistic regression fitted by Newton's method."""
    idx = rng.permutation(len(y))
    tr, te = idx[: len(y) // 2], idx[len(y) // 2:]
    mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-12
    z = (x - mu) / sd
    z = np.hstack([np.ones((len(z), 1)), z])
    w = np.zeros(z.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-np.clip(z[tr] @ w, -30, 30)))
        grad = z[tr].T @ (p - y[tr]) + l2 * w
        h = (z[tr] * (p * (1 - p))[:, None]).T @ z[tr] + l2 * np.eye(len(w))
        step = np.linalg.solve(h, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return rank_auc(z[te] @ w, y[te])


def features(rows: np.ndarray) -> np.ndarray:
    srt = -np.sort(-rows, axis=1)
    return np.hstack([srt, np.log(srt + 1e-9)])


def prepare(n: int, seed: int):
    data = synthesize(SynthConfig(members=n, seed=seed))
    res = bisg.bisg(data.members["surname"].to_numpy(object), data.members["zip"].to_numpy(object))
    probs = res.probabilities
    t = clipping.threshold_from_rule(probs)
    is_self = np.zeros(n, dtype=bool)
    pos = np.flatnonzero(data.members["member_id"].isin(data.self_id["member_id"]).to_numpy())
    cats = np.array([RACE_INDEX[r] for r in data.self_id["race"]])
    rng = np.random.default_rng(seed + 1)
    combined = probs.copy()
    combined[pos] = randomized_response.privatize_one_hot(cats, rng)
    is_self[pos] = True
    return combined, is_self, t


def measure(combined: np.ndarray, is_self: np.ndarray, t: float, alpha: float, seed: int) -> tuple[float, float, int, int]:
    rng = np.random.default_rng(seed)
    band = combined.max(axis=1) > t
    clipped = clipping.clip(combined[band], t, rng, concentration=alpha)
    y = is_self[band].astype(float)
    x = features(clipped)
    lr = logistic_auc(x, y, rng)
    single = max(max(a, 1 - a) for a in (rank_auc(x[:, j], y) for j in range(6)))
    return lr, single, int(y.sum()), int(len(y) - y.sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--grid", action="store_true", help="sweep the Dirichlet concentration")
    ap.add_argument("--threshold", type=float, default=None,
                    help="fixed T (default: the 90%% rule on the synthetic BISG rows)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    combined, is_self, t = prepare(args.members, args.seed)
    if args.threshold is not None:
        t = clipping.check_threshold(args.threshold)
        print(f"members={args.members} T(fixed)={t:.4f}")
    else:
        print(f"members={args.members} T(90% rule)={t:.4f}")
    alphas = [0.3, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0] if args.grid else [clipping.DIRICHLET_CONCENTRATION]
    for a in alphas:
        lr, single, n_self, n_bisg = measure(combined, is_self, t, a, args.seed + 2)
        print(f"alpha={a:<5} logistic AUC={lr:.3f} best single-feature AUC={single:.3f} "
              f"(band: {n_self} Self-ID rows, {n_bisg} BISG rows)")
    print(f"elapsed {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
