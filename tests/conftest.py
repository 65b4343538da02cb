"""What every test runs with, and how the suite is scheduled.

* Its own user data directory, so that `ppre audit --local`'s privacy ledger
  (`tester_service.release.local_ledger_path`) never carries budget from one test, or from
  the developer's own runs, into another.
* Test keys: `PPRE_TEST_KEY_BITS` (`common.crypto.paillier.test_key_bits`) is set for the
  whole run, so that every service and command a test starts, in this process or in a
  child, makes 1024-bit Paillier keys (`tests.helpers.TEST_BITS`) instead of paying 2048-bit
  key generation and arithmetic in each audit. A test that checks production keys unsets it
  (`monkeypatch.delenv`, or a child's environment without it).
* The `long` tier: tests marked `long` (the validations at production size: the utility
  bar at 100,000 members, 1,000,000 members, the paper's 400,000-row LOT validation, the
  200-audit soak) are skipped unless `--long` is given; each has a smaller version with
  the same assertions in the suite. Its command: docs/development.md.
* Under xdist, the work units (`unit_of`) run longest first (`pytest_xdist_make_scheduler`).
"""
from __future__ import annotations

import os

import pytest

from common.crypto import paillier
from tests.helpers import TEST_BITS

os.environ.setdefault(paillier.TEST_KEY_ENV, str(TEST_BITS))

LONG_TIER = "long tier: run with --long (docs/development.md, 'Running the tests')"


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked long (validations at production size)")


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


#: tests that are work units of their own under `--dist loadfile` (every nodeid that starts
#: so, each parametrisation apart): long and independent, they would hold one worker for
#: longer than the rest of the suite takes on the other
OWN_UNITS = (
    "tests/test_utility_bar.py::test_the_defaults_keep_every_large_group_within_001_of_the_noiseless_estimate[",
    "tests/test_faults.py::test_soak_",
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file (whose module fixtures are built once, on one
    worker), unless it is one of `OWN_UNITS`."""
    return nodeid if nodeid.startswith(OWN_UNITS) else _file_of(nodeid)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (the README's test command) with `OWN_UNITS` apart and the units
    in the order the workers collected them (`pytest_collection_modifyitems`: longest
    first by their `cost` marks)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` skip without `--long`. On an xdist worker: the work units
    (`unit_of`) longest first by their tests' `cost` marks, so that no long unit starts last
    and leaves the other worker idle; unmarked units after them, those with more tests first
    (xdist's own order). A run without workers keeps the collection's order."""
    if not config.getoption("--long", default=False):
        for item in items:
            if item.get_closest_marker("long") is not None:
                item.add_marker(pytest.mark.skip(reason=LONG_TIER))
    if not hasattr(config, "workerinput"):
        return
    items[:] = by_cost(items)


def by_cost(items: list) -> list:
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    cost = {name: _unit_cost(name, unit) for name, unit in units.items()}
    # then, as xdist orders units, those with more tests first (stable: ties keep the collection's order)
    order = sorted(units, key=lambda name: (-cost[name], -len(units[name])))
    return [item for name in order for item in units[name]]


def _unit_cost(name: str, unit: list) -> float:
    """Seconds of a work unit: its tests' own `cost` marks, and, for a file's own unit, the
    mark in the module's `pytestmark` (what its fixtures and unmarked tests take together).
    Tests that skip (the long tier without `--long`) cost nothing."""
    running = [item for item in unit if item.get_closest_marker("skip") is None]
    modules = {item.getparent(pytest.Module) for item in running if _file_of(item.nodeid) == name}
    return sum(float(mark.args[0]) for node in [*running, *modules] for mark in node.own_markers
               if mark.name == "cost")
