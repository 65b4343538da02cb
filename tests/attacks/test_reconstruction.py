"""(c) Compressed-sensing reconstruction over many audits (`reconstruction`)."""
from __future__ import annotations

import pytest

from tests.attacks import reconstruction
from tests.attacks.checks import DEFAULTS, OFF, Attacker, assert_attack_works, assert_defended

pytestmark = [pytest.mark.slow, pytest.mark.cost(135)]
N_TARGETS = 12


def targets(population):
    return population.targets[-N_TARGETS:]


def test_reconstruction_recovers_targets_with_defences_off(population, tmp_path):
    attacker = Attacker(population, OFF, tmp_path)
    outcome = reconstruction.run(attacker, targets(population))
    assert outcome.audits < reconstruction.N_MEMBERS  # fewer audits than unknown members
    assert_attack_works(outcome)


def test_reconstruction_is_stopped_by_the_defaults(population, tmp_path):
    attacker = Attacker(population, DEFAULTS, tmp_path)
    assert_defended(reconstruction.run(attacker, targets(population)))
