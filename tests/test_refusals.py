"""Refused audits: one answer for every too-small intersection, counted per Test-Client
identity and limited (tester_service/release.py, docs/privacy-ledger.md "Refused audits")."""
from __future__ import annotations

import dataclasses
import json

import pytest

from common.errors import InputError
from tester_service.release import (DEFAULT_MAX_REFUSALS, INTERSECTION_REFUSAL, IntersectionRefused,
                                    PrivacyAccountant, RefusalLimitReached, ReleasePolicy, local_accountant)
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


def test_a_local_audit_counts_no_refusals(tmp_path):
    """Its user holds both datasets: a limit would only lock them out of fixing an id column."""
    acc = local_accountant(0.4, (None, None), None, tmp_path / "ledger.json")
    for _ in range(5):
        assert acc.refuse("anyone") == 0
    acc.check_refusals("anyone", 1)


def test_the_policy_limit_is_checked():
    assert ReleasePolicy().max_refusals == DEFAULT_MAX_REFUSALS and ReleasePolicy.off().max_refusals is None
    with pytest.raises(InputError, match="max refusals"):
        ReleasePolicy(max_refusals=-1)


@pytest.mark.parametrize("overlap", [0, 1, 20, 99])
def test_an_empty_and_a_small_intersection_get_the_same_words(overlap):
    """Design §8.2: the refusal states no count, and an empty join is no different."""
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
