"""MQOS-AUC exact under the release controls: what the score bins cost (design §5.6,
"Score bins"; docs/metrics/mqos-auc.md).

Reads a `ppre synth` population, computes the Tester's probabilities as an audit does
and joins the Test-Client's `mqos_auc.csv` (`bench/mqos_auc_noise.py`). Per cell (each
group and overall) it prints the exact AUC of the rank form, the AUC of the score in K
quantile bins (`common.metrics.mqos_auc.score_bins`) for each K asked, the difference,
and the release noise's rms on that cell under the default controls (V noised with
sd σ₀/2, D with σ₀, σ₀ from `ReleasePolicy.moment_sigmas`), so the bias is read against
the noise. Both forms in plaintext (`released_form`, the slots the encrypted path
releases). Also: a binormal population of `--synthetic` rows per AUC level. Usage::

    .venv/bin/ppre synth --members 100000 --seed 1 --out /tmp/pop100k
    .venv/bin/python bench/auc_score_bins.py /tmp/pop100k --bins 16,32,64
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.crypto.encoding import quantize_probabilities  # noqa: E402
from common.metrics.mqos_auc import normaliser_bits, released_form, score_bins  # noqa: E402
from common.metrics.scoring import dense_score_rank  # noqa: E402
from tester_service.release import ReleasePolicy  # noqa: E402


def aucs(q: np.ndarray, y: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cell (q's columns, then overall): the AUC and D in members, from the released slots."""
    n = len(y)
    unit = float(2 ** (33 + normaliser_bits(n)))
    slots = released_form(q, y, rank, n_rows=n)[0]
    v = np.array([float(a) for a, _ in slots]) / unit
    d = np.array([float(b) for _, b in slots]) / unit
    return 0.5 + v / d, d


def noise_rms(auc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The release noise's rms on each cell's AUC = ½ + V/D (first order)."""
    sigma0, _ = ReleasePolicy().moment_sigmas(2, pair_components=1)
    return sigma0 * np.sqrt(0.25 + (auc - 0.5) ** 2) / d


def table(title: str, names: list[str], q: np.ndarray, y: np.ndarray, scores: np.ndarray, ks: list[int]) -> None:
    exact, d = aucs(q, y, dense_score_rank(scores))
    rms = noise_rms(exact, d)
    print(f"\n{title}: {len(y)} rows, {int(y.sum())} positive")
    print("| cell | exact AUC | noise rms | " + " | ".join(f"K={k}: binned − exact (÷ rms)" for k in ks) + " |")
    print("|---|---|---|" + "---|" * len(ks))
    diffs = {k: aucs(q, y, score_bins(scores, k))[0] - exact for k in ks}
    for c, name in enumerate(names):
        cols = " | ".join(f"{diffs[k][c]:+.5f} ({diffs[k][c] / rms[c]:+.2f})" for k in ks)
        print(f"| {name} | {exact[c]:.4f} | {rms[c]:.4f} | {cols} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("population", type=Path, nargs="?", help="a `ppre synth` folder")
    ap.add_argument("--bins", default="16,32,64")
    ap.add_argument("--synthetic", type=int, default=20000, help="rows of the binormal populations (0: none)")
    args = ap.parse_args()
    ks = [int(x) for x in args.bins.split(",")]
    if args.population:
        from mqos_auc_noise import joined
        names, p, y, scores = joined(args.population)
        q = quantize_probabilities(p[:, :-1])
        table(f"{args.population}", names, q, y.astype(np.int64), scores, ks)
    if args.synthetic:
        rng = np.random.default_rng(7)
        n = args.synthetic
        for shift in (0.5, 1.0, 2.5):
            y = (rng.random(n) < 0.3).astype(np.int64)
            groups = rng.integers(0, 3, n)
            # group 2's positives scored lower: its AUC below overall's
            scores = rng.normal(size=n) + shift * y * np.where(groups == 2, 0.6, 1.0)
            p = np.full((n, 3), 0.05)
            p[np.arange(n), groups] = 0.9
            table(f"binormal, shift {shift}", ["g0", "g1", "g2 (lower)", "overall"],
                  quantize_probabilities(p), y, scores, ks)
    if not args.population and not args.synthetic:
        ap.error("nothing to measure")
    print(f"\n(noise rms at the default ρ: σ₀ = {ReleasePolicy().moment_sigmas(2, pair_components=1)[0]:.2f} "
          f"members per unit; a cell's rms ≈ σ₀·sqrt(¼ + (AUC − ½)²)/D)", file=sys.stderr)


if __name__ == "__main__":
    main()
