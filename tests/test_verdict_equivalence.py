"""A verdict that says what its numbers support (`common.stats.verdict`, design §5.10):
"none" rests on an equivalence test (every compared band within ±τ), never on a
difference that was merely not significant; an inconclusive verdict names its compared
gap as observed, not as a finding; a group the verdict tested is never called "not
judged"; and a significant gap says when BISG weighting understates it and by how much
it could (design §5.9), by default, from the released second moments, so that a gap is
never read as "low, below τ" where its band, its corrected value or its attenuation
reaches τ."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from common.races import RACES
from common.stats import wording
from common.stats.correction import Corrected
from common.stats.verdict import attenuation_factor, verdict_from, with_attenuation
from ppre.report.model import verdict_words
from tester_service.audit_spec import AuditSpec
from tester_service.release import ReleasePolicy

from tests.helpers import local_audit

TAU = 0.05


def family(estimates, sds, replicates: int = 400, seed: int = 0) -> np.ndarray:
    """(R+1, C): row 0 the estimates, then normal replicates around them."""
    est = np.asarray(estimates, dtype=np.float64)
    return np.vstack([est, est + np.random.default_rng(seed).normal(size=(replicates, est.size)) * np.asarray(sds)])


# ----------------------------------------------------------------------------------
# "none" is an equivalence
# ----------------------------------------------------------------------------------
def test_a_gap_whose_band_reaches_tau_is_not_none_even_where_the_audit_had_the_power():
    """Not significant, the minimum detectable difference below τ (the old rule's "none"),
    but the band reaches past τ: a gap of τ is not ruled out, so inconclusive, and the
    message says which comparison's band reaches it."""
    v = verdict_from("range", ["x - y"], family([0.02], [0.017]), 0.95, "percentile", TAU)
    assert not v.significant and v.mdd is not None and v.mdd <= TAU
    assert v.compared["band_low"] < 0 < TAU <= v.compared["band_high"]
    assert v.severity == "inconclusive" and v.equivalent is False
    assert "not ruled out" in v.message and "x - y" in v.message.split("not ruled out")[1]
    assert v.members_factor is not None and v.members_factor > 1.0  # the equivalence's need, not the MDD's (< 1)
    # an estimate beyond tau/2: how many more members is not extrapolated, "more members" is all
    near = verdict_from("range", ["x - y"], family([0.028], [0.016]), 0.95, "percentile", TAU)
    assert near.severity == "inconclusive" and near.mdd <= TAU and near.members_factor is None
    assert "conclusive with more members," in near.message and "x as many" not in near.message


def test_none_says_every_band_lies_within_tau_and_the_page_calls_it_an_equivalence():
    v = verdict_from("range", ["x - y", "x - z"], family([0.004, -0.006], [0.004, 0.004]), 0.95, "percentile", TAU)
    assert v.severity == "none" and v.equivalent is True
    assert abs(v.compared["band_low"]) < TAU and abs(v.compared["band_high"]) < TAU
    assert "equivalence" in v.message and "lies within +/-0.05" in v.message

    class Report:  # what verdict_words reads
        verdict, tau, confidence, params, n_matched, release = v, TAU, 0.95, {}, 1000, {}

    headline, explain = verdict_words(Report())
    assert headline == "No disparity of \u03c4 or more" and "equivalence test" in explain


@pytest.mark.parametrize("rule, estimate, inside", [
    ("below_overall", -0.2, True),     # a group far above overall: no shortfall, the band below tau
    ("below_overall", 0.03, False),    # a shortfall whose band reaches tau
    ("negative_cells", 0.2, True),     # a cell far above 0: the lower-ranked member is not favoured
    ("negative_cells", -0.03, False),
])
def test_the_equivalence_is_judged_in_the_rules_direction(rule, estimate, inside):
    sd = 0.002 if inside else 0.012
    v = verdict_from(rule, ["c"], family([estimate], [sd]), 0.95, "percentile", TAU)
    assert v.equivalent is inside
    if not v.significant:
        assert v.severity == ("none" if inside else "inconclusive")


# ----------------------------------------------------------------------------------
# Messages that agree with the decision
# ----------------------------------------------------------------------------------
def test_an_inconclusive_verdict_names_its_gap_as_observed_not_as_a_finding():
    """No interval at all (a release whose noise leaves no replicate): the gap is printed
    as what was observed and said to be no finding; the words never read "= +0.1132, has"
    like a measurement."""
    values = np.vstack([[0.1132], np.full((10, 1), np.nan)])
    v = verdict_from("below_overall", ["overall - hispanic"], values, 0.95, "random_groups", TAU, noisy=True)
    assert v.severity in ("inconclusive", "insufficient data")
    if v.severity == "inconclusive":
        assert "observed, overall - hispanic = +0.1132, is no finding" in v.message
        assert "undefined" in v.message
    values = family([0.02], [0.03])
    v = verdict_from("range", ["a - b"], values, 0.95, "percentile", TAU)
    assert v.severity == "inconclusive" and "observed, a - b = +0.0200, is no finding" in v.message


def test_a_group_the_verdict_tests_is_never_called_not_judged():
    """Under release noise a comparison with a group too wide to be informative counts at
    its band's level (its interval covers: bench/RESULTS.md). Such a group can give the
    flag, so no message, flagged or not, may say it was not judged."""
    labels = ["a - b", "a - wide", "b - wide"]
    flagged = verdict_from("range", labels, family([0.004, 0.12, 0.11], [0.004, 0.03, 0.03]), 0.95, "percentile",
                           TAU, left_out=["wide"], strict=[False, True, True], noisy=True, strict_significance=False)
    assert flagged.significant and "wide" in flagged.compared["label"]
    quiet = verdict_from("range", labels, family([0.004, 0.02, 0.01], [0.004, 0.03, 0.03]), 0.95, "percentile",
                         TAU, left_out=["wide"], strict=[False, True, True], noisy=True, strict_significance=False)
    assert quiet.severity == "inconclusive"
    for v in (flagged, quiet):
        assert "not judged" not in v.message
    assert "tested like the others" in quiet.message


# ----------------------------------------------------------------------------------
# Severity honest about attenuation
# ----------------------------------------------------------------------------------
def _corrected(mixing: np.ndarray, groups=("a", "b", "c"), values=None, unidentifiable=()) -> Corrected:
    k = len(groups)
    values = np.full((1, k), np.nan) if values is None else np.asarray(values, dtype=float)[None, :]
    shares = np.full(k, 1.0 / k)
    return Corrected(values, 1.0, tuple(unidentifiable), (), 30.0, tuple(groups), np.asarray(mixing, float),
                     shares, reported=False)


def test_the_attenuation_factor_undoes_the_mixing_of_calibrated_probabilities():
    """Calibrated probabilities (each member's race drawn from its own vector), every race
    at rate 0.10 but b at 0.18: the weighted gap b − a times the factor is the true gap
    (the difference lies in one race, which is what the factor assumes)."""
    rng = np.random.default_rng(4)
    n = 400_000
    p = rng.dirichlet([2.0, 0.8, 0.6], n)
    race = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    rate = np.where(race == 1, 0.18, 0.10)
    f = rng.random(n) < rate
    weighted = (p * f[:, None]).sum(0) / p.sum(0)
    m = p.T @ p
    mixing = m / m.sum(axis=1, keepdims=True)
    factor = attenuation_factor(_corrected(mixing), "b", "a")
    gap = weighted[1] - weighted[0]
    assert 1.2 < factor < 5.0
    assert gap * factor == pytest.approx(0.08, abs=0.006)
    assert gap < 0.08 - 0.01  # the weighted gap understates it


def _low_verdict(estimate=0.03, sd=0.004):
    return verdict_from("range", ["b - a"], family([estimate], [sd]), 0.95, "percentile", TAU)


def test_a_low_gap_whose_attenuation_reaches_tau_says_it_may_be_moderate():
    v = _low_verdict()
    assert v.severity == "low" and not v.may_reach_tau  # its band lies below tau
    mixing = np.array([[0.9, 0.05, 0.05], [0.35, 0.55, 0.10], [0.2, 0.1, 0.7]])
    out = with_attenuation(v, _corrected(mixing), {"a": 0, "b": 1, "c": 2}, 0.95, "percentile", (0.0, 1.0), [])
    a = out.attenuation
    assert a["factor"] == pytest.approx(1 / min(0.55 - 0.05, 0.9 - 0.35), rel=1e-3)
    assert a["up_to"] >= TAU and a["understates"] and a["reported"] is False
    assert out.severity == "low" and out.may_reach_tau
    assert "understates the true-race gap" in out.message and "may be moderate" in out.message
    assert "b 55%" in out.message and "a 90%" in out.message

    class Report:
        verdict, tau, confidence, params, n_matched, release = out, TAU, 0.95, {}, 1000, {}

    headline, explain = verdict_words(Report())
    assert "may be \u03c4 or more" in headline and "lies below \u03c4" not in explain


def test_a_low_gap_whose_band_reaches_tau_is_not_read_as_below_tau():
    v = _low_verdict(estimate=0.035, sd=0.009)
    assert v.severity == "low" and v.compared["band_high"] >= TAU
    assert v.may_reach_tau and "may be tau or more" in v.message


def test_a_corrected_gap_is_used_where_identifiable_and_said_unidentifiable_where_not():
    v = _low_verdict()
    mixing = np.array([[0.97, 0.02, 0.01], [0.03, 0.95, 0.02], [0.01, 0.02, 0.97]])  # little mixing: factor ~1
    ok = with_attenuation(v, _corrected(mixing, values=[0.10, 0.16, 0.1]), {"a": 0, "b": 1, "c": 2}, 0.95,
                          "percentile", (0.0, 1.0), [])
    assert ok.attenuation["corrected"] == pytest.approx(0.06) and ok.may_reach_tau
    assert "corrected for attenuation, b - a = +0.0600" in ok.message
    hidden = with_attenuation(v, _corrected(mixing, values=[0.10, 0.16, 0.1], unidentifiable=("b",)),
                              {"a": 0, "b": 1, "c": 2}, 0.95, "percentile", (0.0, 1.0), [])
    assert hidden.attenuation["corrected"] is None and "not identifiable at this size" in hidden.message


def _calibrated_population(n: int, seed: int, disadvantaged: str, extra: float):
    """Tester probabilities (Dirichlet, BISG-like: most members clearly one race), each
    member's race drawn from them, FPR 0.10 for every race but `disadvantaged`'s."""
    rng = np.random.default_rng(seed)
    alpha = np.array([3.0, 1.0, 0.6, 0.3, 0.3, 1.2])
    p = rng.dirichlet(alpha * 0.3, n)
    race = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, len(RACES) - 1)
    ids = [f"m{i:06d}" for i in range(n)]
    tester = pd.DataFrame(p, columns=list(RACES))
    tester.insert(0, "member_id", ids)
    y_true = (rng.random(n) < 0.3).astype(int)
    fpr = np.where(np.asarray(RACES)[race] == disadvantaged, 0.10 + extra, 0.10)
    y_pred = np.where(y_true == 1, rng.random(n) < 0.8, rng.random(n) < fpr).astype(int)
    client = pd.DataFrame({"member_id": ids, "y_true": y_true, "y_pred": y_pred})
    return tester, client, p, race


