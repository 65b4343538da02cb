"""Tester preparation (design §2) and its input readers; group mappings (design §1.3)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.errors import InputError
from common.races import RACES, GroupMapping
from tester_service.demographics import bisg as bisg_mod
from tester_service.demographics import clipping, randomized_response
from tester_service.demographics import preparation
from tester_service.demographics.preparation import (PreparationConfig, prepare, read_members, read_members_table,
                                        read_self_id, validate_members)

MEMBERS = pd.DataFrame({
    "member_id": ["007", "008", "009", "010", "011", "012"],
    "surname": ["Smith", "Garcia", "Nguyen", "Washington", "Zzqxw", "O'Brien"],
    "zip": ["60614", "00601", "02134", "20001", "", "2134"],
})

# Ambiguous surnames (largest BISG probabilities 0.46 to 1.00): the 90% rule value lies
# inside its clamp range [0.5, 0.99], so a test of the rule sees the rule, not the clamp.
MIXED = pd.DataFrame({
    "member_id": ["101", "102", "103", "104", "105", "106"],
    "surname": ["Lee", "Jackson", "Kim", "Lopez", "Miller", "Brown"],
    "zip": ["60614", "10027", "90012", "", "30310", ""],
})


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    df.to_csv(path, index=False)
    return path


def err(fn, *a, **kw) -> InputError:
    with pytest.raises(InputError) as exc:
        fn(*a, **kw)
    return exc.value


def load_members(path: Path) -> pd.DataFrame:
    """Read and validate a members file, as `prepare` does with the Tester's file."""
    df = read_members(path)
    validate_members(df, str(path))
    return df


def prepare_files(members: Path, self_id: Path | None = None, config: PreparationConfig | None = None):
    """What the Tester runs per audit (`tester_service.server.prepare_from_files`)."""
    return prepare(read_members(members), read_self_id(self_id) if self_id else None,
                   config or PreparationConfig(seed=0), labels=(str(members), str(self_id)))


def rule_value(probs: np.ndarray) -> float:
    """Design §2.4's default T, computed here without `tester_service.demographics.clipping`: the value under
    which 90% of the rows' largest probabilities fall (numpy's default linear quantile),
    kept within [0.5, 0.99]."""
    top = np.sort(probs.max(axis=1))
    h = (len(top) - 1) * 0.9
    lo = int(np.floor(h))
    t = top[lo] + (h - lo) * (top[min(lo + 1, len(top) - 1)] - top[lo])
    return float(min(max(t, 0.5), 0.99))


# --- prepare -----------------------------------------------------------------------
def test_prepare_basic():
    sid = pd.DataFrame({"member_id": ["008", "011"], "race": ["hispanic", "Black"]})
    out = prepare(MEMBERS, sid, PreparationConfig(seed=1, threshold=0.825))
    assert list(out.columns) == ["member_id", *RACES]
    assert list(out["member_id"]) == list(MEMBERS["member_id"])  # order, leading zeros kept
    assert all(isinstance(v, str) for v in out["member_id"])
    p = out[list(RACES)].to_numpy()
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-9)
    assert p.max() <= 0.825
    st = out.attrs["preparation"]
    assert st.self_id_used == 2 and st.threshold == 0.825
    assert st.sources["prior"] == 1  # Zzqxw with no ZIP
    # No opt-out, country or state column: nobody is dropped, and the counts say so.
    assert (st.members_in, st.dropped_opt_out, st.dropped_non_us, st.dropped_excluded_state) == (6, 0, 0, 0)
    # Reproducible with a seed.
    again = prepare(MEMBERS, sid, PreparationConfig(seed=1, threshold=0.825))
    pd.testing.assert_frame_equal(out, again)


def test_self_id_replaces_bisg_row():
    # With ε large the reported race is kept; the clipped row's top category is that race.
    sid = pd.DataFrame({"member_id": ["007"], "race": ["api"]})  # Smith in 60614 is mostly white by BISG
    out = prepare(MEMBERS, sid, PreparationConfig(seed=2, epsilon=50, threshold=0.825))
    row = out.loc[out["member_id"] == "007", list(RACES)].to_numpy()[0]
    assert RACES[row.argmax()] == "api" and 0.775 <= row.max() < 0.825


