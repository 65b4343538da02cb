"""Synthetic populations (`ppre.synth`) and the `ppre synth` / `ppre bisg` commands."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from common.errors import InputError
from common.races import RACES
from ppre.cli import main
from ppre.synth import METRIC_DATASETS, SynthConfig, metric_datasets, parse_race_values, synthesize
from tester_service.demographics.bisg import bisg

#: the columns of each Test-Client dataset `ppre synth` writes
DATASET_COLUMNS = {
    "ero": ["member_id", "y_true", "y_pred"],
    "lot": ["query_id", "member_id", "rank", "relevance"],
    "mqos_ndcg": ["query_id", "member_id", "rank", "relevance"],
    "pot": ["member_id", "score", "outcome"],
    "mqos_auc": ["member_id", "y_true", "score"],
    "output": ["member_id", "outcome"],
    "prob_count": ["member_id", "pool"],
}


def test_synthesize_shapes_and_seed():
    d = synthesize(SynthConfig(members=5000, seed=4))
    assert list(d.members.columns) == ["member_id", "surname", "zip", "first_name"]
    assert list(d.self_id.columns) == ["member_id", "race"]
    assert list(d.ero.columns) == ["member_id", "y_true", "y_pred"]
    assert len(d.members) == len(d.truth) == len(d.ero) == 5000
    assert len(d.self_id) == 300 and d.self_id["member_id"].isin(d.members["member_id"]).all()
    assert d.members["member_id"].is_unique and set(d.truth["race"]) <= set(RACES)
    assert d.members["zip"].str.fullmatch(r"\d{5}").all()
    # Self-ID reports the true race.
    merged = d.self_id.merge(d.truth, on="member_id", suffixes=("", "_true"))
    assert (merged["race"] == merged["race_true"]).all()
    again = synthesize(SynthConfig(members=5000, seed=4))
    pd.testing.assert_frame_equal(d.members, again.members)
    # Every ZIP is a ZCTA; about 10% of surnames are invented (not on the Census list).
    src = bisg(d.members["surname"], d.members["zip"]).source
    assert set(src) == {"surname+geography", "geography"}
    assert abs((src == "geography").mean() - 0.0994) < 0.02


def test_disparity_and_bias():
    d = synthesize(SynthConfig(members=60_000, seed=5, disparity={"black": 0.08}, base_fpr=0.10))
    fpr = d.fpr_by_race()
    assert abs(fpr["white"] - 0.10) < 0.01 and abs(fpr["black"] - 0.18) < 0.02
    shares = d.truth["race"].value_counts(normalize=True)
    assert abs(shares["white"] - 0.631) < 0.01
    biased = synthesize(SynthConfig(members=60_000, seed=5, self_id_bias={"white": 3.0}))
    assert (biased.self_id["race"] == "white").mean() > (d.self_id["race"] == "white").mean() + 0.1


def test_parse_and_validation():
    assert parse_race_values("black=0.08, Native=-0.01", "disparity") == {"black": 0.08, "aian": -0.01}
    assert parse_race_values("none", "disparity") == {}
    for text in ("martian=0.1", "black", "black=x", "black=0.1,black=0.2"):
        with pytest.raises(InputError):
            parse_race_values(text, "disparity")
    with pytest.raises(InputError, match="disparity"):
        synthesize(SynthConfig(members=10, disparity={"black": 0.95}))
    with pytest.raises(InputError, match="members"):
        synthesize(SynthConfig(members=0))


def test_cli_synth_then_bisg(tmp_path, capsys):
    out = tmp_path / "pop"
    assert main(["synth", "--members", "2000", "--seed", "3", "--out", str(out),
                 "--disparity", "black=0.1", "--self-id-bias", "white=1.5"]) == 0
    for name in ("members.csv", "self_id.csv", "truth.csv", *(f"client/{n}.csv" for n in DATASET_COLUMNS)):
        assert (out / name).is_file()
    assert sorted(p.name for p in (out / "client").iterdir()) == sorted(f"{n}.csv" for n in DATASET_COLUMNS)
    members = pd.read_csv(out / "members.csv", dtype=str)
    assert len(members) == 2000
    ero = pd.read_csv(out / "client" / "ero.csv", dtype={"member_id": str})
    assert set(ero["y_pred"]) <= {0, 1}
    # every dataset: its columns, ids among the members, and readable by its own metric
    # (the Test-Client's reader and plaintext rows, as an audit would load it)
    from common.metrics import get_metric
    for name, columns in DATASET_COLUMNS.items():
        path = out / "client" / f"{name}.csv"
        frame = pd.read_csv(path, dtype={"member_id": str, "query_id": str, "pool": str})
        assert list(frame.columns) == columns, name
        assert frame["member_id"].isin(members["member_id"]).all(), name
        metric = get_metric(name.replace("_", "-"))
        for option in metric.options:
            m = metric.for_option(option)
            params = m.parse_params({"pairs": "500"} if option == "sampled" else {})
            rows = m.client_rows(m.read(str(path)), str(path), option, params, np.random.default_rng(0))
            assert rows.n_rows > 0, name

    probs = tmp_path / "probs.csv"
    assert main(["bisg", "--input", str(out / "members.csv"), "--output", str(probs)]) == 0
    p = pd.read_csv(probs, dtype={"member_id": str})
    assert list(p.columns) == ["member_id", *RACES, "source"]
    assert list(p["member_id"]) == list(members["member_id"])
    np.testing.assert_allclose(p[list(RACES)].sum(axis=1), 1, atol=1e-9)
    expected = bisg(members["surname"], members["zip"]).probabilities
    np.testing.assert_allclose(p[list(RACES)].to_numpy(), expected, atol=1e-12)

    pq = tmp_path / "probs.parquet"
    assert main(["bisg", "--input", str(out / "members.csv"), "--output", str(pq)]) == 0
    assert set(pd.read_parquet(pq)["source"].astype(str)) == {"surname+geography", "geography"}


def test_cli_bisg_options_and_errors(tmp_path, capsys):
    m = pd.DataFrame({"member_id": ["1", "2"], "surname": ["Smith", "Garcia"], "zip": ["60614", "00601"],
                      "first_name": ["John", "Maria"], "tract": ["17031070200", ""]})
    src = tmp_path / "m.csv"
    m.to_csv(src, index=False)
    dst = tmp_path / "o.csv"
    assert main(["bisg", "--input", str(src), "--output", str(dst), "--first-names", "--geo", "tract"]) == 0
    p = pd.read_csv(dst, dtype={"member_id": str})
    expected = bisg(m["surname"], m["zip"], tracts=m["tract"], first_names=m["first_name"], geo="tract")
    np.testing.assert_allclose(p[list(RACES)].to_numpy(), expected.probabilities, atol=1e-12)

    # Errors: exit 2, one clear line, and no output (not even a temp file) left behind.
    bad = tmp_path / "bad.csv"
    m.assign(surname=["Smith", ""]).to_csv(bad, index=False)
    out2 = tmp_path / "o2.csv"
    assert main(["bisg", "--input", str(bad), "--output", str(out2)]) == 2
    msg = capsys.readouterr().err
    assert "row 2" in msg and "surname" in msg
    assert main(["bisg", "--input", str(src), "--output", str(tmp_path / "no" / "o.csv")]) == 2
    assert main(["bisg", "--input", str(tmp_path / "missing.csv"), "--output", str(out2)]) == 2
    m[["member_id", "surname", "zip"]].to_csv(src, index=False)
    assert main(["bisg", "--input", str(src), "--output", str(out2), "--geo", "tract"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "m.csv", "o.csv"]
    assert main(["synth", "--members", "10", "--out", str(tmp_path / "x"), "--disparity", "martian=1"]) == 2


def test_csv_writer_quotes_only_when_needed(tmp_path):
    import pyarrow as pa

    from ppre.commands.bisg import write_table_atomic
    plain = pa.table({"member_id": ["a1", "b2"], "p": [0.25, 1.0], "q": [0.75, 0.0]})
    write_table_atomic(plain, tmp_path / "plain.csv")
    assert (tmp_path / "plain.csv").read_text().splitlines()[1] == "a1,0.25,0.75"
    odd = pa.table({"member_id": ['x,1', 'y"2', "z\n3"], "p": [0.1, 0.2, 0.3], "q": [0.9, 0.8, 0.7]})
    write_table_atomic(odd, tmp_path / "odd.csv")
    back = pd.read_csv(tmp_path / "odd.csv", dtype={"member_id": str})
    assert list(back["member_id"]) == ['x,1', 'y"2', "z\n3"]
    np.testing.assert_allclose(back["p"], [0.1, 0.2, 0.3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.csv", "plain.csv"]


def _one_hot(races: pd.Series) -> np.ndarray:
    return (races.to_numpy(dtype=object)[:, None] == np.asarray(RACES, dtype=object)[None, :]).astype(np.float64)


def test_metric_datasets_schemas():
    cfg = SynthConfig(members=5003, seed=4)
    d = synthesize(cfg)
    sets = metric_datasets(cfg, d)
    assert tuple(sets) == METRIC_DATASETS
    ids = set(d.members["member_id"])
    for name, frame in sets.items():
        assert list(frame.columns) == DATASET_COLUMNS[name], name
        assert set(frame["member_id"]) <= ids, name
        assert frame.notna().all().all(), name

    # LOT: lists of 10 different members, ranks 1..10, grades 0-4, each member in at most 2 queries
    lot = sets["lot"]
    assert lot.groupby("query_id").size().eq(10).all() and lot["query_id"].nunique() == 2 * (5003 // 10)
    assert lot.groupby("query_id")["rank"].apply(list).map(lambda r: r == list(range(1, 11))).all()
    assert not lot.duplicated(["query_id", "member_id"]).any()
    assert lot["member_id"].value_counts().max() == 2 and set(lot["relevance"]) <= set(range(5))
    # MQOS-NDCG: every member is a viewer of 1-3 queries of 10 results; one viewer per query
    nd = sets["mqos_ndcg"]
    assert nd.groupby("query_id")["member_id"].nunique().eq(1).all()
    assert nd.groupby("query_id")["rank"].apply(list).map(lambda r: r == list(range(1, 11))).all()
    per_viewer = nd.groupby("member_id")["query_id"].nunique()
    assert set(per_viewer.index) == ids and per_viewer.between(1, 3).all() and set(nd["relevance"]) <= set(range(5))
    # one row per member, in the members' order
    for name in ("pot", "mqos_auc", "output", "prob_count"):
        assert list(sets[name]["member_id"]) == list(d.members["member_id"]), name
    pot, auc = sets["pot"], sets["mqos_auc"]
    assert pot["score"].between(0, 1).all() and set(pot["outcome"]) == {0, 1}
    assert auc["score"].between(0, 1).all() and set(auc["y_true"]) == {0, 1}
    assert np.isfinite(sets["output"]["outcome"]).all()
    pools = sets["prob_count"]["pool"].value_counts()
    assert pools.to_dict() == {"large": 5003 - 35 - 497, "medium": 497, "small": 30, "tiny": 5}

    # seeded, and the population's own tables are untouched by drawing them
    again = metric_datasets(cfg, synthesize(cfg))
    for name in METRIC_DATASETS:
        pd.testing.assert_frame_equal(sets[name], again[name])
    pd.testing.assert_frame_equal(synthesize(cfg).ero, d.ero)
    other = metric_datasets(SynthConfig(members=5003, seed=5), synthesize(SynthConfig(members=5003, seed=5)))
    assert not other["pot"]["score"].equals(sets["pot"]["score"])


def test_metric_datasets_tiny_populations():
    for n in (1, 2, 7, 40):
        cfg = SynthConfig(members=n, seed=1)
        sets = metric_datasets(cfg, synthesize(cfg))
        assert len(sets["prob_count"]) == n and sets["prob_count"]["pool"].notna().all()
        assert len(sets["lot"]) == 2 * (n // min(10, n)) * min(10, n)
        if n >= 2:
            assert set(sets["mqos_auc"]["y_true"]) == {0, 1}


def test_metric_datasets_injected_disparity():
    """The --disparity races are disadvantaged in every dataset (measured with the true races)."""
    from common.metrics.ranking import lot_rows, ranked_lists, viewer_ndcg
    from tests.metric_reference import linear_auc

    def effects(disparity):
        cfg = SynthConfig(members=30_000, seed=6, disparity=disparity)
        d = synthesize(cfg)
        sets = metric_datasets(cfg, d)
        race = d.truth.set_index("member_id")["race"]
        out = {}
        o = sets["output"].assign(race=lambda f: f["member_id"].map(race))
        means = o.groupby("race")["outcome"].mean()
        out["output"] = means["black"] - means["white"]
        p = sets["pot"].assign(race=lambda f: f["member_id"].map(race), gap=lambda f: f["outcome"] - f["score"])
        gaps = p.groupby("race")["gap"].mean()
        out["pot"] = gaps["black"] - gaps["white"]
        a = sets["mqos_auc"]
        aucs = linear_auc(_one_hot(a["member_id"].map(race)), a["y_true"].to_numpy(), a["score"].to_numpy())
        out["auc"] = aucs[RACES.index("black")] - aucs[RACES.index("white")]
        v = viewer_ndcg(ranked_lists(sets["mqos_ndcg"], "ndcg", one_viewer_per_query=True))
        ndcg = pd.DataFrame({"race": pd.Series(v.viewer_ids).map(race), "s": v.ndcg_sum, "q": v.n_queries})
        sums = ndcg.groupby("race")[["s", "q"]].sum()
        out["ndcg"] = sums.loc["black", "s"] / sums.loc["black", "q"] - sums.loc["white", "s"] / sums.loc["white", "q"]
        rows = lot_rows(ranked_lists(sets["lot"], "lot"), "raw")
        hi = pd.Series(rows.higher_ids).map(race).eq("black").to_numpy()
        lo = pd.Series(rows.lower_ids).map(race).eq("black").to_numpy()
        out["lot"] = rows.delta[~hi & lo].mean() - rows.delta[hi & ~lo].mean()
        return out

    null, black = effects({}), effects({"black": 0.08})
    for name, value in null.items():
        assert abs(value) < (0.1 if name == "lot" else 0.03), (name, value)
    assert abs(black["output"] + 0.08) < 0.03 and abs(black["pot"] - 0.08) < 0.03
    assert abs(black["auc"] + 0.08) < 0.03 and abs(black["ndcg"] + 0.08) < 0.03
    # LOT (raw grades): a non-black member directly above a black one is less relevant than
    # in the reverse order (by about 0.9 grades at 0.8 grades of penalty)
    assert black["lot"] < -0.6


# --------------------------------------------------------------------------------------
# Real name frequencies (ppre.synth_names) and the calibrated mode
# --------------------------------------------------------------------------------------
#: people in the 2010 Census surname file, listed surnames and ALL OTHER NAMES together
CENSUS_PEOPLE = 294_979_229


def test_surnames_follow_the_census_counts():
    """Pr(s|r) ∝ Pr(r|s)·count(s): the most common surnames are drawn as often as they
    occur in the 2010 Census (drawing uniformly over the list, the top 100 would cover 0.06%)."""
    from tester_service.demographics.bisg import surname_table
    from ppre.synth_names import surname_counts

    d = synthesize(SynthConfig(members=200_000, seed=2))
    surname, race = d.members["surname"], d.truth["race"]
    assert surname[race.isin(["white", "black"])].value_counts().index[0] == "Smith"
    counts = surname_counts()
    assert counts.shape == (len(surname_table().probs),) and counts.min() >= 100
    top = np.argsort(-counts)[:100]
    top_names = pd.Index(surname_table().index[top]).str.title()
    census_share = counts[top].sum() / CENSUS_PEOPLE  # 17.3% of all people
    assert abs(surname.isin(top_names).mean() - census_share) < 0.01
    drawn = surname.value_counts()
    for i in top[:10]:  # SMITH .. MARTINEZ: each within 10% of its Census share
        name = surname_table().index[i].title()
        assert abs(drawn.get(name, 0) / len(surname) / (counts[i] / CENSUS_PEOPLE) - 1) < 0.1, name


def test_first_names_are_drawn_per_race():
    """Pr(f|r) ∝ obs(f)·share_r(f) (Tzioumis 2018), unlisted first names invented at that
    data's rate per race; BIFSG runs on them and beats BISG."""
    from tester_service.demographics.bisg import first_name_table
    from ppre.synth_names import first_names

    d = synthesize(SynthConfig(members=200_000, seed=2))
    first, race = d.members["first_name"], d.truth["race"]
    assert first.str.fullmatch(r"[A-Z][a-z]+").all()
    table = first_names()
    listed = first.str.upper().isin(first_name_table().index)
    for j, r in enumerate(RACES):
        rows = (race == r).to_numpy()
        n = rows.sum()
        p_unlisted = table.unlisted_given_race[j]  # 5% of white, 36% of api applicants
        assert abs((~listed[rows]).mean() - p_unlisted) < 4 * np.sqrt(p_unlisted / n) + 0.005, r
        drawn = first[rows].value_counts()
        for k in np.argsort(-table.given_race[:, j])[:5]:
            p = table.given_race[k, j]
            assert abs(drawn.get(table.names[k], 0) / n - p) < 4 * np.sqrt(p / n) + 0.001, (r, table.names[k])
    assert first[race == "hispanic"].value_counts().index[0] == "Jose"
    assert first[race == "white"].value_counts().index[0] == "Michael"

    truth = pd.Categorical(race, categories=RACES).codes
    plain = bisg(d.members["surname"], d.members["zip"]).probabilities.argmax(axis=1)
    with_first = bisg(d.members["surname"], d.members["zip"], first_names=first).probabilities.argmax(axis=1)
    assert (with_first == truth).mean() > (plain == truth).mean() + 0.01


