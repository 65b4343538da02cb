"""Verdicts that know what they can see (`common.stats.results`): ranges, informative flags,
the minimum detectable difference, "inconclusive", tables whose columns never run
together, and the bootstrap's null flag rate on `ppre synth`-like data
(`bench/bench_null.py`)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from common.metrics.base import Layout
from common.metrics.ero import METRIC as ERO
from common.races import RACES
from common.stats.results import (MIN_EFFECTIVE_SIZE, MIN_KISH_SIZE, AuditReport, SEVERITIES, finish, kish_sizes,
                            null_scaled, small_for_verdict)

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ["white", "black", "api", "aian", "multiple", "hispanic"]


def _values(estimates, sds, replicates=400, seed=0):
    est = np.asarray(estimates, dtype=np.float64)
    return np.vstack([est, est + np.random.default_rng(seed).normal(size=(replicates, est.size)) * np.asarray(sds)])


def _finish(values, interval="random_groups", **kwargs):
    plan = ERO.plan(GROUPS, (), Layout(64, 2, 2), "fpr", {}, {})
    return finish(ERO, plan, values, option="fpr", confidence=0.95, tau=0.05, params={}, info={},
                  replicates=values.shape[0] - 1, interval=interval, **kwargs)


def test_inconclusive_is_a_severity():
    assert "inconclusive" in SEVERITIES


def test_noised_rates_are_reported_inside_their_range_and_nan_never_reaches_a_message():
    est = [0.10, 1.20, -0.05, 0.10, np.nan, 0.10, 0.10]   # noise pushed black above 1, api below 0
    report = _finish(_values(est, [0.01, 0.5, 0.3, 0.01, 0.01, 0.01, 0.005], replicates=10))
    for g in report.groups:
        for x in (g.estimate, g.ci_low, g.ci_high):
            assert x is None or 0.0 <= x <= 1.0, g
    for d in report.differences:
        for x in (d.estimate, d.ci_low, d.ci_high):
            assert x is None or -1.0 <= x <= 1.0, d
    assert not report.group("black").informative and report.group("white").informative
    assert "nan" not in report.verdict.message.lower()
    again = AuditReport.from_json(report.to_json())
    assert again.group("white").informative and again.verdict.mdd == report.verdict.mdd


def test_no_disparity_only_when_a_gap_of_tau_was_detectable():
    sure = _finish(_values([0.1] * 7, [0.002] * 7, replicates=10))
    assert sure.verdict.severity == "none" and sure.verdict.mdd <= 0.05
    wide = _finish(_values([0.1] * 7, [0.002, 0.002, 0.002, 0.08, 0.002, 0.002, 0.002], replicates=10))
    v = wide.verdict
    assert v.severity == "inconclusive" and v.uninformative == ("aian",) and v.members_factor > 1
    assert "inconclusive at this size and privacy level" in v.message and "aian" in v.message
    assert v.compared is not None and "aian" not in v.compared["label"]  # compared among informative groups


def test_table_columns_never_run_together():
    est = [4898847.0, 0.99, 0.98, 0.97, 0.96, 0.95, 1.0]
    report = _finish(_values(est, [1e6, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01], replicates=10))
    lines = report.to_table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("group"))
    for line in lines[header + 1:header + 8]:
        cells = line.split()
        assert len(cells) == 5, line  # group, estimate, ci_low, ci_high, inf.


def test_kish_size_counts_the_rows_that_carry_a_group():
    one_hot = np.eye(3)[[0] * 300 + [1] * 299 + [2] * 5]
    assert kish_sizes(one_hot).tolist() == [300, 299, 5]
    assert small_for_verdict(one_hot, ["a", "b", "c"], "ero") == ["b", "c"] and MIN_KISH_SIZE == 300
    # the Kish rule is the rates' (a 0/1 event's variance); other metrics keep Σp below 30
    assert small_for_verdict(one_hot * 2.0, ["a", "b", "c"], "output", scale=2.0) == ["c"]
    thin = np.full((10_000, 1), 0.01)  # Σp = 100 spread over 10,000 rows
    few = np.r_[np.full(100, 0.9), np.full(9_900, 0.001)][:, None]  # Σp ≈ 100 carried by 100 rows
    assert kish_sizes(thin)[0] == pytest.approx(10_000) and kish_sizes(few)[0] < 130
    assert kish_sizes(np.zeros((4, 1)))[0] == 0 and small_for_verdict(np.zeros((4, 1)), ["e"], "ero") == ["e"]


def test_without_noise_the_verdict_tests_a_low_rate_at_the_overalls_spread():
    est = [0.10, 0.10, 0.10, 0.04, 0.12, 0.10, 0.10]
    values = _values(est, [0.002, 0.002, 0.002, 0.006, 0.002, 0.002, 0.001])
    index = {g: i for i, g in enumerate(GROUPS + ["overall"])}
    scaled = null_scaled(values, index, (0.0, 1.0))
    widened = np.std(scaled[1:, 3]) / np.std(values[1:, 3])
    assert widened == pytest.approx(math.sqrt(0.10 * 0.90 / (0.04 * 0.96)), rel=1e-9)
    others = [0, 1, 2, 4, 5, 6]  # at or above the overall's spread: as released
    assert np.array_equal(scaled[:, others], values[:, others]) and np.array_equal(scaled[0], values[0])
    assert null_scaled(values, index, None) is values
    plain = _finish(values, "percentile").verdict
    tested = _finish(values, "percentile", noisy=False).verdict
    assert plain.compared["label"] == tested.compared["label"] == "multiple - aian"
    width = lambda v: v.compared["band_high"] - v.compared["band_low"]  # noqa: E731
    assert width(tested) > 1.3 * width(plain)
    reported = _finish(values, "percentile", noisy=False).group("aian")
    assert (reported.ci_low, reported.ci_high) == (_finish(values, "percentile").group("aian").ci_low,
                                                   _finish(values, "percentile").group("aian").ci_high)


def test_a_group_left_out_for_its_size_rules_out_a_green_none_and_the_advice_follows_the_noise():
    values = _values([0.1] * 7, [0.002] * 7, replicates=10)
    assert _finish(values).verdict.severity == "none"
    v = _finish(values, small_groups=["aian"], noisy=False).verdict
    assert v.severity == "inconclusive" and v.excluded_groups == ("aian",) and not v.significant
    assert f"left out of the verdict (effective sample size below {MIN_KISH_SIZE:g}): aian" in v.message
    assert "rho" not in v.message and "or fewer groups (--group-mapping)" in v.message
    assert v.members_factor is None and "conclusive with more members or" in v.message  # not "1.0x as many"
    noisy = _finish(values, small_groups=["aian"], noisy=True).verdict
    assert "a larger privacy budget (rho)" in noisy.message and "noised effective size" in noisy.message
    assert "under the release controls" not in noisy.message
    alone = _finish(values, small_groups=[g for g in GROUPS if g != "white"], noisy=False).verdict
    assert alone.severity == "inconclusive" and "no two groups can be compared" in alone.message
    assert AuditReport.from_json(_finish(values, small_groups=["aian"]).to_json()).verdict.excluded_groups == ("aian",)


def test_the_report_page_says_why_groups_were_left_out():
    from dataclasses import replace
    from ppre.report import render_html
    report = _finish(_values([0.1] * 7, [0.002] * 7, replicates=10), small_groups=["aian"], noisy=False)
    report = replace(report, n_matched=10_000)
    page = render_html(replace(report, release={"controls": False}))
    assert "left out of the verdict (effective sample size below 300)" in page
    assert "privacy budget" not in page.split("Inconclusive at this size", 1)[1].split("</p>", 1)[0]
    noisy = render_html(replace(report, release={"controls": True, "rho": 0.2}))
    assert "noised effective size below 30" in noisy


def _one_hot_inputs(counts: dict[str, int], seed: int):
    from tests.helpers import make_inputs
    n = sum(counts.values())
    tester, client = make_inputs(n, n, n, seed=seed, one_hot=True)
    races = [g for g, c in counts.items() for _ in range(c)]
    tester[list(RACES)] = np.eye(len(RACES))[[RACES.index(g) for g in races]]
    return tester, client


def _header(seen):
    return next(m.aggregates_header for m in seen if m.WhichOneof("body") == "aggregates_header")


def test_the_tester_leaves_out_small_groups_by_kish_size_without_noise_and_by_noised_sizes_with_it():
    from tester_service.release import ReleasePolicy
    from tests.helpers import local_audit
    tester, client = _one_hot_inputs({"white": 600, "black": 320, "api": 299, "aian": 29, "multiple": 29,
                                      "hispanic": 29}, seed=5)
    seen: list = []
    report, _, _ = local_audit(tester, client, tap=lambda d, m: seen.append(m))
    assert list(_header(seen).small_groups) == ["api", "aian", "multiple", "hispanic"]
    assert set(report.verdict.excluded_groups) == {"api", "aian", "multiple", "hispanic"}
    assert report.verdict.severity == "inconclusive" and "rho" not in report.verdict.message
    # with noise: the noised sizes decide (exact ones, 29 < 30 here, never reach the Test-Client)
    seen = []
    report, _, _ = local_audit(tester, client, tap=lambda d, m: seen.append(m), release=ReleasePolicy())
    sizes = report.release["effective_sizes"]
    assert list(_header(seen).small_groups) == sorted(g for g, v in sizes.items() if v < MIN_EFFECTIVE_SIZE)
    if report.verdict.severity == "inconclusive":
        assert "a larger privacy budget (rho)" in report.verdict.message


@pytest.mark.slow
def test_null_flag_rate_of_the_bootstrap_verdict_is_not_above_nominal_at_10k():
    """`bench/bench_null.py` on 300 null datasets of 10,000 members (B = 500): the share
    flagged is at most 5% plus 3 Monte Carlo sd (8.8%); it was 12.6% before groups were
    left out by Kish size and tested at the overall's spread."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_null
    pool = bench_null.probability_pool(100_000)
    datasets = 300
    s = bench_null.summary(bench_null.run(pool, 10_000, datasets, 500, seed=3))
    assert s["rate"] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / datasets), s


