"""Refused audits: one answer for every too-small intersection, counted per Test-Client
identity and limited (tester_service/release.py, docs/privacy-ledger.md "Refused audits")."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from common.errors import InputError
from tester_service.release import (DEFAULT_MAX_POPULATION_REFUSALS, DEFAULT_MAX_REFUSALS, INTERSECTION_REFUSAL,
                                    INTERSECTION_SHARE, IntersectionRefused, PrivacyAccountant,
                                    RefusalLimitReached, ReleasePolicy, local_accountant)
from tests.helpers import local_audit, make_inputs


def test_the_accountant_limits_refusals_per_identity_and_keeps_them(tmp_path):
    ledger = tmp_path / "ledger.json"
    acc = PrivacyAccountant(0.4, ledger)
    acc.charge("client-a", 0.2)
    for n in range(1, DEFAULT_MAX_REFUSALS + 1):
        acc.check_refusals("client-a", DEFAULT_MAX_REFUSALS)
        assert acc.refuse("client-a") == n
    with pytest.raises(RefusalLimitReached, match=r"'client-a' has had 3 audits refused.*the limit is 3.*ledger file"):
        acc.check_refusals("client-a", DEFAULT_MAX_REFUSALS)
    acc.check_refusals("client-b", DEFAULT_MAX_REFUSALS)  # per identity
    acc.check_refusals("client-a", None)  # no limit
    assert json.loads(ledger.read_text()) == {"spent": {"client-a": 0.2}, "refusals": {"client-a": 3}}
    again = PrivacyAccountant(0.4, ledger)  # a restart keeps the count and the spent rho
    assert again.refusals("client-a") == 3 and again.spent("client-a") == pytest.approx(0.2)
    with pytest.raises(RefusalLimitReached):
        again.check_refusals("client-a", DEFAULT_MAX_REFUSALS)


def test_a_ledger_of_spent_rho_alone_still_reads_and_a_bad_count_is_refused(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"client-a": 0.4}))
    assert PrivacyAccountant(0.4, ledger).refusals("client-a") == 0
    ledger.write_text(json.dumps({"spent": {"client-a": 0.4}, "refusals": {"client-a": -1}}))
    with pytest.raises(InputError, match="refusals"):
        PrivacyAccountant(0.4, ledger)


def test_a_local_audit_counts_no_refusals_for_its_identity_but_for_its_population(tmp_path):
    """Its user holds both datasets: a limit per pair of files would only lock them out of
    fixing an id column, and every client file is a new identity anyway; the population
    (the Tester's files) counts them, up to `DEFAULT_MAX_POPULATION_REFUSALS`."""
    ledger = tmp_path / "ledger.json"
    acc = local_accountant(0.4, (None, None), None, ledger)
    for _ in range(5):
        assert acc.refuse("anyone") == 0
    acc.check_refusals("anyone", 1)
    assert acc.population_refusals() == 5
    for n in range(5, DEFAULT_MAX_POPULATION_REFUSALS):
        local_accountant(0.4, (None, None), pd.DataFrame({"file": [n]}), ledger).refuse("anyone")  # another file
    again = local_accountant(0.4, (None, None), pd.DataFrame({"file": [-1]}), ledger)
    with pytest.raises(RefusalLimitReached, match=r"the Tester's members \(population [0-9a-f]{16}\) have had 10 "
                                                  r"audits refused.*the limit is 10.*population_refusals"):
        again.check_refusals("anyone", DEFAULT_MAX_REFUSALS)
    stored = json.loads(ledger.read_text())
    assert stored["refusals"] == {} and list(stored["population_refusals"].values()) == [10]


def test_a_service_counts_refusals_per_identity_and_per_population(tmp_path):
    """Each identity has its limit (3), and all of them together the population's (10):
    four identities with 3 refusals each meet the population's bound at the fourth."""
    ledger = tmp_path / "ledger.json"
    acc = PrivacyAccountant(0.4, ledger, population="population x")
    for n in range(9):
        acc.check_refusals(f"client-{n // 3}", DEFAULT_MAX_REFUSALS)
        assert acc.refuse(f"client-{n // 3}") == n % 3 + 1
    with pytest.raises(RefusalLimitReached, match="Test-Client 'client-0' has had 3"):
        acc.check_refusals("client-0", DEFAULT_MAX_REFUSALS)
    acc.check_refusals("client-3", DEFAULT_MAX_REFUSALS)
    acc.refuse("client-3")
    with pytest.raises(RefusalLimitReached, match=r"population x\) have had 10 audits refused"):
        acc.check_refusals("client-3", DEFAULT_MAX_REFUSALS)
    restarted = PrivacyAccountant(0.4, ledger, population="population x")
    assert restarted.population_refusals() == 10 and restarted.refusals("client-3") == 1
    with pytest.raises(RefusalLimitReached, match="population x"):
        restarted.check_refusals("client-9", None)  # no identity limit: the population's still holds
    PrivacyAccountant(0.4, ledger, population="population x", max_population_refusals=None).check_refusals("c", None)
    with pytest.raises(InputError, match="max population refusals"):
        PrivacyAccountant(0.4, population="p", max_population_refusals=-1)


def test_a_bad_population_refusal_count_in_the_ledger_is_refused(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"spent": {}, "refusals": {}, "population_refusals": {"population x": 1.5}}))
    with pytest.raises(InputError, match="population_refusals"):
        PrivacyAccountant(0.4, ledger)


