"""The README's examples run as documented: the metric examples (README.md, section
"Metrics") and the first audit on one's own files (section "A first audit on your own
files").

Every ``ppre`` command in the ```sh blocks of the Metrics section is collected: one
``ppre synth`` and one or more ``ppre audit`` per metric. The fast test checks that they
cover every metric of the catalog and parse; the slow ones run the synth command in a
fresh folder, then each audit command there (as a new user would, a process each), and
check that it prints exactly one JSON object with the keys docs/metrics/README.md
documents for that metric (section "JSON fields (all metrics)"; a fast test checks that
the page names them all).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common.metrics import METRICS
from common.stats import verdict
from ppre.synth import METRIC_DATASETS

README = Path(__file__).resolve().parent.parent / "README.md"

#: keys of every result, and the parts only some metrics add
BASE_KEYS = {"metric", "metric_option", "n_matched", "bootstrap", "confidence", "interval", "groups",
             "differences", "verdict", "params", "info", "result_recipient", "tau", "phase_seconds",
             "preparation", "release"}
EXTRA_KEYS = {"lot": {"cells"}, "pot": {"cells", "curves"}, "prob-count": {"pools"}}
WITH_OVERALL = {"ero", "mqos-ndcg", "mqos-auc", "output"}
GROUP_KEYS = {"group", "estimate", "ci_low", "ci_high", "informative"}
CELL_KEYS = {"higher", "lower", "rank_pair", "estimate", "ci_low", "ci_high", "informative"}
CURVE_KEYS = {"group", "score", "estimate", "ci_low", "ci_high", "informative"}
POOL_KEYS = {"pool", "group", "members", "expected_count", "prob_at_least", "included"}
DIFF_KEYS = {"kind", "a", "b", "estimate", "ci_low", "ci_high", "informative"}
VERDICT_KEYS = {"rule", "tau", "severity", "significant", "flagged", "compared", "significant_comparisons",
                "non_overlapping", "message", "excluded_groups", "mdd", "uninformative", "members_factor",
                "attenuation", "equivalent", "may_reach_tau"}
COMPARED_KEYS = {"label", "estimate", "ci_low", "ci_high", "band_low", "band_high", "informative", "mdd"}
RULES = {"ero": "range", "output": "range", "lot": "negative_cells", "mqos-ndcg": "below_overall",
         "mqos-auc": "below_overall", "pot": "nonzero_pairs", "prob-count": "inclusion"}
SEVERITIES = set(verdict.SEVERITIES)


def readme_commands() -> list[list[str]]:
    """The ``ppre`` commands of the ```sh blocks in README's "## Metrics" section
    (a line ending in a backslash continues on the next)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Metrics\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("ppre "):
                commands.append(shlex.split(line))
    return commands


def test_the_json_keys_are_documented():
    """Every key these tests expect of a result is named on the page that documents them."""
    page = (README.parent / "docs" / "metrics" / "README.md").read_text(encoding="utf-8")
    start = page.index("### JSON fields (all metrics)")
    section = page[start:page.index("\n### ", start + 1)]
    keys = (BASE_KEYS | set().union(*EXTRA_KEYS.values()) | GROUP_KEYS | CELL_KEYS | CURVE_KEYS | POOL_KEYS
            | DIFF_KEYS | VERDICT_KEYS | COMPARED_KEYS | {"group_mapping"})
    missing = sorted(k for k in keys if not re.search(rf"\b{k}\b", section))
    assert not missing, f"docs/metrics/README.md does not document: {missing}"


def _option(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


AUDITS = [c for c in readme_commands() if c[1] == "audit"]


def _id(argv: list[str]) -> str:
    return "-".join(x for x in (_option(argv, "--metric"), _option(argv, "--metric-option")) if x)


def test_readme_examples_cover_every_metric():
    commands = readme_commands()
    synth = [c for c in commands if c[1] == "synth"]
    assert len(synth) == 1 and all(c[1] in ("synth", "audit") for c in commands)
    assert {_option(c, "--metric") for c in AUDITS} == set(METRICS)
    for option in METRICS["mqos-auc"].options:  # both algorithms are shown
        assert any(_option(c, "--metric-option") == option for c in AUDITS if _option(c, "--metric") == "mqos-auc")
    from ppre.cli import build_parser
    parser = build_parser()
    out = _option(synth[0], "--out")
    datasets = {"ero", *METRIC_DATASETS}
    for argv in AUDITS:
        args = parser.parse_args(argv[1:])
        assert args.local and args.json, argv
        data = Path(args.client_data)
        assert data.parent == Path(out) / "client" and data.suffix == ".csv" and data.stem in datasets, argv
        assert Path(args.tester_members).parent == Path(out) and Path(args.self_id).parent == Path(out), argv


def _ppre(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert argv[0] == "ppre"
    return subprocess.run([sys.executable, "-m", "ppre.cli", *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    (synth,) = [c for c in readme_commands() if c[1] == "synth"]
    cwd = tmp_path_factory.mktemp("readme")
    done = _ppre(synth, cwd)
    assert done.returncode == 0, done.stderr
    return cwd


def _check_keys(items: list[dict], keys: set[str], what: str) -> None:
    assert items, f"no {what}"
    for item in items:
        assert set(item) == keys, (what, item)


@pytest.mark.slow
@pytest.mark.parametrize("argv", AUDITS, ids=[_id(a) for a in AUDITS])
def test_readme_example_runs(argv, synth_dir):
    done = _ppre(argv, synth_dir)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout[-2000:]
    result = json.loads(lines[0])
    assert isinstance(result, dict) and "error" not in result, result

    metric = _option(argv, "--metric")
    option = _option(argv, "--metric-option") or METRICS[metric].options[0]
    # an audit over coarsened groups says how they were made (`--group-mapping`)
    mapped = {"group_mapping"} if _option(argv, "--group-mapping") else set()
    assert set(result) == BASE_KEYS | EXTRA_KEYS.get(metric, set()) | mapped, sorted(result)
    if mapped:
        assert result["group_mapping"].replace(" ", "") == _option(argv, "--group-mapping").replace(" ", "")
    assert result["metric"] == metric and result["metric_option"] == option
    members = sum(1 for _ in open(synth_dir / _option(argv, "--tester-members"))) - 1
    assert result["preparation"]["members_read"] == members

    # the interval and what "bootstrap" counts
    interval = result["interval"]
    if metric == "prob-count":
        assert interval == "exact" and result["bootstrap"] == 0
    elif metric == "mqos-auc" and option == "exact":
        assert interval == "random_groups" and result["bootstrap"] >= 2
    else:
        assert interval in ("percentile", "random_groups")
        if interval == "percentile":
            assert result["bootstrap"] == int(_option(argv, "--bootstrap", "1000"))

    # n_matched: members, or pairs (LOT), or rows (sampled AUC); every synthetic member is in the dataset
    if metric == "lot":
        assert result["n_matched"] == result["info"]["pairs"] > 0
    elif metric == "mqos-auc" and option == "sampled":
        # the pairs kept: as many as asked, or as the cap on rows per member allows (the rest
        # counted), among as many dummy rows again or more (docs/metrics/mqos-auc.md)
        kept = result["info"]["pairs_kept"]
        assert kept == int(_option(argv, "--pairs", "100000")) - result["info"]["pairs_dropped"]
        assert result["n_matched"] >= 2 * kept > 0
    else:
        assert result["n_matched"] == members

    groups = result["groups"]
    if metric in ("lot", "pot"):
        assert groups == [] and result["differences"] == []
    else:
        _check_keys(groups, GROUP_KEYS, "groups")
        assert ("overall" in {g["group"] for g in groups}) == (metric in WITH_OVERALL)
    if metric in WITH_OVERALL:
        _check_keys(result["differences"], DIFF_KEYS, "differences")
        kinds = {d["kind"] for d in result["differences"]}
        assert kinds == {"between", "to_overall"}
    if metric == "lot":
        _check_keys(result["cells"], CELL_KEYS, "cells")
        pairs = {c["rank_pair"] for c in result["cells"]}
        assert None in pairs and "1-2" in pairs
        assert {c["higher"] for c in result["cells"]} == {"hsm", "non_hsm"}  # the README's --group-mapping
    if metric == "pot":
        _check_keys(result["cells"], CELL_KEYS, "cells")
        assert all(c["rank_pair"] is None for c in result["cells"])
        _check_keys(result["curves"], CURVE_KEYS, "curves")
        assert "overall" in {c["group"] for c in result["curves"]}
        assert len(result["info"]["reference_scores"]) == len({c["score"] for c in result["curves"]})
    if metric == "prob-count":
        _check_keys(result["pools"], POOL_KEYS, "pools")
        assert all(g["ci_low"] is None for g in groups)

    verdict = result["verdict"]
    assert set(verdict) == VERDICT_KEYS
    assert verdict["rule"] == RULES[metric] and verdict["severity"] in SEVERITIES and verdict["message"]
    if metric == "prob-count":
        assert verdict["compared"] is None
        # the synthetic pools of 5 and 30 members leave small groups short
        assert verdict["flagged"] and any(not p["included"] for p in result["pools"])
    elif verdict["compared"] is None:  # fewer than two groups to compare: inconclusive, saying why
        assert verdict["severity"] == "inconclusive" and verdict["excluded_groups"], verdict["message"]
        assert "left out of the verdict" in verdict["message"] and "conclusive with" in verdict["message"]
    else:
        assert set(verdict["compared"]) == COMPARED_KEYS


# --------------------------------------------------------------------------- the first audit on one's own files

def readme_first_audit() -> list[list[str]]:
    """The ``ppre`` commands of the README's first-audit block (section "A first audit
    on your own files": the ```bash block that runs ``ppre audit --local``)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## A first audit on your own files\n")
    section = text[start:text.index("\n## ", start + 1)]
    (block,) = [b for b in re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M) if "ppre audit --local" in b]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip().startswith("ppre ")]


