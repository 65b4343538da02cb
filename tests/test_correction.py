"""The attenuation correction (`common.stats.correction`): its algebra, the HE path against its
plaintext twin (both result recipients, ERO and POT's curves), identifiability, the
release noise it needs, and what a peer or an operator may not ask for."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from common.stats import correction
from common.errors import InputError, ProtocolError
from common.races import RACES
from common.stats.results import AuditReport
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import local_audit

GROUPS = list(RACES)


def calibrated_population(n: int, seed: int, *, rates=(0.10, 0.22, 0.08, 0.15, 0.12, 0.09), alpha: float = 0.4):
    """Probabilities p_i ~ Dirichlet(alpha), true race drawn from p_i (calibrated by
    construction), y_true ~ Bernoulli(0.7), a false positive with the race's rate."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(len(GROUPS), alpha), size=n)
    race = (p.cumsum(axis=1) > rng.random(n)[:, None]).argmax(axis=1)
    y_true = (rng.random(n) < 0.3).astype(int)
    y_pred = np.where(y_true == 1, (rng.random(n) < 0.8), rng.random(n) < np.asarray(rates)[race]).astype(int)
    ids = [f"m{i:06d}" for i in range(n)]
    tester = pd.DataFrame(p, columns=GROUPS)
    tester.insert(0, "member_id", ids)
    client = pd.DataFrame({"member_id": ids, "y_true": y_true, "y_pred": y_pred})
    return tester, client, p, race


def plain_corrected(p: np.ndarray, f: np.ndarray, d: np.ndarray, hidden: tuple[int, ...] = ()) -> np.ndarray:
    """The plaintext twin: M⁻¹·Num from floating-point sums; a hidden (not identifiable)
    group's rate is its weighted estimate, subtracted from the others' rows (NaN for it)."""
    m, num, den = correction.plain_matrix(p, d), p.T @ f, p.T @ d
    solved = [j for j in range(p.shape[1]) if j not in hidden]
    fixed = list(hidden)
    out = np.full(p.shape[1], np.nan)
    out[solved] = np.linalg.solve(m[np.ix_(solved, solved)],
                                  num[solved] - m[np.ix_(solved, fixed)] @ (num[fixed] / den[fixed]))
    return out


# ----------------------------------------------------------------------------------
# The algebra
# ----------------------------------------------------------------------------------
def test_pair_weights_are_exact_products_rounded_at_32_bits_and_rows_sum_to_the_group():
    """Pairs without the last group: the product rounded at 32 bits, exactly. Pairs with
    it: what makes each row of M sum to the group's weight (so that the Tester derives
    them from the others), within k/2 units of the rounded product, and (k−1, k−1), which
    takes the others' rounding, within ((k − 1)² + 1)/2."""
    from common.crypto.encoding import quantize_probabilities
    rng = np.random.default_rng(3)
    q = quantize_probabilities(rng.dirichlet(np.full(4, 0.3), size=500))
    q[0] = [1 << 32, 0, 0, 0]  # the extremes: a certain member, and 0
    q[1] = [0, 0, 0, 1 << 32]
    q[2] = [(1 << 32) - 1, 0, 0, 1]
    weights = dict(zip(correction.pairs(4), correction.pair_weights(q)))
    for (j, r), w in weights.items():
        expected = np.array([(int(a) * int(b) + (1 << 31)) >> 32 for a, b in zip(q[:, j], q[:, r])])
        if r < 3:
            assert w.tolist() == expected.tolist()
        else:
            assert np.abs(w - expected).max() <= (2 if j < 3 else 5), (j, r)
    for j in range(4):
        row = sum(weights[(min(j, r), max(j, r))] for r in range(4))
        assert row.tolist() == q[:, j].tolist()
    assert [int(weights[(a, b)][0]) for a, b in correction.pairs(4)] == [1 << 32] + [0] * 9