def test_the_minimum_is_checked_on_a_noised_count():
    """Design §8.2: under noise, `distinct` + N(0, σ_i²) against the minimum, σ_i² =
    1/(2·ρ·INTERSECTION_SHARE) (5 members at the defaults); an empty intersection never
    passes; without noise the exact count."""
    policy = ReleasePolicy()
    assert policy.intersection_rho() == pytest.approx(policy.rho * INTERSECTION_SHARE)
    assert policy.intersection_sigma() == pytest.approx((2 * policy.rho * INTERSECTION_SHARE) ** -0.5)
    assert policy.intersection_answered(99, draw=lambda sigma: 1.0)
    assert not policy.intersection_answered(100, draw=lambda sigma: -0.5)
    assert not policy.intersection_answered(0, draw=lambda sigma: 1e9)
    drawn = []
    policy.intersection_answered(140, draw=lambda sigma: drawn.append(sigma) or 0.0)
    assert drawn == [pytest.approx(5.0)]
    exact = dataclasses.replace(policy, rho=0.0)
    assert exact.intersection_answered(100) and not exact.intersection_answered(99)
    assert exact.intersection_sigma() == 0.0 == exact.intersection_rho()
    for share in (0.0, 0.6):
        with pytest.raises(InputError, match="intersection share"):
            ReleasePolicy(intersection_share=share)


def test_an_answer_refused_before_its_charge_counts_as_a_refusal(tmp_path):
    """An audit answered on its intersection whose release is then refused (the budget
    spent meanwhile by a concurrent audit) has told the Test-Client the decision: counted
    as a refused audit, for the identity and the population, and recorded as one."""
    from client_service.datasets import DatasetRegistry
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.audit_log import AuditLog
    from tester_service.release import BudgetExhausted
    from tester_service.server import UNPAID_ANSWER, run_audit
    from tests.helpers import TEST_BITS, wait_until

    tester, client = make_inputs(200, 160, 160, seed=9)
    client.to_csv(tmp_path / "d.csv", index=False)

    class Raced(PrivacyAccountant):
        def charge(self, identity, rho):
            raise BudgetExhausted("spent meanwhile by a concurrent audit")

    acc = Raced(0.4, tmp_path / "ledger.json", population="population x")
    log = AuditLog(tmp_path / "audit.log")
    with local_services(lambda: tester, DatasetRegistry(data_dir=tmp_path), modulus_bits=TEST_BITS,
                        allow_insecure=True, release=ReleasePolicy(), accountant=acc) as svc:
        svc.tester_config.audit_log = log
        event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="d", bootstrap=10))
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    assert event.error.code == "privacy_budget_exhausted"
    assert acc.refusals(svc.tester_config.client_identity) == 1 and acc.population_refusals() == 1
    outcome = json.loads(log.path.read_text().splitlines()[-1])["record"]["outcome"]
    assert outcome["status"] == "refused" and outcome["reason"].startswith(UNPAID_ANSWER)
    assert "privacy_budget_exhausted" in outcome["reason"]


def test_the_policy_limit_is_checked():
    assert ReleasePolicy().max_refusals == DEFAULT_MAX_REFUSALS and ReleasePolicy.off().max_refusals is None
    with pytest.raises(InputError, match="max refusals"):
        ReleasePolicy(max_refusals=-1)


@pytest.mark.parametrize("overlap", [0, 1, 20, 59])
def test_an_empty_and_a_small_intersection_get_the_same_words(overlap):
    """Design §8.2: the refusal states no count, and an empty join is no different (the
    noise on the count is cut at 8σ_i = 40 members: 59 is always refused)."""
    tester, client = make_inputs(150, 150, overlap, seed=5)
    with pytest.raises(IntersectionRefused) as refused:
        local_audit(tester, client, release=ReleasePolicy())
    assert (refused.value.code, str(refused.value)) == ("release_refused", INTERSECTION_REFUSAL)


def test_a_repeated_member_is_refused_whether_or_not_it_joins():
    """A dataset whose ids must be unique with one id twice: the same protocol error
    for a member the Tester holds and one it does not (checked on all the rows)."""
    from common.errors import ProtocolError
    tester, client = make_inputs(150, 150, 120, seed=6)
    policy = dataclasses.replace(ReleasePolicy.off(), min_intersection=100)
    for row in (0, 140):  # a joined member, then one the Tester does not hold
        doubled = client.iloc[list(range(150)) + [row]].reset_index(drop=True)
        with pytest.raises(ProtocolError, match="more than one row"):
            local_audit(tester, doubled, release=policy)


def test_a_bad_max_refusals_flag_is_named_as_the_user_typed_it(tmp_path):
    """`ppre tester serve --max-refusals -1`: refused, naming the flag (not the policy's field)."""
    from ppre.cli import _parser_for
    from ppre.commands.tester import release_settings
    argv = ["tester", "serve", "--client", "127.0.0.1:1", "--probabilities", str(tmp_path / "p.csv"),
            "--privacy-ledger", str(tmp_path / "ledger.json"), "--max-refusals", "-1"]
    args = _parser_for(argv).parse_args(argv)
    with pytest.raises(InputError, match=r"parameter '--max-refusals': must be a whole number >= 0"):
        release_settings(args)


def test_the_test_clients_spread_facts_are_checked():
    """MQOS-NDCG's facts for its interval under noise (`spread_facts`): a negative or
    impossible spread, or a negative Σ d², is a bad HelloAck (common.protocol.validation)."""
    from common.metrics.mqos_ndcg import METRIC as NDCG
    NDCG.check_info({"spread_per_query": 0.01, "queries_squared": 12}, [])
    for bad in ({"spread_per_query": -0.1}, {"spread_per_query": float("nan")}, {"spread_per_query": 1e9},
                {"queries_squared": -4}):
        with pytest.raises(ValueError, match="spread per query"):
            NDCG.check_info(bad, [])
