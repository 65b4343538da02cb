"""Verdicts that know what they can see (`common.stats.verdict`): ranges, informative flags,
the minimum detectable difference, "inconclusive", tables whose columns never run
together, and the bootstrap's null flag rate on `ppre synth`-like data
(`bench/bench_null.py`). Which groups take part in the verdict (informative ones; a
bounded group's half-width judged at the overall's spread), when a comparison with an
uninformative group counts, which significant comparison gives the severity, and the
simultaneous band's flag rate on null families at most the nominal rate."""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from common.metrics.base import Layout
from common.metrics.ero import METRIC as ERO
from common.races import RACES
from common.stats.intervals import null_scaled
from common.stats.left_out import MIN_EFFECTIVE_SIZE, MIN_KISH_SIZE, kish_sizes, small_for_verdict
from common.stats.results import AuditReport, finish
from common.stats.verdict import SEVERITIES
from ppre.report.text import render_text

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
    lines = render_text(report).splitlines()
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
    from common.stats.intervals import distinct_tests, simultaneous_bands
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
    # every group informative, but a gap's band reaches tau: no equivalence, the widest one's need
    wide = _finish(_values([0.1, 0.12, 0.1, 0.1, 0.1, 0.1, 0.1], [0.022] * 7, replicates=10)).verdict
    assert wide.severity == "inconclusive" and not wide.uninformative and wide.equivalent is False
    assert " needs the most)" in wide.message and "not ruled out" in wide.message


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
    assert "x as many" not in v.message and "conclusive from about" not in render_text(report)
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


# ---------------------------------------------------------------- who takes part, which comparison decides
def test_a_group_is_informative_when_its_half_width_is_at_most_half_tau():
    from common.stats.intervals import INFORMATIVE_SHARE, is_informative
    tau = 0.05
    edge = INFORMATIVE_SHARE * tau
    assert is_informative(0.1, 0.1 + 2 * edge, tau)
    assert not is_informative(0.1, 0.1 + 2 * edge + 1e-6, tau)
    assert not is_informative(None, 0.2, tau) and not is_informative(0.1, None, tau)
    assert not is_informative(float("nan"), 0.2, tau)


def test_only_informative_groups_of_an_unbounded_metric_take_part_in_the_verdict():
    """Without bounds, `_eligible` follows the group's informative flag and half-width:
    a wide (uninformative) group never takes part, a narrow one does, and a group
    missing its estimate or either end of its interval never does."""
    from common.stats.results import GroupResult
    from common.stats.verdict import _eligible
    tau = 0.05
    narrow = GroupResult("a", 0.3, 0.29, 0.31, informative=True)
    wide = GroupResult("b", 0.3, 0.1, 0.5, informative=False)
    overall = GroupResult("overall", 0.3, 0.295, 0.305, informative=True)
    assert _eligible(narrow, overall, None, tau)
    assert not _eligible(wide, overall, None, tau)
    assert not _eligible(dataclasses.replace(narrow, informative=False), overall, None, tau)
    for missing in ("estimate", "ci_low", "ci_high"):
        assert not _eligible(dataclasses.replace(narrow, **{missing: None}), overall, None, tau), missing
        assert not _eligible(dataclasses.replace(narrow, **{missing: None}), overall, (0.0, 1.0), tau), missing


def _eligible_by_the_docs(g, overall, bounds, tau) -> bool:
    """`_eligible` as its docstring states it, written independently."""
    import math
    if g.estimate is None or g.ci_low is None or g.ci_high is None:
        return False
    if bounds is None and not g.informative:
        return False
    half = (g.ci_high - g.ci_low) / 2
    if bounds is not None and overall is not None and overall.estimate is not None:
        lo, hi = bounds
        own = (g.estimate - lo) * (hi - g.estimate)
        if own <= 0:
            return False
        half = half * math.sqrt((overall.estimate - lo) * (hi - overall.estimate) / own)
    return half <= 0.5 * tau + 1e-12


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (0.2, 1.2), (-1.0, 1.0), None])
def test_a_bounded_groups_half_width_is_judged_at_the_overalls_spread(bounds):
    """A rate near a bound has a narrow interval because of where it sits, not because
    it is well measured: its half-width is rescaled from its own spread (x − lo)(hi − x)
    to the overall's before it is compared with half of tau. Checked against the rule
    written out independently, for groups and overalls on both sides of the threshold
    (and without an overall, or without bounds, no rescaling)."""
    import numpy as np
    from common.stats.results import GroupResult
    from common.stats.verdict import _eligible
    tau = 0.05
    lo, hi = bounds if bounds is not None else (0.0, 1.0)
    rng = np.random.default_rng(44)
    agree = decided = 0
    for _ in range(400):
        x, o = lo + (hi - lo) * rng.uniform(0.01, 0.99, 2)
        half = 0.5 * tau * rng.uniform(0.3, 2.5)
        g = GroupResult("g", float(x), float(x - half), float(x + half), informative=bool(rng.random() < 0.5))
        overall = None if rng.random() < 0.1 else GroupResult("overall", float(o), float(o) - 0.01, float(o) + 0.01)
        expected = _eligible_by_the_docs(g, overall, bounds, tau)
        assert _eligible(g, overall, bounds, tau) == expected, (g, overall, bounds)
        agree += 1
        decided += expected
    assert 0 < decided < agree  # both outcomes occur
    if bounds is not None:  # at a bound a group is never eligible
        edge = GroupResult("e", lo, lo, lo + 0.001, informative=True)
        assert not _eligible(edge, GroupResult("overall", (lo + hi) / 2, 0.0, 0.0), bounds, tau)