def test_the_pairs_with_the_last_group_are_derived_from_the_others():
    """`pair_derivations` names, for each pair with the last group, the group column and
    the pair columns whose difference it is; the Tester's check of the identity holds on
    real weights and catches a column that breaks it."""
    from common.crypto.encoding import quantize_probabilities
    from common.metrics.base import Derivation
    from tester_service.aggregation import verified_derivations
    q = quantize_probabilities(np.random.default_rng(4).dirichlet(np.ones(6), size=300))
    weights = [q[:, j] for j in range(6)] + [tuple(range(6))] + correction.pair_weights(q)
    candidates = {c: Derivation(minus, total=total) for c, (total, minus) in correction.pair_derivations(6, 7).items()}
    candidates[5] = Derivation(tuple(range(5)), constant=1 << 32)
    assert sorted(candidates) == [5] + [7 + p for p, (a, b) in enumerate(correction.pairs(6)) if b == 5]
    assert verified_derivations(weights, candidates) == candidates
    at = {pair: 7 + p for p, pair in enumerate(correction.pairs(6))}
    broken = list(weights)
    broken[at[(2, 5)]] = broken[at[(2, 5)]] + 1  # its identity fails, and so does (5, 5)'s, which subtracts it
    assert sorted(verified_derivations(broken, candidates)) == sorted(set(candidates) - {at[(2, 5)], at[(5, 5)]})


def test_solve_recovers_rates_and_sizes_of_separated_groups():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(4, 0.5), size=2000)
    mu = np.array([0.1, 0.3, 0.2, 0.05])
    m = correction.plain_matrix(p)
    assert np.allclose(correction.solve(m @ mu, m), mu, atol=1e-12)
    # scale-free: a masked system (a common factor) gives the same solution
    assert np.allclose(correction.solve(7.5e30 * (m @ mu), 7.5e30 * m), mu, atol=1e-12)
    hard = np.eye(4)[rng.integers(0, 4, 1000)]
    assert np.allclose(correction.identifying_sizes(correction.plain_matrix(hard)), hard.sum(axis=0))
    # a group that is a copy of another cannot be told apart
    twins = np.column_stack([p[:, 0] / 2, p[:, 0] / 2, p[:, 1:].sum(axis=1)])
    assert correction.identifying_sizes(correction.plain_matrix(twins))[:2].max() < 1e-6 or \
        np.isnan(correction.solve(np.ones(3), correction.plain_matrix(twins))).all()


def test_the_correction_removes_the_attenuation_the_weighted_estimator_has():
    """On calibrated data the weighted estimator is biased towards the mean, the corrected
    one is not (a large sample: the bias dwarfs the noise)."""
    rates = np.array([0.10, 0.30, 0.08, 0.15, 0.12, 0.09])
    _, client, p, _ = calibrated_population(200_000, 5, rates=rates)
    f = ((client.y_pred == 1) & (client.y_true == 0)).to_numpy(float)
    d = (client.y_true == 0).to_numpy(float)
    weighted = (p.T @ f) / (p.T @ d)
    corrected = plain_corrected(p, f, d)
    assert np.abs(corrected - rates).max() < 0.01
    assert np.abs(weighted - rates).max() > 0.05


# ----------------------------------------------------------------------------------
# The HE path against its plaintext twin
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_ero_he_path_equals_its_plaintext_twin(recipient):
    tester, client, p, _ = calibrated_population(1500, 11, alpha=1.0)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=30, seed=2, result_recipient=recipient,
                     correction="calibration")
    report, session, _ = local_audit(tester, client, spec=spec)
    f = ((client.y_pred == 1) & (client.y_true == 0)).to_numpy(float)
    d = (client.y_true == 0).to_numpy(float)
    twin = plain_corrected(p, f, d)
    got = np.array([report.group(g).corrected_estimate for g in GROUPS])
    assert np.abs(got - twin).max() < 1e-9, (got, twin)
    assert report.overall.corrected_estimate is None
    for g in GROUPS:
        entry = report.group(g)
        assert entry.corrected_ci_low < entry.corrected_estimate < entry.corrected_ci_high
    assert report.correction["method"] == "calibration" and report.correction["unidentifiable"] == []
    cond = np.linalg.cond(correction.plain_matrix(p, d))
    assert report.correction["condition_number"] == pytest.approx(cond, rel=1e-6)
    # the weighted estimates are those of an audit without the correction
    plain, _, _ = local_audit(tester, client, spec=dataclasses.replace(spec, correction="none"))
    assert [g.estimate for g in plain.groups] == pytest.approx([g.estimate for g in report.groups], abs=1e-9)
    assert "corrected_estimate" not in plain.to_dict()["groups"][0] and "correction" not in plain.to_dict()
    # the JSON contract: the corrected fields per group, and back
    d_json = report.to_dict()
    assert {"corrected_estimate", "corrected_ci_low", "corrected_ci_high"} <= set(d_json["groups"][0])
    assert AuditReport.from_json(report.to_json()).to_dict() == d_json
    assert "corrected (calibration)" in render_text(report)