def _calibration_bins(probs: np.ndarray, race: pd.Series, min_members: int = 300):
    """Per race and tenth of its probability: (race, members, mean probability − share of
    that race, the same in standard errors), for bins of at least ``min_members``."""
    out = []
    for j, r in enumerate(RACES):
        is_r = (race == r).to_numpy()
        tenth = np.minimum((probs[:, j] * 10).astype(int), 9)
        for b in range(10):
            rows = tenth == b
            n = int(rows.sum())
            if n >= min_members:
                mean_p = probs[rows, j].mean()
                gap = mean_p - is_r[rows].mean()
                out.append((r, n, gap, gap / np.sqrt(max(mean_p * (1 - mean_p), 1e-4) / n)))
    return out


@pytest.mark.parametrize("first_names", [False, True], ids=["bisg", "bifsg"])
def test_calibrated_mode_makes_the_posterior_calibrated(first_names):
    """Calibrated mode: among members whose BISG (BIFSG) probability of race r is about p,
    a share p is of race r, in every tenth of every race with enough members."""
    generative = synthesize(SynthConfig(members=50_000, seed=1))
    d = synthesize(SynthConfig(members=50_000, seed=1, mode="calibrated", calibrated_first_names=first_names))
    # the same names and ZCTAs (the redraw uses a stream of its own) ...
    pd.testing.assert_frame_equal(d.members, generative.members)
    probs = bisg(d.members["surname"], d.members["zip"],
                 first_names=d.members["first_name"] if first_names else None).probabilities
    bins = _calibration_bins(probs, d.truth["race"])
    assert len(bins) >= 30 and {r for r, *_ in bins} == set(RACES)
    for r, n, gap, z in bins:
        assert abs(z) < 4 and (n < 2000 or abs(gap) < 0.04), (r, n, gap, z)
    shares = d.truth["race"].value_counts(normalize=True)
    for j, r in enumerate(RACES):  # and each race's mean probability is its share
        assert abs(probs[:, j].mean() - shares[r]) < 0.01, r
    # ... and the race is redrawn from the posterior, independently of the generative
    # race: it changes for the expected share of members (not for none)
    before = pd.Categorical(generative.truth["race"], categories=RACES).codes
    expected_change = 1 - probs[np.arange(len(probs)), before].mean()
    changed = (d.truth["race"] != generative.truth["race"]).mean()
    assert expected_change > 0.1 and abs(changed - expected_change) < 0.01
    if first_names:  # the BISG-calibrated race is not BIFSG-calibrated: the check has power
        plain = synthesize(SynthConfig(members=50_000, seed=1, mode="calibrated"))
        assert max(abs(z) for *_, z in _calibration_bins(probs, plain.truth["race"])) > 8


