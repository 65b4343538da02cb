"""Ranked lists, LOT pairs and MQOS-NDCG in plaintext (common.metrics.ranking)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import ndcg_score

from common.errors import InputError
from common.metrics.ranking import (RankedLists, dcg, gain, idcg, lot_rows, ranked_lists,
                                    viewer_ndcg)
from common.tables import read_table
from tests.metric_data import lot_validation_data, random_ranked_lists

FILE = "lists.csv"


def frame(rows, columns=("query_id", "member_id", "rank", "relevance")) -> pd.DataFrame:
    f = pd.DataFrame(rows, columns=list(columns))
    f["rank"] = f["rank"].astype(np.float64)
    f["relevance"] = f["relevance"].astype(np.float64)
    f["member_id"] = f["member_id"].astype(object)
    f["query_id"] = f["query_id"].astype(object)
    return f


def refused(fn, *args, column=None, row=None, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert err.file == FILE
    assert (err.column, err.row) == (column, row), str(err)
    return err


def no_values(err: InputError, *values: str) -> None:
    for v in values:
        assert v not in str(err)


# --------------------------------------------------------------------------------------
# Gains and DCG
# --------------------------------------------------------------------------------------
def test_gain_dcg_idcg_by_hand():
    rel = np.array([3.0, 2.0, 3.0, 0.0, 1.0, 2.0])
    assert gain(rel).tolist() == [7.0, 3.0, 7.0, 0.0, 1.0, 3.0]
    assert gain(np.array([1e-300]))[0] == pytest.approx(1e-300 * math.log(2), rel=1e-12)
    expected = sum((2 ** r - 1) / math.log2(p + 2) for p, r in enumerate(rel))
    assert dcg(rel)[0] == pytest.approx(expected, rel=1e-15)
    ideal = sorted(rel, reverse=True)
    assert idcg(rel)[0] == pytest.approx(sum((2 ** r - 1) / math.log2(p + 2) for p, r in enumerate(ideal)))
    # several lists, one after the other
    starts = np.array([0, 2, 3, 6])
    both = dcg(rel, starts)
    assert both.shape == (3,)
    assert both[0] == pytest.approx(7 + 3 / math.log2(3))
    assert both[1] == pytest.approx(7.0)
    assert both[2] == pytest.approx(0 + 1 / math.log2(3) + 3 / 2)
    assert idcg(rel, starts)[2] == pytest.approx(3 + 1 / math.log2(3))
    with pytest.raises(ValueError):
        dcg(rel, np.array([0, 3, 3, 6]))


# --------------------------------------------------------------------------------------
# Ranked lists
# --------------------------------------------------------------------------------------
def test_lists_ordered_by_query_code_then_rank():
    f = frame([("qB", "m3", 2, 0.5), ("qA", "m1", 1, 1.0), ("qB", "m4", 1, 2.0), ("qA", "m2", 2, 0.0),
               ("qB", "m1", 3, 1.5)])
    lists = ranked_lists(f, FILE)
    assert isinstance(lists, RankedLists)
    assert lists.n_queries == 2
    assert lists.query.tolist() == [0, 0, 0, 1, 1]  # qB first: it appears first
    assert lists.rank.tolist() == [1, 2, 3, 1, 2]
    assert lists.member_ids.tolist() == ["m4", "m3", "m1", "m1", "m2"]
    assert lists.relevance.tolist() == [2.0, 0.5, 1.5, 1.0, 0.0]
    assert lists.row.tolist() == [3, 1, 5, 2, 4]
    assert lists.starts.tolist() == [0, 3, 5]
    assert lists.sizes.tolist() == [3, 2]
    assert lists.member_ids.dtype == object
    assert lists.query.dtype == lists.rank.dtype == lists.row.dtype == np.int64
    assert lists.relevance.dtype == np.float64
    with pytest.raises(ValueError):
        lists.relevance[0] = 9.0  # read-only
    assert not lists.one_viewer_per_query


@pytest.mark.parametrize("bad", [0.0, -1.0, 1.5, np.inf, -np.inf])
def test_rank_must_be_whole_and_at_least_one(bad):
    f = frame([("q1", "m1", 1, 1.0), ("q1", "m2", bad, 1.0), ("q1", "m3", 2, 1.0)])
    err = refused(ranked_lists, f, FILE, column="rank", row=2)
    assert "whole number" in str(err)


def test_duplicate_rank_names_both_rows():
    f = frame([("q1", "m1", 1, 1.0), ("q1", "m2", 2, 1.0), ("q2", "m3", 1, 1.0), ("q1", "m4", 2, 1.0)])
    err = refused(ranked_lists, f, FILE, column="rank", row=4)
    assert "rank 2 appears twice" in str(err) and "row 2" in str(err)
    no_values(err, "q1", "m2", "m4")


def test_missing_rank_names_the_querys_first_row():
    f = frame([("q0", "m0", 1, 1.0), ("q1", "m1", 1, 1.0), ("q1", "m2", 3, 1.0), ("q1", "m3", 4, 1.0)])
    err = refused(ranked_lists, f, FILE, column="rank", row=2)
    assert "rank 2 is missing" in str(err)
    no_values(err, "q1")
    # a rank far above the query's size is a gap too (no overflow)
    f = frame([("q0", "m0", 1, 1.0), ("q1", "m1", 1e20, 1.0), ("q1", "m2", 1e21, 1.0)])
    err = refused(ranked_lists, f, FILE, column="rank", row=2)
    assert "rank 1 is missing" in str(err)
    # a query not starting at 1
    f = frame([("q0", "m0", 2, 1.0), ("q0", "m1", 3, 1.0)])
    assert "rank 1 is missing" in str(refused(ranked_lists, f, FILE, column="rank", row=1))


@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_relevance_must_be_finite(bad):
    f = frame([("q1", "m1", 1, 1.0), ("q1", "m2", 2, 1.0), ("q2", "m3", 1, bad)])
    refused(ranked_lists, f, FILE, column="relevance", row=3)


def test_member_twice_in_a_query():
    f = frame([("q1", "m1", 1, 1.0), ("q2", "m1", 1, 1.0), ("q1", "m2", 2, 1.0), ("q1", "m1", 3, 1.0)])
    err = refused(ranked_lists, f, FILE, column="member_id", row=4)
    assert "row 1" in str(err)
    no_values(err, "m1", "q1")
    # in different queries it is fine
    assert ranked_lists(f.iloc[:3], FILE).n_queries == 2


def test_one_viewer_per_query():
    f = frame([("q1", "v1", 1, 1.0), ("q1", "v1", 2, 1.0), ("q2", "v2", 1, 1.0), ("q1", "v3", 3, 1.0)])
    err = refused(ranked_lists, f, FILE, one_viewer_per_query=True, column="member_id", row=4)
    assert "row 1" in str(err)
    no_values(err, "v1", "v3", "q1")
    lists = ranked_lists(f.iloc[:3], FILE, one_viewer_per_query=True)
    assert lists.one_viewer_per_query
    with pytest.raises(ValueError):
        viewer_ndcg(ranked_lists(f.iloc[:3], FILE))


def test_empty_query_id_and_missing_column():
    f = frame([("q1", "m1", 1, 1.0), ("", "m2", 1, 1.0)])
    refused(ranked_lists, f, FILE, column="query_id", row=2)
    refused(ranked_lists, f.drop(columns="relevance"), FILE, column="relevance", row=None)


def test_rows_are_the_positional_index_plus_one():
    f = frame([("q1", "m1", 1, 1.0), ("q1", "m2", 0, 1.0)])
    f.index = [10, 20]
    refused(ranked_lists, f, FILE, column="rank", row=2)


def test_read_table_then_lists(tmp_path):
    path = tmp_path / "lists.csv"
    path.write_text("member_id,query_id,rank,relevance\n"
                    "a,q1,1,2\nb,q1,2,1\nc,q2,1,0\na,q2,2,3\nd,q2,2,1\n")
    f = read_table(path, ("rank", "relevance"), text=("query_id",), unique_ids=False)
    with pytest.raises(InputError) as info:
        ranked_lists(f, str(path))
    assert (info.value.file, info.value.column, info.value.row) == (str(path), "rank", 5)
    lists = ranked_lists(f.iloc[:4], str(path))
    rows = lot_rows(lists)
    assert rows.n_pairs == 2 and rows.higher_ids.tolist() == ["a", "c"]


# --------------------------------------------------------------------------------------
# LOT
# --------------------------------------------------------------------------------------
def direct_lot(f: pd.DataFrame, option: str) -> pd.DataFrame:
    """Adjacent differences by pandas, straight from the definition."""
    f = f.copy()
    f["code"] = pd.factorize(f["query_id"])[0]
    f = f.sort_values(["code", "rank"]).reset_index(drop=True)
    if option == "idcg":
        def ideal(rel: pd.Series) -> float:
            r = np.sort(rel.to_numpy())[::-1]
            return float(np.sum((2.0 ** r - 1) / np.log2(np.arange(len(r)) + 2.0)))
        f["idcg"] = f.groupby("code")["relevance"].transform(ideal)
        f = f[f["idcg"] > 0]
        f["y"] = f["relevance"] / f["idcg"]
    else:
        f["y"] = f["relevance"]
    g = f.groupby("code")
    f["lower"] = g["member_id"].shift(-1)
    f["delta"] = f["y"] - g["y"].shift(-1)
    pairs = f.dropna(subset=["lower"])
    return pd.DataFrame({"query": pairs["code"].to_numpy(np.int64),
                         "rank_pair": pairs["rank"].to_numpy(np.int64) - 1,
                         "higher": pairs["member_id"].to_numpy(object),
                         "lower": pairs["lower"].to_numpy(object),
                         "delta": pairs["delta"].to_numpy(np.float64)})


@pytest.mark.parametrize("option", ["idcg", "raw"])
@pytest.mark.parametrize("grades", [4, None])
def test_lot_deltas_match_pandas(option, grades):
    rng = np.random.default_rng(7)
    f = random_ranked_lists(300, rng, min_len=1, max_len=9, grades=grades, n_members=40)
    if option == "raw":
        f["relevance"] -= 1.0  # signed relevances are fine in raw mode
    rows = lot_rows(ranked_lists(f, FILE), option)
    expected = direct_lot(f, option)
    assert rows.option == option
    assert rows.n_pairs == len(expected)
    assert rows.query.tolist() == expected["query"].tolist()
    assert rows.rank_pair.tolist() == expected["rank_pair"].tolist()
    assert rows.higher_ids.tolist() == expected["higher"].tolist()
    assert rows.lower_ids.tolist() == expected["lower"].tolist()
    np.testing.assert_allclose(rows.delta, expected["delta"], rtol=1e-12, atol=1e-15)
    assert rows.delta.dtype == np.float64 and rows.rank_pair.dtype == rows.query.dtype == np.int64
    sizes = f.groupby("query_id").size()
    assert rows.skipped_single_item == int((sizes == 1).sum())
    assert rows.n_queries == len(np.unique(rows.query))
    assert rows.n_queries + rows.skipped_single_item + rows.skipped_zero_idcg == 300
    assert rows.rank_pair_labels == tuple(f"{r}-{r + 1}" for r in range(1, int(rows.rank_pair.max()) + 2))
    assert rows.rank_pair_labels[0] == "1-2"
    if option == "idcg" and grades == 4:
        assert rows.skipped_zero_idcg > 0  # some multi-item lists are all 0 with 4 grades
    if option == "raw":
        assert rows.skipped_zero_idcg == 0


def test_lot_skips_and_counts():
    f = frame([("q1", "m1", 1, 1.0),                            # one item
               ("q2", "m2", 1, 0.0), ("q2", "m3", 2, 0.0),      # IDCG 0
               ("q3", "m4", 1, 2.0), ("q3", "m5", 2, 1.0), ("q3", "m6", 3, 1.0)])
    lists = ranked_lists(f, FILE)
    rows = lot_rows(lists)
    assert (rows.n_queries, rows.skipped_single_item, rows.skipped_zero_idcg) == (1, 1, 1)
    assert rows.query.tolist() == [2, 2] and rows.rank_pair.tolist() == [0, 1]
    ideal = 3 + 1 / math.log2(3) + 1 / 2
    np.testing.assert_allclose(rows.delta, [1 / ideal, 0.0])
    assert rows.rank_pair_labels == ("1-2", "2-3")
    raw = lot_rows(lists, "raw")
    assert (raw.n_queries, raw.skipped_single_item, raw.skipped_zero_idcg) == (2, 1, 0)
    assert raw.delta.tolist() == [0.0, 1.0, 0.0]


def test_lot_no_pairs_is_an_error():
    f = frame([("q1", "m1", 1, 1.0), ("q2", "m2", 1, 2.0)])
    err = refused(lot_rows, ranked_lists(f, FILE), column=None, row=None)
    assert "no query has two ranked items" in str(err)
    f = frame([("q1", "m1", 1, 0.0), ("q1", "m2", 2, 0.0), ("q2", "m3", 1, 2.0)])
    err = refused(lot_rows, ranked_lists(f, FILE), column=None, row=None)
    assert "no query has two ranked items" in str(err)
    assert lot_rows(ranked_lists(f, FILE), "raw").n_pairs == 1


def test_lot_negative_relevance_only_in_idcg_mode():
    f = frame([("q1", "m1", 1, 1.0), ("q1", "m2", 2, 0.5), ("q2", "m3", 2, -0.5), ("q2", "m4", 1, 1.0)])
    lists = ranked_lists(f, FILE)
    err = refused(lot_rows, lists, column="relevance", row=3)
    assert "0 or more" in str(err)
    assert lot_rows(lists, "raw").delta.tolist() == [0.5, 1.5]
    with pytest.raises(InputError) as info:
        lot_rows(lists, "zscore")
    assert info.value.parameter == "option"


def test_relevance_whose_gain_overflows_is_refused():
    f = frame([("q1", "v1", 1, 1.0), ("q1", "v1", 2, 0.5), ("q2", "v2", 1, 1.0), ("q2", "v2", 2, 2000.0)])
    lists = ranked_lists(f, FILE, one_viewer_per_query=True)
    assert "too large" in str(refused(lot_rows, lists, column="relevance", row=4))
    refused(viewer_ndcg, lists, column="relevance", row=4)
    assert lot_rows(lists, "raw").n_pairs == 2


def test_lot_validation_data_recovers_the_gaps():
    gaps = [0.12, 0.34, -0.27, 0.78, -0.43]
    f = lot_validation_data(2000, gaps, np.random.default_rng(3))
    assert list(f.columns) == ["query_id", "member_id", "rank", "relevance"]
    assert len(f) == 2000 * 6 and f["member_id"].nunique() == len(f)
    assert f["member_id"].iloc[0] == "m000000"
    first = f.loc[f["rank"] == 1, "relevance"]
    assert first.min() >= 2.0 and first.max() <= 3.0
    rows = lot_rows(ranked_lists(f.sample(frac=1.0, random_state=1), FILE), "raw")
    assert rows.rank_pair_labels == ("1-2", "2-3", "3-4", "4-5", "5-6")
    means = pd.Series(rows.delta).groupby(rows.rank_pair).mean().to_numpy()
    np.testing.assert_allclose(means, gaps, atol=1e-4)


# --------------------------------------------------------------------------------------
# MQOS-NDCG
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("grades", [3, None])
def test_ndcg_matches_sklearn(grades):
    rng = np.random.default_rng(11)
    f = random_ranked_lists(250, rng, min_len=2, max_len=8, grades=grades, viewers=30)
    zero = frame([("qzero", "v_zero", 1, 0.0), ("qzero", "v_zero", 2, 0.0), ("qzero", "v_zero", 3, 0.0)])
    f = pd.concat([f, zero], ignore_index=True)
    lists = ranked_lists(f, FILE, one_viewer_per_query=True)
    result = viewer_ndcg(lists)
    codes, uniques = pd.factorize(f["query_id"])
    for q in range(lists.n_queries):
        part = f[codes == q].sort_values("rank")
        y_true = (2.0 ** part["relevance"].to_numpy() - 1)[None, :]
        y_score = -part["rank"].to_numpy()[None, :]
        assert result.query_ndcg[q] == pytest.approx(ndcg_score(y_true, y_score), rel=1e-12, abs=1e-15)
    assert result.query_ndcg[-1] == 0.0
    assert result.zero_idcg_queries == int(sum((f[codes == q]["relevance"] == 0).all()
                                               for q in range(lists.n_queries)))
    assert result.zero_idcg_queries >= 1
    # per viewer: the sum and count of the viewer's queries
    viewer = f.groupby(codes)["member_id"].first()
    by_viewer = pd.DataFrame({"viewer": viewer.to_numpy(), "ndcg": result.query_ndcg}) \
        .groupby("viewer", sort=False)["ndcg"].agg(["sum", "count"])
    assert result.viewer_ids.tolist() == by_viewer.index.tolist()
    np.testing.assert_allclose(result.ndcg_sum, by_viewer["sum"].to_numpy(), rtol=1e-12)
    assert result.n_queries.tolist() == by_viewer["count"].tolist()
    assert result.n_queries.dtype == np.int64 and result.ndcg_sum.dtype == np.float64
    assert result.viewer_ids.dtype == object
    assert result.viewer_ids[result.query_viewer].tolist() == viewer.tolist()
    assert result.total_queries == lists.n_queries == int(result.n_queries.sum())
    assert result.total_ndcg == pytest.approx(result.query_ndcg.sum())
    assert result.overall == pytest.approx(result.query_ndcg.mean())


def test_ndcg_batched_equal_lengths_and_single_items():
    rng = np.random.default_rng(5)
    f = random_ranked_lists(200, rng, min_len=6, max_len=6, grades=5, viewers=10, shuffle=False)
    result = viewer_ndcg(ranked_lists(f, FILE, one_viewer_per_query=True))
    rel = f["relevance"].to_numpy().reshape(200, 6)
    expected = ndcg_score(2.0 ** rel - 1, np.tile(-np.arange(1.0, 7.0), (200, 1)))
    assert result.query_ndcg.mean() == pytest.approx(expected, rel=1e-12)
    # one-item queries are kept: NDCG 1, or 0 when the relevance is 0
    f = frame([("q1", "v1", 1, 2.0), ("q2", "v1", 1, 0.0), ("q3", "v2", 1, 0.5)])
    result = viewer_ndcg(ranked_lists(f, FILE, one_viewer_per_query=True))
    assert result.query_ndcg.tolist() == [1.0, 0.0, 1.0]
    assert result.ndcg_sum.tolist() == [1.0, 1.0] and result.n_queries.tolist() == [2, 1]
    assert result.zero_idcg_queries == 1


def test_ndcg_refuses_negative_relevance():
    f = frame([("q1", "v1", 1, 1.0), ("q1", "v1", 2, -0.1)])
    err = refused(viewer_ndcg, ranked_lists(f, FILE, one_viewer_per_query=True), column="relevance", row=2)
    assert "0 or more" in str(err)


# --------------------------------------------------------------------------------------
# Size
# --------------------------------------------------------------------------------------
def test_400k_rows_run():
    rng = np.random.default_rng(1)
    f = random_ranked_lists(40_000, rng, min_len=10, max_len=10, grades=5, n_members=100_000)
    assert len(f) == 400_000
    rows = lot_rows(ranked_lists(f, FILE))
    assert rows.n_queries + rows.skipped_zero_idcg == 40_000
    assert rows.n_pairs == 9 * rows.n_queries
    g = random_ranked_lists(40_000, rng, min_len=10, max_len=10, grades=5, viewers=20_000)
    result = viewer_ndcg(ranked_lists(g, FILE, one_viewer_per_query=True))
    assert result.total_queries == 40_000
