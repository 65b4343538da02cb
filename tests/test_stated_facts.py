"""The facts a Test-Client states about its whole table for the interval under release
noise (`Metric.stated_facts`: MQOS-NDCG's spread per query, LOT's gap spreads, POT's
residual cross-moments, MQOS-AUC exact's placement variances; design §8.4, §9.1) reach the
Tester only when the Hello says the interval comes from second moments; the Tester requires
them then and refuses them otherwise (`common.protocol.validation`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common.errors import ProtocolError
from common.metrics import get_metric
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import local_audit, make_inputs
from tests.metric_data import lot_validation_data, random_ranked_lists

NOISY = ReleasePolicy(rho=1.0, budget=1.0)


class SeenAck(Exception):
    """Raised by the tap once the HelloAck has gone by: the rest of the audit is not needed."""


def _scores(client, rng):
    return client.assign(score=rng.random(len(client)))


def metric_case(name: str):
    """(tester table, Test-Client frame, spec) of a small audit of metric `name`."""
    rng = np.random.default_rng(7)
    if name == "mqos-ndcg":
        tester, _ = make_inputs(400, 10, 0, seed=41)
        return tester, random_ranked_lists(600, rng, min_len=2, max_len=4, viewers=400), \
            AuditSpec(metric=name, client_dataset="d", bootstrap=10, seed=1)
    if name == "lot":
        lists = lot_validation_data(200, [0.1, 0.2], rng)
        tester, _ = make_inputs(len(lists), 10, 0, seed=42)
        tester = tester.assign(member_id=lists["member_id"].to_numpy())
        return tester, lists, AuditSpec(metric=name, metric_option="raw", client_dataset="d", bootstrap=10, seed=1,
                                        params={"relevance_range": "-1:4"})
    tester, client = make_inputs(600, 600, 600, seed=43)
    client = _scores(client, rng)
    if name == "pot":
        client = client.assign(outcome=(rng.random(len(client)) < client["score"]).astype(float))
        return tester, client[["member_id", "score", "outcome"]], \
            AuditSpec(metric=name, client_dataset="d", bootstrap=10, seed=1)
    return tester, client[["member_id", "y_true", "score"]], \
        AuditSpec(metric="mqos-auc", metric_option="exact", client_dataset="d", bootstrap=10, seed=1)


STATING = ("mqos-ndcg", "lot", "pot", "mqos-auc")


def _facts_sent(name: str, release: ReleasePolicy | None) -> tuple[bool, dict]:
    """(the Hello's second-moments flag, the HelloAck's dataset facts) of an audit of `name`."""
    tester, client, spec = metric_case(name)
    seen: dict = {}

    def tap(direction, msg):
        kind = msg.WhichOneof("body")
        if kind == "hello":
            seen["second_moments"] = msg.hello.second_moments
        if kind == "hello_ack":
            seen["info"] = json.loads(msg.hello_ack.info_json or "{}")
            raise SeenAck

    with pytest.raises(SeenAck):
        local_audit(tester, client, spec=spec, tap=tap, release=release)
    return seen["second_moments"], seen["info"]


@pytest.mark.parametrize("name", STATING)
def test_stated_facts_travel_only_for_an_interval_from_second_moments(name):
    metric = get_metric(name).for_option("exact" if name == "mqos-auc" else "")
    assert metric.stated_facts
    flag, info = _facts_sent(name, None)  # no release controls: a bootstrap interval
    assert flag is False and not set(metric.stated_facts) & set(info), info
    flag, info = _facts_sent(name, NOISY)
    assert flag is True and set(metric.stated_facts) <= set(info), info


def _ack_tap(edit):
    def tap(direction, msg):
        if msg.WhichOneof("body") == "hello_ack":
            info = json.loads(msg.hello_ack.info_json or "{}")
            edit(info)
            msg.hello_ack.info_json = json.dumps(info)
    return tap


def test_a_fact_stated_for_an_audit_without_second_moments_is_refused():
    tester, client, spec = metric_case("mqos-auc")
    with pytest.raises(ProtocolError, match="stated placement_variances, which an audit whose interval"):
        local_audit(tester, client, spec=spec,
                    tap=_ack_tap(lambda info: info.update(placement_variances=[0.02, 0.03])))


@pytest.mark.parametrize("name", ["pot", "mqos-ndcg"])
def test_a_fact_missing_under_second_moments_is_refused(name):
    tester, client, spec = metric_case(name)
    metric = get_metric(name)
    missing = metric.stated_facts[-1]
    with pytest.raises(ProtocolError, match=f"lack {missing}, which the interval under release noise reads"):
        local_audit(tester, client, spec=spec, release=NOISY, tap=_ack_tap(lambda info: info.pop(missing)))


def test_a_hello_asking_second_moments_of_a_metric_without_them_is_refused():
    tester, client, _ = metric_case("mqos-auc")
    spec = AuditSpec(metric="mqos-auc", metric_option="sampled", client_dataset="d", bootstrap=10, seed=1)

    def tap(direction, msg):
        if msg.WhichOneof("body") == "hello":
            msg.hello.second_moments = True

    with pytest.raises(ProtocolError, match="asked for second moments, which mqos-auc lacks"):
        local_audit(tester, client, spec=spec, tap=tap)