def test_drops_and_opt_out_self_id():
    m = MEMBERS.assign(opt_out=["", "1", "no", "0", "yes", "false"],
                       country=["US", "usa", "", "CA", "US", " us "],
                       state=["IL", "PR", "MA", "DC", "IL", "ma"])
    sid = pd.DataFrame({"member_id": ["008", "009"], "race": ["hispanic", "api"]})
    out = prepare(m, sid, PreparationConfig(seed=0, excluded_states=("ma",), threshold=0.9))
    # 008 and 011 opted out, 010 non-US, 009 and 012 in an excluded state -> only 007 remains.
    assert list(out["member_id"]) == ["007"]
    st = out.attrs["preparation"]
    assert (st.dropped_opt_out, st.dropped_non_us, st.dropped_excluded_state) == (2, 1, 2)
    assert st.self_id_used == 0 and st.self_id_dropped == 2


def test_group_mapping_output():
    out = prepare(MEMBERS, None, PreparationConfig(seed=0, group_mapping=GroupMapping.hsm()))
    assert list(out.columns) == ["member_id", "hsm", "non_hsm"]
    np.testing.assert_allclose(out[["hsm", "non_hsm"]].sum(axis=1), 1, atol=1e-9)


def test_rule_threshold_and_config_errors():
    out = prepare(MIXED, None, PreparationConfig(seed=0))
    t = out.attrs["preparation"].threshold
    expected = rule_value(bisg_mod.bisg(MIXED["surname"], zips=MIXED["zip"]).probabilities)
    assert 0.5 < expected < 0.99  # inside the clamp range: the rule itself decides
    assert t == pytest.approx(expected, abs=1e-12)
    assert out[list(RACES)].to_numpy().max() <= t
    st = out.attrs["preparation"]
    bisg_max = bisg_mod.bisg(MIXED["surname"], zips=MIXED["zip"]).probabilities.max(axis=1)
    assert st.clipped_rows == int((bisg_max > t).sum()) == 1  # the rows above T, counted per row
    # Every source is counted, also those no member had (no ZIP-less unlisted name here).
    assert st.sources == {"surname+geography": 4, "surname": 2, "geography": 0, "prior": 0}
    assert err(PreparationConfig, epsilon=0).parameter == "epsilon"
    assert err(PreparationConfig, threshold=1.0).parameter == "T"
    assert err(PreparationConfig, geo="county").parameter == "geo"
    e = err(prepare, MEMBERS, None, PreparationConfig(geo="tract"))
    assert e.parameter == "geo" and "needs a 'tract' column" in str(e)
    e = err(prepare, MEMBERS, None, PreparationConfig(excluded_states=("IL",)))
    assert e.parameter == "excluded_states" and "members have no 'state' column" in str(e)
    # In-memory tables (not read from a file) are checked for their columns too.
    e = err(prepare, MEMBERS.rename(columns={"surname": "surnme"}), None, PreparationConfig(), labels=("m.csv", "s"))
    assert (e.file, e.column) == ("m.csv", "surname") and "found 'surnme': misspelt?" in str(e)
    e = err(prepare, MEMBERS, pd.DataFrame({"member_id": ["007"]}), PreparationConfig(), labels=("m", "s.csv"))
    assert (e.file, e.column) == ("s.csv", "race") and str(e).endswith("required column is missing")
    e = err(prepare, MEMBERS, None, PreparationConfig(first_names=True))
    assert e.parameter == "first_names" and "needs a 'first_name' column" in str(e)
    e = err(prepare, MEMBERS.assign(opt_out="yes"), None, PreparationConfig(), labels=("m.csv", "s"))
    assert str(e) == "file m.csv: no members are left after dropping opted-out, non-US and excluded-state rows"
    # Ids of a type that is not text are refused in tables handed over in memory, too.
    e = err(prepare, MEMBERS.assign(member_id=np.arange(6) + 0.5), None, PreparationConfig(), labels=("m.csv", "s"))
    assert (e.file, e.column) == ("m.csv", "member_id") and "must be text or whole numbers" in str(e)
    e = err(prepare, MEMBERS, pd.DataFrame({"member_id": [7.5], "race": ["api"]}), PreparationConfig(),
            labels=("m.csv", "s.csv"))
    assert (e.file, e.column) == ("s.csv", "member_id")


