"""MQOS-AUC exact under the release controls: the score order inside the ciphertexts
(`common.metrics.mqos_auc.BinnedAuc`, design §5.6 "Score bins")."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from common.crypto import encoding, paillier
from common.errors import ProtocolError
from common.metrics.base import SECOND_MOMENTS
from common.metrics.mqos_auc import (BINNED, EXACT, SCORE_BINS, binned_values, released_form, score_bins)
from common.stats import correction
from ppre.report.text import render_text
from tests.helpers import TEST_BITS

GROUPS = ["a", "b", "c"]


def test_bins_are_equal_counts_in_score_order_with_ties_together():
    rng = np.random.default_rng(3)
    scores = rng.normal(size=3200)
    bins = score_bins(scores, SCORE_BINS)
    assert sorted(np.bincount(bins, minlength=SCORE_BINS)) == [100] * SCORE_BINS
    order = np.argsort(scores)
    assert np.all(np.diff(bins[order]) >= 0)  # monotone in the score
    tied = np.repeat(rng.normal(size=50), 64)  # 50 levels, 64 rows each
    tb = score_bins(tied, SCORE_BINS)
    for level in np.unique(tied):
        assert len(set(tb[tied == level])) == 1  # a level never straddles two bins


def test_a_score_with_at_most_k_levels_keeps_its_exact_auc():
    """Binning changes nothing when the score has at most K levels: every level is its own
    bin, and the binned AUC (ties ½) is sklearn's."""
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 2000)
    # K levels of very unequal counts (equal-count bins would merge some of them)
    scores = np.minimum(rng.geometric(0.15, 2000) - 1 + y, SCORE_BINS - 1).astype(float)
    bins = score_bins(scores, SCORE_BINS)
    assert len(np.unique(bins)) == len(np.unique(scores)) == SCORE_BINS
    assert roc_auc_score(y, bins) == pytest.approx(roc_auc_score(y, scores), abs=1e-15)


def test_binned_values_sum_to_the_bins_sums():
    """Weighted by p, the one-hot columns give P1_b and the thermometer G_b =
    2·Σ_{b'<b} S_b' + S_b (`binned_values`)."""
    rng = np.random.default_rng(5)
    n, k = 300, 8
    y = rng.integers(0, 2, n)
    bins = rng.integers(0, k, n)
    p = rng.random(n)
    values = binned_values(y, bins, k)
    assert values.shape == (n, 2 * k + 1)
    sums = p @ values
    s_b = np.array([p[bins == b].sum() for b in range(k)])
    assert sums[0] == pytest.approx(p @ y)
    assert np.allclose(sums[1:k + 1], [p[(bins == b) & (y == 1)].sum() for b in range(k)])
    assert np.allclose(sums[k + 1:], 2 * np.concatenate([[0.0], np.cumsum(s_b)[:-1]]) + s_b)


def test_the_release_picks_the_form():
    assert EXACT.for_release({}) is EXACT
    assert EXACT.for_release({SECOND_MOMENTS: True}) is BINNED
    assert BINNED.for_release({SECOND_MOMENTS: True}) is BINNED
    assert not BINNED.row_strata({SECOND_MOMENTS: True}) and EXACT.row_strata({})


def _layout(n):
    return BINNED.layout("exact", {SECOND_MOMENTS: True}, {}, n_rows=n, n_units=1, recipient="client",
                         modulus_bits=TEST_BITS)


def test_the_layout_puts_y_alone_and_the_bins_after_it():
    for n in (40, 100_000, 1_000_000):
        layout = BINNED.layout("exact", {SECOND_MOMENTS: True}, {}, n_rows=n, n_units=1, recipient="client",
                               modulus_bits=2048)
        assert layout.first_alone and layout.position(0) == (0, 0)
        assert layout.position(1) == (1, 0) and layout.n_components == 2 * SCORE_BINS + 1
        assert {layout.position(c)[0] for c in range(1, layout.n_components)} == set(range(1, layout.n_ciphertexts))
        # the released items keep the rank form's width; the rows' slots are narrower
        release = EXACT.layout("exact", {SECOND_MOMENTS: True}, {}, n_rows=n, n_units=1, recipient="client",
                               modulus_bits=2048)
        assert layout.release_slot_bits == release.slot_bits > layout.slot_bits
        print(n, layout)


