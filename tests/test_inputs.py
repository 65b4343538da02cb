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
    (b"member_id,white,black,api,aian,multiple,hispanic\n1,x,0,0,0,0,1\n", "column 'white', row 1: not a number"),
    (b"member_id,white,black,api,aian,multiple,hispanic\n,1,0,0,0,0,0\n", "row 1: empty member id"),
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

    assert ppre_main(["client", "serve", "--port", "0", "--dataset", "no-equals-sign"]) == 2
    assert "--dataset" in capsys.readouterr().err
    assert ppre_main(["audit", "--metric", "ero"]) == 2
    assert "--tester" in capsys.readouterr().err
    assert ppre_main(["audit", "--local", "--metric", "ero", "--client-data", "x.csv"]) == 2
    assert "--tester-probabilities" in capsys.readouterr().err
    monkeypatch.setenv("PPRE_WORKERS", "many")
    from common import parallel
    with pytest.raises(InputError, match="PPRE_WORKERS"):
        parallel.worker_count()
