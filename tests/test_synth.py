"""Synthetic populations (`ppre.synth`) and the `ppre synth` / `ppre bisg` commands."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from common.bisg import bisg
from common.errors import InputError
from common.races import RACES
from ppre.cli import main
from ppre.synth import SynthConfig, parse_race_values, synthesize


def test_synthesize_shapes_and_seed():
    d = synthesize(SynthConfig(members=5000, seed=4))
    assert list(d.members.columns) == ["member_id", "surname", "zip"]
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
    for name in ("members.csv", "self_id.csv", "truth.csv", "client/ero.csv"):
        assert (out / name).is_file()
    members = pd.read_csv(out / "members.csv", dtype=str)
    assert len(members) == 2000
    ero = pd.read_csv(out / "client" / "ero.csv", dtype={"member_id": str})
    assert set(ero["y_pred"]) <= {0, 1}

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