def test_calibrated_mode_tables_follow_the_final_race():
    """Self-ID, truth, ERO and the other metrics' tables all use the redrawn race."""
    cfg = SynthConfig(members=60_000, seed=5, mode="calibrated", disparity={"black": 0.08})
    d = synthesize(cfg)
    merged = d.self_id.merge(d.truth, on="member_id", suffixes=("", "_true"))
    assert len(merged) == 3600 and (merged["race"] == merged["race_true"]).all()
    fpr = d.fpr_by_race()  # measured with the final race: the injected gap is intact
    assert abs(fpr["white"] - 0.10) < 0.01 and abs(fpr["black"] - 0.18) < 0.02
    output = metric_datasets(cfg, d)["output"].merge(d.truth, on="member_id")
    means = output.groupby("race")["outcome"].mean()
    assert abs(means["black"] - means["white"] + 0.08) < 0.03
    generative = synthesize(SynthConfig(members=60_000, seed=5, disparity={"black": 0.08}))
    assert (d.truth["race"] != generative.truth["race"]).mean() > 0.1


def test_default_mode_is_deterministic_per_seed():
    cfg = SynthConfig(members=20_000, seed=9)
    a, b = synthesize(cfg), synthesize(cfg)
    for name in ("members", "self_id", "truth", "ero"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert SynthConfig(members=1).mode == "generative"
    other = synthesize(SynthConfig(members=20_000, seed=10))
    assert (other.members["surname"] != a.members["surname"]).mean() > 0.9
    assert (other.members["first_name"] != a.members["first_name"]).mean() > 0.9
    c = SynthConfig(members=20_000, seed=9, mode="calibrated")
    pd.testing.assert_frame_equal(synthesize(c).truth, synthesize(c).truth)


def test_mode_validation(tmp_path, capsys):
    with pytest.raises(InputError, match="parameter 'mode': must be one of generative, calibrated, got 'magic'"):
        synthesize(SynthConfig(members=10, mode="magic"))
    with pytest.raises(InputError, match="calibrated-first-names"):
        synthesize(SynthConfig(members=10, calibrated_first_names=True))
    out = tmp_path / "pop"
    assert main(["synth", "--members", "10", "--out", str(out), "--mode", "Calibrated"]) == 2
    err = capsys.readouterr().err
    assert "ppre synth: error: parameter 'mode': must be one of generative, calibrated, got 'Calibrated'" in err
    assert main(["synth", "--members", "10", "--out", str(out), "--calibrated-first-names"]) == 2
    assert "parameter 'calibrated-first-names': applies only with mode 'calibrated'" in capsys.readouterr().err
    assert not out.exists()

    assert main(["synth", "--members", "3000", "--seed", "1", "--out", str(out), "--mode", "calibrated",
                 "--calibrated-first-names"]) == 0
    printed = capsys.readouterr().out
    assert "BIFSG (--first-names) on this population: the 90% rule gives T = 0.990" in printed
    members = pd.read_csv(out / "members.csv", dtype=str, keep_default_na=False)
    assert list(members.columns) == ["member_id", "surname", "zip", "first_name"]
    truth = pd.read_csv(out / "truth.csv", dtype=str)
    again = synthesize(SynthConfig(members=3000, seed=1, mode="calibrated", calibrated_first_names=True))
    assert list(truth["race"]) == list(again.truth["race"])
