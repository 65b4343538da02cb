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


#: modules that read or hold member data, or take seconds to import under load: the
#: process is protected before the first of them is imported
HEAVY_IMPORTS = ("numpy", "pandas", "grpc", "common.crypto", "tester_service", "client_service")


def test_a_command_is_protected_before_it_imports_anything_that_reads_members(tmp_path):
    """`ppre/__init__.py` protects the process first: at the first import of numpy, pandas,
    grpc or the parties' code it is already protected (with the protection left to the
    command's own start, after its imports and argument parsing, the first notes fail)."""
    run = run_cli(["synth", "--members", "200", "--seed", "3", "--out", str(tmp_path / "s")], cwd=tmp_path,
                  env={"PROTECTION_IMPORTS": ",".join(HEAVY_IMPORTS)})
    assert run.returncode == 0, run.stderr
    assert {f"import {m}" for m in ("numpy", "pandas")} <= set(run.imported), run.notes
    assert run.protected, run.notes


def test_a_just_started_command_has_core_dumps_off_within_its_first_second(tmp_path):
    """Read from outside, as an operator would (/proc/PID/limits), while `ppre synth`
    starts: its core-size limit is 0 before the process is a second old (its age from
    /proc/PID/stat, so the test's own scheduling does not count)."""
    import os
    import subprocess
    import time

    from tests.processes import child_env, ppre_argv
    proc = subprocess.Popen([*ppre_argv(), "synth", "--members", "20000", "--seed", "3", "--out", str(tmp_path / "s")],
                            cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ticks = os.sysconf("SC_CLK_TCK")
    age_when_off = None
    try:
        while proc.poll() is None and age_when_off is None:
            try:
                limits = open(f"/proc/{proc.pid}/limits").read()
                started = int(open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
            except OSError:
                break
            age = float(open("/proc/uptime").read().split()[0]) - started
            core = next(line for line in limits.splitlines() if line.startswith("Max core file size"))
            if core.split()[4] == "0":
                age_when_off = age
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    assert age_when_off is not None and age_when_off < 1.0, age_when_off
