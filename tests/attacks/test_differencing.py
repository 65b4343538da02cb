"""(b) Differencing two audits that differ in one member (`differencing`)."""
from __future__ import annotations

import pytest

from tests.attacks import differencing
from tests.attacks.checks import DEFAULTS, OFF, Attacker, assert_attack_works, assert_defended

pytestmark = [pytest.mark.slow, pytest.mark.cost(105)]
N_TARGETS = 10


def targets(population):
    return population.targets[12:12 + N_TARGETS]


def test_differencing_recovers_targets_with_defences_off(population, tmp_path):
    attacker = Attacker(population, OFF, tmp_path)
    assert_attack_works(differencing.run(attacker, targets(population)))


def test_differencing_is_stopped_by_the_defaults(population, tmp_path):
    attacker = Attacker(population, DEFAULTS, tmp_path)
    assert_defended(differencing.run(attacker, targets(population)))
