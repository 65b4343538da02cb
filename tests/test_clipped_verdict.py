"""Values clipped into a declared range, and degenerate intervals (design §5.10, §8.3).

* A large share of clipped rows (`common.stats.declared_range.CLIPPED_SHARE`) is never
  "none": the verdict is inconclusive, and the text, the JSON and the HTML page all say
  that the result describes clipped values and which range to declare; a smaller share
  keeps the verdict and the warning.
* Every reported interval holds its estimate, over degenerate inputs (all values equal,
  all clipped, zero variance, a masked ratio's rounding alone, tiny effective sizes) and
  every interval kind (`common.stats.intervals`: percentile and t intervals, simultaneous
  bands, the differences' and the corrected values' intervals, the parametric draws of
  `common.stats.moments`).
* No power statement from a degenerate variance: no "detects ... 0.0000".
* End to end: an all-clipped LOT audit through both services (`ppre.api.audit_local`).
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from common.crypto.masking import RatioMask, masked_ratio
from common.stats.declared_range import CLIPPED_SHARE, checked_rows, clipped_facts
from common.stats.intervals import (RESOLUTION, degenerate, detectable_differences, estimate_intervals,
                                    marginal_intervals, resolved, simultaneous_bands)
from common.stats.moments import gaussian_draws
from common.stats.results import AuditReport, PairResult
from common.stats.verdict import Verdict, verdict_from, with_clipping
from ppre.report.html import render_html
from ppre.report.text import render_text

ZERO_POWER = re.compile(r"detects with \d+% power is 0\.0000")
METHODS = ("percentile", "random_groups")


# --------------------------------------------------------------------------- degenerate inputs
def masked(num: int, den: int) -> float:
    """A cell's value as the Test-Client reads it: the Tester's ratio mask applied to the
    fixed-point (Num, Den), then the masked ratio (`common.crypto.masking`)."""
    mask = RatioMask.draw()
    return masked_ratio(mask.r * num + mask.e_num, mask.r * den + mask.e_den)


def degenerate_inputs(seed: int) -> dict[str, np.ndarray]:
    """(R+1, C) value arrays that do not vary, as each kind of degenerate cell gives them."""
    rng = np.random.default_rng(seed)
    reps = 200
    unit = 1 << 32  # one member's weight in fixed point
    return {
        "all equal": np.full((reps + 1, 3), 0.37),
        "all zero": np.zeros((reps + 1, 2)),
        "all clipped (masked zeros)": np.array([[masked(0, 9000 * unit << 64) for _ in range(4)]
                                                for _ in range(reps + 1)]),
        "all clipped to a bound (masked)": np.array([[masked(7 * unit << 32, 7 * unit << 32) for _ in range(2)]
                                                     for _ in range(reps + 1)]),
        "tiny effective size (masked)": np.array([[masked(0, int(0.003 * unit)) for _ in range(3)]
                                                  for _ in range(reps + 1)]),
        "zero variance, one replicate": np.array([[0.5, -0.25], [0.5, -0.25]]),
        "undefined replicates": np.vstack([[0.2, 0.0], np.full((reps, 2), np.nan)]),
        "rounding around a constant": 0.8 + rng.uniform(0, 1e-13, size=(reps + 1, 3)),
    }


def holds(low, high, est) -> bool:
    ok = np.isfinite(low) & np.isfinite(high)
    return bool(np.all((low[ok] <= est[ok]) & (est[ok] <= high[ok])))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("method", METHODS)
def test_every_interval_holds_its_estimate_on_degenerate_inputs(seed, method):
    for name, raw in degenerate_inputs(seed).items():
        for values in (raw, resolved(raw)):
            est = values[0]
            low, high = estimate_intervals(values, 0.95, method)
            assert holds(low, high, est), (name, method, low, est, high)
            band_low, band_high = simultaneous_bands(values, 0.95, method)
            assert holds(band_low, band_high, est), (name, method)
            # the differences' intervals: from the same replicates, as `finish` forms them
            if values.shape[1] >= 2:
                diffs = values[:, :1] - values[:, 1:]
                dlow, dhigh = estimate_intervals(diffs, 0.95, method)
                assert holds(dlow, dhigh, diffs[0]), (name, method)


@pytest.mark.parametrize("seed", range(4))
def test_parametric_draws_hold_the_estimate_with_zero_or_tiny_covariance(seed):
    """The intervals under release noise: R draws around the estimate (`common.stats.moments`),
    read as percentile intervals."""
    rng = np.random.default_rng(seed)
    est = np.array([0.0, 0.4, 1e-30])
    for cov in (np.zeros((3, 3)), np.eye(3) * 1e-40, np.diag([0.0, 1e-24, 0.0])):
        values = np.vstack([est, est + gaussian_draws(cov, 300, rng)])
        low, high = estimate_intervals(resolved(values), 0.95, "percentile")
        assert holds(low, high, resolved(values)[0])


def test_the_masked_zero_is_zero_and_its_interval_holds_it():
    """The cause: a cell whose values are all 0 reads as 1e-33 after the ratio mask, the
    estimate and every replicate each with its own rounding, and the replicates'
    quantiles excluded the estimate's about once in twenty cells (of 400, some). At the values'
    resolution they are 0, and so is the interval."""
    unit = 1 << 32
    raw = np.array([[masked(0, 2000 * unit << 64) for _ in range(400)] for _ in range(201)])
    assert (raw > 0).all() and (raw < 1e-20).all()
    plain_low, plain_high = marginal_intervals(raw, 0.95, "percentile")
    assert not holds(plain_low, plain_high, raw[0])  # the replicates' quantiles alone: some miss
    values = resolved(raw)
    assert (values == 0).all()
    low, high = estimate_intervals(values, 0.95, "percentile")
    assert (low == 0).all() and (high == 0).all()


def test_resolution_leaves_varying_values_alone():
    rng = np.random.default_rng(1)
    values = np.vstack([[0.3, -2.0], 0.3 + rng.normal(0, 0.01, (100, 2))])
    values[1:, 1] -= 2.3
    assert np.array_equal(resolved(values), values)
    near = values.copy()
    near[5, 0] = near[0, 0] + RESOLUTION / 4
    assert resolved(near)[5, 0] == near[0, 0]


# --------------------------------------------------------------------------- no power from a zero variance
@pytest.mark.parametrize("method", METHODS)
def test_a_zero_variance_states_no_power(method):
    for name, raw in degenerate_inputs(0).items():
        values = resolved(raw)
        if values.shape[0] < 3 or not np.isfinite(values[1:]).any():
            continue
        if "tiny" not in name:  # within the resolution; a tiny cell's rounding is beyond it
            assert degenerate(values, method).all(), name
        assert np.isnan(detectable_differences(values, 0.95, method)).all(), name
        v = verdict_from("range", [f"d{c}" for c in range(values.shape[1])], values, 0.95, method, 0.05)
        assert v.severity != "none" and v.mdd is None and not ZERO_POWER.search(v.message), name


def test_the_verdict_on_values_that_do_not_vary_is_not_none():
    values = np.zeros((201, 2))
    v = verdict_from("negative_cells", ["a>b", "b>a"], values, 0.95, "percentile", 0.05)
    assert v.severity == "inconclusive" and v.mdd is None and v.members_factor is None
    assert "no detectable gap can be stated" in v.message
    assert not ZERO_POWER.search(v.message) and "0.0000, at most tau" not in v.message
    # a varying family keeps its power statement and its "none"
    rng = np.random.default_rng(0)
    varying = np.vstack([[0.001, -0.001], rng.normal(0, 0.002, (200, 2))])
    ok = verdict_from("negative_cells", ["a>b", "b>a"], varying, 0.95, "percentile", 0.05)
    assert ok.severity == "none" and ok.mdd is not None and "80% power is" in ok.message


def test_one_flat_comparison_among_varying_ones_is_named():
    rng = np.random.default_rng(2)
    values = np.column_stack([np.zeros(201), np.r_[0.0, rng.normal(0, 0.002, 200)]])
    v = verdict_from("negative_cells", ["a>b", "b>a"], values, 0.95, "percentile", 0.05)
    assert v.severity == "inconclusive" and "a>b do not vary" in v.message
    assert not ZERO_POWER.search(v.message)


# --------------------------------------------------------------------------- clipped rows
LOT_INFO = {"queries": 100, "pairs": 400, "skipped_single_item": 0, "skipped_zero_idcg": 0}


def test_the_share_is_over_the_rows_the_count_is_over():
    assert checked_rows("lot", "raw", LOT_INFO) == 500  # every ranked item: pairs + one per query
    assert checked_rows("lot", "raw", {**LOT_INFO, "skipped_single_item": 7}) == 507
    assert checked_rows("lot", "idcg", LOT_INFO) == 400  # its gaps
    assert checked_rows("output", "", {"rows_clipped": 3}) is None  # not stated
    assert checked_rows("output", "", {"rows_clipped": 3, "rows_checked": 12}) == 12
    facts = clipped_facts("lot", "raw", {"relevance_range": (0.0, 1.0)}, {**LOT_INFO, "rows_clipped": 250})
    assert facts["share"] == 0.5 and facts["large"] and facts["parameter"] == "relevance_range"
    assert not clipped_facts("lot", "raw", {}, {**LOT_INFO, "rows_clipped": 249})["large"]
    assert clipped_facts("lot", "raw", {}, {**LOT_INFO, "rows_clipped": 0}) is None
    unknown = clipped_facts("output", "", {"outcome_range": [2.0, 4.0]}, {"rows_clipped": 2})
    assert unknown["share"] is None and not unknown["large"] and unknown["declared"] == [2.0, 4.0]
    assert CLIPPED_SHARE == 0.5


def _none_verdict() -> Verdict:
    rng = np.random.default_rng(0)
    varying = np.vstack([[0.001, -0.001], rng.normal(0, 0.002, (200, 2))])
    return verdict_from("negative_cells", ["a>b", "b>a"], varying, 0.95, "percentile", 0.05)


def test_a_large_share_clipped_is_never_none():
    none = _none_verdict()
    assert none.severity == "none"
    facts = clipped_facts("lot", "raw", {"relevance_range": (0.0, 1.0)}, {**LOT_INFO, "rows_clipped": 400})
    v = with_clipping(none, facts, 0.95)
    assert v.severity == "inconclusive" and v.members_factor is None and v.clipped["large"]
    assert "describes clipped values" in v.message and "--relevance-range LO:HI" in v.message
    assert "no disparity" not in v.message and not ZERO_POWER.search(v.message)
    # a smaller share keeps the verdict; the facts travel beside it
    small = with_clipping(none, clipped_facts("lot", "raw", {}, {**LOT_INFO, "rows_clipped": 10}), 0.95)
    assert small == none


def test_a_significant_gap_on_clipped_values_keeps_its_severity_and_says_so():
    rng = np.random.default_rng(3)
    values = np.vstack([[-0.2, 0.2], np.array([-0.2, 0.2]) + rng.normal(0, 0.01, (200, 2))])
    sig = verdict_from("negative_cells", ["a>b", "b>a"], values, 0.95, "percentile", 0.05)
    assert sig.severity == "high"
    facts = clipped_facts("output", "", {"outcome_range": [0.0, 1.0]},
                          {"rows_clipped": 90, "rows_checked": 100, "rows_clipped_above": 90})
    v = with_clipping(sig, facts, 0.95)
    assert v.severity == "high" and "the gaps are the clipped values'" in v.message
    assert "--outcome-range LO:HI (HI at least the largest of the outcomes, above 1" in v.message


def _report(verdict: Verdict, info: dict, params: dict) -> AuditReport:
    return AuditReport(metric="lot", metric_option="raw", n_matched=400, bootstrap=200, confidence=0.95,
                       interval="percentile", groups=[], verdict=verdict,
                       cells=[PairResult("a", "b", None, 0.0, 0.0, 0.0, informative=True)],
                       params=params, info=info, tau=0.05)


@pytest.mark.parametrize("rows_clipped, large", [(500, True), (10, False)])
def test_the_text_the_json_and_the_page_agree(rows_clipped, large):
    info = {**LOT_INFO, "rows_clipped": rows_clipped}
    params = {"relevance_range": [0.0, 1.0]}
    verdict = with_clipping(_none_verdict(), clipped_facts("lot", "raw", params, info), 0.95)
    report = AuditReport.from_json(_report(verdict, info, params).to_json())  # through the JSON
    assert report.verdict == verdict
    data = json.loads(report.to_json())
    if large:
        assert data["verdict"]["clipped"]["large"] and data["verdict"]["clipped"]["rows"] == 500
    else:  # the verdict did not weigh them: the JSON's warning is info.rows_clipped, as before
        assert "clipped" not in data["verdict"] and data["info"]["rows_clipped"] == rows_clipped
    text = render_text(report)
    page = render_html(report)
    for shown in (text, page):
        assert f"{rows_clipped:,} of the Test-Client&#x27;s 500 relevances".replace("&#x27;", "'") in \
            shown.replace("&#x27;", "'").replace("&#39;", "'")
        assert "--relevance-range LO:HI" in shown and "describe" in shown
    if large:
        assert data["verdict"]["severity"] == "inconclusive"
        assert "verdict: inconclusive: the result describes clipped values" in text
        assert "Inconclusive: the result describes clipped values" in page
        assert "No disparity" not in page and "no disparity" not in text
    else:
        assert data["verdict"]["severity"] == "none" and "verdict: no disparity of tau or more" in text


def test_an_old_result_with_clipped_rows_still_warns():
    """A result finished before the verdict weighed the clipped rows: the pages read them off
    its dataset facts and warn, without judging the share."""
    info = {**LOT_INFO, "rows_clipped": 500}
    report = _report(_none_verdict(), info, {"relevance_range": [0.0, 1.0]})
    assert report.verdict.clipped is None
    assert "warning: 500 of the Test-Client's 500 relevances (100%) lay outside the declared range" in \
        render_text(report)


# --------------------------------------------------------------------------- end to end
def _lot_all_clipped(members: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    ids = [f"m{i:05d}" for i in range(members)]
    p = rng.dirichlet([0.6, 0.6], members)
    probs = pd.DataFrame({"member_id": ids, "hsm": p[:, 0], "non_hsm": p[:, 1]})
    rows = []
    for q in range(members // 3):
        chosen = rng.choice(members, 5, replace=False)
        relevance = np.sort(5 + rng.random(5))[::-1]  # 5-6: beyond the default range 0:1
        rows += [(f"q{q:05d}", ids[m], r + 1, float(relevance[r])) for r, m in enumerate(chosen)]
    return probs, pd.DataFrame(rows, columns=["query_id", "member_id", "rank", "relevance"])


def test_an_all_clipped_lot_audit_is_inconclusive_and_says_which_range_to_declare(tmp_path):
    from ppre import audit_local
    from ppre.report import write_report
    probs, lot = _lot_all_clipped(300, 7)
    report = audit_local(lot, metric="lot", option="raw", probabilities=probs, release_controls=False,
                         bootstrap=200, seed=3, history=False)
    assert report.info["rows_clipped"] == len(lot)
    v = report.verdict
    assert v.severity != "none" and v.severity == "inconclusive"
    assert v.clipped["large"] and v.clipped["share"] == 1.0 and v.clipped["parameter"] == "relevance_range"
    for cell in report.cells:
        assert cell.ci_low <= cell.estimate <= cell.ci_high
        assert cell.estimate == 0.0  # every relevance reads 1: every gap 0, not 1e-33
    compared = v.compared
    assert compared["ci_low"] <= compared["estimate"] <= compared["ci_high"]
    assert compared["band_low"] <= compared["estimate"] <= compared["band_high"]
    text = render_text(report)
    html_path, json_path = write_report(report, tmp_path)[:2]
    page, data = html_path.read_text(encoding="utf-8"), json.loads(json_path.read_text(encoding="utf-8"))
    assert data["verdict"]["severity"] == "inconclusive" and data["verdict"]["clipped"]["large"]
    for shown in (text, page, data["verdict"]["message"]):
        assert "--relevance-range LO:HI" in shown and "clipped" in shown
        assert not ZERO_POWER.search(shown) and "0.0000, at most tau" not in shown
    assert "no disparity" not in text.lower()


def test_an_output_audit_clipped_almost_whole_is_inconclusive():
    """The share needs the rows the clipping count is over: `bounded_column` states them
    (`info["rows_checked"]`) for every metric with a declared range, here the output
    metric's outcomes, nearly all above a declared range of 2:3."""
    from ppre import audit_local
    rng = np.random.default_rng(4)
    ids = [f"m{i:05d}" for i in range(400)]
    p = rng.dirichlet([0.6, 0.6], len(ids))
    probs = pd.DataFrame({"member_id": ids, "hsm": p[:, 0], "non_hsm": p[:, 1]})
    outcome = np.where(np.arange(len(ids)) < 20, 2.5, 3.5 + rng.random(len(ids)))  # 380 of 400 above 3
    data = pd.DataFrame({"member_id": ids, "outcome": outcome})
    report = audit_local(data, metric="output", params={"outcome_range": "2:3"}, probabilities=probs,
                         release_controls=False, bootstrap=200, seed=3, history=False)
    assert report.info["rows_clipped"] == 380 and report.info["rows_checked"] == 400
    assert report.verdict.severity == "inconclusive" and report.verdict.clipped["large"]
    assert "--outcome-range LO:HI" in report.verdict.message
