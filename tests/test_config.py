"""Configuration files, check-config, column mapping and ERO from scores (`ppre/config/`).

* Precedence for every setting of both services: flag > environment > TOML file > default.
* A file's unknown key and wrong type are errors naming the key and the file.
* `ppre tester|client check-config` lists every problem (exit 2) or none (exit 0).
* `--id-column` / `--column OURS=THEIRS` read users' files as they are, end to end.
* ERO with `decision_threshold` X equals ERO on the labels 1(score >= X).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from client_service.datasets import DatasetRegistry
from common.errors import InputError
from common.metrics.ero import METRIC as ERO
from common.races import RACES
from common.tables import parse_column_mapping, read_table
from ppre import cli
from ppre import config as cfg
from tests.helpers import TEST_BITS, make_inputs, plain_ratio

ROOT = Path(__file__).resolve().parent.parent


def parse(argv: list[str], service: str):
    """argv through the real parser, then the configuration layer (as `ppre` runs it)."""
    args = cli.build_parser().parse_args(argv)
    return cfg.apply(args, service)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PPRE_"):
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------------------
# Precedence and the file
# --------------------------------------------------------------------------------------
def test_tester_precedence_flag_env_file_default(tmp_path, monkeypatch):
    conf = write(tmp_path / "tester.toml", """
port = 1111
epsilon = 2.0
peer_timeout = 30
max_sessions = 8
excluded_states = ["TX", "CA"]
first_names = true
members = "data/members.csv"
allow_operator = ["ops.example", "audit.example"]
privacy_budget = inf
""")
    monkeypatch.setenv("PPRE_EPSILON", "3.0")        # env beats the file
    monkeypatch.setenv("PPRE_PEER_TIMEOUT", "40")    # ... but the flag beats env
    monkeypatch.setenv("PPRE_EXCLUDED_STATES", "")   # empty: as if unset
    args = parse(["tester", "serve", "--config", str(conf), "--peer-timeout", "50", "--max-sessions", "4"],
                 "tester")
    assert args.port == 1111 and args.epsilon == 3.0 and args.peer_timeout == 50.0
    assert args.max_sessions == 4  # a flag given at its default value still wins over the file
    assert args.excluded_states == "TX,CA" and args.first_names is True
    assert args.members == str(tmp_path / "data" / "members.csv")  # relative to the file's directory
    assert args.allow_operator == ["ops.example", "audit.example"] and args.privacy_budget == float("inf")
    assert args.buckets == 128 and args.threshold is None and args.host == "127.0.0.1"  # defaults: this machine only
    src = args.config_sources
    assert (src["port"], src["epsilon"], src["peer_timeout"], src["max_sessions"], src["buckets"]) == \
        ("file", "env", "flag", "flag", "default")
    # without the file: env and defaults as before
    args = parse(["tester", "serve"], "tester")
    assert (args.port, args.epsilon, args.peer_timeout, args.excluded_states) == (50051, 3.0, 40.0, "")
    assert args.config_sources["excluded_states"] == "default"


def test_client_precedence_and_config_env(tmp_path, monkeypatch):
    conf = write(tmp_path / "client.toml", """
