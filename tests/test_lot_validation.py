"""The paper's LOT validation via synthetic data (section 8.2.1, Table 5), end to end.

40,000 queries of 10 ranks, every position a different member (400,000 members); the
Tester's hsm/non_hsm probabilities are drawn independently of the outcomes (hsm ~ U(0, 1),
non_hsm = 1 − hsm); the relevance at rank r+1 is the one at rank r minus Table 5's gap plus
N(0, 1e-2) noise (`tests.metric_data.lot_validation_data`). Under independence every
group-pair cell of rank pair r-(r+1) estimates that gap, so the audit (metric `lot`,
option `raw`, B = 1000, both services as real gRPC servers on loopback) must find:

* every per-rank-pair cell, both directed cells (hsm>non_hsm and non_hsm>hsm) and the
  same-group cells (`same_group_pairs=true`), within the paper's 3e-4 of its gap;
* bootstrap standard deviations ((ci_high − ci_low) / 3.92 for the 95% percentile
  interval) of order 1e-4: between 1e-5 and 5e-4 (the paper reports about 1.5e-4; the
  noise of 1e-2 gives about 7e-5, so that 18 or 36 cells stay within 3e-4 with a wide
  margin, where the paper's implied noise of 2e-2 would put the largest error near it);
* a significant verdict (rule "negative_cells"): exactly the cells of the five negative
  gaps are significantly below 0, the most negative being rank pair 5-6 (−0.43).

Sizes: the paper's 40,000 queries are the `long` tier's; the suite runs the same checks on
4,000 queries (40,000 members), with the tolerance and the standard deviations' bounds
scaled by sqrt(40,000 / queries), as the estimates' errors scale (`Size`).

Key size: with production 2048-bit Paillier the full-size audit takes 204-215 s on an
idle 2-core machine, 265 s with the same-group cells, and 420 s when other work shares
the cores (bench/bench_lot.py, bench/RESULTS.md): at or over this test's ~5 minute
budget. So the test runs with `TEST_BITS` (1024-bit, `allow_insecure=True`; 150-190 s
on 2 cores): encodings, slot layout, masking, bootstrap and verdict are the same, only
the modulus differs; the 2048-bit validation is the benchmark's. Marked slow (CI runs
slow tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from client_service.datasets import DatasetRegistry
from common.stats.results import AuditReport
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS
from tests.metric_data import lot_validation_data

# the full-size audit runs once for the module (150-270 s on the 2-core machine): more than the
# default per-test limit leaves room for
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.cost(30)]

#: Table 5's ground-truth gaps, rank pairs 1-2 .. 9-10
GAPS = (0.12, 0.34, -0.27, 0.78, -0.43, -0.24, -0.29, 0.76, -0.41)
#: the declared range of the raw relevances (rank 1 in [2, 3], then Table 5's gaps)
RELEVANCE_RANGE = "0.5:3.5"
QUERIES = 40_000
SUITE_QUERIES = 4_000
BOOTSTRAP = 1000
BITS = TEST_BITS
TOLERANCE = 3e-4
MAX_SD = 5e-4
MIN_SD = 1e-5
Z95 = 3.92  # a 95% normal interval is 2 x 1.96 standard deviations wide
GROUPS = ("hsm", "non_hsm")


def validation_inputs(queries: int, seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the Tester's probability table, the Test-Client's ranked lists)."""
    rng = np.random.default_rng(seed)
    lists = lot_validation_data(queries, GAPS, rng, noise=1e-2)
    hsm = rng.uniform(0.0, 1.0, len(lists))
    probabilities = pd.DataFrame({"member_id": lists["member_id"].to_numpy(), "hsm": hsm, "non_hsm": 1.0 - hsm})
    return probabilities, lists


def run_validation(directory, queries: int = QUERIES, bootstrap: int = BOOTSTRAP, bits: int = BITS,
                   same_group_pairs: bool = True) -> AuditReport:
    probabilities, lists = validation_inputs(queries)
    path = directory / "lot.csv"
    lists.to_csv(path, index=False, float_format="%.17g")
    request = pb.AuditRequest(metric="lot", client_dataset="lot", bootstrap=bootstrap, confidence=0.95,
                              has_seed=True, seed=11, metric_option="raw",
                              metric_params={"same_group_pairs": "true" if same_group_pairs else "false",
                                             # the relevances' declared range (they lie in about
                                             # [1.0, 3.0]); a value outside is refused, never clipped
                                             "relevance_range": RELEVANCE_RANGE, "out_of_range": "refuse"})
    with local_services(lambda: probabilities, DatasetRegistry(named={"lot": path}),
                        modulus_bits=bits, allow_insecure=bits < 2048, release=NO_RELEASE_CONTROLS) as svc:
        event = run_audit(svc.tester_address, request)
    assert event.WhichOneof("event") == "result", f"{event.error.code}: {event.error.message}"
    return AuditReport.from_proto(event.result)


