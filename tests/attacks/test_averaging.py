"""(e) Averaging repeated reads of a target's Self-ID through the real services (`averaging`)."""
from __future__ import annotations

import pytest

from tester_service.demographics import preparation
from tests.attacks import averaging
from tests.attacks.harness import Population, make_population

pytestmark = [pytest.mark.slow, pytest.mark.cost(125)]
N_TARGETS = 10
#: a population of its own (the harness's is seed 11): half the members in Self-ID
POPULATION = dict(members=600, seed=1818, self_id_share=0.5)


@pytest.fixture(scope="module")
def averaging_population(tmp_path_factory) -> Population:
    return make_population(tmp_path_factory.mktemp("averaging-population"), **POPULATION)


def test_averaging_reads_a_target_when_the_tester_redraws_per_audit(averaging_population, tmp_path, monkeypatch):
    """Defence removed (a new epoch per audit): the reads of a target are different draws,
    and their sum recovers more targets than one read does."""
    monkeypatch.setattr(preparation, "process_epoch", averaging.per_audit_epochs(seed=1))
    with averaging.tester(averaging_population, averaging.REDRAWN, tmp_path) as attacker:
        result = averaging.run(attacker, averaging_population.targets[:N_TARGETS])
    print(result)
    assert result.outcome.answered == result.outcome.audits == N_TARGETS * averaging.READS
    assert result.draws_differ >= N_TARGETS / 2, result
    assert result.outcome.recovered > result.first_read.recovered, result
    assert result.outcome.recovered > N_TARGETS * averaging.one_draw_rate(), result


def test_averaging_gains_nothing_with_one_draw_per_member(averaging_population, tmp_path, monkeypatch):
    """The defence (one draw per member for the Tester process's epoch): every read of a
    target is the same draw, so the sum recovers what one read does — no more than one
    randomized response read exactly allows."""
    monkeypatch.setattr(preparation, "_epoch", None)  # this Tester's own epoch
    with averaging.tester(averaging_population, averaging.FIXED, tmp_path) as attacker:
        result = averaging.run(attacker, averaging_population.targets[:N_TARGETS])
    print(result)
    assert result.outcome.answered == result.outcome.audits == N_TARGETS * averaging.READS
    assert result.draws_differ == 0, result
    # the sum and the first read can differ only in a blind pick (a draw on BISG's argmax)
    assert result.outcome.recovered - result.first_read.recovered <= result.on_public, result
    assert result.outcome.recovered <= result.baseline_margin, result
