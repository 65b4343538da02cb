"""Metric inputs end to end: bad input per metric, signed encoding and
overflow (point 11), verdicts that mean significance (point 7), metric names (point 8).

Bad input is an `InputError` naming the file, the column and the 1-based data row where
there is one (design §5; common/errors.py), and it reaches the operator as
``{"error": {"code": "bad_input", ...}}`` from ``ppre audit --local --json``. Signed values
use thirds of the plaintext space (design §4.3): the middle third is an overflow,
reported, never wrapped.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd
import pytest

from client_service.datasets import DatasetRegistry
from common.crypto import encoding, paillier
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.metrics import METRICS, get_metric
from common.metrics.base import Component
from common.stats.verdict import verdict_from
from ppre.cli import build_parser
from ppre.cli import main as ppre_main
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession
from tests.helpers import local_audit, make_inputs

FILE = "client.csv"
METRIC_NAMES = ("ero", "lot", "mqos-ndcg", "pot", "mqos-auc", "output", "prob-count")
RANKED = (("lot", "idcg"), ("lot", "raw"), ("mqos-ndcg", "default"))


# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------
def client_rows(name: str, frame: pd.DataFrame, option: str = "", params: dict[str, str] | None = None,
                file: str = FILE):
    """What the Test-Client computes from a dataset as read (no encryption)."""
    metric = get_metric(name)
    option = metric.check_option(option)
    metric = metric.for_option(option)
    return metric.client_rows(frame, file, option, metric.parse_params(params or {}), np.random.default_rng(0))


def refused(name: str, frame: pd.DataFrame, option: str = "", params: dict[str, str] | None = None,
            file: str = FILE) -> InputError:
    with pytest.raises(InputError) as info:
        client_rows(name, frame, option, params, file)
    return info.value


def ranked(rows, *, viewer: bool = False) -> pd.DataFrame:
    """(query, rank, relevance) rows -> a ranked-list frame as `read_table` returns it: a
    different member per row (LOT), or one viewer per query (MQOS-NDCG)."""
    frame = pd.DataFrame(rows, columns=["query_id", "rank", "relevance"]).astype(
        {"rank": np.float64, "relevance": np.float64})
    members = [f"v_{q}" for q in frame["query_id"]] if viewer else [f"m{i:04d}" for i in range(len(frame))]
    frame.insert(0, "member_id", np.array(members, dtype=object))
    frame["query_id"] = frame["query_id"].astype(object)
    return frame


def ranked_for(name: str, rows) -> pd.DataFrame:
    return ranked(rows, viewer=name == "mqos-ndcg")


def scores_frame(n: int = 40, seed: int = 0, **columns) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"member_id": np.array([f"m{i:04d}" for i in range(n)], dtype=object),
                          "y_true": (np.arange(n) % 2).astype(np.float64),
                          "score": rng.normal(size=n), "outcome": rng.normal(size=n)})
    for name, values in columns.items():
        frame[name] = values
    return frame


def two_groups(ids, p_a) -> pd.DataFrame:
    """A Tester probability table over two groups a and b."""
    p_a = np.asarray(p_a, dtype=np.float64)
    return pd.DataFrame({"member_id": list(ids), "a": p_a, "b": 1.0 - p_a})


def cli_json(capsys, *args: str) -> tuple[int, dict]:
    """`ppre audit --local --json ...`: exit code and the one JSON object printed."""
    code = ppre_main(["audit", "--local", "--json", "--no-release-controls", *args])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    return code, json.loads(lines[0])


def cli_error(capsys, *args: str) -> str:
    code, obj = cli_json(capsys, *args)
    assert code == 2 and set(obj) == {"error"}, obj
    assert obj["error"]["code"] == "bad_input", obj
    return obj["error"]["message"]


# ==================================================================================
# A. Bad input per metric (point 12)
# ==================================================================================
@pytest.mark.parametrize("name,option", RANKED)
def test_duplicate_rank_names_the_row(name, option):
    frame = ranked_for(name, [("q1", 1, 1), ("q1", 2, 0), ("q2", 1, 2), ("q2", 1, 1)])
    err = refused(name, frame, option)
    assert (err.file, err.column, err.row) == (FILE, "rank", 4)
    assert "rank 1 appears twice" in str(err) and "row 3" in str(err)


@pytest.mark.parametrize("name,option", RANKED)
def test_ranks_must_be_1_to_n_within_a_query(name, option):
    frame = ranked_for(name, [("q1", 1, 1), ("q1", 2, 0), ("q2", 1, 2), ("q2", 3, 1)])
    err = refused(name, frame, option)
    assert (err.file, err.column, err.row) == (FILE, "rank", 3)  # the query's first row
    assert "rank 2 is missing" in str(err) and "ranked 1 to 2" in str(err)


@pytest.mark.parametrize("name,option", RANKED)
@pytest.mark.parametrize("bad", [0.0, -1.0, 1.5, math.inf])
def test_rank_must_be_a_whole_number_from_one(name, option, bad):
    frame = ranked_for(name, [("q1", 1, 1), ("q1", 2, 0), ("q2", bad, 2)])
    err = refused(name, frame, option)
    assert (err.file, err.column, err.row) == (FILE, "rank", 3)


@pytest.mark.parametrize("name,option", RANKED)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_relevance_must_be_finite(name, option, bad):
    frame = ranked_for(name, [("q1", 1, 1), ("q1", 2, 0), ("q2", 1, 2), ("q2", 2, bad)])
    err = refused(name, frame, option)
    assert (err.file, err.column, err.row) == (FILE, "relevance", 4)


def test_lot_single_item_queries_are_skipped_and_counted():
    frame = ranked([("q1", 1, 2), ("q1", 2, 1), ("solo", 1, 3), ("q2", 1, 0), ("q2", 2, 1), ("solo2", 1, 1)])
    for option in ("idcg", "raw"):
        rows = client_rows("lot", frame, option)
        assert rows.info["skipped_single_item"] == 2 and rows.info["queries"] == 2 and rows.info["pairs"] == 2


def test_lot_with_only_single_item_queries_is_a_clear_error():
    frame = ranked([("q1", 1, 2), ("q2", 1, 1), ("q3", 1, 0)])
    for option in ("idcg", "raw"):
        err = refused("lot", frame, option)
        assert err.file == FILE and "no query has two ranked items" in str(err)


def test_lot_skipped_single_item_queries_reach_the_result():
    frame = ranked([(f"q{q}", r, float((q + r) % 3)) for q in range(12) for r in (1, 2, 3)]
                   + [("solo_a", 1, 2.0), ("solo_b", 1, 0.0), ("solo_c", 1, 1.0)])
    ids = frame["member_id"].tolist()
    tester = two_groups(ids, np.random.default_rng(1).uniform(0.05, 0.95, len(ids)))
    report, _, _ = local_audit(tester, frame, spec=AuditSpec(metric="lot", client_dataset="d", bootstrap=10,
                                                             seed=1, metric_option="idcg"))
    assert report.info["skipped_single_item"] == 3 and report.info["queries"] == 12
    assert report.info["pairs"] == 24


@pytest.mark.parametrize("option", ["exact", "sampled"])
@pytest.mark.parametrize("label", [0.0, 1.0])
def test_auc_needs_both_classes(option, label):
    frame = scores_frame(y_true=np.full(40, label))
    err = refused("mqos-auc", frame, option)
    assert (err.file, err.column, err.row) == (FILE, "y_true", None)
    assert "both classes" in str(err)
    assert ("positive" if label == 0.0 else "negative") in str(err)


@pytest.mark.parametrize("name,option", [("mqos-auc", "exact"), ("mqos-auc", "sampled"), ("pot", "")])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_scores_must_be_finite(name, option, bad):
    score = np.random.default_rng(3).normal(size=40)
    score[6] = bad
    err = refused(name, scores_frame(score=score), option)
    assert (err.file, err.column, err.row) == (FILE, "score", 7)


@pytest.mark.parametrize("name,column", [("ero", "y_true"), ("ero", "y_pred"), ("mqos-auc", "y_true")])
def test_labels_must_be_zero_or_one(name, column):
    frame = scores_frame(y_pred=np.zeros(40))
    frame.loc[9, column] = 2.0
    err = refused(name, frame)
    assert (err.file, err.column, err.row) == (FILE, column, 10)


def test_pot_scores_spread_beyond_float64_are_refused_not_crashed():
    score = np.zeros(40)
    score[-1] = 1e308  # sd and the bandwidth would overflow to inf
    err = refused("pot", scores_frame(score=score))
    assert (err.file, err.column) == (FILE, "score") and "bandwidth" in str(err)
    rows = client_rows("pot", scores_frame(score=score), params={"bandwidth": "0.5"})  # a given bandwidth works
    assert np.isfinite(rows.values).all()


def test_prob_count_pool_without_members_in_the_intersection():
    tester, _ = make_inputs(30, 0, 0, seed=2)
    ids = tester["member_id"].tolist()
    client = pd.DataFrame({"member_id": ids[:20] + ["zz1", "zz2"], "pool": ["shown"] * 20 + ["ghost"] * 2})
    with pytest.raises(InputError) as info:
        local_audit(tester, client, spec=AuditSpec(metric="prob-count", client_dataset="d", seed=1))
    assert info.value.column == "pool" and "'ghost' has no member in the intersection" in str(info.value)
    client = pd.DataFrame({"member_id": ids[:20], "pool": ["shown"] * 19 + [" "]})
    err = refused("prob-count", client)
    assert (err.file, err.column, err.row) == (FILE, "pool", 20)


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_unknown_metric_option_names_the_options(name):
    metric = get_metric(name)
    with pytest.raises(InputError) as info:
        metric.check_option("bogus")
    assert info.value.parameter == "metric option"
    assert all(option in str(info.value) for option in metric.options)
    tester, _ = make_inputs(5, 0, 0)
    with pytest.raises(InputError, match="not an option of"):  # the Tester refuses before any work
        TesterSession(AuditSpec(metric=name, client_dataset="d", metric_option="bogus"), tester)


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_unknown_metric_parameter_names_the_known_ones(name):
    metric = get_metric(name)
    with pytest.raises(InputError) as info:
        metric.parse_params({"nope": "1"})
    assert info.value.parameter == "metric parameter" and "'nope' is not a parameter" in str(info.value)
    known = [p.name for p in metric.params] or ["none"]
    assert all(p in str(info.value) for p in known)
    tester, _ = make_inputs(5, 0, 0)
    with pytest.raises(InputError, match="'nope' is not a parameter"):
        TesterSession(AuditSpec(metric=name, client_dataset="d", params={"nope": "1"}), tester)


@pytest.mark.parametrize("name,param,value", [
    ("mqos-auc", "pairs", "0"),
    ("mqos-auc", "pairs", "-5"),
    ("mqos-auc", "pairs", "many"),
    ("mqos-auc", "pairs", str(10 ** 9)),
    ("mqos-auc", "pairs_per_member", "0"),
    ("mqos-auc", "pairs_per_member", "1001"),
    ("prob-count", "inclusion_level", "1.5"),
    ("prob-count", "inclusion_level", "0"),
    ("prob-count", "count_threshold", "0"),
    ("prob-count", "count_threshold", "1.5"),
    ("pot", "reference_scores", "a,b"),
    ("pot", "reference_scores", "0.2,nan"),
    ("pot", "reference_scores", "0.5,0.5"),
    ("pot", "reference_scores", ",".join(str(i) for i in range(65))),
    ("pot", "bandwidth", "0"),
    ("pot", "bandwidth", "-1"),
    ("pot", "bandwidth", "inf"),
    ("pot", "dti_weights", "1,inf"),
    ("pot", "dti_weights", ",".join(["0.1"] * 10)),  # more than the 9 default deciles
    ("lot", "same_group_pairs", "maybe"),
])
def test_bad_parameter_value_names_the_parameter(name, param, value):
    with pytest.raises(InputError) as info:
        get_metric(name).parse_params({param: value})
    assert info.value.parameter == param and f"parameter '{param}'" in str(info.value)


def test_dti_weights_must_match_the_reference_scores():
    pot = get_metric("pot")
    with pytest.raises(InputError) as info:  # known before any data is read
        pot.parse_params({"reference_scores": "0.1,0.5,0.9", "dti_weights": "0.5,0.5"})
    assert info.value.parameter == "dti_weights" and "2 weights for 3 reference scores" in str(info.value)
    assert pot.parse_params({"reference_scores": "0.1,0.5,0.9", "dti_weights": "1,2,3"})["dti_weights"] == (1, 2, 3)
    # default deciles: three distinct scores give three reference points, known once the data is read
    frame = scores_frame(score=np.repeat([0.0, 1.0, 2.0], [14, 13, 13]))
    err = refused("pot", frame, params={"dti_weights": ",".join(["0.1"] * 9), "bandwidth": "1"})
    assert err.parameter == "dti_weights" and "9 weights for 3 reference scores" in str(err)


@pytest.mark.parametrize("name", ["output", "pot"])
@pytest.mark.parametrize("value", [5.0 + 1e-9, -5.5, 1e12])
def test_outcome_beyond_the_declared_range_is_refused_naming_the_row(name, value):
    outcome = np.clip(np.random.default_rng(4).normal(size=40), -5, 5)
    outcome[11] = value
    params = {"outcome_range": "-5:5", "out_of_range": "refuse"}
    err = refused(name, scores_frame(outcome=outcome), params=params)
    assert (err.file, err.column, err.row) == (FILE, "outcome", 12) and "declared range [-5, 5]" in str(err)
    outcome[11] = math.copysign(5.0, value)  # the bound itself is accepted
    client_rows(name, scores_frame(outcome=outcome), params=params)


@pytest.mark.parametrize("value", [2.0 + 1e-9, -0.5, 1e300])
def test_lot_raw_relevance_beyond_its_range_is_refused_naming_the_row(value):
    frame = ranked([("q1", 1, 1), ("q1", 2, 0), ("q2", 1, 2), ("q2", 2, value)])
    params = {"relevance_range": "0:2", "out_of_range": "refuse"}
    err = refused("lot", frame, "raw", params=params)
    assert (err.file, err.column, err.row) == (FILE, "relevance", 4) and "declared range [0, 2]" in str(err)
    frame.loc[3, "relevance"] = 2.0 if value > 0 else 0.0
    assert client_rows("lot", frame, "raw", params=params).info["pairs"] == 2
    with pytest.raises(InputError, match="±1.04858e"):  # a declared range beyond 2^20
        get_metric("lot").parse_params({"relevance_range": "0:2e6"})


def test_relevance_without_a_gain_is_refused_in_idcg_modes():
    negative = [("q1", 1, 1), ("q1", 2, -1)]
    huge = [("q1", 1, 1), ("q1", 2, 5000)]
    for name, option in (("lot", "idcg"), ("mqos-ndcg", "")):
        err = refused(name, ranked_for(name, negative), option)
        assert (err.column, err.row) == ("relevance", 2) and "0 or more" in str(err)
        err = refused(name, ranked_for(name, huge), option)
        assert (err.column, err.row) == ("relevance", 2) and "too large" in str(err)
    assert client_rows("lot", ranked(negative), "raw").info["pairs"] == 1


# ---------------------------------------------------------------- read from files
def _load(tmp_path, name: str, text: str, option: str = "", params: dict[str, str] | None = None):
    path = tmp_path / f"{name}.csv"
    path.write_text(text)
    metric = get_metric(name)
    option = metric.check_option(option)
    metric = metric.for_option(option)
    frame = DatasetRegistry(named={"d": path}).load("d", metric)
    return metric.client_rows(frame, str(path), option, metric.parse_params(params or {}),
                              np.random.default_rng(0)), str(path)


@pytest.mark.parametrize("text,column,row", [
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,2,1\nq2,c,1,2\nq2,d,1,0\n", "rank", 4),
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,2,1\nq2,c,1,2\nq2,d,3,0\n", "rank", 3),
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,2,NaN\n", "relevance", 2),
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,2,\n", "relevance", 2),
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,2,inf\n", "relevance", 2),
    ("query_id,member_id,rank,relevance\nq1,a,1,3\nq1,b,two,1\n", "rank", 2),
])
def test_lot_file_errors_name_file_column_and_data_row(tmp_path, text, column, row):
    with pytest.raises(InputError) as info:
        _load(tmp_path, "lot", text, "raw")
    assert info.value.file == str(tmp_path / "lot.csv")
    assert (info.value.column, info.value.row) == (column, row)


def test_auc_and_output_file_errors(tmp_path):
    with pytest.raises(InputError) as info:
        _load(tmp_path, "mqos-auc", "member_id,y_true,score\na,1,0.2\nb,1,0.5\nc,1,0.1\n")
    assert (info.value.file, info.value.column, info.value.row) == (str(tmp_path / "mqos-auc.csv"), "y_true", None)
    with pytest.raises(InputError) as info:
        _load(tmp_path, "mqos-auc", "member_id,y_true,score\na,1,0.2\nb,0,NaN\n", "sampled")
    assert (info.value.column, info.value.row) == ("score", 2)
    refuse = {"outcome_range": "-1e9:1e9", "out_of_range": "refuse"}
    with pytest.raises(InputError) as info:
        _load(tmp_path, "output", "member_id,outcome\na,1\nb,-3\nc,-2e9\n", params=refuse)
    assert (info.value.file, info.value.column, info.value.row) == (str(tmp_path / "output.csv"), "outcome", 3)
    rows, _ = _load(tmp_path, "output", "member_id,outcome\na,1\nb,-3\nc,-1e9\n", params=refuse)
    assert rows.values[:, 0].tolist() == [1.0, -3.0, -1e9]  # encoded relative to the range's centre, 0


# ---------------------------------------------------------------- through the CLI
@pytest.fixture()
def cli_inputs(tmp_path):
    """A Tester probability table (60 members) and a directory for client files."""
    tester, _ = make_inputs(60, 0, 0, seed=5)
    tp = tmp_path / "probabilities.csv"
    tester.to_csv(tp, index=False)
    return tester["member_id"].tolist(), tp, tmp_path


def test_cli_reports_bad_data_as_bad_input_json(cli_inputs, capsys):
    ids, tp, d = cli_inputs
    lot = d / "lot.csv"
    lot.write_text("query_id,member_id,rank,relevance\n" + "".join(
        f"q{i // 3},{m},{i % 3 + 1},{i % 4}\n" for i, m in enumerate(ids[:30])) + f"q99,{ids[40]},2,1\n"
        f"q99,{ids[41]},2,0\n")
    message = cli_error(capsys, "--metric", "lot", "--tester-probabilities", str(tp), "--client-data", str(lot))
    assert f"file {lot}" in message and "column 'rank'" in message and "row 32" in message
    assert "appears twice" in message

    out = d / "output.csv"
    pd.DataFrame({"member_id": ids, "outcome": [1.0] * 17 + [-3e9] + [0.0] * 42}).to_csv(out, index=False)
    message = cli_error(capsys, "--metric", "output", "--out-of-range", "refuse", "--tester-probabilities", str(tp),
                        "--client-data", str(out))
    assert f"file {out}" in message and "column 'outcome'" in message and "row 18" in message
    assert "--outcome-range" in message

    auc = d / "auc.csv"
    pd.DataFrame({"member_id": ids, "y_true": 1, "score": np.linspace(0, 1, 60)}).to_csv(auc, index=False)
    message = cli_error(capsys, "--metric", "mqos-auc", "--tester-probabilities", str(tp), "--client-data", str(auc))
    assert f"file {auc}" in message and "column 'y_true'" in message and "both classes" in message

    pools = d / "pools.csv"
    pd.DataFrame({"member_id": ids[:30] + ["stranger"], "pool": ["p"] * 30 + ["ghost"]}).to_csv(pools, index=False)
    message = cli_error(capsys, "--metric", "prob-count", "--tester-probabilities", str(tp),
                        "--client-data", str(pools))
    assert "column 'pool'" in message and "'ghost' has no member in the intersection" in message
    for id_ in ids:  # no member id in any message
        assert id_ not in message


def test_cli_reports_bad_options_and_parameters_as_bad_input_json(cli_inputs, capsys):
    ids, tp, d = cli_inputs
    out = d / "output.csv"
    pd.DataFrame({"member_id": ids, "outcome": np.arange(60.0)}).to_csv(out, index=False)
    base = ["--tester-probabilities", str(tp), "--client-data", str(out)]
    message = cli_error(capsys, "--metric", "mqos-auc", "--metric-option", "fast", *base)
    assert "'fast' is not an option of mqos-auc" in message and "exact" in message and "sampled" in message
    message = cli_error(capsys, "--metric", "output", "--metric-param", "smoothing=2", *base)
    assert "'smoothing' is not a parameter of output" in message
    message = cli_error(capsys, "--metric", "prob-count", "--metric-param", "inclusion_level=1.5", *base)
    assert "parameter 'inclusion_level'" in message and "between 0 and 1" in message
    message = cli_error(capsys, "--metric", "mqos-auc", "--metric-option", "sampled", "--pairs", "0", *base)
    assert "parameter 'pairs'" in message
    message = cli_error(capsys, "--metric", "pot", "--reference-scores", "a,b", *base)
    assert "parameter 'reference_scores'" in message
    message = cli_error(capsys, "--metric", "pot", "--reference-scores", "0.2,0.8", "--dti-weights", "1,1,1", *base)
    assert "parameter 'dti_weights'" in message and "3 weights for 2 reference scores" in message


# ==================================================================================
# B. Signed encoding and overflow (point 11)
# ==================================================================================
def test_signed_thirds_decode_exactly_and_refuse_the_middle():
    modulus = (1 << 127) - 1
    third = modulus // 3
    for x in (0, 1, -1, third, -third, third - 12345, -(third - 12345)):
        assert encoding.decode_signed(encoding.encode_signed(x, modulus), modulus) == x
    assert encoding.decode_signed(modulus - third, modulus) == -third
    for x in (third + 1, -(third + 1), 2 * third, -modulus):
        with pytest.raises(EncodingOverflowError):
            encoding.encode_signed(x, modulus)
    for m in (third + 1, modulus // 2, modulus - third - 1):
        with pytest.raises(EncodingOverflowError, match="overflow third"):
            encoding.decode_signed(m, modulus)


def test_slots_refuse_values_that_do_not_fit():
    layout = encoding.SlotLayout(64, 3)
    values = [(1 << 63) - 1, -(1 << 63) + 1, -7]
    assert layout.unpack(layout.pack(values)) == values
    with pytest.raises(EncodingOverflowError):
        layout.pack([1 << 63, 0, 0])
    with pytest.raises(EncodingOverflowError):
        layout.check_bound(1 << 63)
    for extra in (1 << 192, -(1 << 192)):  # a carry out of the last slot
        with pytest.raises(EncodingOverflowError):
            layout.unpack(layout.pack(values) + extra)


def test_component_bound_is_enforced():
    comp = Component("v", 8, 1000)
    assert comp.quantize(np.array([1000 / 256, -1000 / 256])).tolist() == [1000, -1000]
    for bad in (1001 / 256, -1001 / 256, math.nan):
        with pytest.raises(EncodingOverflowError, match="exceed the metric's bound"):
            comp.quantize(np.array([0.0, bad]))


def _lot_plain_cells(client: pd.DataFrame, tester: pd.DataFrame, labels) -> dict:
    """LOT_ab = Σ ΔỸ·p_ra·p_(r+1)b / Σ p_ra·p_(r+1)b in plaintext, pooled and per rank pair."""
    rows = client_rows("lot", client, "raw", params={"relevance_range": f"{-2.0 ** 20}:{2.0 ** 20}"})
    p = tester.set_index("member_id")[["a", "b"]]
    hi = p.loc[rows.ids[0]].to_numpy()
    lo = p.loc[rows.ids[1]].to_numpy()
    delta = rows.values[:, 0]
    out = {}
    for s in [None] + list(range(len(labels))):
        keep = np.ones(len(delta), bool) if s is None else rows.strata == s
        for a, ga in enumerate("ab"):
            for b, gb in enumerate("ab"):
                w = hi[keep, a] * lo[keep, b]
                out[(ga, gb, None if s is None else labels[s])] = float(delta[keep] @ w / w.sum())
    return out


def test_lot_raw_differences_at_the_bound_round_trip_with_their_sign():
    top = 2.0 ** 20
    rows = []
    for q in range(8):   # a at rank 1 (+2^20), b at rank 2 (-2^20): a>b gets +2^21
        rows += [(f"x{q}", 1, top), (f"x{q}", 2, -top)]
    for q in range(8):   # b at rank 1 (-2^20), a at rank 2 (+2^20), then b (-2^20): b>a -2^21, a>b +2^21
        rows += [(f"y{q}", 1, -top), (f"y{q}", 2, top), (f"y{q}", 3, -top)]
    rows += [("solo", 1, top)]
    frame = ranked(rows)
    sign = frame["relevance"].to_numpy() > 0
    tester = two_groups(frame["member_id"], sign.astype(float))  # one-hot: a = the +2^20 rows
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1, metric_option="raw",
                     params={"relevance_range": f"{-top}:{top}"})
    report, _, _ = local_audit(tester, frame, spec=spec)
    cells = {(c.higher, c.lower, c.rank_pair): c for c in report.cells}
    assert cells[("a", "b", None)].estimate == pytest.approx(2.0 ** 21, rel=1e-12)
    assert cells[("b", "a", None)].estimate == pytest.approx(-(2.0 ** 21), rel=1e-12)
    assert cells[("a", "b", "1-2")].estimate == pytest.approx(2.0 ** 21, rel=1e-12)
    assert cells[("b", "a", "1-2")].estimate == pytest.approx(-(2.0 ** 21), rel=1e-12)
    assert cells[("a", "b", "2-3")].estimate == pytest.approx(2.0 ** 21, rel=1e-12)
    assert cells[("b", "a", "2-3")].estimate is None  # no such pair at ranks 2-3
    assert cells[("b", "a", None)].ci_low == pytest.approx(-(2.0 ** 21), rel=1e-12)
    assert report.info["skipped_single_item"] == 1

    # soft probabilities, mixed signs at and near the bound: equal to the plaintext formula
    rng = np.random.default_rng(7)
    values = np.array([top, -top, top - 0.25, -top + 0.5, 0.0, 3.5])
    rows = [(f"q{q}", r, float(rng.choice(values))) for q in range(30) for r in (1, 2, 3, 4)]
    frame = ranked(rows)
    tester = two_groups(frame["member_id"], rng.uniform(0.01, 0.99, len(frame)))
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=2, metric_option="raw",
                     params={"same_group_pairs": "true", "relevance_range": f"{-top}:{top}"})
    report, _, _ = local_audit(tester, frame, spec=spec)
    plain = _lot_plain_cells(frame, tester, ["1-2", "2-3", "3-4"])
    assert len(report.cells) == len(plain) == 16
    for c in report.cells:
        assert c.estimate == pytest.approx(plain[(c.higher, c.lower, c.rank_pair)], rel=1e-6, abs=1e-6 * top)
    assert min(plain.values()) < -1e5 and max(plain.values()) > 1e5  # both signs exercised


def _output_audit_inputs():
    tester, _ = make_inputs(80, 0, 0, seed=3)
    ids = tester["member_id"].tolist()
    client = pd.DataFrame({"member_id": ids[:60], "outcome": np.linspace(-5, 5, 60)})
    return tester, client


class AggregateTamperer:
    """A tap that adds `offset(n, header)` to the plaintext of the first aggregate: it
    multiplies that ciphertext by the (unrandomised) encryption 1 + offset·n of offset."""

    def __init__(self, offset) -> None:
        self.offset = offset
        self.n = None
        self.header = None
        self.done = False

    def __call__(self, direction, msg) -> None:
        kind = msg.WhichOneof("body")
        if kind == "hello_ack":
            self.n = int.from_bytes(msg.hello_ack.paillier_n, "big")
        elif kind == "aggregates_header":
            self.header = msg.aggregates_header
        elif kind == "chunk" and msg.chunk.table == pb.AGGREGATES and not self.done:
            blob = msg.chunk.ciphertexts
            width = len(blob) // msg.chunk.rows
            c = int.from_bytes(blob[:width], "big")
            c = paillier.add_plain(self.n, c, self.offset(self.n, self.header))
            msg.chunk.ciphertexts = c.to_bytes(width, "big") + blob[width:]
            self.done = True


@pytest.mark.parametrize("recipient", ["client", "tester"])
@pytest.mark.parametrize("sign", [1, -1])
def test_aggregate_in_the_middle_third_is_a_protocol_error(recipient, sign):
    # n//2 ≡ (p-1)/2 (mod p) since 2·(n//2) = n-1 ≡ -1, and -(n//2) ≡ (p+1)/2: either offset
    # moves a small aggregate (positive or negative) into the middle third of Z_p
    tester, client = _output_audit_inputs()
    tap = AggregateTamperer(lambda n, header: sign * (n // 2))
    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=5, seed=1, result_recipient=recipient)
    with pytest.raises(ProtocolError, match="does not decode: overflow"):
        local_audit(tester, client, spec=spec, tap=tap)
    assert tap.done


@pytest.mark.parametrize("sign", [1, -1])
def test_aggregate_overflowing_its_slots_is_a_protocol_error(sign):
    tester, client = _output_audit_inputs()
    tap = AggregateTamperer(lambda n, header: sign << (header.slot_bits * header.item_slots))
    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=5, seed=1)
    with pytest.raises(ProtocolError, match="overflow"):
        local_audit(tester, client, spec=spec, tap=tap)
    assert tap.done


#: an outcome range wider than any outcome below (none is clipped), centred on 0
WIDE = {"outcome_range": "-1e6:1e6"}


def test_untampered_output_audit_matches_plaintext():
    tester, client = _output_audit_inputs()
    report, _, _ = local_audit(tester, client, spec=AuditSpec(metric="output", client_dataset="d", bootstrap=5,
                                                              seed=1, params=WIDE))
    p = tester.set_index("member_id").loc[client["member_id"]].to_numpy()
    y = client["outcome"].to_numpy()
    expected = p.T @ y / p.sum(axis=0)
    got = [g.estimate for g in report.by_group]
    assert got == pytest.approx(expected.tolist(), abs=1e-6)


def test_values_beyond_the_component_bound_are_refused_by_the_test_client(monkeypatch):
    from common.metrics import output

    small = int(1000 * (1 << output.SCALE_BITS))  # a metric whose outcomes may not exceed 1000

    def components(self, option, params, info):
        return (Component("outcome", output.SCALE_BITS, small),
                Component("one", output.SCALE_BITS, 1 << output.SCALE_BITS))

    monkeypatch.setattr(output.OutputMetric, "components", components)
    tester, client = _output_audit_inputs()
    client.loc[30, "outcome"] = 5000.0
    with pytest.raises(InputError) as info:
        local_audit(tester, client, spec=AuditSpec(metric="output", client_dataset="d", bootstrap=5, seed=1,
                                                   params=WIDE))
    assert "exceed the metric's bound" in str(info.value) and info.value.file == "d"
    client.loc[30, "outcome"] = 1000.0
    report, _, _ = local_audit(tester, client, spec=AuditSpec(metric="output", client_dataset="d", bootstrap=5,
                                                              seed=1, params=WIDE))
    assert report.overall.estimate is not None


# ==================================================================================
# C. Verdicts mean significance (point 7)
# ==================================================================================
COMPARED_KEYS = {"label", "estimate", "ci_low", "ci_high", "band_low", "band_high", "informative", "mdd"}


def family(estimates, sds, replicates: int = 400, seed: int = 0) -> np.ndarray:
    """(R+1, C): row 0 the estimates, then normal replicates around them."""
    est = np.asarray(estimates, dtype=np.float64)
    reps = est + np.random.default_rng(seed).normal(size=(replicates, est.size)) * np.asarray(sds)
    return np.vstack([est, reps])


@pytest.mark.parametrize("estimate,sd,severity", [
    (0.08, 0.1, "inconclusive"),  # a gap above tau whose interval includes 0: the audit could not see tau
    (0.005, 0.004, "none"),    # not significant, and a gap of tau would have been detected
    (0.03, 0.002, "low"),      # significant, below tau
    (0.05, 0.002, "moderate"),  # at tau
    (0.07, 0.002, "moderate"),
    (0.10, 0.002, "high"),     # at 2 tau
    (0.40, 0.05, "high"),
])
def test_verdict_severity_levels(estimate, sd, severity):
    v = verdict_from("range", ["x - y"], family([estimate], [sd]), 0.95, "percentile", 0.05)
    assert v.severity == severity
    assert v.significant == (severity not in ("none", "inconclusive"))
    assert v.flagged == (severity in ("moderate", "high"))
    assert set(v.compared) == COMPARED_KEYS and v.compared["label"] == "x - y"
    assert v.compared["estimate"] == pytest.approx(estimate)
    assert (v.compared["band_low"] > 0) == v.significant
    assert v.compared["ci_low"] <= estimate <= v.compared["ci_high"]
    assert v.compared["band_low"] <= estimate <= v.compared["band_high"]


def test_verdict_reports_the_largest_significant_gap_not_the_largest_gap():
    v = verdict_from("range", ["big but noisy", "small but sure"], family([0.3, 0.06], [0.3, 0.002]),
                     0.95, "percentile", 0.05)
    assert v.significant and v.severity == "moderate" and v.compared["label"] == "small but sure"
    assert v.significant_comparisons == ("small but sure",)
    v = verdict_from("range", ["a", "b"], family([0.3, 0.06], [0.3, 0.1]), 0.95, "percentile", 0.05)
    assert v.severity == "inconclusive" and not v.significant and v.compared["label"] == "a"


def test_verdict_rules_orient_the_compared_difference():
    sure = [0.002]
    # below_overall: overall − group > 0 is adverse; a group above overall is no disparity
    assert verdict_from("below_overall", ["o-g"], family([0.12], sure), 0.95, "percentile", 0.05).severity == "high"
    v = verdict_from("below_overall", ["o-g"], family([-0.12], sure), 0.95, "percentile", 0.05)
    assert v.severity == "none" and "lies below 0" in v.message and "includes 0" not in v.message
    # negative_cells (LOT): a cell significantly below 0
    assert verdict_from("negative_cells", ["a>b"], family([-0.07], sure), 0.95, "percentile",
                        0.05).severity == "moderate"
    v = verdict_from("negative_cells", ["a>b"], family([0.07], sure), 0.95, "percentile", 0.05)
    assert v.severity == "none" and "lies above 0" in v.message and "includes 0" not in v.message
    # nonzero_pairs (POT): either sign
    assert verdict_from("nonzero_pairs", ["a>b"], family([-0.03], sure), 0.95, "percentile", 0.05).severity == "low"
    # random groups (t intervals)
    assert verdict_from("below_overall", ["o-g"], family([0.07], sure, replicates=10), 0.95, "random_groups",
                        0.05).severity == "moderate"
    # nothing defined to compare
    v = verdict_from("range", ["x"], family([np.nan], [0.1]), 0.95, "percentile", 0.05)
    assert v.severity == "insufficient data" and not v.significant and v.compared is None


def _ero_inputs(seed: int):
    return make_inputs(2500, 2500, 2500, seed=seed, one_hot=True)


def test_ero_null_gap_above_tau_is_not_a_disparity():
    tester, client = _ero_inputs(seed=1)  # labels independent of the (one-hot) groups
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=50, seed=1, tau=0.05)
    report, _, _ = local_audit(tester, client, spec=spec)
    estimates = [g.estimate for g in report.by_group]
    assert report.n_matched == 2500
    assert max(estimates) - min(estimates) > 0.05  # the largest gap exceeds tau ...
    v = report.verdict
    # ... but is not significant, and ~420 members per group could not have shown a gap of tau
    assert v.severity == "inconclusive" and not v.significant and not v.flagged
    assert v.compared["estimate"] == pytest.approx(max(estimates) - min(estimates))
    assert v.compared["band_low"] < 0 < v.compared["band_high"]
    assert v.mdd > 0.05 and v.members_factor > 1 and set(v.uninformative) == {g.group for g in report.by_group}
    # no release controls (the harness's default): only the size limits it
    assert v.message.startswith("inconclusive at this size: ") and "--group-mapping" in v.message
    assert "nan" not in v.message.lower()


def test_ero_injected_fpr_disparity_is_significant_and_serialised():
    tester, client = _ero_inputs(seed=0)
    rng = np.random.default_rng(100)
    black = tester["black"].to_numpy() == 1
    negatives_passed = (client["y_true"].to_numpy() == 0) & (client["y_pred"].to_numpy() == 0)
    client.loc[black & negatives_passed & (rng.random(2500) < 0.5), "y_pred"] = 1  # FPR 0.5 -> 0.75
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=100, seed=1, tau=0.05)
    report, _, _ = local_audit(tester, client, spec=spec)
    v = report.verdict
    assert v.significant and v.flagged and v.severity in ("moderate", "high")
    assert "black" in v.compared["label"] and v.compared["band_low"] > 0
    assert v.compared["estimate"] >= 0.05

    d = json.loads(report.to_json())["verdict"]
    assert {"rule", "tau", "severity", "significant", "flagged", "compared"} <= set(d)
    assert (d["rule"], d["tau"], d["significant"], d["flagged"]) == ("range", 0.05, True, True)
    assert set(d["compared"]) == COMPARED_KEYS
    assert d["compared"]["band_low"] <= d["compared"]["estimate"] <= d["compared"]["band_high"]


# ==================================================================================
# D. Names (point 8)
# ==================================================================================
def _audit_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["audit"]


def test_metric_names_are_exactly_the_catalog():
    assert tuple(METRICS) == METRIC_NAMES
    action = next(a for a in _audit_parser()._actions if a.dest == "metric")
    assert tuple(action.choices) == METRIC_NAMES
    for name in METRIC_NAMES:
        assert _audit_parser().parse_args(["--metric", name]).metric == name


@pytest.mark.parametrize("name", ["auc", "fpr", "ndcg", "mqos_aux", ""])
def test_other_metric_names_are_refused_by_argparse(name, capsys):
    with pytest.raises(SystemExit) as info:
        ppre_main(["audit", "--local", "--metric", name, "--tester-probabilities", "p.csv", "--client-data", "d.csv"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown metric '{name}'" in err and "usage:" not in err and len(err.splitlines()) == 2
    with pytest.raises(InputError, match="unknown metric"):
        get_metric(name)


@pytest.mark.parametrize("name, metric", [("mqos_ndcg", "mqos-ndcg"), ("ERO", "ero"), ("prob_count", "prob-count")])
def test_metric_names_with_underscores_or_capitals_are_accepted(name, metric):
    assert _audit_parser().parse_args(["--metric", name]).metric == metric


def test_metric_option_and_parameters_reach_the_metric(cli_inputs, capsys):
    ids, tp, d = cli_inputs
    pools = d / "pools.csv"
    pd.DataFrame({"member_id": ids[:40], "pool": ["p1"] * 20 + ["p2"] * 20}).to_csv(pools, index=False)
    base = ["--metric", "prob-count", "--tester-probabilities", str(tp), "--client-data", str(pools)]
    code, report = cli_json(capsys, *base, "--metric-param", "count_threshold=3",
                            "--metric-param", "inclusion_level=0.5")
    assert code == 0 and report["params"] == {"count_threshold": 3, "inclusion_level": 0.5}
    assert {p["pool"] for p in report["pools"]} == {"p1", "p2"}
    code, report = cli_json(capsys, *base, "--count-threshold", "2")  # the named flag
    assert code == 0 and report["params"] == {"count_threshold": 2, "inclusion_level": 0.9}

    # the option reaches the Test-Client: raw accepts negative relevance within its
    # declared range and refuses one outside it; idcg refuses negative relevance (no gain)
    lot = d / "lot.csv"
    lot.write_text("query_id,member_id,rank,relevance\n" + "".join(
        f"q{i // 2},{m},{i % 2 + 1},{-1 if i == 5 else 3e6 if i == 7 else 1}\n" for i, m in enumerate(ids[:10])))
    base = ["--metric", "lot", "--tester-probabilities", str(tp), "--client-data", str(lot)]
    message = cli_error(capsys, *base, "--metric-option", "idcg")
    assert "row 6" in message and "0 or more" in message
    message = cli_error(capsys, *base, "--metric-option", "raw", "--relevance-range=-1:1", "--out-of-range", "refuse")
    assert "row 8" in message and "declared range [-1, 1]" in message
    message = cli_error(capsys, *base, "--metric-option", "raw", "--metric-param", "same_group_pairs=perhaps")
    assert "parameter 'same_group_pairs'" in message
    message = cli_error(capsys, *base, "--metric-option", "listwise")
    assert "'listwise' is not an option of lot (idcg, raw)" in message