@pytest.mark.parametrize("epsilon, low, high", [(0.1, 0.10, 0.28), (2.0, 0.47, 0.70), (50, 1.0, 1.0)])
def test_self_id_rows_are_privatised_with_the_configured_epsilon(epsilon, low, high):
    # k-ary randomized response keeps the reported race with probability e^ε/(e^ε+5)
    # (design §2.3): 0.18 for ε=0.1, 0.60 for ε=2, 1 for ε=50; clipping keeps the top race.
    n = 600
    members = pd.DataFrame({"member_id": [f"{i:04d}" for i in range(n)],
                            "surname": list(MIXED["surname"]) * (n // len(MIXED)), "zip": ["60614"] * n})
    sid = pd.DataFrame({"member_id": members["member_id"], "race": ["api"] * n})
    out = prepare(members, sid, PreparationConfig(seed=4, epsilon=epsilon, threshold=0.9))
    kept = (out[list(RACES)].to_numpy().argmax(axis=1) == RACES.index("api")).mean()
    assert low <= kept <= high


@pytest.mark.parametrize("first_names, geo", [(True, "tract"), (True, "zcta"), (False, "tract")])
def test_first_names_and_tract(first_names, geo):
    # Without Self-ID the preparation is BIFSG/BISG followed by clipping with the seeded
    # generator: it must equal tester_service.demographics.bisg called directly, then clipped the same way.
    m = MEMBERS.assign(first_name=["Hiroshi", "Maria", "", "Zzq", "Ana", "Sean"],
                       tract=["17031070200", "", "25025000100", "", "", ""])
    t = 0.95
    out = prepare(m, None, PreparationConfig(seed=5, first_names=first_names, geo=geo, threshold=t))
    direct = bisg_mod.bisg(m["surname"], zips=m["zip"], tracts=m["tract"] if geo == "tract" else None,
                           first_names=m["first_name"] if first_names else None, geo=geo).probabilities
    plain = bisg_mod.bisg(m["surname"], zips=m["zip"]).probabilities
    assert np.abs(direct - plain).max() > 1e-3  # first names / tracts really change these rows
    expected = clipping.clip(direct, t, np.random.default_rng(5))
    np.testing.assert_allclose(out[list(RACES)].to_numpy(), expected, rtol=0, atol=1e-12)
    above = int((direct.max(axis=1) > t).sum())
    assert out.attrs["preparation"].clipped_rows == above >= 2  # counted per row


@pytest.mark.parametrize("header", ["OptOut", "optout", " OPTOUT "])
def test_a_custom_opt_out_column_is_read_and_used(tmp_path, header):
    # The operator names the opt-out column ("OptOut"); the file's header matches it
    # whatever its case and spaces, and those members are dropped.
    path = write_csv(tmp_path / "m.csv", MEMBERS.assign(**{header: ["yes", "", "1", "", "", ""]}))
    cfg = PreparationConfig(seed=0, opt_out_column="OptOut")
    members = read_members(path, "OptOut")
    assert "OptOut" in members.columns
    out = prepare(members, None, cfg, labels=(str(path), ""))
    assert list(out["member_id"]) == ["008", "010", "011", "012"]
    assert out.attrs["preparation"].dropped_opt_out == 2
    assert "OptOut" in read_members_table(path, "OptOut").column_names


def test_self_id_goes_to_its_own_member_when_members_were_dropped():
    # 008 opts out, so every later member's row among the kept ones is one less than its
    # row in the file; 010's Self-ID answer must land on 010, not on the member after it.
    m = MEMBERS.assign(opt_out=["", "1", "", "", "", ""])
    sid = pd.DataFrame({"member_id": ["010"], "race": ["api"]})
    out = prepare(m, sid, PreparationConfig(seed=3, epsilon=50, threshold=0.9))
    top = dict(zip(out["member_id"], np.asarray(RACES)[out[list(RACES)].to_numpy().argmax(axis=1)]))
    bisg_top = dict(zip(m["member_id"], np.asarray(RACES)[
        bisg_mod.bisg(m["surname"], zips=m["zip"]).probabilities.argmax(axis=1)]))
    assert bisg_top["010"] != "api" and bisg_top["011"] != "api"
    assert top["010"] == "api" and top["011"] == bisg_top["011"]
    assert out.attrs["preparation"].self_id_used == 1


def test_rule_threshold_uses_the_bisg_rows_only():
    # design §2.4: T is the 90% value of the BISG rows' largest probabilities. Self-ID rows
    # (near one-hot with a large epsilon) must not move it, however many there are.
    sid = pd.DataFrame({"member_id": list(MIXED["member_id"]), "race": ["api"] * len(MIXED)})
    out = prepare(MIXED, sid, PreparationConfig(seed=0, epsilon=50))
    expected = rule_value(bisg_mod.bisg(MIXED["surname"], zips=MIXED["zip"]).probabilities)
    assert expected < 0.98
    assert out.attrs["preparation"].threshold == pytest.approx(expected, abs=1e-12)
    assert out.attrs["preparation"].self_id_used == len(MEMBERS)


def test_self_id_rows_of_people_not_among_the_members_are_counted_and_dropped():
    sid = pd.DataFrame({"member_id": ["007", "999", "998"], "race": ["white", "white", "black"]})
    stats = prepare(MEMBERS, sid, PreparationConfig(seed=0)).attrs["preparation"]
    assert (stats.self_id_used, stats.self_id_not_among_members) == (1, 2)
    assert stats.counts()["self_id_not_among_members"] == 2.0
    none = pd.DataFrame({"member_id": ["999"], "race": ["white"]})
    e = err(prepare, MEMBERS, none, PreparationConfig(seed=0))
    assert "no member id is among the members" in str(e) and "999" not in str(e)


# --- randomized response: one draw per member and epoch (design §2.3) -------------------
def survey_files(tmp_path: Path, n: int = 600) -> tuple[Path, Path]:
    """`n` members, every one in the Self-ID survey (reported 'api')."""
    members = pd.DataFrame({"member_id": [f"{i:04d}" for i in range(n)],
                            "surname": list(MIXED["surname"]) * (n // len(MIXED)), "zip": ["60614"] * n})
    sid = pd.DataFrame({"member_id": members["member_id"], "race": ["api"] * n})
    return write_csv(tmp_path / "members.csv", members), write_csv(tmp_path / "self_id.csv", sid)


def released_answers(out: pd.DataFrame) -> np.ndarray:
    """Each Self-ID row's privatised answer: the top category of its clipped row (T > 1/2
    keeps the largest entry the largest, design §2.4)."""
    return out[list(RACES)].to_numpy().argmax(axis=1)


@pytest.fixture()
def fresh_epoch(monkeypatch):
    """This test's own process epoch (the process's is restored afterwards)."""
    monkeypatch.setattr(preparation, "_epoch", None)


def test_two_audits_of_one_tester_process_release_the_same_draw(tmp_path, fresh_epoch):
    """Two audits of one Tester (`TesterConfig.from_members`: what `ppre tester serve`
    runs per audit) give every Self-ID member the same privatised answer, with no seed;
    clipping is drawn per audit. After `rotate_epoch` the draws are new and independent:
    they agree only as often as two independent randomized responses (Σ_j M[i, j]²)."""
    from tester_service.server import TesterConfig
    members, self_id = survey_files(tmp_path)
    config = TesterConfig.from_members("127.0.0.1:1", members, self_id, PreparationConfig(epsilon=1.0))
    first, second = config.load_probabilities(), config.load_probabilities()
    np.testing.assert_array_equal(released_answers(first), released_answers(second))
    assert not np.allclose(first[list(RACES)].to_numpy(), second[list(RACES)].to_numpy())  # clipping is not
    assert 0.2 < (released_answers(first) == RACES.index("api")).mean() < 0.5  # ε = 1 keeps 35%
    old = preparation.process_epoch().fingerprint
    assert preparation.rotate_epoch().fingerprint != old
    rotated = released_answers(config.load_probabilities())
    q = float((randomized_response.transition_matrix(1.0)[0] ** 2).sum())  # 0.21
    agree = float((rotated == released_answers(first)).mean())
    assert abs(agree - q) < 4 * np.sqrt(q * (1 - q) / len(rotated)), agree
    np.testing.assert_array_equal(rotated, released_answers(config.load_probabilities()))


def test_the_epoch_in_use_explicit_seeded_or_the_process_one(tmp_path, fresh_epoch):
    members, self_id = survey_files(tmp_path, 300)
    mine = randomized_response.ResponseEpoch.new()
    answers = {name: released_answers(prepare_files(members, self_id, PreparationConfig(epsilon=1.0, **kw)))
               for name, kw in {"explicit": dict(epoch=mine), "explicit again": dict(epoch=mine),
                                "seed 7": dict(seed=7), "seed 7 again": dict(seed=7), "seed 8": dict(seed=8),
                                "process": {}, "generator": dict(seed=np.random.default_rng(1))}.items()}
    np.testing.assert_array_equal(answers["explicit"], answers["explicit again"])
    np.testing.assert_array_equal(answers["seed 7"], answers["seed 7 again"])  # reproducible with a seed
    np.testing.assert_array_equal(answers["process"], answers["generator"])  # a Generator seeds clipping only
    for a, b in [("explicit", "seed 7"), ("seed 7", "seed 8"), ("explicit", "process")]:
        assert (answers[a] != answers[b]).any(), (a, b)
    assert PreparationConfig(epoch=mine).response_epoch() is mine
    assert "epoch" not in repr(PreparationConfig(epoch=mine))


# --- readers -------------------------------------------------------------------------
def test_load_members_csv_and_parquet(tmp_path):
    m = MEMBERS.assign(surname=["Nan", "Null", "NA", "Smith", "Jones", "Lee"])
    df = load_members(write_csv(tmp_path / "m.csv", m))
    assert list(df["member_id"]) == list(m["member_id"])
    assert list(df["surname"]) == ["Nan", "Null", "NA", "Smith", "Jones", "Lee"]  # never read as missing
    assert df.loc[4, "zip"] == ""
    pq_path = tmp_path / "m.parquet"
    m.assign(member_id=[7, 8, 9, 10, 11, 12], zip=[60614, 601, 2134, 20001, None, 2134]).to_parquet(pq_path)
    dfp = load_members(pq_path)
    assert list(dfp["member_id"]) == ["7", "8", "9", "10", "11", "12"]
    assert dfp.loc[1, "zip"] == "601"


def test_missing_file_and_columns(tmp_path):
    e = err(load_members, tmp_path / "nope.csv")
    assert "file not found" in str(e) and e.file.endswith("nope.csv")
    e = err(load_members, write_csv(tmp_path / "a.csv", MEMBERS.rename(columns={"surname": "surnme"})))
    assert e.column == "surname" and "found 'surnme': misspelt?" in str(e)
    e = err(load_members, write_csv(tmp_path / "b.csv", MEMBERS.assign(optout="1")))
    assert e.column == "optout" and "did you mean 'opt_out'" in str(e)  # refused, not ignored
    e = err(load_members, write_csv(tmp_path / "c.csv", MEMBERS.iloc[:0]))
    assert "no data rows" in str(e)
    (tmp_path / "d.xlsx").write_text("x")
    assert "unknown type" in str(err(load_members, tmp_path / "d.xlsx"))
    # Header case and spaces do not matter; unrelated extra columns are ignored.
    df = load_members(write_csv(tmp_path / "e.csv", MEMBERS.rename(columns={"zip": " ZIP "}).assign(notes="x")))
    assert list(df.columns) == ["member_id", "surname", "zip"]


def test_bad_rows_are_named(tmp_path):
    m = MEMBERS.copy()
    m.loc[3, "surname"] = "   "
    e = err(load_members, write_csv(tmp_path / "a.csv", m))
    assert (e.column, e.row) == ("surname", 4) and "empty" in str(e)
    m = MEMBERS.copy()
    m.loc[2, "surname"] = "1234"
    e = err(load_members, write_csv(tmp_path / "b.csv", m))
    assert (e.column, e.row) == ("surname", 3) and "no letters" in str(e)
    m = MEMBERS.copy()
    m.loc[4, "member_id"] = "007"
    e = err(load_members, write_csv(tmp_path / "c.csv", m))
    assert (e.column, e.row) == ("member_id", 5) and "the same as data row 1" in str(e) and "007" not in str(e)
    m = MEMBERS.copy()
    m.loc[1, "member_id"] = ""
    e = err(load_members, write_csv(tmp_path / "d.csv", m))
    assert (e.column, e.row) == ("member_id", 2)
    m = MEMBERS.assign(opt_out=["", "", "maybe", "", "", ""])
    path = write_csv(tmp_path / "e.csv", m)
    e = err(load_members, path)
    assert str(e) == f"file {path}, column 'opt_out', data row 3: must be blank, 0/1, true/false or yes/no"
    # The same check on the Arrow table that `ppre bisg` validates (no pandas).
    table = read_members_table(path)
    e = err(validate_members, table, str(path))
    assert str(e) == f"file {path}, column 'opt_out', data row 3: must be blank, 0/1, true/false or yes/no"
    validate_members(read_members_table(write_csv(tmp_path / "e2.csv", MEMBERS.assign(opt_out=["1", "no"] * 3))),
                     "e2.csv")
    raw = "member_id,surname,zip\n1,Smith,60614\n2,Garc\xeda,00601\n".encode("latin-1")
    (tmp_path / "f.csv").write_bytes(raw)
    e = err(load_members, tmp_path / "f.csv")
    assert e.row == 2 and "UTF-8" in str(e) and "line 3" in str(e)
    (tmp_path / "g.csv").write_text("member_id,surname,zip\n1,Smith,60614\n2,Jones\n")
    e = err(load_members, tmp_path / "g.csv")
    assert "fields" in str(e) and e.row == 2 and "Jones" not in str(e)


def test_messages_never_contain_member_data(tmp_path):
    m = MEMBERS.copy()
    m.loc[5, "member_id"] = "008"
    e = err(load_members, write_csv(tmp_path / "a.csv", m))
    for secret in ("008", "O'Brien", "Garcia"):
        assert secret not in str(e)


def test_self_id_file(tmp_path):
    members = write_csv(tmp_path / "m.csv", MEMBERS)
    ok = write_csv(tmp_path / "s.csv", pd.DataFrame({"member_id": ["007", "012"], "race": ["White", " aian "]}))
    assert read_self_id(ok)["member_id"].tolist() == ["007", "012"]
    assert prepare_files(members, ok).attrs["preparation"].self_id_used == 2
    bad_race = pd.DataFrame({"member_id": ["007", "008"], "race": ["white", "Martian-ish"]})
    e = err(prepare_files, members, write_csv(tmp_path / "s2.csv", bad_race))
    assert str(e) == (f"file {tmp_path / 's2.csv'}, column 'race', data row 2: unknown race label; "
                      "expected one of white, black, api, aian, multiple, hispanic")
    unknown = pd.DataFrame({"member_id": ["007", "555"], "race": ["white", "black"]})
    stats = prepare_files(members, write_csv(tmp_path / "s3.csv", unknown)).attrs["preparation"]
    assert (stats.self_id_used, stats.self_id_not_among_members) == (1, 1)
    dup = pd.DataFrame({"member_id": ["007", "007"], "race": ["white", "black"]})
    e = err(prepare_files, members, write_csv(tmp_path / "s4.csv", dup))
    assert (e.column, e.row) == ("member_id", 2) and "the same as data row 1" in str(e)
    e = err(read_self_id, write_csv(tmp_path / "s5.csv", pd.DataFrame({"member_id": ["1"], "rase": ["white"]})))
    assert e.column == "race" and "found 'rase': misspelt?" in str(e)


# --- group mapping ------------------------------------------------------------------
def test_group_mapping():
    g = GroupMapping.parse(" hsm = black + Hispanic + aian , non_hsm=white+api+multiple")
    assert g.names == ("hsm", "non_hsm")
    p = np.array([[0.1, 0.2, 0.3, 0.05, 0.15, 0.2]])
    np.testing.assert_allclose(g.apply(p), [[0.45, 0.55]])
    assert str(GroupMapping.parse(str(g))) == str(g)
    assert GroupMapping.from_dict({"a": ["white"], "b": ["black", "api", "native", "multiple", "hispanic"]}).names == ("a", "b")


@pytest.mark.parametrize("text,words", [
    ("hsm=black+hispanic+aian,non_hsm=white+api+martian", "unknown category"),
    ("hsm=black+hispanic+aian,non_hsm=white+api+multiple+black", "in both"),
    ("hsm=black+black+hispanic+aian,non_hsm=white+api+multiple", "twice"),
    ("hsm=black+hispanic,non_hsm=white+api+multiple", "aian"),
    ("hsm=black+hispanic+aian,hsm=white+api+multiple", "defined twice"),
    ("hsm black", "name=category"),
    ("", "empty"),
    ("hsm=black+hispanic+aian,,non_hsm=white+api+multiple", "empty group"),
])
def test_group_mapping_errors(text, words):
    e = err(GroupMapping.parse, text)
    assert e.parameter == "group mapping" and words in str(e)


def test_duplicate_header(tmp_path):
    (tmp_path / "a.csv").write_text("member_id,surname,zip,ZIP\n1,Smith,60614,60614\n")
    assert "more than once" in str(err(load_members, tmp_path / "a.csv"))
    (tmp_path / "b.csv").write_text("member_id,surname,zip\n")
    assert "no data rows" in str(err(load_members, tmp_path / "b.csv"))
    (tmp_path / "c.csv").write_text("")
    assert "empty" in str(err(load_members, tmp_path / "c.csv"))
