"""Benchmark: how well POT's DTI intervals under the release controls fit the DTIs' spread
over null datasets, per pair of groups (bench/RESULTS.md, "POT's null flag rate at 100,000
members, two more seeds" and "POT's null flag rate at 100,000 members, eight seeds").

Reads a `bench_random_groups.py --metric pot --save PREFIX` file (null data: every true DTI
is 0) and prints, per pair a > b (one of each pair and its reverse), the DTI's rms over the
datasets, the mean sd its 95% interval implies (half-width / 1.96), their ratio (above 1: the
intervals are too narrow) and how often the interval covers 0.

    .venv/bin/python bench/bench_random_groups.py --metric pot --sizes 100000 --datasets 400 --seed 24 --form moments --save /tmp/rg7/diag24b
    .venv/bin/python bench/pot_dti_calibration.py /tmp/rg7/diag24b.pot.100000

`--conditional N` measures instead, on N null datasets of the plaintext twin
(`bench_random_groups.pot_moment_audit`, equal to the sessions), the family-wise rate of the
verdict's max-|t| band *given each dataset*: the band (its draws' sd per DTI and their
quantile q of max |t|) against a reference covariance of the 15 DTIs, by 20,000 Gaussian
draws, averaged over the datasets (its Monte Carlo error is far below a flag count's). Two
bands, two references:

* bands: the release's (noised pair items S^d at σ_m) and the same release with exact pair
  items (the noiseless twin, which claims the same noise sd);
* references: the exact-pair-items draws' covariance, and the sandwich (each row's influence
  on every DTI with its groups' own residuals and exact weights) plus the noise-only draws'.

The gap between the bands is what the noise on S^d costs; the gap between the reference's
rate and the flag rate over datasets is what a Gaussian reference misses (the DTIs' tails).

    .venv/bin/python bench/pot_dti_calibration.py --conditional 100 --seed 51
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


def dti_draws(audit, groups) -> np.ndarray:
    """(R+1, pairs a < b) DTIs of a twin audit's draws (row 0 the estimate), uniform weights."""
    cells = audit.plan.cells
    curve = {g: [c for c, cell in enumerate(cells) if cell.kind == "curve" and cell.group == g] for g in groups}
    return np.column_stack([(audit.values[:, curve[a]] - audit.values[:, curve[b]]).mean(axis=1)
                            for i, a in enumerate(groups) for b in groups[i + 1:]])


def band(draws: np.ndarray) -> tuple[np.ndarray, float]:
    """The verdict's max-|t| band (`results.simultaneous_bands`, percentile) as each column's
    draws' sd and the one quantile q of max |t| that est ± q·sd spans."""
    from common.stats.intervals import simultaneous_bands
    _, high = simultaneous_bands(draws, 0.95, "percentile")
    sd = draws[1:].std(axis=0, ddof=1)
    return sd, float(np.median((high - draws[0]) / sd))


def kernels(frame) -> np.ndarray:
    """(rows, reference scores) of the Test-Client's kernel values K_q(S_i), as `Pot.client_rows`
    encodes them (the default reference scores and bandwidths)."""
    from common.metrics.pot import METRIC as POT
    return POT.client_rows(frame, "pot.csv", "default", POT.parse_params({}), np.random.default_rng(0)).values[:, 1::2]


def sandwich(frame, p: np.ndarray, groups) -> np.ndarray:
    """The DTIs' sampling covariance from each row's influence (groups' own residuals)."""
    from common.crypto import encoding
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS).astype(np.float64) / 2.0 ** 32
    y = frame["outcome"].to_numpy(float)
    k = kernels(frame)
    infl = []
    for a in range(len(groups)):
        den = q[:, a] @ k
        m = (q[:, a] * y) @ k / den
        infl.append((q[:, a][:, None] * k * (y[:, None] - m[None, :]) / den[None, :]).mean(axis=1))
    lin = np.column_stack([infl[i] - infl[j] for i in range(len(groups)) for j in range(i + 1, len(groups))])
    return lin.T @ lin


def conditional(datasets: int, seed: int, n: int = 100_000) -> int:
    """Prints, every 25 datasets, the mean conditional family-wise rate of each band
    against each reference (module docstring), and how many verdicts were significant."""
    import copy

    import bench_random_groups as twin
    import common.stats.moments as moments
    from tester_service.release import ReleasePolicy
    twin.FORM = "moments"
    groups, pool, policy = twin.GROUPS, twin._pool(), ReleasePolicy()
    rng, gauss = np.random.default_rng([seed, n, 0]), np.random.default_rng([seed, 1])
    cross = moments.cross_covariance
    rates = {key: [] for key in ("noised S^d vs exact S^d", "exact S^d vs exact S^d",
                                 "noised S^d vs sandwich", "exact S^d vs sandwich")}
    flags = 0
    for i in range(datasets):
        p = pool[rng.choice(len(pool), size=n, replace=False)]
        frame = twin.pot_frame(n, rng)
        clean_rng = copy.deepcopy(rng)
        noise_rng = copy.deepcopy(rng)
        audit = twin.pot_moment_audit(p, frame, policy, rng, rng)
        noised = dti_draws(audit, groups)
        exact = dti_draws(twin.pot_moment_audit(p, frame, policy, clean_rng, clean_rng, noise=False), groups)
        moments.cross_covariance = lambda *args: 0.0 * cross(*args)  # the draws' noise alone
        try:
            noise_only = dti_draws(twin.pot_moment_audit(p, frame, policy, noise_rng, noise_rng, noise=False), groups)
        finally:
            moments.cross_covariance = cross
        if not (np.all(np.isfinite(noised)) and np.all(np.isfinite(exact))):
            continue
        flags += audit.report.verdict.significant
        refs = {"exact S^d": np.cov(exact[1:].T), "sandwich": sandwich(frame, p, groups) + np.cov(noise_only[1:].T)}
        for name, draws in (("noised S^d", noised), ("exact S^d", exact)):
            sd, q = band(draws)
            for ref, cov in refs.items():
                z = gauss.multivariate_normal(np.zeros(len(cov)), cov, size=20_000, method="eigh")
                rates[f"{name} vs {ref}"].append(float(np.mean((np.abs(z) / sd).max(axis=1) > q)))
        if (i + 1) % 25 == 0 or i + 1 == datasets:
            print(f"{i + 1} datasets: " + "; ".join(f"{k} {np.mean(v):.4f}" for k, v in rates.items())
                  + f"; flagged {flags}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--conditional":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 51
        return conditional(int(argv[1]), seed)
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
