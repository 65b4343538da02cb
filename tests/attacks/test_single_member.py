"""(a) Single-member targeting with decoys through the real services (`single_member`)."""
from __future__ import annotations

import pytest

from tests.attacks import single_member
from tests.attacks.checks import DEFAULTS, OFF, Attacker, assert_attack_works, assert_defended

pytestmark = pytest.mark.slow
N_TARGETS = 12


def test_single_member_recovers_targets_with_defences_off(population, tmp_path):
    attacker = Attacker(population, OFF, tmp_path)
    assert_attack_works(single_member.run(attacker, population.targets[:N_TARGETS]))


def test_single_member_is_stopped_by_the_defaults(population, tmp_path):
    attacker = Attacker(population, DEFAULTS, tmp_path)
    assert_defended(single_member.run(attacker, population.targets[:N_TARGETS]))