def test_by_default_a_real_audit_says_how_much_the_weighted_gap_understates():
    """A real audit (both sessions, default release controls, no correction asked for):
    the verdict's attenuation comes from the released second moments, its own-race shares
    are the probabilities' (Σ p_j²·d / Σ p_j·d over the joined negatives, within the
    release noise), the corrected values are not reported as estimates, and a significant
    gap says it is understated."""
    tester, client, p, _ = _calibrated_population(6000, 11, "black", 0.12)
    policy = ReleasePolicy(budget=math.inf, max_refusals=None)
    spec = AuditSpec(metric="ero", client_dataset="d", seed=3)
    report = local_audit(tester, client, spec=spec, release=policy)[0]
    v = report.verdict
    assert report.correction == {} and all(g.corrected_estimate is None for g in report.groups)
    negatives = client.y_true.to_numpy() == 0
    q = p[negatives]
    own = (q ** 2).sum(0) / q.sum(0)
    assert v.significant, v.message  # the population is built so that it is
    a = v.attenuation
    assert a is not None and a["reported"] is False and a["factor"] > 1.0 and a["understates"]
    assert "black" in a["pair"]
    for g, share in a["own_race_share"].items():  # M's release noise: about 0.02-0.05 on black's row here
        assert share == pytest.approx(own[list(RACES).index(g)], abs=0.03 if g == "white" else 0.1), g
    assert a["own_race_share"]["black"] < a["own_race_share"].get("white", 1.0)
    assert "understates the true-race gap" in v.message
    assert v.severity != "low" or v.may_reach_tau or "lower bound" in v.message


