"""The probabilistic count's release and verdict (common/metrics/prob_count.py): a cell
the release controls withhold is unknown — never "included", never a pass — and the
verdict's words match the numbers the report shows beside it (the pool cells and each
group's figure over all pools). Under the controls the cells are finished from their
noised counts by the result recipient (`cell_report`, here on counts built from the
members' probabilities plus a chosen noise); without them the Tester computes them
from the joined rows (`local_result`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from common.metrics.base import NO_DENOMINATOR, Layout
from common.metrics.prob_count import METRIC, OVERALL, poisson_tail
from common.stats.results import AuditReport
from ppre.report.text import render_text

GROUPS = ["white", "black", "api", "aian", "multiple", "hispanic"]
AIAN = GROUPS.index("aian")


def _population(rng, n_big=600, n_small=12):
    """A big pool where every group is present and a small one where aian is rare."""
    p = rng.dirichlet(np.full(6, 2.0), n_big + n_small)
    p[:, AIAN] *= 0.02
    p /= p.sum(axis=1, keepdims=True)
    strata = np.r_[np.zeros(n_big, int), np.ones(n_small, int)]
    return p, strata


POOLS = ["big", "small"]


def _result(p, strata, *, t=1, level=0.9):
    return METRIC.local_result([p], strata, POOLS, GROUPS, "default",
                               {"count_threshold": t, "inclusion_level": level}, {}, confidence=0.95, tau=0.05)


def _counted(p, strata, *, t=1, level=0.9, min_size=0.0, noise=None, withheld=()):
    """The encrypted form's finish: each pool's expected counts plus `noise` (pools x
    groups), as the result recipient decrypts them, with the groups in `withheld` as the
    Tester withholds them (every pool's cell NaN)."""
    plan = METRIC.plan(GROUPS, POOLS, Layout(64, 2, 2), "default", {}, {"pools": 2})
    noise = np.zeros((len(POOLS), len(GROUPS))) if noise is None else np.asarray(noise, dtype=float)
    values = np.full((1, len(plan.cells)), np.nan)
    for c, cell in enumerate(plan.cells):
        assert cell.kind == "count" and cell.den_slot == NO_DENOMINATOR
        k = POOLS.index(cell.other)
        rows = p[strata == k]
        if cell.group == OVERALL:
            values[0, c] = len(rows) + noise[k].sum()
        elif cell.group not in withheld:
            values[0, c] = rows[:, GROUPS.index(cell.group)].sum() + noise[k, GROUPS.index(cell.group)]
    return METRIC.cell_report(plan, values, option="default", params={"count_threshold": t, "inclusion_level": level},
                              info={}, confidence=0.95, tau=0.05, min_size=min_size)


@pytest.mark.parametrize("mean, t", [(0.08, 2), (3.0, 1), (29.9, 30), (800.0, 900), (1000.0, 100_000),
                                     (56_753.0, 56_000), (999_000.0, 1_000_000), (0.0, 1), (5.0, 0)])
def test_poisson_tail_is_exact_where_exp_of_minus_the_mean_underflows(mean, t):
    from scipy.stats import poisson
    assert poisson_tail(mean, t) == pytest.approx(poisson.sf(t - 1, mean) if t > 0 else 1.0, abs=1e-9)


def test_every_cell_released_and_reaching_the_level_is_a_pass():
    rng = np.random.default_rng(1)
    p, strata = _population(rng, n_small=400)
    p[:, AIAN] = 0.2
    report = _result(p, strata)
    assert report.verdict.severity == "none" and not report.verdict.flagged
    assert report.verdict.message.startswith("every group reaches Pr(N >= 1) >= 0.9 in every pool")
    assert all(c.included is True for c in report.pools)


def test_withheld_cells_are_unknown_and_the_verdict_is_not_a_pass():
    """With the controls on, the small pool's cells fall under the minimum effective
    size: they are withheld (null values, `included` null), listed as unknown, and the
    verdict is "inconclusive" (grey), not "every group reaches ..."."""
    rng = np.random.default_rng(2)
    p, strata = _population(rng)
    p[:, AIAN] = 0.2  # every released cell reaches the level
    report = _counted(p, strata, min_size=30.0, noise=np.full((2, 6), 0.5))
    small = [c for c in report.pools if c.pool == "small"]
    assert small and all(c.included is None and c.expected_count is None and c.prob_at_least is None
                         for c in small)
    v = report.verdict
    assert v.severity == "inconclusive" and not v.flagged and not v.significant
    assert "every group reaches" not in v.message
    assert "6 cell(s) withheld" in v.message and "unknown, not included (" in v.message
    assert "small/aian" in v.message and "--group-mapping" in v.message
    # the JSON keeps "unknown" (null), not false; the table and the page say withheld
    again = AuditReport.from_json(report.to_json())
    assert [c.included for c in again.pools if c.pool == "small"] == [None] * 6
    assert "suppressed" in render_text(report)
    from ppre import report as rp
    page = rp.render_html(report)
    verdict = page.split('id="verdict"')[1].split("</section>")[0]
    assert "Every group included" not in verdict and "Inconclusive" in verdict
    assert "withheld" in page


def test_a_group_figure_below_the_level_is_flagged_never_included():
    """The report's all-pools figure is part of what the verdict reads: when aian's
    cells are withheld (each pool's noised count, 20, is below the minimum 30) and its
    figure over all pools, the Poisson tail at their sum 40, reads about 0.002 for T =
    60, the verdict flags it; it never says every group reaches the level beside it."""
    rng = np.random.default_rng(3)
    p, strata = _population(rng, n_small=400)
    p[:, [j for j in range(6) if j != AIAN]] += 0.5  # every other group well above the level
    p /= p.sum(axis=1, keepdims=True)
    noise = np.zeros((2, 6))
    noise[:, AIAN] = [20.0 - p[strata == s, AIAN].sum() for s in (0, 1)]
    report = _counted(p, strata, t=60, min_size=30.0, noise=noise)
    assert all(c.included is None for c in report.pools if c.group == "aian")
    aian = report.group("aian")
    assert aian.estimate == pytest.approx(poisson_tail(40.0, 60)) and aian.estimate < 0.01
    v = report.verdict
    assert v.flagged and v.severity == "flagged" and "all pools/aian" in v.significant_comparisons
    assert "every group reaches" not in v.message and "all pools/aian" in v.message
    assert "withheld" in v.message  # aian's pool cells: unknown, said so


def test_a_group_the_tester_withheld_has_no_cells_and_no_figure():
    """A group whose noised size is below the minimum is withheld by the Tester (its
    items are Enc(0) and named in the header): every pool's cell and the all-pools figure
    are unknown, and the verdict says so."""
    rng = np.random.default_rng(6)
    p, strata = _population(rng, n_small=400)
    p[:, AIAN] = 0.2
    report = _counted(p, strata, min_size=30.0, withheld=("aian",))
    assert all(c.included is None and c.expected_count is None for c in report.pools if c.group == "aian")
    assert report.group("aian").estimate is None
    assert all(c.included is True for c in report.pools if c.group != "aian")
    assert report.verdict.severity == "inconclusive" and "all pools/aian" in report.verdict.message


def test_a_pools_member_count_is_its_noised_overall_count():
    rng = np.random.default_rng(7)
    p, strata = _population(rng, n_small=400)
    noise = np.zeros((2, 6))
    noise[1, 0] = 2.4
    report = _counted(p, strata, noise=noise)
    assert {c.pool: c.members for c in report.pools} == {"big": 600, "small": 402}


def test_a_group_figure_from_noise_alone_is_withheld():
    """Under the controls a group whose expected count over all pools is below the
    minimum effective size gets no figure: 0.0031 from a noised total near 0 would be
    noise shown as a finding."""
    rng = np.random.default_rng(4)
    p, strata = _population(rng)
    p[:, AIAN] = 1e-4
    p /= p.sum(axis=1, keepdims=True)
    report = _counted(p, strata, t=2, min_size=30.0)
    assert report.group("aian").estimate is None
    assert report.verdict.severity == "inconclusive" and "all pools/aian" in report.verdict.message


def test_the_page_banner_follows_the_inclusion_verdict():
    rng = np.random.default_rng(5)
    p, strata = _population(rng, n_small=400)
    p[:, AIAN] = 0.2
    from ppre import report as rp
    passed = _result(p, strata)
    assert "Every group included" in rp.render_html(passed)
    unknown = replace(passed, verdict=replace(passed.verdict, severity="inconclusive"))
    assert "Every group included" not in rp.render_html(unknown).split('id="verdict"')[1].split("</section>")[0]
