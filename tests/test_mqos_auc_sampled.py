"""MQOS-AUC sampled against exact (design §5.6; `common.metrics.mqos_auc`, "Sampled against
exact under release noise"): without noise the sampled estimate is unbiased for the
weighted AUC the exact option computes; under the release controls the result states how
far its estimates may lie from exact's and when a group has no interval."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.metrics.mqos_auc import SAMPLED, SAMPLED_NOISE_INFO, sampled_release_note
from common.metrics.scoring import sample_pair_graph
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.held_key import client_key, fast_crypto  # noqa: F401  (the fixtures)
from common.races import RACES
from tests.helpers import local_audit, make_inputs


def _weighted_auc(p: np.ndarray, y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per group (p's columns) the weighted AUC over every positive-negative pair, the exact
    option's estimand: Σ p_ij·p_lj·w(i,l) / Σ p_ij·p_lj over positives i and negatives l."""
    pos, neg = y == 1, y == 0
    w = (s[pos][:, None] > s[neg][None, :]) + 0.5 * (s[pos][:, None] == s[neg][None, :])
    num = np.einsum("ij,il,jl->l", w, p[pos], p[neg])
    return num / (p[pos].sum(axis=0) * p[neg].sum(axis=0))


def _population(n: int, seed: int):
    """Two groups whose probabilities go with the label and the score (so that a sampler
    that picked pairs by label or score would be biased), the second with a weaker score."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(np.int64)
    second = rng.random(n) < 0.4
    s = np.round(np.where(second, 0.8, 1.6) * y + rng.normal(size=n), 2)  # ties included
    p_second = np.clip(np.where(second, 0.8, 0.15) + 0.1 * y, 0.0, 1.0)
    return np.column_stack([1.0 - p_second, p_second]), y, s


def test_sampled_estimate_is_unbiased_for_the_exact_weighted_auc():
    """Over the Test-Client's random pair graphs (`sample_pair_graph`), the mean of the sampled
    ratio Σ w·1(s_pos > s_neg) / Σ w (w = p_ij·p_lj) is the weighted AUC over every pair,
    within 4 standard errors of the draws, in each group."""
    p, y, s = _population(600, seed=3)
    exact = _weighted_auc(p, y, s)
    assert exact[1] < exact[0] - 0.05  # the groups differ: a biased sampler would show
    rng = np.random.default_rng(4)
    draws = []
    for _ in range(300):
        first, second, values, kept = sample_pair_graph(y, s, 400, 4, rng, "d.csv")
        w = p[first] * p[second]
        draws.append((w * values[:, [0]]).sum(axis=0) / (w * values[:, [1]]).sum(axis=0))
    draws = np.array(draws)
    se = draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - exact) < 4 * se + 1e-3), (draws.mean(axis=0), exact, se)


def test_release_note_is_fixed_by_the_pair_count():
    """The note names the pairs kept and the random groups' share; the Tester accepts it
    only as the counts give it (no free text from the Test-Client)."""
    note = sampled_release_note(8190)
    assert "8190 pairs" in note and "1/100 of W_j" in note and "exact option" in note
    info = {"pairs": 20000, "pairs_kept": 8190, "pairs_dropped": 11810, SAMPLED_NOISE_INFO: note}
    SAMPLED.check_info(info, [])
    with pytest.raises(ValueError):
        SAMPLED.check_info({**info, SAMPLED_NOISE_INFO: note.replace("8190", "8191")}, [])
    with pytest.raises(ValueError):
        SAMPLED.check_info({**info, SAMPLED_NOISE_INFO: "member m01 is positive"}, [])


def _auc_inputs(seed: int, n: int = 300):
    tester, _ = make_inputs(n, n, n, seed=seed)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, len(tester))
    client = pd.DataFrame({"member_id": list(tester.member_id), "y_true": y,
                           "score": (rng.random(len(tester)) + 0.5 * y).round(3)})
    return tester, client


SPEC = AuditSpec(metric="mqos-auc", metric_option="sampled", client_dataset="d", bootstrap=10, seed=2,
                 params={"pairs": "2000"})


@pytest.mark.usefixtures("fast_crypto")
def test_result_under_release_noise_states_why_intervals_may_be_missing():
    """Under the release controls the sampled result carries the note (`info`) with the pairs
    kept, both parties knew the release was noisy (`params`), and a group without an
    interval is one the note covers: at 300 members the small groups have none."""
    tester, client = _auc_inputs(seed=5)
    release = ReleasePolicy(min_intersection=1, min_effective_size=0.0, rho=0.2, budget=math.inf, max_refusals=None)
    result, _, _ = local_audit(tester, client, spec=SPEC, release=release)
    assert result.params.get("release_noise") is True
    kept = int(result.info["pairs_kept"])
    assert result.info[SAMPLED_NOISE_INFO] == sampled_release_note(kept)
    missing = [g.group for g in result.groups if g.group in RACES and g.ci_low is None]
    assert missing  # what the note explains


@pytest.mark.usefixtures("fast_crypto")
def test_result_without_release_noise_has_no_note_and_intervals():
    """Without the release controls nothing is said of release noise, and every group with an
    estimate has its random-groups interval."""
    tester, client = _auc_inputs(seed=6)
    result, _, _ = local_audit(tester, client, spec=SPEC)
    assert SAMPLED_NOISE_INFO not in result.info and "release_noise" not in result.params
    assert all(g.ci_low is not None for g in result.groups if g.estimate is not None)


def test_the_note_is_on_the_table_and_the_page():
    """The result's note on how far sampled may lie from exact, and why a group has no
    interval, is read where the result is read: the text table and the page."""
    import dataclasses

    from common.stats.results import AuditReport
    from ppre.report.html import render_html
    from ppre.report.text import render_text
    report = AuditReport.from_json((Path(__file__).parent / "data" / "reports" / "ero_calibration.json").read_text())
    note = sampled_release_note(400)
    noted = dataclasses.replace(report, info={**report.info, SAMPLED_NOISE_INFO: note})
    assert f"note: {note}" in render_text(noted) and "note: " not in render_text(report)
    assert "<strong>Note:</strong>" in render_html(noted) and "<strong>Note:</strong>" not in render_html(report)
