"""(D) The membership oracle (`membership`): one-member datasets against the Tester's table."""
from __future__ import annotations

import json

import pytest

from tester_service.audit_log import AuditLog
from tester_service.release import DEFAULT_MAX_REFUSALS, INTERSECTION_REFUSAL, PrivacyAccountant, ReleasePolicy
from tests.attacks import membership

pytestmark = pytest.mark.slow
N_TARGETS = 16


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return membership.make_table(tmp_path_factory.mktemp("membership-table"), N_TARGETS)


def test_the_refusal_told_membership_without_the_defence(table, tmp_path, monkeypatch):
    """Defence removed (the count in the refusal, no refusal limit): every target's status."""
    membership.with_count_in_refusal(monkeypatch)
    outcome = membership.run(table, tmp_path, monkeypatch, release=membership.without_refusal_limit())
    print(outcome)
    assert outcome.recovered == outcome.targets > outcome.blind, outcome


def test_in_and_out_get_the_same_bytes(table, tmp_path, monkeypatch):
    """With one message (the refusal limit lifted, so that every target is asked): the
    Abort the Test-Client receives and its operator's error are the same bytes for a
    member and a non-member, so the attacker does no better than a blind guess."""
    outcome = membership.run(table, tmp_path, monkeypatch, release=membership.without_refusal_limit())
    print(outcome)
    answers = [outcome.reference, *outcome.answers.values()]
    assert len({a.key for a in answers}) == 1, {a.key for a in answers}
    assert outcome.reference.code == "release_refused" and outcome.reference.message == INTERSECTION_REFUSAL
    assert outcome.reference.abort and INTERSECTION_REFUSAL.encode() in outcome.reference.abort
    assert outcome.recovered <= outcome.blind, outcome


def test_refusals_are_limited_per_identity_counted_and_logged(table, tmp_path, monkeypatch):
    """Under the defaults the identity is refused outright after 3 refused audits (kept in
    the ledger: a restart does not reset it), each refusal is an audit log record, and
    the attacker stays at a blind guess. Without the limit every audit is run."""
    ledger, log = tmp_path / "ledger.json", AuditLog(tmp_path / "audit.log")
    policy = ReleasePolicy()
    outcome = membership.run(table, tmp_path / "on", monkeypatch, release=policy,
                             accountant=PrivacyAccountant(policy.budget, ledger), audit_log=log)
    print(outcome)
    codes = [outcome.reference.code, *outcome.codes()]
    limit = DEFAULT_MAX_REFUSALS
    assert codes[:limit] == ["release_refused"] * limit
    assert codes[limit:] == ["refusal_limit_reached"] * (len(codes) - limit)
    assert outcome.recovered <= outcome.blind, outcome
    stored = json.loads(ledger.read_text())
    assert list(stored["refusals"].values()) == [limit]
    refused = [json.loads(line)["record"]["outcome"] for line in log.path.read_text().splitlines()]
    assert [o["status"] for o in refused[:limit]] == ["refused"] * limit
    assert all(INTERSECTION_REFUSAL in o["reason"] for o in refused[:limit])
    assert refused[limit - 1]["reason"].endswith(f"(refused audits of this Test-Client: {limit})")
    # a restarted Tester over the same ledger still refuses the identity
    again = membership.run(table, tmp_path / "again", monkeypatch, release=policy,
                           accountant=PrivacyAccountant(policy.budget, ledger))
    assert set(again.codes()) == {"refusal_limit_reached"}

    unlimited = membership.run(table, tmp_path / "off", monkeypatch, release=membership.without_refusal_limit())
    assert set(unlimited.codes()) == {"release_refused"}  # the limit removed: every audit is run
