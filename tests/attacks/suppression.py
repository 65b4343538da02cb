"""(d) Suppression oracle: the small-cell rule read as a yes/no answer about one member.

Exists only with the release controls on. The Tester suppresses a group's cell when its
effective size, Σ_i p_ij over the joined rows, is below `min_effective_size` (30 by
default), and decides that on the exact sum: no noise. The attacker picks decoys whose
Tester vectors it can predict (public BISG; rows above the clipping threshold T end at
T − u with u ~ U(0, w], the removed mass spread evenly on average; T by the public 90%
rule over its own users) so that, for every group j it can calibrate (enough public
mass among its users, other than the target's public BISG argmax),

    Σ_decoys E[p_ij] = min_effective_size − ½·(T − w/2)   (half a member short),

adds the target, and runs one audit. Group j's cell is released exactly when the target
carries most of a member's weight in j: the released groups name the target's group,
however much noise the estimates carry. Signal: 1 released, 0 suppressed, ½ not
calibrated (aian and multiple lack confident rows). What blurs it is the decoys'
own Self-ID rows (their self-report differs from BISG, or the Tester's per-audit
randomized response moves them): a unit of weight in or out of a group.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tester_service.demographics.clipping import MAX_REDUCTION, RULE_MAX, RULE_MIN, RULE_QUANTILE
from tests.attacks.harness import K, Attacker, Outcome, ero_frame, score

MIN_EFFECTIVE_SIZE = 30.0  # tester_service.release.DEFAULT_MIN_EFFECTIVE_SIZE
MIN_ROWS = 105  # over tester_service.release.DEFAULT_MIN_INTERSECTION (100)
#: fillers are added until each calibrated group is this close below its goal
TOLERANCE = 0.03
#: a decoy row counts as confident in a group from this expected probability; a group
#: is tested only when its users' confident rows can carry the goal (aian and multiple
#: rarely can)
CONFIDENT = 0.8


def expected_rows(public: np.ndarray, threshold: float) -> np.ndarray:
    """E[the Tester's row] of non-Self-ID members: clipping's expectation (tester_service.demographics.clipping)."""
    out = public.copy()
    width = min(MAX_REDUCTION, (threshold - 1.0 / K) / 2.0)
    top = out.argmax(axis=1)
    m = out[np.arange(len(out)), top]
    over = m > threshold
    new_max = threshold - width / 2.0
    removed = np.where(over, m - new_max, 0.0)
    out += removed[:, None] / (K - 1)
    out[np.arange(len(out)), top] = np.where(over, new_max, m)
    return out


def design(expected: np.ndarray, pool: np.ndarray, groups: Sequence[int], goal: float, *,
           padding: int = 0, pad_group: int = 0) -> list[int]:
    """Pool indices whose expected rows sum to just under `goal` in every group of
    `groups` (greedy: `padding` rows most confident in `pad_group`, a group not tested,
    to reach the minimum intersection; then confident rows; then fillers that fit)."""
    chosen: list[int] = []
    used = np.zeros(len(expected), dtype=bool)
    used[~pool] = True
    sums = np.zeros(K)
    groups = list(groups)
    for i in np.argsort(-expected[:, pad_group]):
        if len(chosen) >= padding:
            break
        if not used[i]:
            chosen.append(int(i)); used[i] = True; sums += expected[i]

    def fits(i: int) -> bool:
        return all(sums[g] + expected[i, g] <= goal for g in groups)

    for j in groups:  # confident rows of j up to a member and a half below the goal
        for i in np.argsort(-expected[:, j]):
            if used[i] or expected[i, j] < CONFIDENT or sums[j] + expected[i, j] > goal - 1.5:
                continue
            if fits(i):
                chosen.append(int(i)); used[i] = True; sums += expected[i]
    stuck: set[int] = set()
    for _ in range(200):  # fillers: the group furthest from its goal gets the largest row that fits
        open_groups = [g for g in groups if g not in stuck and goal - TOLERANCE / 3 - sums[g] >= TOLERANCE]
        if not open_groups:
            break
        j = max(open_groups, key=lambda g: goal - sums[g])
        gap = goal - TOLERANCE / 3 - sums[j]
        ok = ~used & (expected[:, j] <= gap) & (expected[:, j] > 0)
        for g in groups:
            ok &= sums[g] + expected[:, g] <= goal
        if not ok.any():
            stuck.add(j)
            continue
        cross = expected[:, groups].sum(axis=1) - expected[:, j]
        i = int(np.argmax(np.where(ok, expected[:, j] - 2.0 * cross, -np.inf)))
        chosen.append(i); used[i] = True; sums += expected[i]
    return chosen


def run(attacker: Attacker, targets: Sequence[str], *, seed: int = 0,
        min_effective_size: float = MIN_EFFECTIVE_SIZE) -> Outcome:
    pop = attacker.population
    ids = pop.ids
    public = pop.public(ids)
    threshold = min(max(float(np.quantile(public.max(axis=1), RULE_QUANTILE)), RULE_MIN), RULE_MAX)
    expected = expected_rows(public, threshold)
    width = min(MAX_REDUCTION, (threshold - 1.0 / K) / 2.0)
    goal = min_effective_size - 0.5 * (threshold - width / 2.0)
    pool = ~np.isin(ids, np.asarray(list(targets), dtype=object))
    signals, informed = [], []
    for target in targets:
        b = pop.public_argmax(target)
        confident = np.where(expected[pool] >= CONFIDENT, expected[pool], 0.0).sum(axis=0)
        calibrated = [j for j in range(K) if j != b and confident[j] > goal]
        decoys = design(expected, pool, calibrated, goal)
        if len(decoys) < MIN_ROWS:  # pad with rows of the target's public group (not tested)
            decoys = design(expected, pool, calibrated, goal, padding=MIN_ROWS - len(decoys) + 5, pad_group=b)
        sums = expected[decoys].sum(axis=0)
        calibrated = [j for j in calibrated if goal - sums[j] < 0.25]  # the ones the design hit
        rows = [target, *ids[decoys]]
        release = attacker.audit(ero_frame(rows, np.zeros(len(rows)), np.zeros(len(rows))))
        values = release.vector()
        signal = np.full(K, 0.5)
        if release.answered:
            for j in calibrated:
                signal[j] = 0.0 if np.isnan(values[j]) else 1.0
        signals.append(signal)
        informed.append(release.answered)
    return score("suppression oracle", attacker, targets, signals, informed, seed=seed)
