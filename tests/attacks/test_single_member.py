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


def test_the_output_metric_leaks_the_same_way_and_is_stopped_the_same_way(population, tmp_path):
    """The controls are the Tester's, for every metric: the outcome-rate metric, with the
    target the only outcome of 1, gives the target away without them and not with them."""
    targets = population.targets[:N_TARGETS]
    off = single_member.run(Attacker(population, OFF, tmp_path / "off"), targets, metric="output")
    assert_attack_works(off)
    assert_defended(single_member.run(Attacker(population, DEFAULTS, tmp_path / "on"), targets, metric="output"))