def test_pot_curves_he_path_equals_its_plaintext_twin():
    """POT: one system per reference score (several cells per ciphertext share M's items)."""
    tester, _, p, race = calibrated_population(1200, 12, alpha=1.0)
    rng = np.random.default_rng(4)
    scores = rng.beta(2, 2, size=len(p))
    outcome = (rng.random(len(p)) < np.clip(scores + 0.1 * (race == 1), 0, 1)).astype(float)
    client = pd.DataFrame({"member_id": tester.member_id, "score": scores, "outcome": outcome})
    refs = (0.25, 0.5, 0.75)
    spec = AuditSpec(metric="pot", client_dataset="d", bootstrap=10, seed=2, correction="calibration",
                     params={"reference_scores": ",".join(map(str, refs)), "bandwidth": "0.1"})
    report, _, _ = local_audit(tester, client, spec=spec)
    for s in refs:
        # the kernel values as the Test-Client encrypts them (fixed point, 24 bits)
        # (the outcome relative to its declared range's centre, 0.5: `common.metrics.pot`)
        k = np.exp(-0.5 * ((scores - s) / 0.1) ** 2)
        kernel = np.rint(k * 2.0 ** 24) / 2.0 ** 24
        kernel_y = np.rint(k * (outcome - 0.5) * 2.0 ** 24) / 2.0 ** 24
        shown = [j for j, g in enumerate(GROUPS) if g not in report.correction["unidentifiable"]]
        twin = 0.5 + plain_corrected(p, kernel_y, kernel, tuple(j for j in range(len(GROUPS)) if j not in shown))
        got = [next(c for c in report.curves if c.group == GROUPS[j] and c.score == pytest.approx(s)).corrected_estimate
               for j in shown]
        assert len(shown) >= 4 and np.abs(np.array(got) - twin[shown]).max() < 1e-9
    assert all(c.corrected_estimate is None for c in report.curves if c.group == "overall")


@pytest.mark.parametrize("metric", ["output", "mqos-ndcg"])
def test_other_ratio_metrics_he_path_equals_their_plaintext_twin(metric):
    """The output metric (d = 1) and MQOS-NDCG (a viewer's NDCG sum over its query count):
    the Test-Client's own plaintext rows (`Metric.client_rows`) through the twin."""
    from common.metrics import get_metric

    tester, _, p, race = calibrated_population(1500, 17, alpha=0.4)
    rng = np.random.default_rng(5)
    ids = tester.member_id.to_numpy()
    if metric == "output":
        client = pd.DataFrame({"member_id": ids, "outcome": np.round(rng.normal(1.0, 0.5, len(ids)) - 0.2 * (race == 1), 4)})
    else:
        rows = []
        for i, member in enumerate(ids):
            for query in range(1 + i % 2):
                grades = rng.integers(0, 5, 5)
                order = np.argsort(-(grades + rng.normal(0, 1 + (race[i] == 1), 5)))
                rows += [{"query_id": f"q{i}-{query}", "member_id": member, "rank": rank + 1,
                          "relevance": int(grades[j])} for rank, j in enumerate(order)]
        client = pd.DataFrame(rows)
    spec = AuditSpec(metric=metric, client_dataset="d", bootstrap=10, seed=2, correction="calibration")
    report, _, _ = local_audit(tester, client, spec=spec)
    m = get_metric(metric)
    frame = client.copy()
    frame["member_id"] = frame["member_id"].astype(str)
    rows = m.client_rows(frame, "d", spec.metric_option or m.options[0], m.parse_params({}), np.random.default_rng(0))
    comps = m.components(m.options[0], m.parse_params({}), rows.info)
    values = np.column_stack([c.quantize(rows.values[:, i]) / 2.0 ** c.scale_bits for i, c in enumerate(comps)])
    order = {member: i for i, member in enumerate(ids)}
    joined = p[[order[x] for x in rows.ids[0]]]
    hidden = tuple(j for j, g in enumerate(GROUPS) if g in report.correction["unidentifiable"])
    # both encode their values relative to 0.5 (the output metric's default range 0:1, NDCG)
    twin = 0.5 + plain_corrected(joined, values[:, 0], values[:, 1], hidden)
    got = np.array([report.group(g).corrected_estimate or np.nan for g in GROUPS])
    shown = [j for j in range(len(GROUPS)) if j not in hidden]
    assert len(shown) >= 4 and np.abs(got[shown] - twin[shown]).max() < 1e-9, (got, twin)


