"""The suite's work units under `-n 2 --dist loadfile` (tests/conftest.py): a file is one
unit unless a test is one of `OWN_UNITS`, units run longest first by their `cost` marks,
and a run without workers keeps the collection's order."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import OWN_UNITS, unit_of

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

MODULES = {
    "test_a.py": """
def test_a1(): pass
def test_a2(): pass
""",
    "test_b.py": """
import pytest
pytestmark = pytest.mark.cost(50)
def test_b1(): pass
@pytest.mark.cost(500)
def test_b2(): pass
def test_b3(): pass
""",
    "test_c.py": """
import pytest
@pytest.mark.cost(20)
def test_c1(): pass
@pytest.mark.cost(60)
def test_c2(): pass
""",
    "test_0.py": """
def test_01(): pass
""",
}


@pytest.fixture()
def project(pytester):
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems, pytest_xdist_make_scheduler"
                          "  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    cost(seconds): x\n")
    for name, text in MODULES.items():
        pytester.makepyfile(**{name[:-3]: text})
    return pytester


def run_order(project, *args) -> list[str]:
    result = project.runpytest("-v", "-p", "xdist", *args)
    result.assert_outcomes(passed=8)
    return [m.group(1) or m.group(2) for line in result.outlines
            if (m := re.search(r"^(\S+::\S+) PASSED|PASSED (\S+::\S+)", line))]


def test_one_worker_runs_the_units_longest_first_and_a_file_together(project):
    assert run_order(project, "-n", "1", "--dist", "loadfile") == [
        "test_b.py::test_b1", "test_b.py::test_b2", "test_b.py::test_b3",  # 500 + its pytestmark's 50
        "test_c.py::test_c1", "test_c.py::test_c2",                          # 80
        "test_a.py::test_a1", "test_a.py::test_a2",                          # unmarked: last
        "test_0.py::test_01",                                                # collected first, fewer tests
    ]


def test_without_workers_the_order_is_the_collections(project):
    assert run_order(project) == ["test_0.py::test_01", "test_a.py::test_a1", "test_a.py::test_a2", "test_b.py::test_b1",
                                  "test_b.py::test_b2", "test_b.py::test_b3", "test_c.py::test_c1",
                                  "test_c.py::test_c2"]


def test_the_listed_long_tests_are_units_of_their_own_and_the_rest_their_files():
    pair = "tests/test_utility_bar.py::test_the_defaults_keep_every_large_group_within_001_of_the_noiseless_estimate"
    assert unit_of(f"{pair}[lot]") == f"{pair}[lot]" != unit_of(f"{pair}[pot]")
    assert unit_of("tests/test_utility_bar.py::test_at_1000_members_no_metric_shows_a_green_finding_it_could_not_have_seen"
                   "[lot]") == "tests/test_utility_bar.py"
    assert unit_of("tests/test_faults.py::test_soak_audits_do_not_grow_memory_fds_or_threads[60]") != "tests/test_faults.py"
    assert unit_of("tests/test_faults.py::test_tester_killed_mid_audit") == "tests/test_faults.py"
    assert len(OWN_UNITS) == 2


def test_every_listed_unit_names_a_test_that_exists():
    """An `OWN_UNITS` entry left behind by a renamed test would quietly stop splitting it."""
    for prefix in OWN_UNITS:
        path, name = prefix.split("::")
        assert f"def {name.rstrip('[')}" in (ROOT / path).read_text(), prefix