def test_a_size_decided_below_the_minimum_is_never_shown_at_it(monkeypatch):
    """A noised effective size of 29.96 is below the minimum of 30 (the cell is withheld,
    the group left out): the report must not show it as 30.0 (sizes are cut to 0.1, not
    rounded), so that the sizes shown and the groups left out agree."""
    import tester_service.protocol as tester_protocol
    from tester_service.release import ReleasePolicy
    from tests.helpers import local_audit
    tester, client = _one_hot_inputs({"white": 600, "black": 320, "api": 300, "aian": 300, "multiple": 300,
                                      "hispanic": 30}, seed=6)
    monkeypatch.setattr(tester_protocol, "gaussian", lambda sigma: -0.04)
    seen: list = []
    report, _, _ = local_audit(tester, client, tap=lambda d, m: seen.append(m), release=ReleasePolicy())
    sizes = report.release["effective_sizes"]
    assert sizes["hispanic"] < MIN_EFFECTIVE_SIZE and "hispanic" in _header(seen).small_groups
    assert list(_header(seen).small_groups) == sorted(g for g, v in sizes.items() if v < MIN_EFFECTIVE_SIZE)


def test_random_group_bands_count_a_gap_and_its_reverse_as_one_test():
    """POT's family holds DTI a/b and b/a; Bonferroni over both would halve alpha for
    the same two-sided test (and a gap with an unrelated third column is two tests)."""
    from common.stats.results import distinct_tests, simultaneous_bands
    rng = np.random.default_rng(5)
    gap = rng.normal(0.0, 0.01, size=11)
    other = rng.normal(0.0, 0.01, size=11)
    one = simultaneous_bands(gap[:, None], 0.95, "random_groups")
    both = simultaneous_bands(np.column_stack([gap, -gap]), 0.95, "random_groups")
    assert distinct_tests(np.column_stack([gap, -gap])) == 1
    assert both[0][0] == pytest.approx(one[0][0]) and both[1][0] == pytest.approx(one[1][0])
    assert both[0][1] == pytest.approx(-one[1][0]) and both[1][1] == pytest.approx(-one[0][0])
    two = simultaneous_bands(np.column_stack([gap, -gap, other]), 0.95, "random_groups")
    assert distinct_tests(np.column_stack([gap, -gap, other])) == 2
    assert two[1][0] - two[0][0] > one[1][0] - one[0][0]  # two tests: a wider band than one
    gap_nan = gap.copy()
    gap_nan[3] = np.nan
    assert distinct_tests(np.column_stack([gap_nan, -gap_nan])) == 1