port = 6000
data_dir = "datasets"
allow_tester = "tester.example"
log_format = "json"
id_column = "Member ID"
[columns]
y_pred = "prediction"
[datasets]
special = "/abs/special.csv"
""")
    monkeypatch.setenv("PPRE_CONFIG", str(conf))  # the file named by the environment
    monkeypatch.setenv("PPRE_ALLOW_TESTERS", "t1.example,t2.example")
    args = parse(["client", "serve", "--port", "7000"], "client")
    assert args.port == 7000 and args.data_dir == str(tmp_path / "datasets") and args.log_format == "json"
    assert args.allow_tester == "t1.example,t2.example" and args.config_sources["allow_tester"] == "env"
    assert args.dataset == ["special=/abs/special.csv"]
    assert cfg.client_columns(args) == {"member_id": "Member ID", "y_pred": "prediction"}
    # a flag list replaces the file's table
    args = parse(["client", "serve", "--column", "y_true=label"], "client")
    assert cfg.client_columns(args) == {"member_id": "Member ID", "y_true": "label"}


@pytest.mark.parametrize("text, key, expected", [
    ("colour = 'blue'\n", "colour", "unknown setting"),
    ("prot = 5\n", "prot", "did you mean 'port'"),
    ("[tls]\nca = 'x'\n", "tls", "settings are top-level keys"),
    ("port = '50051'\n", "port", "expected an integer, got a string"),
    ("epsilon = 'high'\n", "epsilon", "expected a number, got a string"),
    ("insecure = 1\n", "insecure", "expected true or false, got an integer"),
    ("members = ['a.csv']\n", "members", "expected a string, got an array"),
    ("geo = 'county'\n", "geo", "must be one of zcta, tract, none"),
    ("columns = ['member_id=Member ID']\n", "columns", "expected a table of OURS"),
])
def test_bad_file_names_key_file_and_type(tmp_path, capsys, text, key, expected):
    conf = write(tmp_path / "bad.toml", text)
    code = cli.main(["tester", "serve", "--config", str(conf)])
    err = capsys.readouterr().err
    assert code == 2 and f"file {conf}" in err and f"parameter '{key}'" in err and expected in err, err


def test_every_problem_of_a_file_at_once_and_bad_toml(tmp_path, capsys):
    conf = write(tmp_path / "bad.toml", "colour = 1\nport = 'x'\nmax_sessions = true\n")
    assert cli.main(["client", "serve", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and all(f"'{k}'" in err for k in ("colour", "port", "max_sessions")), err
    conf = write(tmp_path / "broken.toml", "port = \n")
    assert cli.main(["client", "serve", "--config", str(conf)]) == 2
    assert "is not valid TOML" in capsys.readouterr().err
    assert cli.main(["client", "serve", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "configuration file not found" in capsys.readouterr().err


def test_settings_read_off_the_parsers():
    """Every serve option is a setting with an environment variable (a few flags excepted),
    and the one table lists them all."""
    no_env = {"insecure", "datasets"}
    for service in cfg.SERVICES:
        settings = cfg.settings(service)
        keys = [s.key for s in settings]
        assert len(keys) == len(set(keys))
        for s in settings:
            assert s.env or s.key in no_env, f"{service}: {s.flag} has no environment variable"
        # each variable really is the flag's default: set it, rebuild the parser
        for s in settings:
            if s.env and s.kind in ("int", "float", "str") and not s.choices:
                value = {"int": "7", "float": "0.75", "str": "x.example"}[s.kind]
                os.environ[s.env] = value
                try:
                    args = cli.build_parser().parse_args([service, "serve"])
                finally:
                    del os.environ[s.env]
                assert str(getattr(args, s.dest)) in (value, str(float(value)) if s.kind == "float" else value), s
    table = cfg.settings_table()
    for service in cfg.SERVICES:
        for s in cfg.settings(service):
            assert f"| `{s.key}` | `{s.flag}` |" in table
    assert "| `port` | `--port` | `PPRE_TESTER_PORT` | `50051` | tester |" in table
    assert "| `peer_timeout` | `--peer-timeout` | `PPRE_PEER_TIMEOUT` | `600` | both |" in table


def test_configuration_page_settings_table_matches_the_parsers():
    """docs/configuration.md's settings table is `ppre tester config-table`'s output."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    start, end = "<!-- settings-table -->", "<!-- /settings-table -->"
    assert start in page and end in page, "docs/configuration.md lost its settings table markers"
    shown = page.split(start, 1)[1].split(end, 1)[0].strip()
    assert shown == cfg.settings_table(), "regenerate it: ppre tester config-table > the block in docs/configuration.md"


def test_config_table_command(capsys):
    assert cli.main(["client", "config-table"]) == 0
    assert capsys.readouterr().out.strip() == cfg.settings_table()


