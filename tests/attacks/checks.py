"""The assertions every attack test makes, with the defences off and with the defaults."""
from __future__ import annotations

from tester_service.release import DEFAULT_BUDGET, DEFAULT_RHO_PER_AUDIT
from tests.attacks.harness import DEFAULTS, OFF, Attacker, Outcome

#: the default budget over the default ρ per audit: the audits one Test-Client gets
DEFAULT_AUDITS_ANSWERED = int(DEFAULT_BUDGET / DEFAULT_RHO_PER_AUDIT + 1e-9)


def assert_attack_works(outcome: Outcome) -> None:
    """Defences off: every audit answered, and most targets recovered, far above chance."""
    print(outcome)
    assert outcome.answered == outcome.audits, outcome
    assert outcome.recovered > outcome.targets / 2, outcome
    assert outcome.above_chance, outcome


#: what refuses an attack's audit under the defaults: the budget, and (an attack's datasets
#: often sit near the minimum intersection, which is checked on a noised count: design §8.2)
#: the minimum itself, or the refusal bound that follows it
REFUSALS = ("privacy_budget_exhausted", "release_refused", "refusal_limit_reached")


def assert_defended(outcome: Outcome) -> None:
    """Defaults on: no more recoveries than chance allows, and the budget refuses the
    attack after the audits it pays for (every later audit, under any dataset; one near
    the minimum intersection may be refused by the noised minimum instead)."""
    print(outcome)
    assert outcome.recovered <= outcome.chance_margin, outcome
    assert outcome.answered <= DEFAULT_AUDITS_ANSWERED, outcome
    assert outcome.refusals.get("privacy_budget_exhausted", 0) >= 1, outcome
    assert sum(outcome.refusals.get(r, 0) for r in REFUSALS) >= outcome.audits - DEFAULT_AUDITS_ANSWERED, outcome


__all__ = ["DEFAULTS", "OFF", "Attacker", "assert_attack_works", "assert_defended"]