def test_the_advice_names_the_comparison_that_needs_the_most_members():
    """"About N× as many members" is the need of the widest comparison; the verdict says
    which one, so that a user sees it is one small group (and can merge it) rather than
    the whole audit."""
    sds = [0.002, 0.002, 0.002, 0.09, 0.002, 0.002, 0.002]  # aian far too wide to judge
    v = _finish(_values([0.1] * 7, sds, replicates=10)).verdict
    assert v.severity == "inconclusive" and "aian" in v.uninformative
    assert "as many; aian needs the most)" in v.message
    wide = _finish(_values([0.1] * 7, [0.02] * 7, replicates=10)).verdict  # every gap too wide: the MDD's
    assert wide.severity == "inconclusive" and " needs the most)" in wide.message


def test_a_band_wider_than_the_range_is_clipped_and_no_detectable_gap_is_invented():
    """Noise that swamps every group (sd 3 on rates in [0, 1]): the compared band stays
    inside the differences' range [-1, 1], and the verdict states no MDD beyond the largest
    possible gap nor a factor of members extrapolated from it (no "1,000,000x as many")."""
    values = _values([0.1] * 7, [3.0] * 7, replicates=400, seed=3)
    report = _finish(values, interval="percentile", noisy=True)
    v = report.verdict
    assert v.severity == "inconclusive" and v.compared is not None
    assert -1.0 <= v.compared["band_low"] <= v.compared["band_high"] <= 1.0
    assert v.mdd is None and v.compared["mdd"] is None and v.members_factor is None
    assert "no gap the metric can take (at most 1) is detectable" in v.message
    assert "x as many" not in v.message and "conclusive from about" not in report.to_table()
    # a band inside the range is reported as it is, with its MDD and factor
    calm = _finish(_values([0.1] * 7, [0.05] * 7, replicates=400, seed=3), interval="percentile", noisy=True).verdict
    assert calm.mdd is not None and 0.05 < calm.mdd < 1.0 and calm.members_factor > 1


