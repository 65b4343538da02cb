"""The joined count the Test-Client keeps (design §8.2, §9.2; `client_service.results`).

The Tester checks the minimum intersection on the count of distinct joined members plus
one Gaussian draw of σ_i (5 members at the defaults). It sends that same noised count,
rounded and floored at 0, in the AggregatesHeader to a Test-Client that keeps the result
(`joined_members`, with `joined_members_sd` = σ_i), and the exact count where the release
controls are off (sd 0). Here: the results file of a real audit holds it; it is the
decision's own draw, never a second one; one member more moves it by exactly that member
under the same draw; a malformed count is refused naming the field; the reports say it is
noised, and a local run's merged result still shows the Tester's exact count.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from client_service.datasets import DatasetRegistry
from client_service.results import JOINED_MEMBERS_SD, ResultStore, kept_json, read_kept
from common.errors import ProtocolError
from common.protocol import validation
from common.stats.results import AuditReport
from ppre.local import local_services
from ppre.report.model import JOINED_MEMBERS_SD as REPORT_KEY
from ppre.report.model import joined_rows_text
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service import release as release_controls
from tester_service.audit_spec import AuditSpec
from tester_service.inputs import read_probability_table
from tester_service.protocol import decided_intersection
from tester_service.release import NOISE_TAIL_SD, IntersectionRefused, ReleasePolicy
from tester_service.server import forget_local_results, run_audit
from tests.helpers import TEST_BITS, local_audit, make_inputs, wait_until

#: the default controls, every audit asked (budgets and refusal counts lifted)
DEFAULTS = dataclasses.replace(ReleasePolicy(), budget=math.inf, max_refusals=None)
SIGMA = DEFAULTS.intersection_sigma()
SPEC = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
#: 250 of the Test-Client's 300 members are in the Tester's table of 400
JOINED = 250


def _inputs(overlap: int = JOINED):
    return make_inputs(400, 300, overlap, seed=45)


def _fixed_intersection_draw(monkeypatch, value: float) -> list[float]:
    """The intersection's draw fixed at `value` (every other draw as it was); returns the
    σ of each intersection draw made."""
    real = release_controls.gaussian
    made: list[float] = []

    def gaussian(sigma: float) -> float:
        if sigma == SIGMA:
            made.append(sigma)
            return value
        return real(sigma)

    monkeypatch.setattr(release_controls, "gaussian", gaussian)
    return made


def _header_tap(headers: list, change=None):
    def tap(direction, message):
        if direction == "to_client" and message.WhichOneof("body") == "aggregates_header":
            if change:
                change(message.aggregates_header)
            headers.append(message.aggregates_header)
    return tap


def test_the_results_file_of_a_real_audit_holds_the_decisions_own_draw(tmp_path, monkeypatch):
    """Through both services under the default controls: the file's `n_matched` is the
    true count plus the one intersection draw the decision made (3.4, rounded), with its
    sd; the receipt keeps the exact count."""
    made = _fixed_intersection_draw(monkeypatch, 3.4)
    tester, client = _inputs()
    table, data = tmp_path / "probabilities.csv", tmp_path / "ero.csv"
    tester.to_csv(table, index=False)
    client.to_csv(data, index=False)
    results = tmp_path / "results"
    results.mkdir()
    with local_services(lambda: read_probability_table(table), DatasetRegistry(named={"ero": data}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=DEFAULTS, n_buckets=16,
                        results=ResultStore(results), tls=False) as svc:
        forget_local_results(svc.tester_address)  # as a Tester service's operator: the receipt
        event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10))
        assert event.WhichOneof("event") == "result", event
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    receipt = AuditReport.from_json(event.result.report_json)
    assert receipt.is_receipt and receipt.n_matched == JOINED
    kept = json.loads((results / f"{receipt.audit_id}.json").read_text())
    assert made == [SIGMA] and SIGMA == pytest.approx(5.0)
    assert kept["n_matched"] == JOINED + 3 and kept["info"][JOINED_MEMBERS_SD] == pytest.approx(SIGMA)
    copy = read_kept(json.dumps(kept))
    assert joined_rows_text(copy) == f"about {JOINED + 3} members (noised count, sd 5)"
    assert f"joined rows: about {JOINED + 3} members (noised count, sd 5)" in render_text(copy)


def test_under_the_defaults_the_count_is_noised_near_the_true_count():
    """Five audits of the same data, the operating system's draws: every count within
    5 sd of the true one, and not all of them equal to it (each is with probability
    P(|Z| < 0.1) = 0.08)."""
    tester, client = _inputs()
    counts = []
    for _ in range(5):
        _, _, session = local_audit(tester, client, spec=SPEC, release=DEFAULTS, n_buckets=16)
        copy = read_kept(kept_json(session.result))
        assert copy.info[JOINED_MEMBERS_SD] == pytest.approx(SIGMA)
        counts.append(copy.n_matched)
    print(f"true {JOINED}, released {counts}")
    assert all(abs(c - JOINED) <= 5 * SIGMA for c in counts)
    assert any(c != JOINED for c in counts)


@pytest.mark.parametrize("draw", [-2.7, 0.49, 6.2])
def test_one_member_more_moves_the_count_by_that_member_under_the_same_draw(monkeypatch, draw):
    """Neighbouring Tester tables (the Test-Client's 251st member held or not) under one
    fixed draw: the counts differ by exactly 1, and each is its true count plus the draw,
    rounded; what tells them apart is the noise alone."""
    _fixed_intersection_draw(monkeypatch, draw)
    tester, client = _inputs(overlap=JOINED + 1)
    without = tester[tester.member_id != client.member_id.iloc[JOINED]].reset_index(drop=True)
    counts = []
    for table, true in ((tester, JOINED + 1), (without, JOINED)):
        _, sessions, session = local_audit(table, client, spec=SPEC, release=DEFAULTS, n_buckets=16)
        assert sessions.n_matched == true
        assert session.result.n_matched == round(true + draw)
        counts.append(session.result.n_matched)
    assert counts[0] - counts[1] == 1


def test_the_decision_and_the_count_rest_on_one_draw():
    """`decided_intersection` draws once, and answers exactly when the count it returns
    before rounding reaches the minimum: a count is released only with an answer that
    read it."""
    calls = []
    real = release_controls.gaussian

    def counting(sigma):
        calls.append(sigma)
        return real(sigma)

    policy = ReleasePolicy()
    try:
        release_controls.gaussian = counting
        for distinct in (60, 95, 99, 100, 105, 140):
            answered, count = decided_intersection(policy, distinct)
            assert len(calls) == 1 and calls.pop() == SIGMA
            assert abs(count - distinct) <= NOISE_TAIL_SD * SIGMA + 0.5
            assert not answered or count >= policy.min_intersection
        assert decided_intersection(policy, 0) == (False, 0) and calls == []  # nothing drawn, nothing sent
    finally:
        release_controls.gaussian = real
    assert decided_intersection(ReleasePolicy.off(), 140) == (True, 140)


def test_a_refused_audit_sends_no_count(monkeypatch):
    """Below the minimum after the draw: the fixed refusal, and no AggregatesHeader."""
    _fixed_intersection_draw(monkeypatch, -200.0)
    headers: list = []
    tester, client = _inputs()
    with pytest.raises(IntersectionRefused):
        local_audit(tester, client, spec=SPEC, release=DEFAULTS, n_buckets=16, tap=_header_tap(headers))
    assert headers == []


def test_without_the_release_controls_the_count_is_exact():
    """--no-release-controls: no noise, so the exact count (sd 0) reaches a Test-Client
    that accepted a noiseless release; its reports say so."""
    tester, client = _inputs()
    headers: list = []
    _, _, session = local_audit(tester, client, spec=SPEC, n_buckets=16, tap=_header_tap(headers))
    assert headers[0].joined_members == JOINED and headers[0].joined_members_sd == 0
    copy = read_kept(kept_json(session.result))
    assert copy.n_matched == JOINED and copy.info[JOINED_MEMBERS_SD] == 0
    assert joined_rows_text(copy) == f"exactly {JOINED} members (the Tester's release controls were off)"


def test_a_test_client_that_keeps_no_result_gets_no_count():
    """Result recipient `tester`: the Test-Client keeps nothing, so it is sent nothing."""
    tester, client = _inputs()
    headers: list = []
    spec = dataclasses.replace(SPEC, result_recipient="tester")
    report, _, _ = local_audit(tester, client, spec=spec, release=DEFAULTS, n_buckets=16, tap=_header_tap(headers))
    assert report.n_matched == JOINED
    assert headers and not headers[0].HasField("joined_members") and headers[0].joined_members_sd == 0


@pytest.mark.parametrize("change, field", [
    (lambda h: setattr(h, "joined_members", 10 ** 12), "joined_members"),  # above the members sent
    (lambda h: setattr(h, "joined_members", 300 + 41 + 1), "joined_members"),  # just above, with the cut
    (lambda h: setattr(h, "joined_members_sd", math.nan), "joined_members_sd"),
    (lambda h: setattr(h, "joined_members_sd", -1.0), "joined_members_sd"),
    (lambda h: setattr(h, "joined_members_sd", math.inf), "joined_members_sd"),
    (lambda h: (h.ClearField("joined_members"), setattr(h, "joined_members_sd", 5.0)), "joined_members_sd"),
])
def test_a_malformed_count_from_the_tester_is_refused_naming_the_field(change, field):
    tester, client = _inputs()
    with pytest.raises(ProtocolError, match=rf"aggregates header: {field}\b"):
        local_audit(tester, client, spec=SPEC, release=DEFAULTS, n_buckets=16, tap=_header_tap([], change))


def test_the_count_bound_and_the_mask():
    """`check_joined_members` alone: the largest count 300 sent members allow at sd 5 is
    300 + 8·5 + 1; a count for a Test-Client that keeps no result is refused; no count
    at all is a Tester that sent none (accepted: the result says null)."""
    header = pb.AggregatesHeader(mask="ratio", joined_members=341, joined_members_sd=5.0)
    validation.check_joined_members(header, 300)
    header.joined_members = 342
    with pytest.raises(ProtocolError, match="joined_members 342 is above the 341"):
        validation.check_joined_members(header, 300)
    exact = pb.AggregatesHeader(mask="ratio", joined_members=301)
    with pytest.raises(ProtocolError, match="joined_members"):
        validation.check_joined_members(exact, 300)
    with pytest.raises(ProtocolError, match="joined_members sent to a Test-Client that keeps no result"):
        validation.check_joined_members(pb.AggregatesHeader(mask="additive", joined_members=3), 300)
    validation.check_joined_members(pb.AggregatesHeader(mask="ratio"), 300)
    assert validation.JOINED_NOISE_TAIL_SD == NOISE_TAIL_SD  # the Tester's cut


def test_reports_say_whose_count_and_how_noised():
    """The report's key is the results file's; a copy without a count still says the
    count is the Tester's; a local run's result (the receipt's facts merged in) shows the
    Tester's exact count, not the noised one."""
    assert REPORT_KEY == JOINED_MEMBERS_SD
    tester, client = _inputs()
    merged, _, session = local_audit(tester, client, spec=SPEC, release=DEFAULTS, n_buckets=16)
    assert not merged.audit_id and merged.n_matched == JOINED
    assert joined_rows_text(merged) == f"{JOINED}"
    copy = session.result
    assert joined_rows_text(copy).startswith("about ") and "(noised count, sd 5)" in joined_rows_text(copy)
    legacy = read_kept(kept_json(dataclasses.replace(copy, n_matched=0, info={})))
    assert joined_rows_text(legacy) == f"known to the Tester only (its receipt of audit {copy.audit_id})"
    assert json.loads(kept_json(legacy))["n_matched"] is None