def test_without_second_moments_a_significant_gap_still_says_it_may_be_understated():
    """No release controls (bootstrap intervals, no second moments released) and no
    correction asked for: nothing says by how much, but the message says that the
    weighted gap may understate the true-race one and how to find out."""
    tester, client, _, _ = _calibrated_population(3000, 12, "black", 0.15)
    report = local_audit(tester, client, spec=AuditSpec(metric="ero", client_dataset="d", bootstrap=100, seed=3))[0]
    v = report.verdict
    assert v.significant and v.attenuation is None, v.message
    assert v.message.endswith(wording.ATTENUATION_UNKNOWN)


def test_without_the_release_controls_an_inconclusive_verdict_names_no_privacy_level():
    """No release noise: only the size limits the audit, so neither the message nor the
    page's headline speaks of a privacy level."""
    v = verdict_from("range", ["a - b"], family([0.02], [0.03]), 0.95, "percentile", TAU, noisy=False)
    assert v.message.startswith("inconclusive at this size: ") and "privacy level" not in v.message

    class Report:
        verdict, tau, confidence, params, n_matched = v, TAU, 0.95, {}, 1000
        release = {"controls": False, "rho": 0.0}

    assert verdict_words(Report())[0] == "Inconclusive at this size"
    noisy = verdict_from("range", ["a - b"], family([0.02], [0.03]), 0.95, "percentile", TAU, noisy=True)
    assert noisy.message.startswith("inconclusive at this size and privacy level: ")


