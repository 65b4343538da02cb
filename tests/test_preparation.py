"""Tester preparation (SPEC.md section 2) and its input readers; group mappings (section 1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.errors import InputError
from common.races import RACES, GroupMapping
from tester_service.preparation import (PreparationConfig, load_members, load_self_id, prepare)

MEMBERS = pd.DataFrame({
    "member_id": ["007", "008", "009", "010", "011", "012"],
    "surname": ["Smith", "Garcia", "Nguyen", "Washington", "Zzqxw", "O'Brien"],
    "zip": ["60614", "00601", "02134", "20001", "", "2134"],
})


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    df.to_csv(path, index=False)
    return path


def err(fn, *a, **kw) -> InputError:
    with pytest.raises(InputError) as exc:
        fn(*a, **kw)
    return exc.value


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
    out = prepare(MEMBERS, None, PreparationConfig(seed=0))
    t = out.attrs["preparation"].threshold
    assert 0.5 <= t <= 0.99
    assert err(PreparationConfig, epsilon=0).parameter == "epsilon"
    assert err(PreparationConfig, threshold=1.0).parameter == "T"
    assert err(PreparationConfig, geo="county").parameter == "geo"
    assert err(prepare, MEMBERS, None, PreparationConfig(geo="tract")).parameter == "geo"
    assert err(prepare, MEMBERS, None, PreparationConfig(excluded_states=("IL",))).parameter == "excluded_states"
    assert err(prepare, MEMBERS, None, PreparationConfig(first_names=True)).parameter == "first_names"


def test_first_names_and_tract():
    m = MEMBERS.assign(first_name=["John", "Maria", "", "Zzq", "Ana", "Sean"],
                       tract=["17031070200", "", "25025000100", "", "", ""])
    out = prepare(m, None, PreparationConfig(seed=0, first_names=True, geo="tract"))
    assert len(out) == 6


def test_prepare_rejects_unknown_self_id():
    sid = pd.DataFrame({"member_id": ["007", "999"], "race": ["white", "white"]})
    e = err(prepare, MEMBERS, sid, PreparationConfig(seed=0))
    assert e.row == 2 and "999" not in str(e)


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
    assert "does not exist" in str(e) and e.file.endswith("nope.csv")
    e = err(load_members, write_csv(tmp_path / "a.csv", MEMBERS.rename(columns={"surname": "surnme"})))
    assert "surname" in str(e) and "did you mean 'surnme'" in str(e)
    e = err(load_members, write_csv(tmp_path / "b.csv", MEMBERS.assign(optout="1")))
    assert "optout" in str(e) and "opt_out" in str(e)  # a misspelt opt-out flag is refused, not ignored
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
    assert "rows 1 and 5" in str(e) and "007" not in str(e)
    m = MEMBERS.copy()
    m.loc[1, "member_id"] = ""
    e = err(load_members, write_csv(tmp_path / "d.csv", m))
    assert (e.column, e.row) == ("member_id", 2)
    m = MEMBERS.assign(opt_out=["", "", "maybe", "", "", ""])
    e = err(load_members, write_csv(tmp_path / "e.csv", m))
    assert (e.column, e.row) == ("opt_out", 3)
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


def test_load_self_id(tmp_path):
    members = load_members(write_csv(tmp_path / "m.csv", MEMBERS))
    ok = load_self_id(write_csv(tmp_path / "s.csv", pd.DataFrame({"member_id": ["007", "012"],
                                                                   "race": ["White", " aian "]})),
                      members["member_id"])
    assert list(ok["member_id"]) == ["007", "012"]
    bad_race = pd.DataFrame({"member_id": ["007", "008"], "race": ["white", "Martian-ish"]})
    e = err(load_self_id, write_csv(tmp_path / "s2.csv", bad_race), members["member_id"])
    assert (e.column, e.row) == ("race", 2) and "Martian" not in str(e)
    unknown = pd.DataFrame({"member_id": ["007", "555"], "race": ["white", "black"]})
    e = err(load_self_id, write_csv(tmp_path / "s3.csv", unknown), members["member_id"])
    assert (e.column, e.row) == ("member_id", 2) and "555" not in str(e)
    dup = pd.DataFrame({"member_id": ["007", "007"], "race": ["white", "black"]})
    assert "rows 1 and 2" in str(err(load_self_id, write_csv(tmp_path / "s4.csv", dup)))
    e = err(load_self_id, write_csv(tmp_path / "s5.csv", pd.DataFrame({"member_id": ["1"], "rase": ["white"]})))
    assert "did you mean 'rase'" in str(e)


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
