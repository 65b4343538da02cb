"""Result recipient `client`: the Test-Client keeps the result, the Tester ends with a
receipt (design §3.7, §9.3); local mode, where one user holds both sides, shows the
whole result as before."""
from __future__ import annotations

import json
import math
import os
import stat

import pytest

from client_service.datasets import DatasetRegistry
from client_service.results import ResultNotKept, ResultStore, read_kept
from common.errors import InputError
from common.stats.results import AuditReport, receipt
from ppre.cli import main as ppre_main
from ppre.local import local_services
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service.inputs import read_probability_table
from tester_service.release import ReleasePolicy
from tester_service.server import forget_local_results, run_audit
from tests.helpers import TEST_BITS, wait_until, write_inputs

#: noise on, minimum sizes lowered to these small tables; rho raised from the default so that
#: 90 members keep some estimate in every draw (at the default a draw can swamp every cell)
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0, rho=100.0, budget=math.inf)


def _request(**kw) -> pb.AuditRequest:
    return pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10, **kw)


@pytest.fixture
def services(tmp_path):
    _, _, tp, cp = write_inputs(tmp_path, 120, 90, seed=71)
    results = tmp_path / "results"
    results.mkdir()
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NOISY,
                        results=ResultStore(results), tls=False) as svc:
        yield svc, results


def test_with_noise_on_the_tester_gets_a_receipt_and_the_results_dir_the_result(services):
    svc, results = services
    forget_local_results(svc.tester_address)  # what a Tester's operator gets, not local mode's merge
    event = run_audit(svc.tester_address, _request())
    assert event.WhichOneof("event") == "result", event
    got = AuditReport.from_json(event.result.report_json)
    assert got.is_receipt and got.delivered_to == "client" and got.audit_id
    assert got.groups == [] and got.differences == [] and got.verdict.compared is None
    assert got.n_matched == 90 and got.release["controls"] and got.release["rho"] > 0
    assert '"estimate"' not in event.result.report_json
    assert "result delivered to the Test-Client" in render_text(got) and got.audit_id in render_text(got)
    assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    path = results / f"{got.audit_id}.json"
    assert [p.name for p in results.iterdir()] == [path.name]  # no temporary file left
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    kept = read_kept(path.read_text())  # its joined rows: the Tester's noised count, sd σ_i
    sigma = NOISY.intersection_sigma()
    assert abs(json.loads(path.read_text())["n_matched"] - 90) <= 8 * sigma + 1 and kept.n_matched > 0
    assert kept.info["joined_members_sd"] == pytest.approx(sigma)
    assert not kept.is_receipt and kept.audit_id == got.audit_id and kept.result_recipient == "client"
    # under noise a cell whose noised denominator is swamped has no estimate: some have one
    assert any(g.estimate is not None for g in kept.groups)
    assert len(kept.groups) == len(json.loads(path.read_text())["groups"]) > 1
    assert svc.client_config.results.get(got.audit_id) == kept


def test_local_mode_shows_the_whole_result(services):
    svc, results = services
    event = run_audit(svc.tester_address, _request())
    got = AuditReport.from_json(event.result.report_json)
    assert not got.is_receipt and got.audit_id == "" and got.n_matched == 90
    assert any(g.estimate is not None for g in got.groups) and got.release["controls"]
    assert "total" in got.phase_seconds and "client_decrypt" in got.phase_seconds
    (path,) = results.iterdir()  # the Test-Client's copy is kept all the same
    assert read_kept(path.read_text()).groups == got.groups


def test_result_recipient_tester_is_unchanged(services):
    svc, results = services
    forget_local_results(svc.tester_address)
    got = AuditReport.from_json(run_audit(svc.tester_address, _request(result_recipient="tester")).result.report_json)
    assert not got.is_receipt and got.overall.estimate is not None and got.result_recipient == "tester"
    assert list(results.iterdir()) == []


def test_the_store_never_overwrites_and_checks_its_directory(tmp_path):
    report = receipt(metric="ero", option="", bootstrap=1, confidence=0.95, interval="percentile", tau=0.05,
                     params={}, audit_id="a1")
    store = ResultStore(tmp_path)
    store.keep("a1", report)
    with pytest.raises(ResultNotKept, match="kept already"):
        store.keep("a1", report)  # a Tester that repeats an audit id
    with pytest.raises(ResultNotKept, match="audit id"):
        store.keep("../escape", report)
    assert store.pop("a1") == report and store.pop("a1") is None
    with pytest.raises(InputError, match="--results-dir.*not an existing directory"):
        ResultStore(tmp_path / "missing")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root writes anywhere
        with pytest.raises(InputError, match="--results-dir.*not writable"):
            ResultStore(locked)


def test_client_serve_refuses_a_missing_results_dir_at_start_up(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PPRE_CLIENT_RESULTS_DIR", raising=False)
    missing = tmp_path / "nowhere"
    assert ppre_main(["client", "serve", "--insecure", "--port", "0", "--results-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "--results-dir" in err and str(missing) in err and "not an existing directory" in err


def test_ppre_audit_local_still_prints_the_estimates(tmp_path, capsys, monkeypatch):
    """The default recipient in local mode: the table of estimates, not the receipt."""
    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    _, _, tp, cp = write_inputs(tmp_path, 120, 90, seed=72)
    assert ppre_main(["audit", "--local", "--metric", "ero", "--tester-probabilities", str(tp), "--client-data",
                      str(cp), "--bootstrap", "10", "--no-release-controls", "--executor", "inline",
                      "--history", "none"]) == 0
    out = capsys.readouterr().out
    assert "estimate" in out and "overall" in out and "joined rows: 90" in out
    assert "delivered to the Test-Client" not in out


def test_a_receipt_renders_as_one_line_and_round_trips():
    from dataclasses import replace

    from ppre.report import render_html
    kept = replace(receipt(metric="ero", option="fpr", bootstrap=10, confidence=0.95, interval="percentile",
                           tau=0.05, params={}, audit_id="q3V8m1Xc0aZkR2tE"), n_matched=90)
    assert AuditReport.from_json(kept.to_json()) == kept
    (line,) = render_text(kept).splitlines()
    assert "result delivered to the Test-Client" in line and "q3V8m1Xc0aZkR2tE" in line and "--results-dir" in line
    page = render_html(kept)
    assert "Result delivered to the Test-Client" in page and "q3V8m1Xc0aZkR2tE" in page
    assert 'id="groups"' not in page and 'id="verdict"' not in page