def test_ratio_masks_share_one_factor_per_replicate_only_with_the_correction(monkeypatch):
    """The solve mixes a replicate's cells, so their masks must share the factor (each
    slot keeps its own noise); without the correction every item has its own."""
    from tester_service import aggregation

    tester, client, _, _ = calibrated_population(600, 13, alpha=1.0)
    factors: list = []
    original = aggregation.mask_chunk

    def recording(n, h, items, ratio, pads):
        factors.extend(r for r, _ in ratio)
        return original(n, h, items, ratio, pads)

    monkeypatch.setattr(aggregation, "mask_chunk", recording)
    n_items = {"none": len(GROUPS) + 1, "calibration": len(GROUPS) + 1 + len(correction.pairs(len(GROUPS)))}
    for method, items in n_items.items():
        factors.clear()
        spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=2, correction=method)
        local_audit(tester, client, spec=spec)
        rows = [factors[i:i + items] for i in range(0, 6 * items, items)]  # estimate + 5 replicates
        assert len(factors) == 7 * items  # and a zero test per item (factor 1: sent as it is)
        if method == "none":
            assert all(len(set(row)) == items for row in rows)
        else:
            assert all(len(set(row)) == 1 for row in rows) and len({row[0] for row in rows}) == 6


# ----------------------------------------------------------------------------------
# Identifiability, release noise, refusals
# ----------------------------------------------------------------------------------
def test_a_group_too_mixed_to_tell_apart_is_withheld():
    """aian and multiple carry the same small probability everywhere: their rows of M are
    identical, so neither is identifiable; the others still get corrected values."""
    tester, client, p, _ = calibrated_population(1500, 14, alpha=1.0)
    q = p.copy()
    shared = (q[:, 3] + q[:, 4]) / 2
    q[:, 3] = q[:, 4] = shared
    tester[GROUPS] = q
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=2, correction="calibration")
    report, _, _ = local_audit(tester, client, spec=spec)
    assert sorted(report.correction["unidentifiable"]) == ["aian", "multiple"]
    for g in ("aian", "multiple"):
        assert report.group(g).corrected_estimate is None and report.group(g).estimate is not None
    # the others are solved for, with the hidden groups' weighted rates subtracted from their rows
    f = ((client.y_pred == 1) & (client.y_true == 0)).to_numpy(float)
    d = (client.y_true == 0).to_numpy(float)
    twin = plain_corrected(q, f, d, hidden=(3, 4))
    got = np.array([report.group(g).corrected_estimate or np.nan for g in GROUPS])
    assert np.allclose(got[[0, 1, 2, 5]], twin[[0, 1, 2, 5]], atol=1e-9, rtol=0)
    assert "not identifiable at this size" in render_text(report)


