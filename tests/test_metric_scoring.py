"""Score metrics in plaintext (design §5; paper eqs. (10)-(19)): POT, exact and
sampled MQOS-AUC, the random-groups interval, the probabilistic count."""
from __future__ import annotations

import time

import numpy as np
import pytest
from scipy.stats import norm, rankdata
from sklearn.metrics import roc_auc_score

from common.errors import InputError
from common.metrics import scoring as sc
from common.stats.quantiles import student_t_quantile
from tests import metric_reference as ref


def _hard(g: np.ndarray, k: int) -> np.ndarray:
    p = np.zeros((g.size, k))
    p[np.arange(g.size), g] = 1.0
    return p


def _tied_data(n: int, k: int, seed: int):
    """Hard groups, scores on a coarse grid (many ties), labels depending on score."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, k, n)
    s = np.round(rng.normal(size=n) + 0.3 * g, 1)
    y = (rng.random(n) < norm.cdf(s - 0.2 * g)).astype(float)
    return g, s, y


def _w(si: float, sl: float) -> float:
    return 1.0 if si > sl else (0.5 if si == sl else 0.0)


# ----------------------------------------------------------------------------- POT

def test_reference_scores_default_deciles_sorted_without_duplicates():
    rng = np.random.default_rng(0)
    s = rng.normal(size=1000)
    refs = sc.reference_scores(s)
    assert refs.shape == (9,)
    np.testing.assert_allclose(refs, np.quantile(s, np.arange(1, 10) / 10))
    # many equal scores: the repeated deciles appear once
    tied = np.r_[np.zeros(800), rng.random(200) + 1]
    refs = sc.reference_scores(tied)
    assert refs[0] == 0.0 and (np.diff(refs) > 0).all() and refs.size < 9


def test_reference_scores_given_used_as_is_and_checked():
    np.testing.assert_array_equal(sc.reference_scores(None, [0.7, 0.1, 0.4]), [0.1, 0.4, 0.7])
    np.testing.assert_array_equal(sc.reference_scores(np.zeros(3), [2.5]), [2.5])
    for bad in ([], [0.1, float("nan")], [0.1, float("inf")], [0.2, 0.1, 0.2],
                list(np.linspace(0, 1, 65)), ["x"]):
        with pytest.raises(InputError) as err:
            sc.reference_scores(np.zeros(3), bad)
        assert err.value.parameter == "reference scores"
    assert sc.reference_scores(None, list(np.linspace(0, 1, 64))).size == 64


def test_silverman_bandwidth():
    rng = np.random.default_rng(1)
    s = rng.normal(size=500)
    sd = np.std(s, ddof=1)
    iqr = np.subtract(*np.percentile(s, [75, 25]))
    assert sc.silverman_bandwidth(s, "scores.csv") == pytest.approx(
        0.9 * min(sd, iqr / 1.34) * 500 ** -0.2)
    # IQR 0 (most scores equal): sd alone
    s2 = np.r_[np.zeros(90), np.arange(1, 11.0)]
    assert sc.silverman_bandwidth(s2, "f") == pytest.approx(0.9 * np.std(s2, ddof=1) * 100 ** -0.2)
    with pytest.raises(InputError) as err:
        sc.silverman_bandwidth(np.full(10, 0.3), "scores.csv")
    assert (err.value.file, err.value.column) == ("scores.csv", "score")
    with pytest.raises(InputError) as err:
        sc.silverman_bandwidth(np.array([0.1, 0.2, np.nan, 0.4]), "scores.csv")
    assert (err.value.file, err.value.column, err.value.row) == ("scores.csv", "score", 3)


def test_curve_bandwidths_scale_with_a_fiftieth_of_the_rows_and_follow_the_local_spacing():
    """The default: Silverman's rule for n/50 rows at the median reference score, each
    reference score's bandwidth scaled by its local spacing, so that every decile's kernel
    holds about as many rows; Silverman's single bandwidth gives the tails' deciles far less."""
    rng = np.random.default_rng(3)
    s = rng.normal(0.0, 1.0, 50_000)
    refs = sc.reference_scores(s)
    h = sc.curve_bandwidths(s, refs, "scores.csv")
    assert np.median(h) == pytest.approx(sc.silverman_bandwidth(s, "f") * 50 ** 0.2, rel=1e-9)
    assert h[0] > 1.5 * h[4] and h[-1] > 1.5 * h[4]              # sparse tails, wider kernels

    def masses(bandwidth):
        return np.exp(-0.5 * ((s[:, None] - refs[None, :]) / bandwidth) ** 2).sum(axis=0)

    assert masses(h).max() / masses(h).min() < 1.3
    assert masses(sc.silverman_bandwidth(s, "f")).max() / masses(sc.silverman_bandwidth(s, "f")).min() > 1.5


def test_curve_bandwidths_with_tied_or_lopsided_scores_stay_positive_and_bounded():
    s = np.concatenate([np.full(900, 0.5), np.linspace(0.0, 1.0, 100)])   # 90% tied: windows of width 0
    refs = np.array([0.1, 0.5, 0.9])
    h = sc.curve_bandwidths(s, refs, "scores.csv")
    assert np.all(h > 0) and np.all(np.isfinite(h))
    assert np.allclose(h, sc.silverman_bandwidth(s, "f") * 50 ** 0.2)  # the median window is 0: the scale
    s = np.concatenate([np.linspace(0.0, 0.01, 990), np.linspace(10.0, 1000.0, 10)])
    h = sc.curve_bandwidths(s, np.array([0.005, 500.0]), "scores.csv")
    assert h.max() / h.min() <= 4.0 ** 2 + 1e-9
    with pytest.raises(InputError) as err:
        sc.curve_bandwidths(np.array([0.1, 0.2, np.nan, 0.4]), np.array([0.2]), "scores.csv")
    assert (err.value.file, err.value.column, err.value.row) == ("scores.csv", "score", 3)


def test_kernel_components_and_pot_curves():
    rng = np.random.default_rng(2)
    n, k = 400, 3
    s = rng.random(n)
    y = (rng.random(n) < s).astype(float)
    p = rng.dirichlet(np.ones(k), n)
    p[:, 2] = 0.0                       # an empty group: NaN curve
    p /= p.sum(1, keepdims=True)
    h = sc.silverman_bandwidth(s, "f")
    refs = sc.reference_scores(s)
    comp = sc.kernel_components(s, y, refs, h)
    assert comp.shape == (n, 2 * refs.size)
    kern = np.exp(-0.5 * ((s[:, None] - refs[None, :]) / h) ** 2)
    np.testing.assert_allclose(comp[:, 1::2], kern)
    np.testing.assert_allclose(comp[:, 0::2], kern * y[:, None])
    curves = ref.pot_curves(p, s, y, refs, h)
    assert curves.shape == (refs.size, k)
    # P1's aggregation of P2's columns gives the same ratios
    agg = p.T @ comp                                     # (k, 2Q)
    np.testing.assert_allclose(curves[:, :2], (agg[:2, 0::2] / agg[:2, 1::2]).T)
    assert np.isnan(curves[:, 2]).all()
    # normalised Gaussian kernel (scipy) on a hard group: the 1/h factor cancels
    g = rng.integers(0, 2, n)
    hard = ref.pot_curves(_hard(g, 2), s, y, refs, h)
    for j in range(2):
        dens = norm.pdf(s[g == j][:, None], loc=refs[None, :], scale=h)
        np.testing.assert_allclose(hard[:, j], (dens * y[g == j][:, None]).sum(0) / dens.sum(0))


def test_dti():
    rng = np.random.default_rng(3)
    curves = rng.random((9, 4))
    w = rng.random(9)
    d = ref.dti(curves, w)
    assert d.shape == (4, 4)
    for a in range(4):
        for b in range(4):
            assert d[a, b] == pytest.approx(sum(w[q] * (curves[q, a] - curves[q, b])
                                                for q in range(9)))
    np.testing.assert_allclose(d, -d.T)
    curves[3, 1] = np.nan
    d = ref.dti(curves, w)
    assert np.isnan(d[1, [0, 2, 3]]).all() and np.isnan(d[[0, 2, 3], 1]).all()
    assert np.isfinite(d[0, 2])


# ----------------------------------------------------------------------------- exact AUC

def test_dense_score_rank():
    s = np.array([0.5, 0.1, 0.5, 0.9, 0.1, 0.3])
    np.testing.assert_array_equal(sc.dense_score_rank(s), [2, 0, 2, 3, 0, 1])
    s = np.round(np.random.default_rng(4).normal(size=300), 1)
    r = sc.dense_score_rank(s)
    assert r.dtype == np.int64
    np.testing.assert_array_equal(r, rankdata(s, method="dense") - 1)


def _brute_doubled_a(rank, q, groups=None):
    n, k = q.shape
    out = np.zeros((n, k), dtype=object)
    for i in range(n):
        for l in range(n):
            if l == i or (groups is not None and groups[l] != groups[i]):
                continue
            if rank[l] < rank[i]:
                out[i] += 2 * q[l].astype(object)
            elif rank[l] == rank[i]:
                out[i] += q[l].astype(object)
    return out


def _int_weights(p: np.ndarray) -> np.ndarray:
    q = np.floor(p * sc.WEIGHT_SCALE).astype(np.int64)
    q[:, -1] = sc.WEIGHT_SCALE - q[:, :-1].sum(1)        # rows sum to 2^32 exactly
    return q


def test_doubled_a_weights_equals_brute_force():
    rng = np.random.default_rng(5)
    for trial in range(6):
        n, k = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        s = rng.integers(0, 8, n).astype(float)          # many ties
        rank = sc.dense_score_rank(s)
        q = _int_weights(rng.dirichlet(np.ones(k), n))
        got = sc.doubled_a_weights(rank, q)
        assert got.dtype == np.int64 and got.shape == (n, k)
        assert (got.astype(object) == _brute_doubled_a(rank, q)).all()
        groups = rng.integers(0, 4, n)
        got = sc.doubled_a_weights(rank, q, groups=groups)
        assert (got.astype(object) == _brute_doubled_a(rank, q, groups)).all()
    # the largest weights stay exact
    q = np.full((40, 2), sc.WEIGHT_SCALE, dtype=np.int64)
    rank = np.arange(40) // 3
    assert (sc.doubled_a_weights(rank, q).astype(object) == _brute_doubled_a(rank, q)).all()


def test_doubled_a_weights_refuses_what_it_cannot_do_exactly(monkeypatch):
    rank = np.arange(5)
    with pytest.raises(ValueError):
        sc.doubled_a_weights(rank, np.full((5, 2), 0.5))          # not integers
    with pytest.raises(ValueError):
        sc.doubled_a_weights(rank, np.full((5, 2), sc.WEIGHT_SCALE + 1, dtype=np.int64))
    with pytest.raises(ValueError):
        sc.doubled_a_weights(rank, np.full((5, 2), -1, dtype=np.int64))
    monkeypatch.setattr(sc, "MAX_EXACT_ROWS", 5)
    with pytest.raises(ValueError):
        sc.doubled_a_weights(rank, np.ones((5, 2), dtype=np.int64))
    assert sc.MAX_EXACT_ROWS == 5 and sc.doubled_a_weights(rank[:4], np.ones((4, 2), dtype=np.int64)).shape == (4, 2)


def test_linear_auc_equals_sklearn_on_hard_groups_with_ties():
    for seed in range(3):
        g, s, y = _tied_data(3000, 4, seed)
        assert len(np.unique(s)) < 200                    # heavily tied
        auc = ref.linear_auc(_hard(g, 4), y, s)
        for j in range(4):
            assert abs(auc[j] - roc_auc_score(y[g == j], s[g == j])) < 1e-12
        overall = ref.linear_auc(np.ones((s.size, 1)), y, s)
        assert overall.shape == (1,)
        assert abs(overall[0] - roc_auc_score(y, s)) < 1e-12


def test_linear_auc_equals_double_sum_on_soft_groups():
    rng = np.random.default_rng(7)
    n, k = 150, 3
    p = rng.dirichlet(np.full(k, 0.7), n)
    s = rng.integers(0, 12, n).astype(float)
    y = (rng.random(n) < 0.4).astype(float)
    W = np.vectorize(_w)(s[:, None], s[None, :])         # w(i, l)
    pairs = y[:, None] * (1 - y)[None, :]
    auc = ref.linear_auc(p, y, s)
    for j in range(k):
        pp = p[:, j][:, None] * p[:, j][None, :] * pairs
        assert abs(auc[j] - (pp * W).sum() / pp.sum()) < 1e-12
    # the integer path (what P1 encrypts against): L from 2A / 2^33, same AUC
    q = _int_weights(p)
    a = sc.doubled_a_weights(sc.dense_score_rank(s), q) / 2.0 ** 33
    pq = q / 2.0 ** 32
    L = (pq * y[:, None] * a).sum(0)
    T = (pq * y[:, None]).sum(0)
    Q = (pq ** 2 * y[:, None]).sum(0)
    np.testing.assert_allclose(ref.auc_from_aggregates(L, T, Q, pq.sum(0)), auc, atol=1e-8)


def test_linear_auc_nan_without_both_classes():
    s = np.array([0.1, 0.2, 0.3, 0.4])
    y = np.array([1.0, 1.0, 0.0, 0.0])
    p = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=float)
    auc = ref.linear_auc(p, y, s)
    assert np.isnan(auc).all()


def test_linear_auc_by_group_is_the_auc_of_each_subsample():
    rng = np.random.default_rng(8)
    n, k, G = 600, 3, 7
    p = rng.dirichlet(np.ones(k), n)
    s = rng.integers(0, 20, n).astype(float)
    y = (rng.random(n) < 0.5).astype(float)
    groups = ref.random_groups(n, G, rng)
    per = ref.linear_auc_by_group(p, y, s, groups, G)
    assert per.shape == (G, k)
    for g in range(G):
        m = groups == g
        np.testing.assert_allclose(per[g], ref.linear_auc(p[m], y[m], s[m]), atol=1e-12)


def test_random_groups_partition():
    rng = np.random.default_rng(9)
    g = ref.random_groups(1003, 10, rng)
    assert g.dtype == np.int64 and g.shape == (1003,)
    counts = np.bincount(g, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003
    assert not (np.diff(g) == 1).all()                      # not in row order
    for n, G in ((5, 10), (100, 1)):
        with pytest.raises(InputError):
            ref.random_groups(n, G, rng)


def test_random_group_interval_formula():
    from scipy.stats import t
    rng = np.random.default_rng(10)
    per = rng.normal(size=(12, 3))
    per[[0, 5], 1] = np.nan
    per[:, 2] = np.nan
    per[4, 2] = 0.3                                        # a single defined group
    full = np.array([0.1, 0.2, 0.3])
    lo, hi = ref.random_group_interval(full, per, 0.9)
    for c, g in ((0, 12), (1, 10)):
        v = per[:, c][~np.isnan(per[:, c])]
        half = t.ppf(0.95, g - 1) * v.std(ddof=1) / np.sqrt(g)
        assert lo[c] == pytest.approx(full[c] - half) and hi[c] == pytest.approx(full[c] + half)
    assert np.isnan(lo[2]) and np.isnan(hi[2])


def test_student_t_quantile_matches_scipy():
    from scipy.stats import t
    df = np.arange(1, 200)
    for level in (0.6, 0.95, 0.975, 0.9995):
        np.testing.assert_allclose(student_t_quantile(level, df), t.ppf(level, df), rtol=1e-10)
    with pytest.raises(ValueError):
        student_t_quantile(0.975, np.array([0]))


def _binormal_truth(gp, prev, mu, delta):
    pos = gp * prev / np.sum(gp * prev)
    neg = gp * (1 - prev) / np.sum(gp * (1 - prev))
    group = norm.cdf(delta / np.sqrt(2))
    glob = sum(pos[a] * neg[b] * norm.cdf((mu[a] + delta[a] - mu[b]) / np.sqrt(2))
               for a in range(3) for b in range(3))
    return group, glob


def test_random_group_interval_coverage():
    """300 binormal data sets (n = 2000, 3 hard groups with true AUCs 0.86, 0.76, 0.64),
    G = DEFAULT_RANDOM_GROUPS: the 95% intervals of each group AUC and of each
    global-minus-group difference cover the truth 90-99% of the time."""
    gp = np.array([0.4, 0.35, 0.25])
    prev = np.array([0.3, 0.5, 0.4])
    mu = np.array([0.0, 0.3, -0.2])
    delta = np.array([1.5, 1.0, 0.5])
    group, glob = _binormal_truth(gp, prev, mu, delta)
    truth = np.r_[group, glob - group]
    rng = np.random.default_rng(11)
    G, n, reps = sc.DEFAULT_RANDOM_GROUPS, 2000, 300
    hits = np.zeros(6)
    for _ in range(reps):
        g = rng.choice(3, n, p=gp)
        y = (rng.random(n) < prev[g]).astype(float)
        s = rng.normal(mu[g] + delta[g] * y, 1.0)
        p = np.c_[_hard(g, 3), np.ones(n)]                  # the last column: global AUC
        full = ref.linear_auc(p, y, s)
        per = ref.linear_auc_by_group(p, y, s, ref.random_groups(n, G, rng), G)
        est = np.r_[full[:3], full[3] - full[:3]]
        per_est = np.c_[per[:, :3], per[:, 3:] - per[:, :3]]
        lo, hi = ref.random_group_interval(est, per_est, 0.95)
        hits += (lo <= truth) & (truth <= hi)
    coverage = hits / reps
    assert ((coverage >= 0.90) & (coverage <= 0.99)).all(), coverage


# ----------------------------------------------------------------------------- sampled AUC

def test_sample_pairs_order_and_indicator():
    rng = np.random.default_rng(12)
    g, s, y = _tied_data(500, 2, 12)
    first, second, ind = sc.sample_pairs(y, s, 20000, rng, "outcomes.csv")
    assert first.shape == second.shape == ind.shape == (20000,)
    assert first.dtype == np.int64 and ind.dtype == np.float64
    assert (y[first] != y[second]).all()
    first_pos = y[first] == 1
    assert 0.47 < first_pos.mean() < 0.53                    # order hides the positive
    pos = np.where(first_pos, first, second)
    neg = np.where(first_pos, second, first)
    np.testing.assert_array_equal(ind, np.vectorize(_w)(s[pos], s[neg]))
    assert (ind == 0.5).any()


def test_sample_pairs_needs_both_classes():
    rng = np.random.default_rng(13)
    for y in (np.ones(5), np.zeros(5)):
        with pytest.raises(InputError) as err:
            sc.sample_pairs(y, np.arange(5.0), 10, rng, "outcomes.csv")
        assert (err.value.file, err.value.column) == ("outcomes.csv", "y_true")
    with pytest.raises(InputError) as err:
        sc.sample_pairs(np.array([0, 1, 2.0]), np.arange(3.0), 10, rng, "outcomes.csv")
    assert err.value.row == 3


def test_sampled_auc_close_to_sklearn():
    rng = np.random.default_rng(14)
    g, s, y = _tied_data(4000, 3, 14)
    first, second, ind = sc.sample_pairs(y, s, 200_000, rng, "outcomes.csv")
    auc = ref.sampled_auc(_hard(g, 3), first, second, ind)
    assert auc.shape == (3,)
    for j in range(3):
        mine = (g[first] == j) & (g[second] == j)
        se = ind[mine].std(ddof=1) / np.sqrt(mine.sum())
        assert abs(auc[j] - roc_auc_score(y[g == j], s[g == j])) < 4 * se
    soft = rng.dirichlet(np.ones(3), s.size)
    w = soft[first] * soft[second]
    np.testing.assert_allclose(ref.sampled_auc(soft, first, second, ind),
                               (w * ind[:, None]).sum(0) / w.sum(0))


def test_sample_capped_pairs_keeps_every_member_within_the_cap_and_stays_unbiased():
    """The sampled AUC's declared cap (`sample_capped_pairs`): no member in more than
    `cap` pairs, as many pairs as the cap allows (cap·min(#pos, #neg)), the members in
    random order, and the estimate still the AUC (within sampling error of scikit-learn)."""
    rng = np.random.default_rng(15)
    g, s, y = _tied_data(4000, 3, 15)
    for cap, m in ((1, 10_000), (4, 5_000), (4, 100_000)):
        first, second, ind = sc.sample_capped_pairs(y, s, m, cap, rng, "outcomes.csv")
        expected = min(m, cap * int((y == 1).sum()), cap * int((y == 0).sum()))
        assert first.shape == second.shape == ind.shape == (expected,)
        assert (y[first] != y[second]).all()
        counts = np.bincount(np.concatenate([first, second]), minlength=y.size)
        assert counts.max() <= cap
        assert 0.45 < (y[first] == 1).mean() < 0.55
        pos = np.where(y[first] == 1, first, second)
        neg = np.where(y[first] == 1, second, first)
        np.testing.assert_array_equal(ind, np.vectorize(_w)(s[pos], s[neg]))
        se = ind.std(ddof=1) / np.sqrt(ind.size)
        assert abs(ind.mean() - roc_auc_score(y, s)) < 5 * se
    with pytest.raises(InputError) as err:
        sc.sample_capped_pairs(y, s, 10, 0, rng, "outcomes.csv")
    assert err.value.parameter == "pairs per member"


def test_sample_pair_graph_is_label_independent_capped_and_unbiased():
    """The sampled AUC's rows (`sample_pair_graph`, docs/metrics/mqos-auc.md "What the
    Tester sees"): which members a row joins is a function of the rng and the table's
    counts alone (shuffled labels and scores give the same rows), positives and negatives
    have the same degree distribution, the graph is far from bipartite by label, no member
    is in more than `cap` rows, dummies carry (0, 0), and the ratio of the two sums is
    the AUC within its sampling error."""
    from scipy.stats import chi2_contingency
    g, s, y = _tied_data(4000, 3, 16)
    for cap, m in ((4, 3_000), (4, 100_000), (50, 30_000)):
        first, second, values, kept = sc.sample_pair_graph(y, s, m, cap, np.random.default_rng(cap + m), "o.csv")
        shuffled = np.random.default_rng(1).permutation(y.size)
        again = sc.sample_pair_graph(y[shuffled], s[shuffled] * -1, m, cap, np.random.default_rng(cap + m), "o.csv")
        np.testing.assert_array_equal(again[0], first)
        np.testing.assert_array_equal(again[1], second)
        degree = np.bincount(np.concatenate([first, second]), minlength=y.size)
        assert degree.max() <= cap and (first != second).all()
        table = [np.bincount(degree[y == c], minlength=cap + 1) for c in (0, 1)]
        table = np.array(table)[:, np.array(table).sum(0) > 0]
        assert chi2_contingency(table)[1] > 1e-3                  # same degree distribution
        pi = y.mean()
        same = (y[first] == y[second]).mean()                     # bipartite by label: 0
        assert abs(same - (1 - 2 * pi * (1 - pi))) < 5 * np.sqrt(0.25 / first.size), same
        real = values[:, 1] == 1
        assert kept == real.sum() == sc.pair_graph_size(int(y.sum()), int((1 - y).sum()), m, cap)[1]
        assert (y[first[real]] != y[second[real]]).all() and (values[~real] == 0).all()
        pos = np.where(y[first] == 1, first, second)[real]
        neg = np.where(y[first] == 1, second, first)[real]
        np.testing.assert_array_equal(values[real, 0], np.vectorize(_w)(s[pos], s[neg]))
        ind = values[real, 0]
        se = ind.std(ddof=1) / np.sqrt(ind.size)
        assert abs(values[:, 0].sum() / values[:, 1].sum() - roc_auc_score(y, s)) < 5 * se
    assert sc.pair_graph_size(2000, 2000, 100_000, 4) == (8000, 3821)  # capped: all slots, 4000 - 4·44.7
    assert sc.pair_graph_size(20000, 80000, 1000, 4)[1] == 1000            # the count asked for
    with pytest.raises(InputError) as err:
        sc.sample_pair_graph(y, s, 10, 0, np.random.default_rng(0), "o.csv")
    assert err.value.parameter == "pairs per member"


# ----------------------------------------------------------------------------- count

def _exact_tail(p: np.ndarray, T: int) -> float:
    pmf = np.array([1.0])
    for pi in p:
        pmf = np.convolve(pmf, [1 - pi, pi])
    return float(pmf[T:].sum())


def test_count_threshold_one_is_equation_19():
    rng = np.random.default_rng(15)
    p = rng.random((80, 4)) * 0.05
    prob, expected = sc.count_summary(p, 1)
    np.testing.assert_allclose(prob, 1 - np.prod(1 - p, axis=0), rtol=1e-12)
    np.testing.assert_allclose(expected, p.sum(0))
    assert ref.poisson_binomial_tail(p[:, 0], 1) == pytest.approx(1 - np.prod(1 - p[:, 0]), rel=1e-12)


def test_count_hard_groups_and_edges():
    g = np.array([0, 0, 1, 2, 0, 1])
    p = _hard(g, 4)
    prob, expected = sc.count_summary(p, 2)
    np.testing.assert_array_equal(prob, [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(expected, [3, 2, 1, 0])
    np.testing.assert_array_equal(sc.count_summary(p, 3)[0], [1, 0, 0, 0])
    assert ref.poisson_binomial_tail(np.full(4, 0.3), 0) == 1.0
    assert ref.poisson_binomial_tail(np.full(4, 0.3), 5) == 0.0
    assert ref.poisson_binomial_tail(np.full(4, 1.0), 4) == 1.0
    for bad in (-1, 1.5):
        with pytest.raises(InputError):
            sc.count_summary(p, bad)
    with pytest.raises(ValueError):
        sc.count_summary(np.array([[1.2]]), 1)


def test_count_matches_exact_distribution():
    """Against the full Poisson-binomial pmf (sequential convolution), T from 1 to n,
    including T larger than the block size (block merging) and tiny tails."""
    rng = np.random.default_rng(16)
    for n in (1, 7, 50, 333):
        p = rng.random(n) ** 2
        for T in sorted({1, 2, 3, n // 3 + 1, n // 2 + 1, n}):
            assert ref.poisson_binomial_tail(p, T) == pytest.approx(_exact_tail(p, T), rel=1e-9, abs=1e-15)
    tiny = np.full(60, 1e-3)
    want = _exact_tail(tiny, 12)
    assert 0 < want < 1e-20
    assert ref.poisson_binomial_tail(tiny, 12) == pytest.approx(want, rel=1e-9)


def test_count_matches_monte_carlo():
    rng = np.random.default_rng(17)
    n, k, T, draws = 40, 3, 4, 200_000
    p = rng.dirichlet(np.full(k, 0.5), n)
    prob, _ = sc.count_summary(p, T)
    for j in range(k):
        hits = 0
        for _ in range(4):
            hits += ((rng.random((draws // 4, n)) < p[:, j]).sum(1) >= T).sum()
        mc = hits / draws
        se = np.sqrt(max(mc * (1 - mc), 1e-6) / draws)
        assert abs(prob[j] - mc) < 4 * se, (j, prob[j], mc)


def test_count_large_pool_is_fast():
    rng = np.random.default_rng(18)
    p = rng.random((100_000, 5)) * 1e-4
    start = time.perf_counter()
    prob, expected = sc.count_summary(p, 5)
    assert time.perf_counter() - start < 2.0
    lam = expected
    # many small probabilities: close to Poisson(lambda)
    from scipy.stats import poisson
    np.testing.assert_allclose(prob, poisson.sf(4, lam), rtol=0.02)
    assert ref.poisson_binomial_tail(p[:, 0], 5) == pytest.approx(prob[0], rel=1e-12)