def test_marginal_intervals_that_do_not_overlap_are_no_finding_when_nothing_is_significant():
    """Two groups whose marginal 95% intervals miss each other while their simultaneous band
    includes 0: the inconclusive verdict names them as marginal intervals that are not a
    finding; once the band excludes 0 they read as non-overlapping CIs beside the finding."""
    quiet = _finish(_values([0.1, 0.138, 0.1, 0.1, 0.1, 0.1, 0.1], [0.01] * 6 + [0.004], replicates=2000, seed=1),
                    interval="percentile", noisy=True).verdict
    assert quiet.severity == "inconclusive" and ("white", "black") in quiet.non_overlapping
    assert "group CIs that do not overlap (marginal intervals, not a finding" in quiet.message
    assert "non-overlapping group CIs" not in quiet.message
    found = _finish(_values([0.1, 0.145, 0.1, 0.1, 0.1, 0.1, 0.1], [0.01] * 6 + [0.004], replicates=2000, seed=1),
                    interval="percentile", noisy=True).verdict
    assert found.significant and "non-overlapping group CIs: white/black" in found.message


def test_below_overall_never_calls_an_excess_a_shortfall():
    """MQOS-AUC's rule compares overall − group: where every group lies above overall the
    most adverse difference is negative, and the verdict names it as the group closest to
    overall, not as a "shortfall" of a negative size."""
    from common.metrics.mqos_auc import EXACT
    plan = EXACT.plan(GROUPS, (), None, "exact", {}, {})
    values = _values([0.86, 0.87, 0.88, 0.86, 0.87, 0.865, 0.85], [0.004] * 7, replicates=400)
    report = finish(EXACT, plan, values, option="exact", confidence=0.95, tau=0.05, params={}, info={},
                    replicates=400, interval="percentile")
    v = report.verdict
    assert v.compared["estimate"] < 0 and "shortfall" not in v.message
    assert "group closest to overall (none lies below it), overall - white" in v.message
    below = finish(EXACT, plan, _values([0.80, 0.87, 0.88, 0.86, 0.87, 0.865, 0.85], [0.004] * 7, replicates=400),
                   option="exact", confidence=0.95, tau=0.05, params={}, info={}, replicates=400,
                   interval="percentile")
    assert "largest shortfall of a group below overall, overall - white = +0.0500" in below.verdict.message


def test_a_significant_gap_of_uncertain_size_says_so_and_under_noise_no_band_must_clear_tau():
    """Under release noise a comparison with an uninformative group counts at its band's
    level, so the verdict must not claim that such gaps were "compared only for gaps whose
    band clears tau" (a 1,000-member output audit said so beside a band from +0.02); and a
    severity read off the estimate (high) whose band reaches down into a milder one (low)
    says how small the band lets the gap be."""
    sds = [0.004, 0.1, 0.004, 0.004, 0.004, 0.004, 0.002]  # black far too wide to be informative
    values = _values([0.1, 0.4, 0.1, 0.1, 0.1, 0.1, 0.1], sds, replicates=2000, seed=4)
    v = _finish(values, interval="percentile", noisy=True).verdict
    assert v.significant and v.severity == "high" and "black" in v.uninformative
    assert "compared only for gaps whose band clears tau" not in v.message
    assert "not informative (interval half-width above 0.5 tau): black" in v.message
    low = v.compared["band_low"] if v.compared["estimate"] > 0 else -v.compared["band_high"]
    assert 0 < low < 0.05, v.compared
    assert f"the band allows a gap as small as {low:.4f} (low)" in v.message
    # without noise (strict significance) a gap with an uninformative group must clear tau
    # itself: this one's band does not, so it is no finding there
    plain = _finish(values, interval="percentile", noisy=False).verdict
    assert not plain.significant and plain.severity == "inconclusive"
    # a narrow band whose nearer end reads as the estimate does adds no such words
    sharp = _finish(_values([0.1, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1], [0.002] * 7, replicates=2000, seed=4),
                    interval="percentile", noisy=True).verdict
    assert sharp.severity == "high" and "as small as" not in sharp.message