@pytest.mark.parametrize("rule, below_tau, beyond_tau", [
    ("range", 0.03, 0.10), ("below_overall", 0.03, 0.10), ("negative_cells", -0.03, -0.10),
    ("nonzero_pairs", -0.03, -0.10), ("nonzero_pairs", 0.03, 0.10)])
def test_a_comparison_with_an_uninformative_group_counts_only_when_its_band_clears_tau(rule, below_tau, beyond_tau):
    """Without release noise (`strict_significance`), a comparison involving a group left
    out as not informative is significant only when its whole band lies beyond tau; a
    gap whose band excludes 0 but not tau does not count (its interval may under-cover)."""
    from common.stats.verdict import verdict_from
    tau, sure = 0.05, [0.002]
    v = verdict_from(rule, ["a - b"], _values([below_tau], sure), 0.95, "percentile", tau)
    assert v.significant and v.severity == "low"  # a full member of the family: counts
    v = verdict_from(rule, ["a - b"], _values([below_tau], sure), 0.95, "percentile", tau, strict=[True])
    assert not v.significant and v.severity not in ("low", "moderate", "high"), v
    v = verdict_from(rule, ["a - b"], _values([beyond_tau], sure), 0.95, "percentile", tau, strict=[True])
    assert v.significant and v.severity == "high"
    v = verdict_from(rule, ["a - b"], _values([below_tau], sure), 0.95, "percentile", tau, strict=[True],
                     strict_significance=False)
    assert v.significant and v.severity == "low"  # with release noise: compared like the others


def test_no_green_none_when_a_judged_difference_has_no_band():
    """"none" needs every judged difference to have a defined band and a detectable gap
    of tau among the informative groups' comparisons: a difference without a band (too
    few defined replicates) beside a comparison with a group left out as not informative
    leaves the audit inconclusive."""
    import numpy as np
    from common.stats.verdict import verdict_from
    values = _values([0.0, 0.005], [0.004, 0.004])
    values[1:, 0] = np.nan  # no defined replicate: no band
    v = verdict_from("range", ["no band", "with an uninformative group"], values, 0.95, "percentile", 0.05,
                     strict=[False, True])
    assert v.severity == "inconclusive" and v.mdd is None, v


def test_the_severity_comes_from_the_informative_groups_significant_comparison_first():
    """Among significant comparisons, those between informative groups are picked first
    and give the severity; a larger gap that is not significant never does; only
    without such a comparison does one with an uninformative group (clearing tau) count."""
    from common.stats.verdict import verdict_from
    tau, sd = 0.05, 0.002
    labels = ["informative, low", "uninformative, beyond tau", "informative, not significant"]
    values = _values([0.03, 0.12, 0.2], [sd, sd, 0.3])
    v = verdict_from("range", labels, values, 0.95, "percentile", tau, strict=[False, True, False])
    assert v.compared["label"] == labels[0] and v.severity == "low" and not v.flagged, v
    assert set(v.significant_comparisons) == set(labels[:2])
    values = _values([0.005, 0.12], [0.004, sd])
    v = verdict_from("range", [labels[2], labels[1]], values, 0.95, "percentile", tau, strict=[False, True])
    assert v.compared["label"] == labels[1] and v.severity == "high", v


# ---------------------------------------------------------------- the simultaneous band
def _null_families(method: str, columns: int, rng) -> np.ndarray:
    """(R+1, C) values of a null family: every difference's truth is 0."""
    if method == "percentile":  # a bootstrap: replicates spread around the estimate
        est = rng.normal(0.0, 0.01, columns)
        return np.vstack([est, est + rng.normal(0.0, 0.01, (200, columns))])
    groups = rng.normal(0.0, 0.03, (10, columns))  # random groups: the estimate is their mean
    return np.vstack([groups.mean(axis=0), groups])


@pytest.mark.parametrize("method", ["percentile", "random_groups"])
def test_the_verdict_flags_a_null_family_at_most_at_the_nominal_rate(monkeypatch, method):
    """15 null differences (6 groups' pairs): marginal 95% intervals exclude 0 for at
    least one of them in about half the audits; the verdict's simultaneous band in at
    most 5% plus 3 Monte Carlo sd."""
    import functools
    from common.stats import intervals
    from common.stats.intervals import marginal_intervals
    from common.stats.verdict import verdict_from
    # the same quantiles, computed once each (they are slow to compute and repeat here)
    monkeypatch.setattr(intervals, "t_quantile", functools.lru_cache(maxsize=None)(intervals.t_quantile))
    rng = np.random.default_rng(41)
    labels = [f"d{c}" for c in range(15)]
    runs, flagged, marginal = 300, 0, 0
    for _ in range(runs):
        values = _null_families(method, len(labels), rng)
        verdict = verdict_from("nonzero_pairs", labels, values, 0.95, method, tau=0.001, strict_significance=False)
        flagged += bool(verdict.significant)
        low, high = marginal_intervals(values, 0.95, method)
        marginal += bool(np.any((low > 0) | (high < 0)))
    assert marginal / runs > 0.3  # the simulation tells the two apart
    assert flagged / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs), flagged
