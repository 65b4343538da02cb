"""Benchmark: the probabilistic count's released counts under the release controls against
the exact counts of the same members (bench/RESULTS.md, "The probabilistic count under the
controls, aggregated under encryption").

Per seed, one audit through both sessions (1024-bit test keys, `tests.helpers`) with the
controls off (the Tester's exact counts from plaintext pools) and one with them on (the
encrypted form's noised counts, finished by the Test-Client), over `--pools` pools; each
released cell's error divided by σ₀ = `ReleasePolicy.single_sigma(1)`, over the cells whose
exact count is above 4σ₀ (so that withholding a negative noised count does not cut the
errors). Prints their number, mean and sd: about 0 and 1 when the noise is the announced one.

    PYTHONPATH=. .venv/bin/python bench/prob_count_noise.py --seeds 4 --members 3000 --pools 20
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first-seed", type=int, default=70)
    parser.add_argument("--members", type=int, default=3000)
    parser.add_argument("--pools", type=int, default=20)
    args = parser.parse_args()
    from tester_service.release import ReleasePolicy
    from tests.helpers import one_key_inline_chunks
    from tests.test_prob_count_encrypted import NOISY, _pools, _run
    sigma = NOISY.single_sigma(1)
    errors: list[float] = []
    with one_key_inline_chunks():
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            tester, client = _pools(args.pools, seed=seed, members=args.members)
            exact = _run(tester, client, ReleasePolicy.off(), recipient="tester")[0].result
            noised = _run(tester, client, NOISY)[1].result
            truth = {(p.pool, p.group): p.expected_count for p in exact.pools}
            errors += [(p.expected_count - truth[(p.pool, p.group)]) / sigma for p in noised.pools
                       if truth[(p.pool, p.group)] > 4 * sigma and p.expected_count is not None]
    z = np.array(errors)
    print(f"{len(z)} cells over {args.seeds} seeds: mean {z.mean():+.3f}, sd {z.std(ddof=1):.3f} "
          f"(standard error {1 / np.sqrt(len(z)):.3f}); sigma0 {sigma:.3f} members")


if __name__ == "__main__":
    main()
