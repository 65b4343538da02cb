"""(d) The small-cell rule as an oracle (`suppression`): only the release controls have it.

With the defaults the budget stops it after two audits. Per answered audit it is not
stopped by the noise (the report's "noise, no budget" row): the suppression decision is
taken on the exact effective size."""
from __future__ import annotations

import pytest

from tests.attacks import suppression
from tests.attacks.checks import DEFAULTS, Attacker, assert_defended

pytestmark = pytest.mark.slow
N_TARGETS = 12


def test_suppression_oracle_is_stopped_by_the_defaults(population, tmp_path):
    attacker = Attacker(population, DEFAULTS, tmp_path)
    assert_defended(suppression.run(attacker, population.targets[:N_TARGETS]))