# --------------------------------------------------------------------------------------
# check-config
# --------------------------------------------------------------------------------------
MEMBERS = pd.DataFrame({"Member ID": ["a1", "a2", "a3", "a4", "a5", "a6"],
                        "surname": ["Smith", "Garcia", "Nguyen", "Washington", "Zqxvbn", "Lopez"],
                        "zip": ["60614", "00601", "02134", "20001", "90012", "99999"],
                        "state": ["IL", "PR", "MA", "DC", "CA", "TX"]})
SELF_ID = pd.DataFrame({"Member ID": ["a1", "a3"], "race": ["white", "api"]})


def _certs(directory: Path) -> Path:
    from common.net.tls import DevCA
    DevCA.generate("test CA").write(directory)
    return directory


def test_tester_check_config_good(tmp_path, capsys):
    MEMBERS.to_csv(tmp_path / "members.csv", index=False)
    SELF_ID.to_csv(tmp_path / "self_id.csv", index=False)
    _certs(tmp_path / "certs")
    conf = write(tmp_path / "tester.toml", """
members = "members.csv"
self_id = "self_id.csv"
tls_dir = "certs"
excluded_states = ["TX"]
privacy_ledger = "ledger.json"
[columns]
member_id = "Member ID"
""")
    code = cli.main(["tester", "check-config", "--config", str(conf), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["problems"] == [], report["problems"]
    checks = {c["check"]: c for c in report["checks"]}
    assert "tester.ppre.local" in checks["TLS"]["message"]
    prep = next(c for name, c in checks.items() if name.startswith("preparation ("))
    sources = prep["details"]["bisg_sources"]
    assert set(sources) == {"surname+geography", "surname", "geography", "prior"}
    assert sum(sources.values()) == 5  # six members, one in an excluded state
    assert "5 of 6 members kept" in prep["message"] and "Self-ID answers used 2" in prep["message"]
    assert report["settings"]["members"] == {"value": str(tmp_path / "members.csv"), "source": "file"}
    # the text report says the same
    assert cli.main(["tester", "check-config", "--config", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "all is well" in out and "BISG sources: surname+geography" in out


def test_tester_check_config_lists_every_problem(tmp_path, capsys):
    MEMBERS.drop(columns=["surname"]).to_csv(tmp_path / "members.csv", index=False)
    certs = _certs(tmp_path / "certs")
    conf = write(tmp_path / "tester.toml", f"""
members = "members.csv"
self_id = "missing.csv"
epsilon = -1.0
colour = "blue"
max_sessions = "four"
ca = "{certs / 'ca.pem'}"
cert = "{certs / 'tester.pem'}"
key = "{certs / 'client.key'}"
[columns]
member_id = "Member ID"
""")
    code = cli.main(["tester", "check-config", "--config", str(conf), "--json"])
    report = json.loads(capsys.readouterr().out)
    problems = "\n".join(report["problems"])
    assert code == 2 and not report["ok"]
    assert "parameter 'colour'" in problems and "parameter 'max_sessions'" in problems  # the file: both
    assert "preparation settings" in problems and "epsilon" in problems
    assert "the private key does not belong to the certificate" in problems  # TLS pair
    assert "members file" in problems and "column 'surname': required column is missing" in problems
    assert "'Member ID', 'zip', 'state'" in problems  # the columns that are there
    assert "Self-ID file" in problems and "file not found" in problems
    assert len(report["problems"]) >= 6, problems
    assert cli.main(["tester", "check-config", "--config", str(conf)]) == 2
    out = capsys.readouterr().out
    assert f"{len(report['problems'])} problems:" in out and "FAIL  TLS" in out


def test_client_check_config_checks_the_results_directory(tmp_path, capsys):
    """`--results-dir`: an existing, writable directory (as `ppre client serve` checks it)."""
    data = tmp_path / "data"
    data.mkdir()
    _, client = make_inputs(20, 20, 20, seed=3)
    client.to_csv(data / "ero.csv", index=False)
    base = ["client", "check-config", "--data-dir", str(data), "--insecure", "--json"]
    assert cli.main(base + ["--results-dir", str(tmp_path)]) == 0
    good = json.loads(capsys.readouterr().out)
    assert any(c["check"] == "results directory" for c in good["checks"])
    assert cli.main(base + ["--results-dir", str(tmp_path / "missing")]) == 2
    bad = json.loads(capsys.readouterr().out)
    assert any("results directory" in p and "--results-dir" in p for p in bad["problems"]), bad["problems"]


def test_client_check_config_good_and_bad(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    _, client = make_inputs(20, 20, 20, seed=3)
    client.assign(prob=np.linspace(0, 1, 20)).rename(columns={"member_id": "Member ID", "y_pred": "prediction"}) \
        .to_csv(data / "ero.csv", index=False)
    conf = write(tmp_path / "client.toml", """
data_dir = "data"
insecure = true
id_column = "Member ID"
[columns]
y_pred = "prediction"
score = "prob"
""")
    code = cli.main(["client", "check-config", "--config", str(conf), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["problems"]
    [ero] = [c for c in report["checks"] if c["check"] == "dataset ero"]
    assert ero["details"]["rows"] == 20 and "ero" in ero["details"]["metrics"]
    assert "ero with --decision-threshold" in ero["details"]["metrics"]
    assert "pot" in ero["details"]["missing"]
    # bad: a file serving nothing, an ERO file with a non-number, a mapping to a column PPRE does not read
    pd.DataFrame({"key": ["a", "b"], "colour": ["x", "y"]}).to_csv(data / "junk.csv", index=False)
    bad = client.rename(columns={"member_id": "Member ID", "y_pred": "prediction"}).astype(object)
    bad.loc[4, "y_true"] = "maybe"
    bad.to_csv(data / "ero2.csv", index=False)
    code = cli.main(["client", "check-config", "--config", str(conf), "--json"])
    report = json.loads(capsys.readouterr().out)
    problems = report["problems"]
    assert code == 2 and len(problems) >= 2, problems
    assert any(p.startswith("dataset junk:") and "serves no metric" in p and "'key', 'colour'" in p
               and "member_id (read from 'Member ID' by the column mapping)" in p for p in problems), problems
    assert any(p.startswith("dataset ero2 for ero:") and "row 5" in p and "not a number" in p for p in problems)
    assert "maybe" not in json.dumps(report)  # never a value
    code = cli.main(["client", "check-config", "--config", str(conf), "--column", "y_prd=prediction"])
    out = capsys.readouterr().out
    assert code == 2 and "'y_prd' is not a column a Test-Client dataset reads (did you mean 'y_pred'?)" in out


# --------------------------------------------------------------------------------------
# Column mapping
# --------------------------------------------------------------------------------------
def test_missing_column_lists_the_columns_and_the_mapping(tmp_path):
    path = tmp_path / "d.csv"
    pd.DataFrame({"Member ID": ["a", "b"], "y_true": [0, 1], "prediction": [1, 0]}).to_csv(path, index=False)
    with pytest.raises(InputError) as info:
        read_table(path, ("y_true", "y_pred"))
    msg = str(info.value)
    assert "column 'member_id': required column is missing" in msg
    assert "the file has 'Member ID', 'y_true', 'prediction'" in msg and "--id-column NAME" in msg
    frame = read_table(path, ("y_true", "y_pred"), columns={"member_id": "member id", "y_pred": "PREDICTION"})
    assert list(frame.columns) == ["member_id", "y_true", "y_pred"] and frame["y_pred"].tolist() == [1.0, 0.0]
    # a mapping naming a column the file does not have
    with pytest.raises(InputError) as info:
        read_table(path, ("y_true", "y_pred"), columns={"member_id": "Member ID", "y_pred": "pred"})
    assert info.value.column == "pred" and "names a column the file does not have" in str(info.value)
    # ERO's y_pred (read leniently) is named too
    with pytest.raises(InputError) as info:
        frame = DatasetRegistry(named={"d": path}, columns={"member_id": "Member ID"}).load("d", ERO)
        ERO.client_rows(frame, str(path), "fpr", ERO.parse_params({}), np.random.default_rng(0))
    assert info.value.column == "y_pred" and "'prediction'" in str(info.value) and "--column y_pred=NAME" in \
        str(info.value)
    # a file without its header row: what may be values is withheld, never printed
    headless = tmp_path / "headless.csv"
    headless.write_text("m000123,1,0\nm000124,0,0\n")
    with pytest.raises(InputError) as info:
        read_table(headless, ("y_true", "y_pred"))
    assert "m000123" not in str(info.value) and "withheld" in str(info.value)


def test_parse_column_mapping():
    assert parse_column_mapping("Member ID", ["y_pred=prediction", " Y_TRUE = label "]) == \
        {"member_id": "Member ID", "y_pred": "prediction", "y_true": "label"}
    for id_column, items, text in [(None, ["y_pred"], "expected OURS=THEIRS"),
                                   ("A", ["member_id=B"], "mapped twice"),
                                   (None, ["y_pred=x", "y_true=X"], "both mapped to the column"),
                                   (None, ["=x"], "needs both names")]:
        with pytest.raises(InputError, match=text):
            parse_column_mapping(id_column, items)


def _audit(services, dataset: str, params: dict[str, str] | None = None, seed: int = 5):
    from proto import ppre_pb2 as pb
    from tester_service.server import run_audit
    request = pb.AuditRequest(metric="ero", client_dataset=dataset, bootstrap=20, confidence=0.95, has_seed=True,
                              seed=seed, metric_params=params or {})
    event = run_audit(services.tester_address, request, timeout=120, tls=services.operator_tls)
    assert event.WhichOneof("event") == "result", event.error.message
    from common.stats.results import AuditReport
    return {g["group"]: g["estimate"] for g in json.loads(AuditReport.from_proto(event.result).to_json())["groups"]}


@pytest.mark.timeout(300)
def test_column_mapping_and_decision_threshold_end_to_end(tmp_path):
    """Both services read renamed columns through real gRPC; ERO from scores with a
    decision threshold equals ERO on the thresholded labels, and both equal the
    plaintext weighted formula."""
    from ppre.local import local_services
    from tester_service.inputs import read_probability_table
    from tester_service.release import ReleasePolicy

    tester, client = make_inputs(120, 150, 100, seed=11)
    rng = np.random.default_rng(2)
    score = np.round(rng.uniform(0, 1, len(client)), 3)
    threshold = 0.4
    score[7] = threshold  # exactly at the threshold: predicted positive
    client["y_pred"] = (score >= threshold).astype(int)
    tester_file = tmp_path / "probs.csv"
    tester.rename(columns={"member_id": "Member ID", "black": "Black Prob"}).to_csv(tester_file, index=False)
    renamed = client.rename(columns={"member_id": "Member ID", "y_pred": "prediction", "y_true": "Truth"})
    renamed.to_csv(tmp_path / "labels.csv", index=False)
    scores = client.drop(columns=["y_pred"]).assign(prob=score)
    scores.rename(columns={"member_id": "Member ID", "y_true": "Truth"}).to_csv(tmp_path / "scores.csv", index=False)
    t_cols = parse_column_mapping("Member ID", ["black=Black Prob"])
    c_cols = parse_column_mapping("Member ID", ["y_pred=prediction", "y_true=Truth", "score=prob"])
    registry = DatasetRegistry(named={"labels": tmp_path / "labels.csv", "scores": tmp_path / "scores.csv"},
                               columns=c_cols)
    with local_services(lambda: read_probability_table(tester_file, None, t_cols), registry, modulus_bits=TEST_BITS,
                        allow_insecure=True, release=ReleasePolicy.off(), tls=False) as services:
        labels = _audit(services, "labels")
        from_scores = _audit(services, "scores", {"decision_threshold": str(threshold)})
    joined = tester.merge(client, on="member_id")
    y, yhat = joined["y_true"].to_numpy(), joined["y_pred"].to_numpy()
    expected = plain_ratio(joined[list(RACES)].to_numpy(), (yhat == 1) & (y == 0), y == 0)
    for j, race in enumerate(RACES):
        assert labels[race] == pytest.approx(expected[j], abs=1e-6)
        assert from_scores[race] == pytest.approx(labels[race], abs=1e-9)
    assert from_scores["overall"] == pytest.approx(labels["overall"], abs=1e-9)


def test_decision_threshold_rows_and_errors(tmp_path):
    params = ERO.parse_params({"decision_threshold": "0.5"})
    frame = pd.DataFrame({"member_id": ["a", "b", "c", "d"], "y_true": [0, 0, 1, 0],
                          "score": [0.2, 0.5, 0.9, 0.7], "y_pred": [1, 1, 1, 1]})
    path = tmp_path / "s.csv"
    frame.to_csv(path, index=False)
    rows = ERO.client_rows(ERO.read(str(path)), str(path), "fpr", params, np.random.default_rng(0))
    assert rows.values[:, 0].tolist() == [0, 1, 0, 1]  # f = 1(score >= 0.5, y = 0): scores, not y_pred
    for value, text in [("", "not a number"), ("inf", "must be a finite number"), ("high", "not a number")]:
        bad = frame.astype(object)
        bad.loc[2, "score"] = value
        bad.to_csv(path, index=False)
        with pytest.raises(InputError) as info:
            ERO.client_rows(ERO.read(str(path)), str(path), "fpr", params, np.random.default_rng(0))
        e = info.value
        assert (e.column, e.row) == ("score", 3) and text in str(e), str(e)
        # without a threshold the score column is not used, whatever it holds
        ERO.client_rows(ERO.read(str(path)), str(path), "fpr", ERO.parse_params({}), np.random.default_rng(0))
    frame.drop(columns=["score"]).to_csv(path, index=False)
    with pytest.raises(InputError, match="column 'score': required column is missing"):
        ERO.client_rows(ERO.read(str(path)), str(path), "fpr", params, np.random.default_rng(0))
    frame.drop(columns=["y_pred"]).to_csv(path, index=False)
    with pytest.raises(InputError, match="with a decision threshold"):
        ERO.client_rows(ERO.read(str(path)), str(path), "fpr", ERO.parse_params({}), np.random.default_rng(0))
    for text in ("nan", "inf", "x"):
        with pytest.raises(InputError, match="decision_threshold"):
            ERO.parse_params({"decision_threshold": text})


def test_audit_flags_reach_both_sides(tmp_path):
    """`ppre audit --local` forwards --tester-id-column / --client-column and
    --decision-threshold (a real subprocess, both services over mutual TLS)."""
    tester, client = make_inputs(150, 150, 150, seed=4)
    tester.rename(columns={"member_id": "ID"}).to_csv(tmp_path / "p.csv", index=False)
    client.assign(p=np.linspace(0, 1, 150)).drop(columns=["y_pred"]).to_csv(tmp_path / "c.csv", index=False)
    cmd = [sys.executable, "-m", "ppre.cli", "audit", "--local", "--metric", "ero", "--tester-probabilities",
           str(tmp_path / "p.csv"), "--tester-id-column", "ID", "--client-data", str(tmp_path / "c.csv"),
           "--client-column", "score=p", "--decision-threshold", "0.5", "--bootstrap", "10", "--json",
           "--history", "none", "--no-release-controls", "--executor", "inline"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPRE_")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    result = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert result["n_matched"] == 150 and result["params"] == {"decision_threshold": 0.5}


@pytest.mark.timeout(120)
def test_client_serve_reads_its_config_file(tmp_path):
    """`ppre client serve --config FILE` serves with the file's settings."""
    data = tmp_path / "data"
    data.mkdir()
    make_inputs(5, 5, 5)[1].to_csv(data / "ero.csv", index=False)
    conf = write(tmp_path / "client.toml", 'host = "127.0.0.1"\nport = 0\ndata_dir = "data"\ninsecure = true\n'
                                            'executor = "inline"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPRE_")}
    proc = subprocess.Popen([sys.executable, "-m", "ppre.cli", "client", "serve", "--config", str(conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = proc.stdout.readline()
        assert re.match(r"client serving on 127\.0\.0\.1:\d+ \(this machine only; [^)]*\); datasets: ero; INSECURE", line), \
            line + proc.stderr.read() if proc.poll() is not None else line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
