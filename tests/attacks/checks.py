"""The assertions every attack test makes, with the defences off and with the defaults."""
from __future__ import annotations

from tests.attacks.harness import DEFAULTS, OFF, Attacker, Outcome, release_flags_available

#: the default budget (ρ 2) over the default ρ per audit (1): audits one Test-Client gets
DEFAULT_AUDITS_ANSWERED = 2


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
    assert release_flags_available(), "the release-control flags are missing from `ppre audit`"
    assert outcome.recovered <= outcome.chance_margin, outcome
    assert outcome.answered <= DEFAULT_AUDITS_ANSWERED, outcome
    assert outcome.refusals.get("privacy_budget_exhausted", 0) >= outcome.audits - DEFAULT_AUDITS_ANSWERED, outcome


__all__ = ["DEFAULTS", "OFF", "Attacker", "assert_attack_works", "assert_defended"]