def test_the_page_shows_the_attenuation_the_verdict_states():
    """The page's facts say what the message says: the factor, the allowance and the shares."""
    from dataclasses import replace as _replace

    from ppre.report.model import attenuation_text
    v = _low_verdict()
    mixing = np.array([[0.9, 0.05, 0.05], [0.35, 0.55, 0.10], [0.2, 0.1, 0.7]])
    out = with_attenuation(v, _corrected(mixing), {"a": 0, "b": 1, "c": 2}, 0.95, "percentile", (0.0, 1.0), [])
    text = attenuation_text(out.attenuation)
    assert "about 2.0x the weighted gap" in text and "b 55%" in text and "not identifiable" in text
    assert "understates" in text
    assert _replace(out, attenuation=None).attenuation is None


def test_a_mixing_the_noise_swamps_states_no_share_and_no_factor():
    """A noised M can make a group look unmixed or wholly mixed (the output metric at 5,000
    members once read "multiple (0% of its weight on its race)"): a share whose noise sd
    exceeds MAX_SHARE_SD is not stated, and a factor whose divisor the noise does not tell
    from 0 is not given."""
    from dataclasses import replace as _replace

    from common.stats.verdict import MAX_SHARE_SD
    mixing = np.array([[0.9, 0.05, 0.05], [0.35, 0.55, 0.10], [0.2, 0.1, 0.0]])
    quiet = _corrected(mixing)
    noisy = _replace(quiet, mixing_sd=np.array([[0.01] * 3, [0.01, 0.3, 0.01], [0.01, 0.01, 2 * MAX_SHARE_SD]]))
    assert attenuation_factor(quiet, "b", "a") is not None and attenuation_factor(noisy, "b", "a") is None
    v = _low_verdict()
    out = with_attenuation(v, noisy, {"a": 0, "b": 1, "c": 2}, 0.95, "percentile", (0.0, 1.0), [])
    assert out.attenuation is None or "b" not in out.attenuation["own_race_share"]
    none = verdict_from("range", ["a - c"], family([0.004], [0.004]), 0.95, "percentile", TAU)
    assert "c (0%" in with_attenuation(none, quiet, {}, 0.95, "percentile", None, []).message
    assert "c (0%" not in with_attenuation(none, noisy, {}, 0.95, "percentile", None, []).message


def test_no_members_factor_is_extrapolated_from_an_estimate_near_tau():
    """An estimate at 0.049 whose band reaches τ: (half-width/(τ − 0.049))² would promise
    thousands of times the members from a distance to τ that the noise alone sets."""
    v = verdict_from("range", ["a - b"], family([0.049], [0.03]), 0.95, "percentile", TAU)
    assert v.severity == "inconclusive"
    assert v.members_factor is None or v.members_factor < 100


def test_a_kept_low_result_from_before_the_flag_is_not_read_as_below_tau():
    """A result kept in a history before `may_reach_tau` existed (its JSON has no such key):
    the page reads its band, and a band that reaches τ is not called "below τ"."""
    import json
    from pathlib import Path

    from common.stats.results import AuditReport
    data = json.loads((Path(__file__).parent / "data" / "reports" / "ero_calibration.json").read_text())
    data["verdict"].pop("may_reach_tau", None)
    data["verdict"]["severity"] = "low"
    report = AuditReport.from_dict(data)
    assert not report.verdict.may_reach_tau and report.verdict.compared["band_high"] >= TAU
    headline, explain = verdict_words(report)
    assert "may be \u03c4 or more" in headline and "lies below" not in explain