@dataclass(frozen=True)
class Size:
    """An audit's number of queries and the bounds at that size: the paper's at its
    40,000 queries, each error bound widened by sqrt(40,000 / queries)."""

    queries: int

    @property
    def factor(self) -> float:
        return math.sqrt(QUERIES / self.queries)

    @property
    def tolerance(self) -> float:
        return TOLERANCE * self.factor

    @property
    def max_sd(self) -> float:
        return MAX_SD * self.factor


@pytest.fixture(scope="module", params=[pytest.param(QUERIES, marks=[pytest.mark.long, pytest.mark.cost(300)],
                                                     id="40k-queries"),
                                        pytest.param(SUITE_QUERIES, id="4k-queries")])
def size(request) -> Size:
    return Size(request.param)


@pytest.fixture(scope="module")
def report(size, tmp_path_factory) -> AuditReport:
    return run_validation(tmp_path_factory.mktemp("lot_validation"), queries=size.queries)


def rank_pair_cells(report: AuditReport) -> dict[str, dict[tuple[str, str], object]]:
    cells: dict[str, dict[tuple[str, str], object]] = {}
    for c in report.cells:
        if c.rank_pair is not None:
            cells.setdefault(c.rank_pair, {})[(c.higher, c.lower)] = c
    return cells


def test_every_rank_pair_and_cell_is_reported(report, size):
    assert report.metric == "lot" and report.metric_option == "raw" and report.bootstrap == BOOTSTRAP
    assert report.info["queries"] == size.queries and report.info["pairs"] == size.queries * len(GAPS)
    assert report.n_matched == size.queries * len(GAPS)
    cells = rank_pair_cells(report)
    assert sorted(cells, key=lambda s: int(s.split("-")[0])) == [f"{r}-{r + 1}" for r in range(1, len(GAPS) + 1)]
    every = {(a, b) for a in GROUPS for b in GROUPS}
    for label, by_pair in cells.items():
        assert set(by_pair) == every, label
    pooled = [c for c in report.cells if c.rank_pair is None]
    assert {(c.higher, c.lower) for c in pooled} == every


def test_estimates_match_the_gaps_within_3e_4(report, size):
    cells = rank_pair_cells(report)
    errors = {}
    for r, gap in enumerate(GAPS, start=1):
        for (a, b), cell in cells[f"{r}-{r + 1}"].items():
            assert cell.estimate is not None, (r, a, b)
            errors[(f"{r}-{r + 1}", a, b)] = cell.estimate - gap
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= size.tolerance, f"{worst}: error {errors[worst]:+.2e} (all: {errors})"


def test_bootstrap_sd_is_small_and_intervals_cover_the_estimate(report, size):
    for label, by_pair in rank_pair_cells(report).items():
        for (a, b), cell in by_pair.items():
            assert cell.ci_low is not None and cell.ci_high is not None, (label, a, b)
            assert cell.ci_low <= cell.estimate <= cell.ci_high, (label, a, b)
            sd = (cell.ci_high - cell.ci_low) / Z95
            assert MIN_SD < sd < size.max_sd, (label, a, b, sd)


def test_pooled_cells_average_the_gaps(report):
    # every rank pair has the same number of rows and, in expectation, the same weight
    # sum, so the pooled cell is close to the plain mean of the gaps
    for c in report.cells:
        if c.rank_pair is None:
            assert c.estimate == pytest.approx(float(np.mean(GAPS)), abs=5e-3), c


def test_verdict_is_significant_on_the_negative_gaps(report, size):
    v = report.verdict
    assert v.rule == "negative_cells"
    assert v.significant and v.flagged and v.severity == "high", v.message
    negative = {f"{r}-{r + 1}" for r, gap in enumerate(GAPS, start=1) if gap < 0}
    expected = {f"{a}>{b}@{label}" for label in negative for a in GROUPS for b in GROUPS}
    assert set(v.significant_comparisons) == expected
    assert v.compared["label"].endswith("@5-6")
    assert v.compared["estimate"] == pytest.approx(-0.43, abs=size.tolerance)
