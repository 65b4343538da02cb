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


def assert_defended(outcome: Outcome) -> None:
    """Defaults on: no more recoveries than chance allows, and the budget refuses the
    attack after the audits it pays for (every later audit, under any dataset)."""
    print(outcome)
    assert outcome.recovered <= outcome.chance_margin, outcome
    assert outcome.answered <= DEFAULT_AUDITS_ANSWERED, outcome
    assert outcome.refusals.get("privacy_budget_exhausted", 0) >= outcome.audits - DEFAULT_AUDITS_ANSWERED, outcome


__all__ = ["DEFAULTS", "OFF", "Attacker", "assert_attack_works", "assert_defended"]
