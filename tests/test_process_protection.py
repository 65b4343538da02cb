"""Every entry point that holds member data runs protected: no core dump, not dumpable
(`common.execution.memory.protect_process`; design §7). Each test runs the entry point as a fresh
process on small inputs and reads its state from inside it (tests/protection.py) at each
open of an input file and at exit; without the `protect_process` call the process stays
dumpable and the test fails."""
from __future__ import annotations

import pytest

from tests.helpers import write_inputs
from tests.protection import run_cli, run_protected


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    """`ppre synth`'s files (members, Self-ID, outputs), made under the hook."""
    out = tmp_path_factory.mktemp("protection-synth")
    run = run_cli(["synth", "--members", "400", "--seed", "23", "--out", str(out / "s")], cwd=out)
    return out / "s", run


def _assert_protected(run, *, opened: bool = True):
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.protected, run.notes
    if opened:
        assert run.opened, run.notes  # it did read the members' data while protected


def test_synth_is_protected(population):
    _assert_protected(population[1], opened=False)


def test_bisg_is_protected(population, tmp_path):
    root, _ = population
    run = run_cli(["bisg", "--input", str(root / "members.csv"), "--output", str(tmp_path / "p.csv")],
                  cwd=tmp_path, watch=[root / "members.csv"])
    _assert_protected(run, opened=False)  # it reads through Arrow, out of the audit hook's sight
    assert (tmp_path / "p.csv").is_file()


def test_validate_bisg_is_protected(population, tmp_path):
    root, _ = population
    run = run_cli(["tester", "validate-bisg", "--members", str(root / "members.csv"),
                   "--self-id", str(root / "self_id.csv"), "--min-bin-count", "1"],
                  cwd=tmp_path, watch=[root / "members.csv", root / "self_id.csv"])
    _assert_protected(run, opened=False)


@pytest.mark.slow
def test_local_audit_is_protected(tmp_path):
    _, _, tp, cp = write_inputs(tmp_path, 150, 120, seed=23)
    run = run_cli(["audit", "--local", "--metric", "ero", "--tester-probabilities", str(tp), "--client-data",
                   str(cp), "--bootstrap", "10", "--privacy-ledger", str(tmp_path / "ledger.json"), "--insecure",
                   "--history", "none", "--executor", "inline", "--json"], cwd=tmp_path, watch=[tp, cp])
    _assert_protected(run)


@pytest.mark.slow
def test_demo_is_protected(tmp_path):
    run = run_cli(["demo", "--members", "1500", "--bootstrap", "10", "--insecure", "--executor", "inline"],
                  cwd=tmp_path)
    _assert_protected(run, opened=False)  # its population is drawn in memory and written to a temporary directory


API = '''
import sys
from ppre import audit_local
result = audit_local(client_data=sys.argv[2], probabilities=sys.argv[1], metric="ero", bootstrap=10,
                     privacy_ledger=sys.argv[3], history=False)
print(result.n_matched)
'''


@pytest.mark.slow
def test_python_api_is_protected(tmp_path):
    _, _, tp, cp = write_inputs(tmp_path, 150, 120, seed=23)
    run = run_protected(API, [str(tp), str(cp), str(tmp_path / "ledger.json")], cwd=tmp_path, watch=[tp, cp])
    _assert_protected(run)
    assert run.stdout.strip() == "120"
