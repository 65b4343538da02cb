"""The output metric's release twin in `bench/bench_intervals.py` (`--metric output`):
the sums it releases are the Tester's (`tests.test_moments.output_release`), and its noise
is the Tester's per slot (σ₀ on f and 1, σ_m on the group items' f² and on every pair
slot, "overall" the sum of the groups)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_intervals as bench  # noqa: E402
from tester_service.release import ReleasePolicy  # noqa: E402
from tests.test_moments import output_release  # noqa: E402


class Noiseless(ReleasePolicy):
    def moment_sigmas(self, n_components, *, squares=0):
        return 0.0, 0.0


def sample(n: int = 1500, seed: int = 2):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(bench.K, 0.4), size=n)
    return p, np.clip(rng.normal(1.0, 0.5, n), -1.0, 3.0), rng


def test_output_twin_releases_the_testers_sums():
    p, y, rng = sample()
    plan, pairs_plan, row, _, _, _ = bench.release_output(p, y, Noiseless(), rng)
    plan2, pairs_plan2, row2, _, _ = output_release(p, y, -1.0, 3.0)
    assert plan == plan2 and pairs_plan == pairs_plan2
    assert len(row) == len(row2)
    for got, want in zip(row, row2):
        assert got == pytest.approx(want, rel=1e-12, abs=1 << 20)  # float64 sums of ~2^70


def test_output_twin_noise_is_the_testers_per_slot():
    p, y, rng = sample()
    policy = ReleasePolicy()
    plan, pairs_plan, row, noise_sd, _, _ = bench.release_output(p, y, policy, rng)
    s0, sm = policy.moment_sigmas(2.0, squares=1)
    slots = plan.item_slots
    assert slots == 4 and len(noise_sd) == 2 * len(row) * slots and not any(noise_sd[len(noise_sd) // 2:])
    sd = np.array(noise_sd[:len(noise_sd) // 2]).reshape(len(row), slots)
    unit = 2.0 ** 56  # a value of 1 (2^24) at a probability of 1 (2^32)
    k = bench.K
    assert sd[0, :3] / unit == pytest.approx([2 * s0, s0, 4 * sm], rel=1e-6) and sd[0, 3] == 0
    assert sd[k] == pytest.approx(sd[0] * math.sqrt(k))                 # overall: the sum of the groups
    first_pair = pairs_plan.first_item
    assert sd[first_pair, :3] / unit == pytest.approx([2 * sm, sm, 4 * sm], rel=1e-6)
    assert sd[first_pair, 2] / sd[first_pair, 0] == pytest.approx(2.0)
    assert sd[0, 2] / sd[0, 0] == pytest.approx(2.0 * sm / s0)          # as the Tester's 2048-bit release


@pytest.mark.slow
def test_output_intervals_cover_at_1000_members_where_the_spread_is_mostly_noise():
    """At 1,000 members the released Σ f², whose noise is sized for f²'s bound, carries
    noise of about 40% of an outcome's spread (sd 0.5 in a range of width 4): an interval
    that took the pooled spread as known covered white's weighted value in 0.88 of
    audits (bench/RESULTS.md). With one sd of that noise added to the spread
    (`moments.pooled_spread`) white's coverage is nominal (measured 0.96 on 400)."""
    import bench_null
    pool = bench_null.probability_pool(50_000)
    datasets = 200
    result = bench.run(pool, 1000, datasets, 400, 51, 0.0, ReleasePolicy(), "output")
    white = bench.GROUPS.index("white")
    coverage = float(result["coverage"]["w"][white])
    assert coverage >= 0.95 - 2 * math.sqrt(0.95 * 0.05 / datasets), result["coverage"]["w"]
