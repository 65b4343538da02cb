"""(A) The small-groups list read as a target's group, through LOT (design §8.2, §9.2).

The Test-Client receives, in the AggregatesHeader, the groups too small for the verdict.
The attack: a LOT dataset of 99 two-item queries, the target at rank 1 of every one and
a different decoy at rank 2 (so the joined rows' first members are the target 99 times).
A group is "small" when Σ_i p_ij over the rows' first members is below 30, i.e. when
99·p_tj < 30: with exact sizes exactly the target's groups of probability 0.3 or more
are not small, and the one not-small group names the target's group. Under the default
release controls the list is decided on noised sizes only, and LOT's cells are group
pairs, whose sizes never enter it: it says nothing of the target.

Run on the sans-I/O sessions (1024-bit test keys), against the same Tester table with the
release controls off (the defence removed: the list from exact sizes) and with the
defaults. Guess: a group not in the list, chosen uniformly; chance 1/6 per target.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from common.races import RACES
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import local_audit, one_key_inline_chunks

pytestmark = pytest.mark.slow
#: a population seed no other attack uses
SEED = 1819
N_TARGETS = 16
DECOYS = 99
K = len(RACES)


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def _population(rng: np.random.Generator) -> pd.DataFrame:
    """Members with Dirichlet probabilities; the targets lean clearly to one group."""
    n = N_TARGETS + N_TARGETS * DECOYS
    probs = rng.dirichlet(np.full(K, 0.5), n)
    targets = np.eye(K)[rng.integers(0, K, N_TARGETS)] * 0.7 + 0.3 / K
    probs[:N_TARGETS] = targets
    table = pd.DataFrame(probs, columns=list(RACES))
    table.insert(0, "member_id", [f"m{i:05d}" for i in range(n)])
    return table


def _dataset(target: int, decoys: range) -> pd.DataFrame:
    rows = []
    for q, decoy in enumerate(decoys):
        rows += [{"query_id": f"q{q}", "member_id": f"m{target:05d}", "rank": 1.0, "relevance": 1.0},
                 {"query_id": f"q{q}", "member_id": f"m{decoy:05d}", "rank": 2.0, "relevance": 0.0}]
    return pd.DataFrame(rows)


def _small_groups(tester: pd.DataFrame, client: pd.DataFrame, policy: ReleasePolicy) -> list[str]:
    seen: list[str] = []

    def tap(direction, message):
        if direction == "to_client" and message.WhichOneof("body") == "aggregates_header":
            seen.extend(message.aggregates_header.small_groups)

    # a cap on rows per member that keeps the target's 99 rows (the list, not the cap, is under test)
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1, metric_option="raw",
                     params={"rows_per_member": str(DECOYS)})
    local_audit(tester, client, spec=spec, tap=tap, release=policy, n_buckets=16)
    return seen


def _attack(policy: ReleasePolicy) -> int:
    rng = np.random.default_rng(SEED)
    tester = _population(rng)
    truth = tester[list(RACES)].to_numpy()[:N_TARGETS].argmax(axis=1)
    recovered = 0
    for t in range(N_TARGETS):
        decoys = range(N_TARGETS + t * DECOYS, N_TARGETS + (t + 1) * DECOYS)
        small = set(_small_groups(tester, _dataset(t, decoys), policy))
        candidates = [j for j, g in enumerate(RACES) if g not in small] or list(range(K))
        recovered += int(rng.choice(candidates) == truth[t])
    return recovered


def test_the_small_groups_list_names_the_target_without_the_controls():
    recovered = _attack(ReleasePolicy.off())
    print(f"small groups, controls off: {recovered}/{N_TARGETS} (chance {N_TARGETS / K:.1f})")
    assert recovered >= N_TARGETS - 1


def test_the_small_groups_list_says_nothing_of_the_target_under_the_defaults():
    margin = int(binom.ppf(0.999, N_TARGETS, 1.0 / K))
    # the minimum intersection lowered below the 100 distinct members less the noise's cut
    # (8σ_i = 40), so that every audit is answered: the list, not the minimum, is under test
    recovered = _attack(dataclasses.replace(ReleasePolicy(), min_intersection=DECOYS + 1 - 41))
    print(f"small groups, defaults: {recovered}/{N_TARGETS} (chance {N_TARGETS / K:.1f}, margin {margin})")
    assert recovered <= margin
