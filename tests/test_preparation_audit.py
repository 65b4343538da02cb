"""Design §2 wired into the audit: the Tester prepares BISG probabilities inside each audit."""
from __future__ import annotations

import json

import pytest

from ppre.cli import main as ppre_main
from ppre.synth import SynthConfig, synthesize


@pytest.fixture()
def files(tmp_path):
    data = synthesize(SynthConfig(members=300, seed=3))
    paths = {name: tmp_path / f"{name}.csv" for name in ("members", "self_id", "ero")}
    data.members.to_csv(paths["members"], index=False)
    data.self_id.to_csv(paths["self_id"], index=False)
    data.ero.to_csv(paths["ero"], index=False)
    return paths


def _audit(files, *extra):
    return ["audit", "--local", "--no-release-controls", "--metric", "ero", "--tester-members", str(files["members"]),
            "--tester-self-id", str(files["self_id"]), "--client-data", str(files["ero"]),
            "--bootstrap", "20", "--seed", "2", "--json", *extra]


def test_local_audit_prepares_bisg_probabilities(files, capsys):
    assert ppre_main(_audit(files, "--threshold", "0.825")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_matched"] == 300
    assert [g["group"] for g in report["groups"]] == ["white", "black", "api", "aian", "multiple", "hispanic", "overall"]


def test_preparation_counts_reach_the_result(files, capsys):
    """The Tester's preparation counts (never member data) travel with the result: members
    read and dropped, Self-ID rows used, the clipping threshold; they add up."""
    import pandas as pd

    members = pd.read_csv(files["members"], dtype=str)
    members.loc[:9, "opt_out"] = "1"  # ten members opt out
    members.to_csv(files["members"], index=False)
    assert ppre_main(_audit(files, "--threshold", "0.825")) == 0
    report = json.loads(capsys.readouterr().out)
    prep = report["preparation"]
    assert prep["members_read"] == 300 and prep["dropped_opt_out"] == 10
    kept = prep["members_read"] - prep["dropped_opt_out"] - prep["dropped_non_us"] - prep["dropped_excluded_state"]
    assert report["n_matched"] == kept
    survey = pd.read_csv(files["self_id"], dtype=str)
    assert prep["self_id_used"] + prep["self_id_not_among_kept"] == len(survey)
    assert prep["threshold"] == 0.825
    assert sum(v for k, v in prep.items() if k.startswith("bisg_")) == kept
    assert ppre_main([a for a in _audit(files, "--threshold", "0.825") if a != "--json"]) == 0  # the table too
    assert "preparation: members read 300, dropped opt out 10" in capsys.readouterr().out


def test_group_mapping_coarsens_the_audit(files, capsys):
    assert ppre_main(_audit(files, "--group-mapping", "hsm=black+hispanic+aian,non_hsm=white+api+multiple")) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["group"] for g in report["groups"]] == ["hsm", "non_hsm", "overall"]
    for g in report["groups"]:
        assert g["ci_low"] <= g["estimate"] <= g["ci_high"]


@pytest.mark.parametrize("extra, match", [(("--epsilon", "0"), "epsilon"), (("--threshold", "0.1"), "T"),
                                          (("--group-mapping", "hsm=black+nobody"), "group mapping")])
def test_bad_preparation_parameters_are_named(files, capsys, extra, match):
    assert ppre_main(_audit(files, *extra)) == 2
    assert match in json.loads(capsys.readouterr().out)["error"]["message"]  # --json: the one JSON object


def test_tester_serve_needs_exactly_one_input(capsys):
    assert ppre_main(["tester", "serve", "--port", "0"]) == 2
    assert "exactly one of --probabilities" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_runs_end_to_end(capsys):
    assert ppre_main(["demo", "--members", "400", "--bootstrap", "30"]) == 0
    out = capsys.readouterr().out
    assert "true race" in out and "verdict" in out and "hispanic" in out and "corrected" in out
    # the verdict is set beside the truth: detected, or why not (400 members: not at this size)
    assert "the audit does not detect a disparity at this size" in out or "verdict: " in out.split("true race")[-1]


def test_demo_writes_compose_data(tmp_path, capsys):
    assert ppre_main(["demo", "--members", "50", "--write-data", str(tmp_path)]) == 0
    for rel in ("tester/members.csv", "tester/self_id.csv", "client/ero.csv"):
        assert (tmp_path / rel).is_file()
