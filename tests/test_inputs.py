"""The parties' input files: CSV and Parquet, and errors that name the place."""
from __future__ import annotations

import pandas as pd
import pytest

from client_service.datasets import DatasetRegistry
from common.errors import InputError
from common.metrics.ero import METRIC as ERO
from tester_service.inputs import read_probability_table
from tests.helpers import make_inputs


def test_parquet_and_csv_give_the_same_tables(tmp_path):
    tester, client = make_inputs(50, 50, 20)
    tester.to_parquet(tmp_path / "p.parquet")
    tester.to_csv(tmp_path / "p.csv", index=False)
    a, b = read_probability_table(tmp_path / "p.parquet"), read_probability_table(tmp_path / "p.csv")
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12)
    client.to_parquet(tmp_path / "ero.parquet")
    frame = DatasetRegistry(tmp_path).load("ero", ERO)
    assert list(frame.member_id) == list(client.member_id)


def test_member_ids_stay_strings(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("member_id,white,black,api,aian,multiple,hispanic\n007,1,0,0,0,0,0\n7,0,1,0,0,0,0\n")
    frame = read_probability_table(path)
    assert list(frame.member_id) == ["007", "7"]  # not merged as the number 7


@pytest.mark.parametrize("content, match", [
    (b"", r"is empty \(0 bytes\)"),
    (b"member_id,white\n1,1\n", "column 'black'"),
    (b"member_id,white,black,api,aian,multiple,hispanic\n", "has no data rows"),
    (b"member_id,white,black,api,aian,multiple,hispanic\n1,x,0,0,0,0,1\n", "column 'white', data row 1: not a number"),
    (b"member_id,white,black,api,aian,multiple,hispanic\n,1,0,0,0,0,0\n", "data row 1: empty member id"),
    (b"member_id,white,black,api,aian,multiple,hispanic\n\xff\xfe,1,0,0,0,0,0\n", "UTF-8"),
])
def test_bad_probability_files(tmp_path, content, match):
    path = tmp_path / "p.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=match) as info:
        read_probability_table(path)
    assert str(path) in str(info.value)


def test_dataset_names_are_checked(tmp_path):
    registry = DatasetRegistry(tmp_path)
    with pytest.raises(InputError, match="letters, digits"):
        registry.path("../etc/passwd")
    with pytest.raises(InputError, match="unknown dataset 'nope'"):
        registry.path("nope")


def test_cli_flags_with_bad_values_are_named(capsys, monkeypatch):
    from ppre.cli import main as ppre_main

    assert ppre_main(["client", "serve", "--insecure", "--port", "0", "--dataset", "no-equals-sign"]) == 2
    assert "--dataset" in capsys.readouterr().err
    assert ppre_main(["audit", "--metric", "ero"]) == 2
    assert "--tester" in capsys.readouterr().err
    assert ppre_main(["audit", "--local", "--metric", "ero", "--client-data", "x.csv"]) == 2
    assert "--tester-probabilities" in capsys.readouterr().err
    monkeypatch.setenv("PPRE_WORKERS", "many")
    from common.execution import parallel
    with pytest.raises(InputError, match="PPRE_WORKERS"):
        parallel.worker_count()


def test_a_probability_table_may_carry_any_group_columns(tmp_path):
    """A split made elsewhere (member_id, hsm, non_hsm) is used as given, in its column order."""
    path = tmp_path / "p.csv"
    path.write_text("member_id,HSM,non_hsm\na,0.25,0.75\nb,1,0\n")
    frame = read_probability_table(path)
    assert list(frame.columns) == ["member_id", "hsm", "non_hsm"]
    assert frame.hsm.tolist() == [0.25, 1.0]
    path.write_text("member_id,hsm,non_hsm\na,0.25,0.7\n")
    with pytest.raises(InputError, match="sum to 1"):
        read_probability_table(path)
    path.write_text("member_id,overall,rest\na,0.25,0.75\n")
    with pytest.raises(InputError, match="reserved") as info:
        read_probability_table(path)
    assert info.value.column == "overall"
    path.write_text("member_id\na\n")
    with pytest.raises(InputError, match="no group columns"):
        read_probability_table(path)


def test_the_group_mapping_coarsens_a_prepared_race_table(tmp_path):
    from common.races import RACES, GroupMapping
    tester, _ = make_inputs(40, 40, 10, seed=3)
    path = tmp_path / "p.csv"
    tester.to_csv(path, index=False)
    mapping = GroupMapping.parse("hsm=black+hispanic+aian,non_hsm=white+api+multiple")
    coarse = read_probability_table(path, mapping)
    assert list(coarse.columns) == ["member_id", "hsm", "non_hsm"]
    expected = tester[["black", "hispanic", "aian"]].sum(axis=1).to_numpy()
    assert abs(coarse.hsm.to_numpy() - expected).max() < 1e-12
    assert abs(coarse[["hsm", "non_hsm"]].sum(axis=1) - 1).max() < 1e-9
    assert list(read_probability_table(path).columns) == ["member_id", *RACES]
    # a table of other groups cannot be mapped from races
    other = tmp_path / "o.csv"
    other.write_text("member_id,hsm,non_hsm\na,0.25,0.75\n")
    with pytest.raises(InputError, match="six race columns"):
        read_probability_table(other, mapping)
    with pytest.raises(InputError, match="reserved"):
        GroupMapping.parse("overall=black+hispanic+aian,rest=white+api+multiple")