def _encrypted_release(n, seed, *, tamper=None):
    """Run the binned form's Tester and Test-Client steps under a real key: the rows
    packed by the layout, aggregated per weight column (over the ciphertexts
    `column_ciphertexts` allows), the masked round trip, `combine`; returns the decoded
    (V, D) per cell and (S1, S0) per pair, and what the plaintext twin gives."""
    rng = np.random.default_rng(seed)
    k = len(GROUPS)
    q = encoding.quantize_probabilities(rng.dirichlet(np.ones(k), n))
    y = rng.integers(0, 2, n)
    scores = rng.normal(size=n) + y
    bins = score_bins(scores, SCORE_BINS)
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public
    layout = _layout(n)
    packed = layout.pack(binned_values(y, bins, SCORE_BINS).astype(np.int64))
    n_cts = layout.n_ciphertexts
    rows = [packed[i * n_cts:(i + 1) * n_cts] for i in range(n)]
    weights = list(BINNED.weights((q,), None, np.zeros(n, dtype=np.int64), GROUPS, "exact", {}))
    weights += correction.pair_weights(q)
    only = BINNED.column_ciphertexts(k, len(weights), layout)

    def column(w):
        col = weights[w]
        if isinstance(col, tuple):
            return sum(np.asarray(weights[c]).astype(object) for c in col)
        return np.asarray(col).astype(object)
    agg = {0: []}
    for w in range(len(weights)):
        col = column(w)
        agg[0].append([paillier.encrypt_chunk(pub.n, pub.h, [sum(int(col[i]) * rows[i][t] for i in range(n)) % pub.n])[0]
                       if t in only.get(w, range(n_cts)) else 1 for t in range(n_cts)])
    facts = BINNED.tester_facts((q,), None, np.zeros(n, dtype=np.int64), row_bound=n)
    state, requests = BINNED.square_requests(agg, 1, pub, facts, layout)
    assert len(requests) == (k + 1) * n_cts
    plain = key.decrypt_mod_p(requests)
    answers = BINNED.square_answers(plain, layout, pub.n)
    if tamper is not None:
        answers = tamper(answers)
    assert BINNED.square_answer_count(len(requests), layout) == len(answers) or tamper is not None
    squares = paillier.encrypt_chunk(pub.n, pub.h, answers)
    items = BINNED.combine(state, squares, pub, layout, None)
    shift = layout.release_slot_bits
    decoded = []
    for value in key.decrypt_mod_p(items):
        value = value - key.p if value > key.p // 2 else value
        low = (value + (1 << (shift - 1))) % (1 << shift) - (1 << (shift - 1))
        decoded.append((low, (value - low) >> shift))
    expected = released_form(q, y, bins, n_rows=n)[0]
    pairs = [(int(np.dot(w.astype(object), y)), int(np.dot(w.astype(object), 1 - y))) for w in correction.pair_weights(q)]
    return decoded, expected + pairs


def test_the_encrypted_bins_release_the_plaintext_form_of_the_binned_score():
    """Under encryption (the masked products round trip included) the binned form's
    items are exactly the rank form's released slots with the bin as the rank
    (`released_form`), then the pair items (S1, S0)."""
    decoded, expected = _encrypted_release(60, 11)
    assert decoded == expected


def test_a_wrong_answer_count_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="answers received"):
        _encrypted_release(20, 12, tamper=lambda a: a[:-1])


def test_the_test_client_refuses_requests_that_are_not_whole_cells_or_do_not_decode():
    layout = _layout(30)
    with pytest.raises(ValueError, match="whole cells"):
        BINNED.square_answers([1] * (layout.n_ciphertexts + 1), layout, 10 ** 40)
    too_big = [5] + [1 << (layout.slot_bits * layout.slots)] * (layout.n_ciphertexts - 1)
    with pytest.raises(ValueError, match="does not decode"):
        BINNED.square_answers(too_big, layout, 1 << 4000)


def test_the_masked_requests_hide_the_bins_sums():
    """What the Test-Client decrypts is each bin's sum plus a uniform mask 64 bits wider:
    two runs over the same rows give unrelated values (never the sums themselves)."""
    n = 40
    layout = _layout(n)
    rng = np.random.default_rng(2)
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public
    sums = [int(v) for v in rng.integers(0, 1 << 40, 2 * SCORE_BINS)]
    packed = layout.pack(np.array([[0] + sums], dtype=object))
    agg = {0: [[paillier.encrypt_chunk(pub.n, pub.h, [v])[0] for v in packed]]}
    facts = {"S": [1 << 32], "n": n}
    seen = []
    for _ in range(2):
        _, requests = BINNED.square_requests(agg, 1, pub, facts, layout)
        plain = key.decrypt_mod_p(requests)[1:]
        width = layout.slot_bits
        seen.append([(v >> (s * width)) & ((1 << width) - 1) for v in plain for s in range(layout.slots)])
    for a, b in zip(*seen):
        assert a != b
    assert not set(sums) & set(seen[0])


def test_an_audit_under_the_controls_says_its_auc_is_the_binned_scores():
    """Through both sessions under the release controls: no stratum on the rows, the
    result's `info.score_bins` is K, and the table's first line and the page's title say
    the AUC is the binned score's; without the controls neither does."""
    import pandas as pd
    from ppre.report.model import metric_title
    from tester_service.protocol import AuditSpec
    from tester_service.release import ReleasePolicy
    from tests.helpers import local_audit, make_inputs
    tester, _ = make_inputs(240, 1, 0)
    rng = np.random.default_rng(6)
    ids = list(tester.member_id[:200])
    y = rng.integers(0, 2, len(ids))
    client = pd.DataFrame({"member_id": ids, "y_true": y, "score": rng.random(len(ids)) + y})
    spec = AuditSpec(metric="mqos-auc", client_dataset="d", bootstrap=10, seed=1, metric_option="exact")
    report, session, _ = local_audit(tester, client, spec=spec,
                                     release=ReleasePolicy(min_intersection=1, min_effective_size=0.0))
    assert session.metric is BINNED and report.info["score_bins"] == SCORE_BINS
    assert render_text(report).splitlines()[0].startswith("metric: mqos-auc (exact; AUC of the score in 32 bins)")
    assert metric_title(report).endswith(", AUC of the score in 32 bins")
    plain, session, _ = local_audit(tester, client, spec=spec)
    assert session.metric is EXACT and "score_bins" not in plain.info
    assert "bins" not in render_text(plain).splitlines()[0] and "bins" not in metric_title(plain)