def test_release_noise_covers_the_correction_items_and_the_weighted_estimate_does_not_pay_for_them():
    """Under release noise ERO releases its estimate and the pair items (its second
    moments, which are also M: `common.stats.moments`) with or without the correction, each
    with its own noise (`ReleasePolicy.moment_sigmas`): the group items' noise is the same
    whether the correction is asked for or not, the pair items' is larger by
    sqrt(4·share ratio), and the identifiability threshold follows the noise
    (`correction.noise_threshold`)."""
    from tester_service.release import MOMENT_SHARE, PAIR_FACTOR, THRESHOLD_SHARE

    tester, client, _, _ = calibrated_population(6000, 15, alpha=0.2)  # identifying sizes ~350
    headers, reports = {}, {}
    for method in ("none", "calibration"):
        def tap(direction, msg, method=method):
            if msg.WhichOneof("body") == "aggregates_header":
                headers[method] = msg.aggregates_header
        spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=2, correction=method)
        reports[method], _, _ = local_audit(tester, client, spec=spec, tap=tap, release=ReleasePolicy())
        assert reports[method].interval == "percentile" and headers[method].interval == "parametric"
    plain, corrected = np.array(headers["none"].noise_sd), np.array(headers["calibration"].noise_sd)
    assert np.array_equal(plain, corrected)  # the same release either way
    k, slots = len(GROUPS), headers["none"].item_slots
    groups, pairs_sd = plain[:k * slots], plain[(k + 1) * slots:plain.size // 2]
    ratio = np.sqrt(PAIR_FACTOR * (1 - MOMENT_SHARE - THRESHOLD_SHARE) / MOMENT_SHARE)
    assert np.allclose(pairs_sd / groups[0], ratio) and np.allclose(groups, groups[0])
    report = reports["calibration"]
    assert report.group("white").corrected_estimate is not None
    assert report.group("white").corrected_ci_low <= report.group("white").corrected_estimate \
        <= report.group("white").corrected_ci_high
    threshold = correction.noise_threshold(groups[0] / 2.0 ** 32)
    assert report.correction["min_identifying_size"] == pytest.approx(threshold, abs=0.1) and threshold > 30
    assert reports["none"].correction == {} and reports["none"].group("white").corrected_estimate is None


def test_an_operator_may_not_ask_a_metric_without_a_correction_for_one():
    with pytest.raises(InputError, match="no attenuation correction"):
        AuditSpec(metric="lot", client_dataset="d", correction="calibration").validated()
    with pytest.raises(InputError, match="is not a correction"):
        AuditSpec(metric="ero", client_dataset="d", correction="magic").validated()


def test_the_test_client_refuses_a_hello_asking_an_impossible_correction():
    from common.protocol import validation

    inbound = validation.ClientInbound()
    hello = pb.Hello(protocol_version=validation.PROTOCOL_VERSION, metric="lot", salt_share=b"\0" * 32,
                     probability_bits=32, result_recipient="client", sealed_width=validation.sealed_width(6),
                     buckets=128, correction="calibration")
    with pytest.raises(ProtocolError, match="correction"):
        inbound._hello(None, hello)
    with pytest.raises(ProtocolError, match="correction"):
        inbound._hello(None, pb.Hello(**{**{f.name: getattr(hello, f.name) for f, _ in hello.ListFields()},
                                         "metric": "ero", "correction": "magic"}))


@pytest.mark.parametrize("tamper", ["unknown_group", "without_correction"])
def test_a_header_naming_impossible_unidentifiable_groups_is_a_protocol_error(tamper):
    """The Test-Client checks the Tester's list of withheld groups: they must be among the
    groups, and only an audit with a correction has any."""
    tester, client, _, _ = calibrated_population(400, 16, alpha=1.0)

    def tap(direction, msg):
        if msg.WhichOneof("body") == "aggregates_header":
            msg.aggregates_header.unidentifiable.append("martian" if tamper == "unknown_group" else "white")

    method = "calibration" if tamper == "unknown_group" else "none"
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=5, seed=2, correction=method)
    with pytest.raises(ProtocolError, match="unidentifiable groups"):
        local_audit(tester, client, spec=spec, tap=tap)


@pytest.mark.slow
def test_a_new_user_sees_the_correction_recover_an_injected_disparity(tmp_path):
    """As a new user would: `ppre synth --mode calibrated` with the default injected
    disparity (black FPR +0.08), then `ppre audit --local --correction calibration`
    (real services, BISG + Self-ID + clipping inside the audit). The large groups'
    corrected intervals contain their true-race FPR, and for black members the corrected
    value is closer to the truth than the weighted one, whose interval misses it."""
    import json
    import subprocess
    import sys

    ppre = [sys.executable, "-m", "ppre.cli"]
    pop = tmp_path / "pop"
    subprocess.run(ppre + ["synth", "--members", "20000", "--seed", "7", "--mode", "calibrated", "--out", str(pop)],
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run(ppre + ["audit", "--local", "--metric", "ero", "--tester-members", str(pop / "members.csv"),
                                 "--tester-self-id", str(pop / "self_id.csv"), "--client-data",
                                 str(pop / "client" / "ero.csv"), "--correction", "calibration", "--insecure",
                                 "--no-release-controls", "--bootstrap", "100", "--seed", "3", "--json"],
                         check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout)
    truth = pd.read_csv(pop / "truth.csv").merge(pd.read_csv(pop / "client" / "ero.csv"))
    negatives = truth[truth.y_true == 0]
    true_fpr = negatives.groupby("race").y_pred.mean()
    groups = {g["group"]: g for g in report["groups"]}
    for name in ("white", "hispanic"):
        g = groups[name]
        assert g["corrected_ci_low"] <= true_fpr[name] <= g["corrected_ci_high"], (name, g, true_fpr[name])
    black = groups["black"]
    assert abs(black["corrected_estimate"] - true_fpr["black"]) < abs(black["estimate"] - true_fpr["black"])
    assert not black["ci_low"] <= true_fpr["black"] <= black["ci_high"]
    assert report["correction"]["condition_number"] > 1
