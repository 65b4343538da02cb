"""Benchmark: how well POT's DTI intervals under the release controls fit the DTIs' spread
over null datasets, per pair of groups (bench/RESULTS.md, "POT's null flag rate at 100,000
members, two more seeds").

Reads a `bench_random_groups.py --metric pot --save PREFIX` file (null data: every true DTI
is 0) and prints, per pair a > b (one of each pair and its reverse), the DTI's rms over the
datasets, the mean sd its 95% interval implies (half-width / 1.96), their ratio (above 1: the
intervals are too narrow) and how often the interval covers 0.

    .venv/bin/python bench/bench_random_groups.py --metric pot --sizes 100000 --datasets 400 --seed 24 --form moments --save /tmp/rg7/diag24b
    .venv/bin/python bench/pot_dti_calibration.py /tmp/rg7/diag24b.pot.100000
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np


def calibration(records: list[dict]) -> list[tuple[str, int, float, float, float]]:
    """(pair, datasets, rms of the DTI, mean implied sd, coverage of 0), one row per pair."""
    seen: set[tuple[str, str]] = set()
    rows = []
    for label in records[0]["pairs"]:
        a, b = label.split(">")
        if (b, a) in seen:
            continue
        seen.add((a, b))
        cells = [r["pairs"][label] for r in records if None not in r["pairs"][label]]
        est = np.array([c[0] for c in cells])
        sd = np.array([(c[2] - c[1]) / (2 * 1.96) for c in cells])
        cover = float(np.mean([c[1] <= 0.0 <= c[2] for c in cells]))
        rows.append((label, len(cells), float(np.sqrt(np.mean(est ** 2))), float(np.mean(sd)), cover))
    return rows


def main(argv: list[str]) -> int:
    records = pickle.loads(Path(argv[0]).read_bytes())["records"]
    rows = calibration(records)
    print(f"{len(records)} datasets")
    for label, n, rms, sd, cover in sorted(rows, key=lambda r: -r[2] / r[3]):
        print(f"{label:20s} n={n} rms(DTI)={rms:.4f} implied sd={sd:.4f} ratio={rms / sd:.3f} covers 0: {cover:.3f}")
    ratios = [r[2] / r[3] for r in rows]
    print(f"mean ratio {np.mean(ratios):.3f}, mean coverage {np.mean([r[4] for r in rows]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