def _exports(synth: Path, out: Path) -> None:
    """`ppre synth`'s files as a user's exports: the README's column names, a "First
    Name" column the audit does not read, and a survey answer of someone the members
    export dropped."""
    import pandas as pd

    members = pd.read_csv(synth / "members.csv", dtype=str)
    members.rename(columns={"member_id": "Customer Key", "surname": "Last Name", "first_name": "First Name"}) \
        .to_csv(out / "crm.csv", index=False)
    survey = pd.read_csv(synth / "self_id.csv", dtype=str)
    survey = pd.concat([survey, pd.DataFrame({"member_id": ["not-a-member"], "race": ["white"]})])
    survey.rename(columns={"member_id": "Customer Key"}).to_csv(out / "survey.csv", index=False)
    outputs = pd.read_csv(synth / "client" / "ero.csv", dtype=str)
    outputs.rename(columns={"member_id": "Member ID", "y_pred": "prediction"}).to_csv(out / "model_outputs.csv",
                                                                                     index=False)


def test_readme_first_audit_parses():
    from ppre.cli import build_parser
    commands = readme_first_audit()
    assert [c[1] for c in commands] == ["tester", "client", "audit", "runs"]
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv[1:])


@pytest.mark.slow
def test_readme_first_audit_runs_on_renamed_exports(tmp_path):
    """The README's first audit, command by command, on exports whose columns have the
    README's names: the checks say all is well, the audit writes its report (under the
    default release controls), and the run is listed."""
    done = _ppre(["ppre", "synth", "--members", "2000", "--seed", "3", "--out", "synth"], tmp_path)
    assert done.returncode == 0, done.stderr
    _exports(tmp_path / "synth", tmp_path)
    env_home = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    outputs = []
    for argv in readme_first_audit():
        done = subprocess.run([sys.executable, "-m", "ppre.cli", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, env={**os.environ, **env_home})
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        outputs.append(done.stdout)
    assert "all is well" in outputs[0] and "all is well" in outputs[1]
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "report.json").exists()
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    assert report["release"]["controls"] is True and report["n_matched"] == 2000
    assert report["preparation"]["self_id_not_among_members"] == 1
    assert len(outputs[3].strip().splitlines()) == 2  # the header and the one run
