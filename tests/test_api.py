"""The Python API (`ppre.api`): a local audit on DataFrames or files, through the real
services, giving the same result object the CLI serialises."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ppre import AuditFailed, AuditReport, audit_local
from ppre.report.text import render_text
from ppre.synth import SynthConfig, synthesize


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    data = synthesize(SynthConfig(members=1500, seed=3))
    root = tmp_path_factory.mktemp("api")
    paths = {"members": root / "members.csv", "self_id": root / "self_id.csv", "ero": root / "ero.csv"}
    data.members.to_csv(paths["members"], index=False)
    data.self_id.to_csv(paths["self_id"], index=False)
    data.ero.to_csv(paths["ero"], index=False)
    return data, paths


def probability_table(data) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    probs = pd.DataFrame(rng.dirichlet(np.full(6, 0.5), len(data.members)),
                         columns=["white", "black", "api", "aian", "multiple", "hispanic"])
    probs.insert(0, "member_id", data.members.member_id)
    return probs


def test_dataframes_give_the_result_the_cli_gives_for_the_same_files(population, tmp_path, monkeypatch):
    data, paths = population
    probs = probability_table(data)
    table = tmp_path / "inputs" / "probabilities.csv"
    table.parent.mkdir()
    probs.to_csv(table, index=False)
    # nothing of the DataFrames is written anywhere: the temporary directory stays empty
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    report = audit_local(data.ero, probabilities=probs, metric="ero", release_controls=False, bootstrap=40,
                         seed=5, correction="calibration")
    assert list(scratch.iterdir()) == []
    assert isinstance(report, AuditReport)
    cli = subprocess.run([sys.executable, "-m", "ppre.cli", "audit", "--local", "--metric", "ero",
                          "--tester-probabilities", str(table), "--client-data", str(paths["ero"]),
                          "--no-release-controls", "--bootstrap", "40", "--seed", "5", "--correction", "calibration",
                          "--insecure", "--json", "--history", "none"],
                         capture_output=True, text=True, timeout=300, check=True)
    expected = AuditReport.from_json(cli.stdout)
    # the same audit: only the masks' noise differs (below 1e-9)
    assert [g.group for g in report.groups] == [g.group for g in expected.groups]
    for ours, theirs in zip(report.groups, expected.groups):
        for field in ("estimate", "ci_low", "ci_high", "corrected_estimate", "corrected_ci_high"):
            a, b = getattr(ours, field), getattr(theirs, field)
            assert (a is None and b is None) or a == pytest.approx(b, abs=1e-9), (ours.group, field)


def test_members_and_self_id_as_dataframes(population):
    data, _ = population
    report = audit_local(data.ero, members=data.members, self_id=data.self_id, metric="ero",
                         release_controls=False, bootstrap=20, seed=1)
    assert report.n_matched == len(data.ero) and report.preparation["self_id_used"] == len(data.self_id)


def test_the_result_object_reads_like_a_metric_frame(population):
    data, paths = population
    report = audit_local(paths["ero"], members=paths["members"], self_id=paths["self_id"], metric="ero",
                         release_controls=False, bootstrap=30, seed=2)
    frame = report.to_frame()
    assert list(frame.columns) == ["estimate", "ci_low", "ci_high"] and "overall" in frame.index
    assert frame.loc["black", "estimate"] == report.group("black").estimate
    largest = report.difference()
    gaps = {(d.a, d.b): d.estimate for d in report.differences if d.kind == "between"}
    assert largest.estimate == pytest.approx(max(abs(v) for v in gaps.values())) and largest.estimate >= 0
    d = report.difference("white", "black")
    assert d.estimate == pytest.approx(report.group("white").estimate - report.group("black").estimate)
    assert d.ci_low <= d.estimate <= d.ci_high
    assert report.difference("black", "overall").b == "overall"
    with pytest.raises(KeyError, match="no difference"):
        report.difference("white", "martian")
    assert json.loads(report.to_json())["groups"][0]["group"] == report.groups[0].group


def test_a_refused_audit_raises_with_the_cli_error_code(population):
    data, _ = population
    with pytest.raises(AuditFailed) as failed:
        audit_local(data.ero.drop(columns=["y_true"]), members=data.members, metric="ero",
                    release_controls=False, bootstrap=10)
    assert failed.value.code == "bad_input"
    assert "<DataFrame>" in failed.value.message and "y_true" in failed.value.message
    # the error names the table, never its content
    assert "m00000" not in failed.value.message
    with pytest.raises(Exception, match="not both"):
        audit_local(data.ero, members=data.members, probabilities=data.members)


def test_the_result_carries_the_group_mapping_and_the_self_id_epsilon(population, tmp_path):
    """What the report's parameters show: the coarsened groups' definition and the
    randomized response's ε, as the Tester applied them."""
    from common.races import GroupMapping
    from ppre.report import write_report
    from tester_service.demographics.preparation import PreparationConfig

    data, _ = population
    mapping = "hsm=black+hispanic+aian,non_hsm=white+api+multiple"
    report = audit_local(data.ero, members=data.members, self_id=data.self_id, metric="ero",
                         release_controls=False, bootstrap=10, seed=1,
                         preparation=PreparationConfig(group_mapping=GroupMapping.parse(mapping), epsilon=3.0))
    assert report.group_mapping == mapping and [g.group for g in report.by_group] == ["hsm", "non_hsm"]
    d = report.to_dict()
    assert d["group_mapping"] == mapping and d["preparation"]["epsilon"] == 3.0
    assert AuditReport.from_json(report.to_json()).group_mapping == mapping
    assert "groups: hsm=black+hispanic+aian, non_hsm=white+api+multiple" in render_text(report)
    html, _ = write_report(report, tmp_path / "rep")
    page = html.read_text()
    assert "group mapping" in page and "hsm=black+hispanic+aian" in page and "randomized response" in page


def test_the_api_and_the_cli_wait_for_an_audit_as_long_as_the_tester_lets_it_run():
    """The default wait covers a 1,000,000-member POT or MQOS-AUC audit on two cores (1-2 h):
    the operator's deadline is the Tester's own session limit, in the API and the CLI alike."""
    import inspect

    from ppre import api
    from ppre.cli import build_parser
    from tester_service.server import AUDIT_DEADLINE_S, TesterConfig

    assert inspect.signature(api.audit_local).parameters["timeout"].default == AUDIT_DEADLINE_S
    assert TesterConfig.__dataclass_fields__["deadline_s"].default == AUDIT_DEADLINE_S >= 4 * 3600
    assert build_parser().parse_args(["audit", "--metric", "ero"]).timeout == AUDIT_DEADLINE_S
