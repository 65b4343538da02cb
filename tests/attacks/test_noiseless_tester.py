"""(B2) A Tester with its controls off (`noiseless_tester`) against the Test-Client's refusal."""
from __future__ import annotations

import pytest

from client_service.protocol import NOISELESS_REFUSED
from ppre.cli import build_parser
from tester_service.release import ReleasePolicy
from tests.attacks import noiseless_tester


def test_without_the_defences_the_tester_reads_every_targets_false_positive_bit(monkeypatch, tmp_path):
    """Both defences removed (the Test-Client accepts noiseless aggregates and sends its
    result back): the Tester reads the result off the wire with result recipient
    `client` (its own check refuses the message, too late), and its bits are the
    targets' false-positive bits."""
    noiseless_tester.send_result_back(monkeypatch)
    outcome = noiseless_tester.run(monkeypatch, tmp_path, accept_noiseless=True)
    print(outcome)
    assert outcome.tester_got_result and outcome.error == "protocol_error"
    assert outcome.recovered == outcome.targets > outcome.blind, outcome


def test_the_test_client_keeps_the_result_even_when_it_accepts_noiseless_aggregates(monkeypatch, tmp_path):
    """Only the first defence removed (`--accept-noiseless`): the audit finishes, the
    Test-Client keeps the result and sends its timings only; the Tester ends with a
    receipt and reads nothing."""
    outcome = noiseless_tester.run(monkeypatch, tmp_path, accept_noiseless=True)
    print(outcome)
    assert outcome.error == "" and "client_result" in outcome.kinds_at_tester
    assert not outcome.tester_got_result and outcome.report.is_receipt
    assert outcome.recovered <= outcome.blind, outcome


def test_the_test_client_refuses_noiseless_aggregates_and_the_tester_gets_nothing(monkeypatch, tmp_path):
    """The default: a clean protocol error that names the flag, reaching the Tester's
    operator; the Test-Client sent no result, so the Tester reads nothing."""
    outcome = noiseless_tester.run(monkeypatch, tmp_path, accept_noiseless=False)
    print(outcome)
    assert outcome.error == "protocol_error" and NOISELESS_REFUSED in outcome.message
    assert "--accept-noiseless" in outcome.message
    assert not outcome.tester_got_result and "client_result" not in outcome.kinds_at_tester
    assert outcome.recovered <= outcome.blind, outcome


@pytest.mark.slow
def test_with_the_testers_default_controls_the_audit_goes_on(monkeypatch, tmp_path):
    """Noise on (the Tester's defaults, minimum sizes lowered to this small table): the
    Test-Client finishes without opting in."""
    policy = ReleasePolicy(min_intersection=1, min_effective_size=0.0)
    outcome = noiseless_tester.run(monkeypatch, tmp_path, accept_noiseless=False, release=policy)
    print(outcome)
    assert outcome.error == "" and "abort" not in outcome.kinds_at_tester
    # noise on, result recipient client: no estimate reaches the Tester's side (design §3.7)
    assert "client_result" in outcome.kinds_at_tester and not outcome.results_at_tester
    assert outcome.report.is_receipt and outcome.report.groups == [] and outcome.report.release
    assert outcome.session_result.is_receipt and outcome.session_result.groups == []
    assert not outcome.tester_got_result and outcome.recovered <= outcome.blind, outcome


def test_client_serve_refuses_noiseless_aggregates_unless_its_operator_opts_in(monkeypatch):
    monkeypatch.delenv("PPRE_ACCEPT_NOISELESS", raising=False)
    base = ["client", "serve", "--insecure"]
    assert build_parser().parse_args(base).accept_noiseless is False
    assert build_parser().parse_args(base + ["--accept-noiseless"]).accept_noiseless is True
