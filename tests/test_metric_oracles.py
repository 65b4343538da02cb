"""Oracle tests: every metric, computed through the REAL gRPC services (both servers in
this process on loopback ports, `ppre.local.local_services`), equals a standard
implementation that nobody here wrote (fairlearn, scikit-learn, pandas, numpy, or a
direct Monte Carlo simulation).

The Tester's probabilities are hard one-hot groups unless said otherwise, so the
weighted estimators of design §5 reduce to the textbook per-group statistics.
The Tester's and the Test-Client's member sets overlap only partly, so the oracles are
computed on the intersection (the PSI join is exercised as well). Both finishing paths
are used: the Test-Client learns the result (`result_recipient="client"`, ratio masks)
or only the Tester does (`"tester"`, additive masks).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fairlearn.metrics import MetricFrame, false_positive_rate
from sklearn.metrics import ndcg_score, roc_auc_score

from client_service.datasets import DatasetRegistry
from common.races import RACES
from common.stats.results import AuditReport
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS

GROUPS = list(RACES)
#: unequal group shares (every group still has dozens of members at n >= 600)
SHARES = np.array([0.40, 0.22, 0.14, 0.10, 0.07, 0.07])


# ----------------------------------------------------------------------------------
# Driving an audit through the services
# ----------------------------------------------------------------------------------
def run_through_services(tmp_path, probabilities: pd.DataFrame, dataset: pd.DataFrame, metric: str, *,
                         option: str = "", params: dict | None = None, recipient: str = "client",
                         bootstrap: int = 20, seed: int = 1) -> AuditReport:
    """One audit over real gRPC: the Tester holds `probabilities` (member_id + group
    columns), the Test-Client the dataset `dataset` (written to a CSV file)."""
    path = tmp_path / f"{metric}-{option or 'default'}-{recipient}.csv"
    dataset.to_csv(path, index=False)
    table = probabilities.copy()
    request = pb.AuditRequest(metric=metric, client_dataset="d", bootstrap=bootstrap, confidence=0.95,
                              has_seed=True, seed=seed, metric_option=option,
                              metric_params={k: str(v) for k, v in (params or {}).items()},
                              result_recipient=recipient)
    with local_services(lambda: table.copy(), DatasetRegistry(named={"d": path}), modulus_bits=TEST_BITS,
                        allow_insecure=True, release=NO_RELEASE_CONTROLS) as svc:
        event = run_audit(svc.tester_address, request)
    assert event.WhichOneof("event") == "result", event
    report = AuditReport.from_proto(event.result)
    assert report.metric == metric and report.result_recipient == recipient
    return report


def hard_table(ids, labels, groups=GROUPS) -> pd.DataFrame:
    """One-hot probabilities: member ids[i] is in groups[labels[i]] with probability 1."""
    table = pd.DataFrame(np.eye(len(groups))[np.asarray(labels)], columns=list(groups))
    table.insert(0, "member_id", list(ids))
    return table


def soft_table(ids, rng: np.random.Generator, groups=GROUPS, alpha: float = 0.6) -> pd.DataFrame:
    table = pd.DataFrame(rng.dirichlet(np.full(len(groups), alpha), len(ids)), columns=list(groups))
    table.insert(0, "member_id", list(ids))
    return table


def member_sets(n_shared: int, n_tester_only: int, n_client_only: int):
    """(shared ids, Tester-only ids, Test-Client-only ids): the join keeps the shared ones."""
    return ([f"m{i:06d}" for i in range(n_shared)], [f"t{i:06d}" for i in range(n_tester_only)],
            [f"c{i:06d}" for i in range(n_client_only)])


def by_name(report: AuditReport) -> dict[str, float | None]:
    return {g.group: g.estimate for g in report.groups}


def approx_or_none(got, want, tol):
    if want is None or (isinstance(want, float) and math.isnan(want)):
        return got is None
    return got is not None and abs(got - want) <= tol


# ----------------------------------------------------------------------------------
# The documented to_dict() contract (results.py; `ppre audit --json`)
# ----------------------------------------------------------------------------------
TOP_KEYS = {"metric", "n_matched", "bootstrap", "confidence", "groups", "verdict"}
GROUP_KEYS = {"group", "estimate", "ci_low", "ci_high", "informative"}
CELL_KEYS = {"higher", "lower", "rank_pair", "estimate", "ci_low", "ci_high", "informative"}
CURVE_KEYS = {"group", "score", "estimate", "ci_low", "ci_high", "informative"}
POOL_KEYS = {"pool", "group", "members", "expected_count", "prob_at_least", "included"}
VERDICT_KEYS = {"rule", "tau", "severity", "significant", "flagged", "compared", "message"}


def check_contract(report: AuditReport, *, part: str | None = None, part_keys: set[str] | None = None,
                   with_groups: bool = True) -> dict:
    """`report.to_dict()` has the documented keys; `with_groups=False` for the metrics whose
    result is pair cells or curves only (LOT, POT: `groups` is then present but may be empty)."""
    d = report.to_dict()
    assert TOP_KEYS <= set(d), TOP_KEYS - set(d)
    assert d["metric"] == report.metric and d["n_matched"] == report.n_matched > 0
    assert isinstance(d["bootstrap"], int) and 0 < d["confidence"] < 1
    assert isinstance(d["groups"], list) and all(set(g) == GROUP_KEYS for g in d["groups"])
    if with_groups:
        assert d["groups"]
    assert VERDICT_KEYS <= set(d["verdict"])
    if part is not None:
        assert d.get(part), f"{part} missing or empty"
        assert all(set(x) == part_keys for x in d[part]), d[part][:2]
    # what `ppre audit --json` prints reads back to the same object
    assert AuditReport.from_json(report.to_json()).to_dict() == d
    return d


# ----------------------------------------------------------------------------------
# 1. ERO: fairlearn's MetricFrame(false_positive_rate)
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("option,recipient", [("fpr", "client"), ("unconditional", "tester")])
def test_ero_equals_fairlearn_metricframe(tmp_path, option, recipient):
    rng = np.random.default_rng(101)
    shared, t_only, c_only = member_sets(900, 60, 80)
    labels = rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES)
    table = hard_table(shared + t_only, labels)
    ids = np.array(shared + c_only, dtype=object)
    group_of = dict(zip(shared, labels[:len(shared)]))
    g = np.array([group_of.get(m, 0) for m in ids])
    y_true = (rng.random(len(ids)) < 0.35 + 0.05 * g).astype(int)
    y_pred = np.where(y_true == 1, rng.random(len(ids)) < 0.8, rng.random(len(ids)) < 0.10 + 0.06 * g).astype(int)
    client = pd.DataFrame({"member_id": ids, "y_true": y_true, "y_pred": y_pred}).sample(frac=1, random_state=3)

    report = run_through_services(tmp_path, table, client, "ero", option=option, recipient=recipient,
                                  bootstrap=50)

    matched = client[client.member_id.isin(shared)]
    race = matched.member_id.map({m: GROUPS[l] for m, l in group_of.items()})
    if option == "fpr":
        metric = false_positive_rate
    else:  # the paper's eq. 6: false positives over everyone, not over the negatives
        def metric(yt, yp):
            return float(np.mean((np.asarray(yp) == 1) & (np.asarray(yt) == 0)))
    frame = MetricFrame(metrics=metric, y_true=matched.y_true.to_numpy(), y_pred=matched.y_pred.to_numpy(),
                        sensitive_features=race.to_numpy())
    got = by_name(report)
    assert report.n_matched == len(shared)
    assert [x.group for x in report.groups] == GROUPS + ["overall"]
    for group, want in frame.by_group.items():
        assert got[group] == pytest.approx(want, abs=1e-9), group
    assert got["overall"] == pytest.approx(frame.overall, abs=1e-9)
    # the range verdict compares the groups' largest gap, the same as MetricFrame's difference()
    gaps = [abs(d.estimate) for d in report.differences if d.kind == "between"]
    assert max(gaps) == pytest.approx(frame.difference(method="between_groups"), abs=1e-9)
    assert report.verdict.rule == "range"
    d = check_contract(report)
    assert d["metric_option"] == option and d["bootstrap"] == 50


# ----------------------------------------------------------------------------------
# 2. MQOS-NDCG: scikit-learn's ndcg_score, one query at a time
# ----------------------------------------------------------------------------------
def viewer_queries(rng, viewers: list[str], n_queries: int, *, min_len=2, max_len=9, grades=5) -> pd.DataFrame:
    """Ranked lists, each issued by one viewer (member_id, the same on all rows of a query)."""
    rows = []
    for q in range(n_queries):
        length = int(rng.integers(min_len, max_len + 1))
        viewer = viewers[int(rng.integers(0, len(viewers)))]
        rel = rng.integers(0, grades, length)
        for r in range(length):
            rows.append((f"q{q:05d}", viewer, r + 1, int(rel[r])))
    frame = pd.DataFrame(rows, columns=["query_id", "member_id", "rank", "relevance"])
    return frame.sample(frac=1, random_state=int(rng.integers(1 << 30))).reset_index(drop=True)


def test_mqos_ndcg_equals_sklearn_ndcg_score(tmp_path):
    rng = np.random.default_rng(202)
    shared, t_only, c_only = member_sets(300, 40, 30)
    labels = rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES)
    table = hard_table(shared + t_only, labels)
    group_of = {m: GROUPS[l] for m, l in zip(shared, labels)}
    client = viewer_queries(rng, shared + c_only, 900)

    report = run_through_services(tmp_path, table, client, "mqos-ndcg", recipient="client",
                                  params={"max_queries_per_viewer": 1000})  # every query enters

    per_query = []
    for qid, rows in client.groupby("query_id"):
        rows = rows.sort_values("rank")
        gains = 2.0 ** rows.relevance.to_numpy() - 1.0
        score = ndcg_score([gains], [-rows["rank"].to_numpy(dtype=float)])
        per_query.append((rows.member_id.iloc[0], score))
    oracle = pd.DataFrame(per_query, columns=["viewer", "ndcg"])
    oracle = oracle[oracle.viewer.isin(group_of)]
    oracle["group"] = oracle.viewer.map(group_of)
    assert (oracle.ndcg == 0).any(), "the data should hold a query whose relevances are all 0"
    want = oracle.groupby("group").ndcg.mean()
    got = by_name(report)
    assert set(want.index) == set(GROUPS)
    assert report.n_matched == oracle.viewer.nunique()
    for group in GROUPS:
        assert got[group] == pytest.approx(want[group], abs=1e-6), group
    assert got["overall"] == pytest.approx(oracle.ndcg.mean(), abs=1e-6)
    assert report.verdict.rule == "below_overall"


# ----------------------------------------------------------------------------------
# 3. MQOS-AUC exact: scikit-learn's roc_auc_score, ties included
# ----------------------------------------------------------------------------------
def auc_data(rng, n_shared=1000, n_tester_only=50, n_client_only=60, decimals=1):
    shared, t_only, c_only = member_sets(n_shared, n_tester_only, n_client_only)
    labels = rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES)
    table = hard_table(shared + t_only, labels)
    group_of = {m: GROUPS[l] for m, l in zip(shared, labels)}
    ids = np.array(shared + c_only, dtype=object)
    g = np.array([GROUPS.index(group_of[m]) if m in group_of else 0 for m in ids])
    y = (rng.random(len(ids)) < 0.4).astype(int)
    signal = 1.2 - 0.15 * g  # a weaker score for some groups: the AUCs differ
    score = np.clip(0.5 + 0.18 * (signal * (y - 0.5) + rng.normal(0, 0.8, len(ids))), 0, 1)
    score = np.round(score, decimals)  # many ties
    client = pd.DataFrame({"member_id": ids, "y_true": y, "score": score}).sample(frac=1, random_state=5)
    return table, client, group_of


def test_mqos_auc_exact_equals_sklearn_roc_auc_with_ties(tmp_path):
    rng = np.random.default_rng(303)
    table, client, group_of = auc_data(rng)
    assert client.score.nunique() <= 11

    report = run_through_services(tmp_path, table, client, "mqos-auc", option="exact", recipient="tester")

    matched = client[client.member_id.isin(group_of)].assign(group=lambda f: f.member_id.map(group_of))
    want = {g: roc_auc_score(rows.y_true, rows.score) for g, rows in matched.groupby("group")}
    want["overall"] = roc_auc_score(matched.y_true, matched.score)
    got = by_name(report)
    assert report.n_matched == len(matched)
    assert set(got) == set(GROUPS) | {"overall"}
    for group, value in want.items():
        assert got[group] == pytest.approx(value, abs=1e-6), group
    # differences: each group to overall (group − overall) and between groups (a − b)
    to_overall = {d.a: d for d in report.differences if d.kind == "to_overall"}
    assert set(to_overall) == set(GROUPS)
    for group in GROUPS:
        d = to_overall[group]
        assert d.b == "overall"
        assert d.estimate == pytest.approx(want[group] - want["overall"], abs=1e-6)
        assert d.ci_low is not None and d.ci_low <= d.estimate <= d.ci_high
    between = {(d.a, d.b): d.estimate for d in report.differences if d.kind == "between"}
    assert len(between) == len(GROUPS) * (len(GROUPS) - 1) // 2
    for (a, b), est in between.items():
        assert est == pytest.approx(want[a] - want[b], abs=1e-6)
    assert report.interval == "random_groups" and report.verdict.rule == "below_overall"


# ----------------------------------------------------------------------------------
# 4. MQOS-AUC sampled: within its sampling error of roc_auc_score
# ----------------------------------------------------------------------------------
def simulate_uniform_pairs(y, s, codes, k, pairs, sims, rng) -> np.ndarray:
    """(sims, k + 1): the sampled estimator's distribution under the documented design
    (common/metrics/mqos_auc.py, B.2.2): `pairs` pairs of a uniform positive and a uniform
    negative; a group's estimate is the mean indicator over the pairs with both members
    in the group (hard groups), the last column over all pairs."""
    out = np.full((sims, k + 1), np.nan)
    pos_idx, neg_idx = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    for t in range(sims):
        i = pos_idx[rng.integers(0, len(pos_idx), pairs)]
        l = neg_idx[rng.integers(0, len(neg_idx), pairs)]
        ind = np.where(s[i] > s[l], 1.0, np.where(s[i] == s[l], 0.5, 0.0))
        same = codes[i] == codes[l]
        for j in range(k):
            sel = same & (codes[i] == j)
            if sel.any():
                out[t, j] = ind[sel].mean()
        out[t, k] = ind.mean()
    return out


@pytest.mark.slow
def test_mqos_auc_sampled_within_sampling_error_of_sklearn(tmp_path):
    rng = np.random.default_rng(404)
    shared, t_only, _ = member_sets(1200, 40, 0)
    labels = rng.permutation(np.arange(len(shared) + len(t_only)) % len(GROUPS))  # equal shares
    table = hard_table(shared + t_only, labels)
    g = labels[:len(shared)]
    y = (rng.random(len(shared)) < 0.4).astype(int)
    score = np.round(np.clip(0.5 + 0.18 * ((1.2 - 0.15 * g) * (y - 0.5) + rng.normal(0, 0.8, len(shared))), 0, 1), 1)
    client = pd.DataFrame({"member_id": shared, "y_true": y, "score": score})
    # every row is Paillier-encrypted: 200,000 take about 2 minutes on 2 cores; the pairs hide
    # among dummy rows, about 1/(2·0.4·0.6) ≈ 2.1 rows per pair (docs/metrics/mqos-auc.md)
    pairs = 15_000

    # a cap of 100 rows per member keeps all 15,000 pairs (in about 32,000 rows): the design simulated below
    report = run_through_services(tmp_path, table, client, "mqos-auc", option="sampled",
                                  params={"pairs": pairs, "pairs_per_member": 100}, recipient="client")

    # the oracle: scikit-learn's AUC per group and overall; the tolerance: 4 standard
    # deviations of the documented sampling design, by simulation
    sim = simulate_uniform_pairs(y, score, g, len(GROUPS), pairs, 200, np.random.default_rng(5))
    sd = np.nanstd(sim, axis=0, ddof=1)
    want = [roc_auc_score(y[g == j], score[g == j]) for j in range(len(GROUPS))] + [roc_auc_score(y, score)]
    assert np.all(np.abs(np.nanmean(sim, axis=0) - want) <= 4 * sd / math.sqrt(len(sim)) + 0.01)
    got = by_name(report)
    for j, group in enumerate(GROUPS + ["overall"]):
        assert got[group] is not None, group
        assert abs(got[group] - want[j]) <= 4 * sd[j], (group, got[group], want[j], sd[j])
    assert report.info["pairs"] == pairs and report.info["pairs_dropped"] == 0
    assert {d.a for d in report.differences if d.kind == "to_overall"} == set(GROUPS)
    assert report.interval == "random_groups"


# ----------------------------------------------------------------------------------
# 5. Output metric: pandas groupby means
# ----------------------------------------------------------------------------------
def test_output_metric_equals_pandas_groupby_mean(tmp_path):
    rng = np.random.default_rng(505)
    shared, t_only, c_only = member_sets(1000, 50, 70)
    labels = rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES)
    table = hard_table(shared + t_only, labels)
    group_of = {m: GROUPS[l] for m, l in zip(shared, labels)}
    ids = shared + c_only
    shift = np.array([GROUPS.index(group_of[m]) if m in group_of else 0 for m in ids], dtype=float)
    outcome = np.round(rng.normal(-3.0 + 2.5 * shift, 40.0, len(ids)), 6)  # signed reals
    client = pd.DataFrame({"member_id": ids, "outcome": outcome}).sample(frac=1, random_state=7)

    report = run_through_services(tmp_path, table, client, "output", recipient="tester",
                                  params={"outcome_range": "-1000:1000", "out_of_range": "refuse"})

    matched = client[client.member_id.isin(group_of)]
    want = matched.groupby(matched.member_id.map(group_of)).outcome.mean()
    got = by_name(report)
    assert (matched.outcome < 0).any() and (matched.outcome > 0).any()
    for group in GROUPS:
        assert got[group] == pytest.approx(want[group], abs=1e-6), group
    assert got["overall"] == pytest.approx(matched.outcome.mean(), abs=1e-6)
    assert report.verdict.rule == "range"
    check_contract(report)


# ----------------------------------------------------------------------------------
# 6. POT: direct Nadaraya-Watson with numpy, hard and soft groups; DTI
# ----------------------------------------------------------------------------------
def nadaraya_watson(weights: np.ndarray, scores: np.ndarray, outcome: np.ndarray, refs, h) -> np.ndarray:
    """(Q, k): m_j(s_q) = Σ_i w_ij K_h(S_i − s_q) Y_i / Σ_i w_ij K_h(S_i − s_q), Gaussian K
    (``h`` one bandwidth or one per reference score)."""
    out = np.empty((len(refs), weights.shape[1]))
    for q, (ref, hq) in enumerate(zip(refs, np.broadcast_to(h, np.shape(refs)))):
        k = np.exp(-0.5 * ((scores - ref) / hq) ** 2) / (hq * math.sqrt(2 * math.pi))
        for j in range(weights.shape[1]):
            out[q, j] = np.sum(weights[:, j] * k * outcome) / np.sum(weights[:, j] * k)
    return out


@pytest.mark.parametrize("soft,recipient,dti_weights", [(False, "client", None), (True, "tester", None),
                                                        (True, "client", (0.5, 0.3, 0.2))])
def test_pot_curves_equal_nadaraya_watson_and_dti(tmp_path, soft, recipient, dti_weights):
    rng = np.random.default_rng(606 + soft)
    shared, t_only, c_only = member_sets(800, 40, 50)
    # h = 0.2: every kernel value K(S_i - s_q) on [0, 1] is >= exp(-4.5), far from rounding to 0
    # (see test_pot_negative_outcome_where_a_kernel_rounds_to_zero for what happens then)
    refs, h = (0.2, 0.5, 0.8), 0.2
    if soft:
        table = soft_table(shared + t_only, rng)
    else:
        table = hard_table(shared + t_only, rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES))
    ids = shared + c_only
    score = rng.uniform(0, 1, len(ids))
    outcome = np.round(2.0 * score + rng.normal(0, 1.0, len(ids)) - 0.7, 6)
    client = pd.DataFrame({"member_id": ids, "score": score, "outcome": outcome}).sample(frac=1, random_state=9)
    params = {"reference_scores": ",".join(map(str, refs)), "bandwidth": h, "outcome_range": "-10:10",
              "out_of_range": "refuse"}
    if dti_weights is not None:
        params["dti_weights"] = ",".join(map(str, dti_weights))

    report = run_through_services(tmp_path, table, client, "pot", params=params, recipient=recipient)

    matched = client.merge(table, on="member_id")
    w = matched[GROUPS].to_numpy()
    s, y = matched.score.to_numpy(), matched.outcome.to_numpy()
    m = nadaraya_watson(np.column_stack([w, np.ones(len(w))]), s, y, refs, h)
    names = GROUPS + ["overall"]
    curves = {(c.group, c.score): c.estimate for c in report.curves}
    assert len(curves) == len(names) * len(refs) == len(report.curves)
    for j, group in enumerate(names):
        for q, ref in enumerate(refs):
            assert curves[(group, ref)] == pytest.approx(m[q, j], abs=1e-5), (group, ref)
    # DTI_ab = Σ_q w_q (m_a(s_q) − m_b(s_q)), w uniform 1/Q unless given
    wq = np.full(len(refs), 1 / len(refs)) if dti_weights is None else np.asarray(dti_weights)
    cells = {(c.higher, c.lower): c for c in report.cells}
    assert len(cells) == len(report.cells) == len(GROUPS) * (len(GROUPS) - 1)
    for a, ga in enumerate(GROUPS):
        for b, gb in enumerate(GROUPS):
            if a != b:
                cell = cells[(ga, gb)]
                assert cell.rank_pair is None
                assert cell.estimate == pytest.approx(float(wq @ (m[:, a] - m[:, b])), abs=1e-5), (ga, gb)
    assert report.n_matched == len(matched) and report.verdict.rule == "nonzero_pairs"
    d = check_contract(report, part="curves", part_keys=CURVE_KEYS, with_groups=False)
    assert all(set(c) == CELL_KEYS for c in d["cells"])


def test_pot_negative_outcome_where_a_kernel_rounds_to_zero(tmp_path):
    """Signed outcomes with the default reference scores (deciles) and bandwidths (Silverman's
    rule for n/50 rows, scaled by each decile's local spacing): a row about 6 bandwidths from a
    reference score has a kernel below 2^-25 (it rounds to 0)
    while |K·Y| >= 2^-25 (it does not). The curves must still equal Nadaraya-Watson."""
    rng = np.random.default_rng(610)
    shared, t_only, c_only = member_sets(600, 20, 20)
    table = hard_table(shared + t_only, rng.choice(len(GROUPS), len(shared) + len(t_only), p=SHARES))
    ids = shared + c_only
    score = rng.uniform(0, 1, len(ids))
    outcome = np.round(rng.normal(0, 3.0, len(ids)), 6)
    client = pd.DataFrame({"member_id": ids, "score": score, "outcome": outcome})

    report = run_through_services(tmp_path, table, client, "pot", recipient="tester",
                                  params={"outcome_range": "-50:50", "out_of_range": "refuse"})

    refs = np.quantile(score, np.arange(1, 10) / 10)  # the default: the deciles of the dataset's scores
    assert report.info["reference_scores"] == pytest.approx(list(refs), abs=1e-12)
    sd, (q75, q25) = np.std(score, ddof=1), np.percentile(score, [75, 25])
    scale = 0.9 * min(sd, (q75 - q25) / 1.34) * (len(score) / 50) ** -0.2  # Silverman's rule for n/50 rows
    ranks = np.clip([np.mean(score < r) for r in refs], 0.05, 0.95)  # each decile's window: 10% of the scores
    spacing = np.quantile(score, ranks + 0.05) - np.quantile(score, ranks - 0.05)
    h = scale * np.clip(spacing / np.median(spacing), 0.25, 4.0)
    assert report.info["bandwidth"] == pytest.approx(list(h), rel=1e-12)
    matched = client.merge(table, on="member_id")
    w = np.column_stack([matched[GROUPS].to_numpy(), np.ones(len(matched))])
    m = nadaraya_watson(w, matched.score.to_numpy(), matched.outcome.to_numpy(), refs, h)
    curves = {(c.group, c.score): c.estimate for c in report.curves}
    for j, group in enumerate(GROUPS + ["overall"]):
        for q, ref in enumerate(refs):
            assert curves[(group, float(ref))] == pytest.approx(m[q, j], abs=1e-5), (group, ref)


# ----------------------------------------------------------------------------------
# 7. Probabilistic count: exact 0/1 on hard groups, Monte Carlo on soft ones
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [1, 3])
def test_prob_count_hard_groups_is_zero_or_one(tmp_path, threshold):
    rng = np.random.default_rng(707)
    # per pool, how many joined members each group has (0 .. 5); the pools' sizes differ
    counts = {"north": [5, 3, 2, 1, 0, 4], "south": [0, 1, 3, 2, 6, 0]}
    rows, labels, ids = [], [], []
    for pool, per_group in counts.items():
        for j, c in enumerate(per_group):
            for _ in range(c):
                member = f"m{len(ids):06d}"
                ids.append(member)
                labels.append(j)
                rows.append((member, pool))
    t_only = [f"t{i:06d}" for i in range(30)]
    table = hard_table(ids + t_only, labels + list(rng.integers(0, len(GROUPS), len(t_only))))
    rows += [(f"c{i:06d}", "north") for i in range(7)] + [(f"c{i:06d}", "south") for i in range(7, 10)]
    client = pd.DataFrame(rows, columns=["member_id", "pool"]).sample(frac=1, random_state=11)

    report = run_through_services(tmp_path, table, client, "prob-count",
                                  params={"count_threshold": threshold, "inclusion_level": 0.9},
                                  recipient="tester")

    pools = {(p.pool, p.group): p for p in report.pools}
    assert len(pools) == len(report.pools) == 2 * len(GROUPS)
    for pool, per_group in counts.items():
        for j, group in enumerate(GROUPS):
            p = pools[(pool, group)]
            assert p.members == sum(per_group)
            assert p.prob_at_least == (1.0 if per_group[j] >= threshold else 0.0), (pool, group)
            assert p.expected_count == pytest.approx(per_group[j], abs=1e-9)
            assert p.included == (per_group[j] >= threshold)
    total = np.sum(list(counts.values()), axis=0)
    for j, group in enumerate(GROUPS):
        assert report.group(group).estimate == (1.0 if total[j] >= threshold else 0.0)
    assert report.n_matched == len(ids)
    assert report.verdict.flagged  # some group falls short in some pool
    check_contract(report, part="pools", part_keys=POOL_KEYS)


def test_prob_count_soft_groups_matches_monte_carlo(tmp_path):
    rng = np.random.default_rng(708)
    sizes = {"small": 12, "large": 40}
    threshold, draws = 3, 100_000
    ids, pool_of = [], {}
    for pool, size in sizes.items():
        for _ in range(size):
            member = f"m{len(ids):06d}"
            ids.append(member)
            pool_of[member] = pool
    table = soft_table(ids + [f"t{i:06d}" for i in range(20)], rng, alpha=0.4)
    client = pd.DataFrame({"member_id": ids + ["c000001"], "pool": [pool_of[m] for m in ids] + ["small"]})

    report = run_through_services(tmp_path, table, client, "prob-count",
                                  params={"count_threshold": threshold}, recipient="client")

    p_all = table.set_index("member_id").loc[ids, GROUPS].to_numpy()
    pools = {(p.pool, p.group): p for p in report.pools}

    def monte_carlo(p):
        """Pr(N_j >= T) per group: each member draws one group from its row, `draws` times."""
        cum = np.cumsum(p, axis=1)
        cum[:, -1] = 1.0
        out = np.zeros(p.shape[1])
        for chunk in np.array_split(np.arange(draws), 10):
            u = rng.random((len(chunk), p.shape[0], 1))
            g = (u > cum[None, :, :]).sum(axis=2)  # (draws, members): each member's drawn group
            counts = np.stack([(g == j).sum(axis=1) for j in range(p.shape[1])], axis=1)
            out += (counts >= threshold).sum(axis=0)
        return out / draws

    for pool in sizes:
        rows = p_all[[pool_of[m] == pool for m in ids]]
        mc = monte_carlo(rows)
        for j, group in enumerate(GROUPS):
            cell = pools[(pool, group)]
            se = max(math.sqrt(mc[j] * (1 - mc[j]) / draws), 1.0 / draws)
            assert abs(cell.prob_at_least - mc[j]) <= 4 * se, (pool, group, cell.prob_at_least, mc[j])
            assert cell.expected_count == pytest.approx(rows[:, j].sum(), abs=1e-6)
            assert cell.members == sizes[pool]
    mc = monte_carlo(p_all)
    for j, group in enumerate(GROUPS):
        se = max(math.sqrt(mc[j] * (1 - mc[j]) / draws), 1.0 / draws)
        assert abs(report.group(group).estimate - mc[j]) <= 4 * se, group


# ----------------------------------------------------------------------------------
# 8. LOT: a direct pandas computation of eq. 7 on a 2-group (hsm / non_hsm) split
# ----------------------------------------------------------------------------------
SPLIT = ["hsm", "non_hsm"]


def candidate_lists(rng, n_queries: int, n_members: int, *, min_len=2, max_len=7, grades: int | None = 4):
    rows = []
    for q in range(n_queries):
        length = int(rng.integers(min_len, max_len + 1))
        members = rng.choice(n_members, length, replace=False)
        rel = rng.integers(0, grades, length) if grades else np.round(rng.uniform(-1.5, 3.0, length), 4)
        rows += [(f"q{q:05d}", f"m{members[r]:06d}", r + 1, float(rel[r])) for r in range(length)]
    frame = pd.DataFrame(rows, columns=["query_id", "member_id", "rank", "relevance"])
    return frame.sample(frac=1, random_state=int(rng.integers(1 << 30))).reset_index(drop=True)


def lot_oracle(lists: pd.DataFrame, group_of: dict[str, str], option: str) -> pd.DataFrame:
    """Adjacent pairs (r, r+1) of every query, with ΔỸ and both members' groups; pairs
    with a member the Tester does not know are dropped (the join cannot weight them)."""
    frame = lists.sort_values(["query_id", "rank"]).copy()
    if option == "idcg":
        def idcg(rel):
            ideal = np.sort(rel.to_numpy())[::-1]
            return float(np.sum((2.0 ** ideal - 1) / np.log2(np.arange(2, len(ideal) + 2))))
        frame["idcg"] = frame.groupby("query_id").relevance.transform(idcg)
        frame = frame[frame.idcg > 0]  # all-zero queries have no Ỹ
        frame["y"] = frame.relevance / frame.idcg
    else:
        frame["y"] = frame.relevance
    nxt = frame.groupby("query_id").shift(-1)
    pairs = pd.DataFrame({"higher": frame.member_id, "lower": nxt.member_id, "delta": frame.y - nxt.y,
                          "rank_pair": frame["rank"].astype(int).astype(str) + "-"
                          + (frame["rank"].astype(int) + 1).astype(str)}).dropna(subset=["lower"])
    pairs["a"] = pairs.higher.map(group_of)
    pairs["b"] = pairs.lower.map(group_of)
    return pairs.dropna(subset=["a", "b"])


@pytest.mark.parametrize("option,recipient", [("idcg", "client"), ("raw", "tester")])
def test_lot_cells_equal_pandas_eq7(tmp_path, option, recipient):
    rng = np.random.default_rng(808 if option == "idcg" else 809)
    n_members = 300
    lists = candidate_lists(rng, 350, n_members, grades=4 if option == "idcg" else None)
    known = [f"m{i:06d}" for i in range(n_members - 15)]  # the last 15 are unknown to the Tester
    labels = (rng.random(len(known)) < 0.3).astype(int)  # 30% hsm
    table = hard_table(known + [f"t{i:06d}" for i in range(20)], list(1 - labels) + [0] * 20, SPLIT)
    group_of = {m: SPLIT[1 - l] for m, l in zip(known, labels)}
    assert set(lists.member_id) - set(group_of), "some pairs should be dropped by the join"

    report = run_through_services(tmp_path, table, lists, "lot", option=option,
                                  params={"same_group_pairs": "true", "relevance_range": "-10:10",
                                          "out_of_range": "refuse", "rows_per_member": "1000"},  # every row
                                  recipient=recipient)

    pairs = lot_oracle(lists, group_of, option)
    if option == "idcg":
        assert report.info["skipped_zero_idcg"] > 0  # the data holds all-zero queries
    pooled = pairs.groupby(["a", "b"]).delta.mean()
    per_rank = pairs.groupby(["a", "b", "rank_pair"]).delta.mean()
    labels_seen = sorted({c.rank_pair for c in report.cells if c.rank_pair}, key=lambda x: int(x.split("-")[0]))
    longest = int(lists["rank"].max())
    assert labels_seen == [f"{r}-{r + 1}" for r in range(1, longest)]
    assert len(report.cells) == 4 * longest  # (pooled + each rank pair) x 4 ordered pairs
    checked = 0
    for cell in report.cells:
        key = (cell.higher, cell.lower) if cell.rank_pair is None else (cell.higher, cell.lower, cell.rank_pair)
        series = pooled if cell.rank_pair is None else per_rank
        want = float(series[key]) if key in series.index else None
        assert approx_or_none(cell.estimate, want, 1e-6), (key, cell.estimate, want)
        checked += want is not None
    assert checked >= 4 * (longest - 1)
    for a in SPLIT:  # the pooled cells exist for all four ordered pairs, same-group ones included
        for b in SPLIT:
            assert any(c.rank_pair is None and (c.higher, c.lower) == (a, b) and c.estimate is not None
                       for c in report.cells)
    assert report.verdict.rule == "negative_cells"
    d = check_contract(report, part="cells", part_keys=CELL_KEYS, with_groups=False)
    assert sum(c["rank_pair"] is None for c in d["cells"]) == 4

