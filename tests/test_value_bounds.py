"""Declared value bounds and the sensitivities the release noise is sized from (design
§8; each metric module's docstring derives its own).

A. For output, POT, MQOS-NDCG, LOT (raw and idcg) and ERO: on small adversarial data
   (values at and beyond their bounds, members in many rows and strata), every member's
   probability vector is replaced by every one-hot vector, the released aggregates are
   recomputed in plaintext with the metric's own client_rows / weights / plan, and the
   realised change of every noised slot, and of the whole release, is compared with what
   the noise is sized for.
B. The bounds as the parties apply them: clipping (counted) or refusing, the query cap,
   the handshake's bounds (each party refuses the other's when they differ), the result
   and the audit log.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from client_service.protocol import ClientSession
from common.crypto import encoding
from common.errors import InputError, ProtocolError
from common.metrics import get_metric
from common.metrics.base import SECOND_MOMENTS, composite_items, sensitivity_rows
from ppre.report.text import render_text
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession
from tests.helpers import TEST_BITS, local_audit

FILE = "data.csv"
GROUPS = ("a", "b", "c")


# ==================================================================================
# A. The realised sensitivity never exceeds the one the noise is sized for
# ==================================================================================
def _released(metric, rows, q, option, params):
    """(noised item -> its slots' aggregates as Python ints, the per-slot sensitivity of
    each noised item, β) of one dataset's rows under quantised probabilities `q`."""
    info = rows.info
    comps = metric.components(option, params, info)
    ints = [comp.quantize(rows.values[:, c]) for c, comp in enumerate(comps)]
    layout = metric.layout(option, params, info, n_rows=rows.n_rows, n_units=1, recipient="client",
                           modulus_bits=2048)
    plan = metric.plan(list(GROUPS), rows.strata_labels, layout, option, params, info)
    units = np.zeros(rows.n_rows, dtype=np.int64)
    weights = metric.weights(q, rows.strata, units, list(GROUPS), option, params)
    n_strata = len(rows.strata_labels) if metric.strata_cells else 0
    composite = composite_items(plan.items, weights, strata=n_strata)
    out = {}
    for i, item in enumerate(plan.items):
        col = weights[item.weight]
        if i in composite or isinstance(col, (int, tuple)):
            continue  # post-processing of noised items, or a weight that depends on no member
        keep = np.ones(rows.n_rows, bool) if item.stratum is None or not metric.strata_cells \
            else rows.strata == item.stratum
        w = [int(x) for x in np.asarray(col)[keep]]
        slots = []
        for s in range(layout.slots):
            c = item.ciphertext * layout.slots + s
            slots.append(sum(a * int(v) for a, v in zip(w, ints[c][keep])) if c < len(comps) else 0)
        out[i] = slots
    return out, layout, plan, comps


def _member_codes(rows):
    ids = np.concatenate([np.asarray(x, dtype=object) for x in rows.ids])
    _, codes = np.unique(ids.astype(str), return_inverse=True)
    return codes.reshape(len(rows.ids), -1).T


def assert_sensitivity_holds(name, frame, option="", params=None, seed=0, second_moments=False):
    """Replace each member's vector by each one-hot vector: per slot |Δ| ≤ s·||Δp||₂ and
    over the release Σ_c (Δ_c / s_c)² ≤ β·||Δp||₂² (`tester_service.release`); with
    `second_moments`, the squared components' slots (released at the second moments'
    noise) over their own count S: Σ (Δ/s)² ≤ S·||Δp||₂²."""
    metric = get_metric(name)
    option = metric.check_option(option)
    metric = metric.for_option(option)
    params = metric.parse_params({k: str(v) for k, v in (params or {}).items()})
    if second_moments:
        params[SECOND_MOMENTS] = True
    rows = metric.client_rows(frame.copy(), FILE, option, params, np.random.default_rng(seed))
    members = sorted({str(m) for ids in rows.ids for m in ids})
    rng = np.random.default_rng(seed)
    base_p = {m: rng.dirichlet(np.ones(len(GROUPS))) if k % 3 else np.eye(len(GROUPS))[k % len(GROUPS)]
              for k, m in enumerate(members)}

    def quantised(p_of):
        return [encoding.quantize_probabilities(np.array([p_of[str(m)] for m in ids]))
                for ids in rows.ids]

    before, layout, plan, comps = _released(metric, rows, quantised(base_p), option, params)
    codes = _member_codes(rows)
    count = sensitivity_rows(codes, rows.strata if metric.strata_cells else None)
    beta = metric.sensitivity_components(option, params, rows.info)
    squares = metric.moment_components(option, params)
    assert squares == (1 if second_moments else 0)
    sens = {i: metric.slot_sensitivity(plan.items[i], layout, comps, count) for i in before}
    moment_slot = {i: {s for s in range(layout.slots)
                       if plan.items[i].ciphertext * layout.slots + s >= len(comps) - squares} for i in before}
    worst = 0.0
    for m in members:
        for j in range(len(GROUPS)):
            p = dict(base_p)
            p[m] = np.eye(len(GROUPS))[j]
            dq = (encoding.quantize_probabilities(p[m][None, :]) -
                  encoding.quantize_probabilities(base_p[m][None, :]))[0] / float(1 << 32)
            norm = float(np.linalg.norm(dq))
            if norm == 0:
                continue
            after, *_ = _released(metric, rows, quantised(p), option, params)
            energy = moment_energy = 0.0
            for i, slots in before.items():
                for s, (x, y) in enumerate(zip(slots, after[i])):
                    if sens[i][s] == 0:
                        assert x == y, "a slot sized with no noise moved"
                        continue
                    ratio = abs(y - x) / (sens[i][s] * norm)
                    assert ratio <= 1 + 1e-9, (name, m, j, i, s, ratio)
                    if s in moment_slot[i]:
                        moment_energy += ((y - x) / sens[i][s]) ** 2
                    else:
                        energy += ((y - x) / sens[i][s]) ** 2
            worst = max(worst, energy / (beta * norm * norm))
            assert energy <= beta * norm * norm * (1 + 1e-9), (name, m, j, energy, beta)
            assert moment_energy <= squares * norm * norm * (1 + 1e-9), (name, m, j, moment_energy)
    assert worst > 0.2, "the search should come near the bound (adversarial data)"
    return worst


def _ranked(rows):
    return pd.DataFrame(rows, columns=["query_id", "rank", "relevance", "member_id"]).astype(
        {"rank": float, "relevance": float})


def test_output_sensitivity_holds_with_values_beyond_the_declared_range():
    outcome = [2.0, 5.0, 9.0, -3.0, 3.5, 5.0, 2.0, 4.9]  # two beyond [2, 5]: clipped
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(len(outcome))], "outcome": outcome})
    assert_sensitivity_holds("output", frame, params={"outcome_range": "2:5"})
    # under the second-moments release the rows carry (outcome − c)² too, its own bound
    assert_sensitivity_holds("output", frame, params={"outcome_range": "2:5"}, second_moments=True)


def test_pot_sensitivity_holds_with_overlapping_kernels():
    scores = [0.2, 0.25, 0.225, 0.8, 0.5, 0.2, 0.8, 0.25]
    outcome = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 7.0]
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(8)], "score": scores, "outcome": outcome})
    assert_sensitivity_holds("pot", frame, params={"reference_scores": "0.2,0.25,0.8", "bandwidth": "0.05"})


def test_pot_sensitivity_holds_with_the_default_bandwidths_one_per_reference_score():
    scores = [0.01, 0.02, 0.03, 0.05, 0.2, 0.5, 0.9, 0.95, 0.3, 0.04]   # sparse on the right: wider kernels there
    outcome = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(10)], "score": scores, "outcome": outcome})
    info = _rows("pot", frame).info
    assert len(set(info["bandwidth"])) > 1
    assert_sensitivity_holds("pot", frame, params={})


def test_kernel_energy_bounds_the_densest_point_with_one_bandwidth_per_reference_score():
    from common.metrics.pot import kernel_energy
    refs, h = np.array([0.1, 0.15, 0.3, 0.32, 0.8]), np.array([0.02, 0.08, 0.01, 0.05, 0.3])
    grid = np.linspace(-1.0, 2.0, 3_000_001)
    densest = max(float(np.exp(-(((chunk[:, None] - refs[None, :]) / h[None, :]) ** 2)).sum(axis=1).max())
                  for chunk in np.array_split(grid, 300))
    bound = kernel_energy(refs, h)
    assert densest <= bound <= densest + 0.01
    assert kernel_energy(refs[::-1], h[::-1]) == pytest.approx(bound)   # the pairs, not the order, count


def test_mqos_ndcg_sensitivity_holds_with_viewers_beyond_the_cap():
    rows = []
    for q in range(14):  # viewer v0 issues 8 queries (cap 3), the others fewer
        viewer = "v0" if q < 8 else f"v{q % 3 + 1}"
        grades = (0, 3) if q % 2 else (3, 0)  # NDCG 1 or the lowest
        rows += [(f"q{q}", 1, grades[0], viewer), (f"q{q}", 2, grades[1], viewer)]
    assert_sensitivity_holds("mqos-ndcg", _ranked(rows), params={"max_queries_per_viewer": 3})


def _lot_lists(relevances):
    rows = []
    members = [f"m{i}" for i in range(5)]
    for q in range(6):  # the same few members at every rank pair, in several queries
        order = members[q % 5:] + members[:q % 5]
        for r, m in enumerate(order[:4]):
            rows.append((f"q{q}", r + 1, relevances[(q + r) % len(relevances)], m))
    return _ranked(rows)


def test_lot_raw_sensitivity_holds_across_rank_pairs_and_queries():
    assert_sensitivity_holds("lot", _lot_lists([1.0, 0.0, 1.5, -0.5]), option="raw",
                             params={"relevance_range": "0:1"})


def test_lot_idcg_sensitivity_holds_at_its_data_independent_bound():
    assert_sensitivity_holds("lot", _lot_lists([0.001, 0.0, 0.0, 0.0]), option="idcg")


def test_ero_sensitivity_holds():
    frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(8)], "y_true": [0, 0, 1, 0, 1, 0, 0, 1],
                          "y_pred": [1, 0, 1, 1, 0, 1, 0, 0]})
    assert_sensitivity_holds("ero", frame)


def test_sensitivity_rows_counts_strata_in_squares():
    members = np.array([[0, 1], [1, 2], [0, 1]])  # member 1 in 3 rows: strata 0, 1, 1
    assert sensitivity_rows(members) == 3
    assert sensitivity_rows(members, np.array([0, 1, 1])) == pytest.approx(math.sqrt(1 + 4))


def test_lot_pooled_cells_are_sums_of_the_rank_pair_cells_not_noised_again():
    metric = get_metric("lot")
    rows = metric.client_rows(_lot_lists([1.0, 0.0]), FILE, "raw", metric.parse_params({}), None)
    layout = metric.layout("raw", {}, rows.info, n_rows=rows.n_rows, n_units=1, recipient="client",
                           modulus_bits=2048)
    plan = metric.plan(list(GROUPS), rows.strata_labels, layout, "raw", metric.parse_params({}), rows.info)
    q = [encoding.quantize_probabilities(np.full((rows.n_rows, 3), 1 / 3)) for _ in rows.ids]
    weights = metric.weights(q, rows.strata, None, list(GROUPS), "raw", {})
    composite = composite_items(plan.items, weights, strata=len(rows.strata_labels))
    pooled = [i for i, it in enumerate(plan.items) if it.stratum is None]
    assert pooled and set(composite) == set(pooled)
    for i in pooled:
        assert sorted(plan.items[p].stratum for p in composite[i]) == list(range(len(rows.strata_labels)))


def test_declared_ranges_shrink_the_slot_sensitivity():
    """The noise scale follows the declared bound, not the largest encodable value: the
    output metric's numerator slot is (HI − LO)/2 in fixed point, MQOS-NDCG's K/2 and K."""
    out = get_metric("output")
    comps = out.components("default", out.parse_params({"outcome_range": "100:101"}), {})
    assert comps[0].bound / (1 << comps[0].scale_bits) == pytest.approx(0.5, abs=1e-6)
    ndcg = get_metric("mqos-ndcg")
    comps = ndcg.components("default", ndcg.parse_params({"max_queries_per_viewer": "4"}), {})
    assert [c.bound / (1 << c.scale_bits) for c in comps] == pytest.approx([2.0, 4.0], abs=1e-6)
    lot = get_metric("lot")
    assert lot.components("idcg", lot.parse_params({}), {})[0].bound / 2.0 ** 32 == pytest.approx(1.0, abs=1e-6)
    pot = get_metric("pot")
    info = {"reference_scores": [0.1 * i for i in range(1, 10)], "bandwidth": 0.01}
    assert pot.sensitivity_components("default", pot.parse_params({}), info) == pytest.approx(2.0, abs=0.01)


# ==================================================================================
# B. The bounds as the parties apply them
# ==================================================================================
def _rows(name, frame, option="", **params):
    metric = get_metric(name)
    option = metric.check_option(option)
    return metric.client_rows(frame, FILE, option, metric.parse_params({k: str(v) for k, v in params.items()}),
                              np.random.default_rng(0))


def test_idcg_gaps_stay_within_one_for_whole_grades_and_fractional_ones_are_clipped_or_refused():
    """LOT idcg: Ỹ = rel/IDCG <= 1 for whole-number grades, so |ΔỸ| <= 1 and nothing is
    clipped; a fractional grade below 1 alone in its query gives Ỹ = rel/(2^rel − 1) > 1."""
    whole = pd.DataFrame({"query_id": ["q"] * 3 + ["r"] * 2, "member_id": ["a", "b", "c", "a", "d"],
                          "rank": [1, 2, 3, 1, 2], "relevance": [3, 0, 1, 1, 0]})
    rows = _rows("lot", whole, "idcg")
    assert rows.info["rows_clipped"] == 0 and np.abs(rows.values[:, 0]).max() <= 1.0
    fractional = pd.DataFrame({"query_id": ["q", "q"], "member_id": ["a", "b"], "rank": [1, 2],
                               "relevance": [0.1, 0.0]})
    rows = _rows("lot", fractional, "idcg")
    assert rows.info["rows_clipped"] == 1 and rows.values[0, 0] == pytest.approx(1.0)
    with pytest.raises(InputError, match="out-of-range clip"):
        _rows("lot", fractional, "idcg", out_of_range="refuse")


def test_outcomes_outside_the_range_are_clipped_and_counted_or_refused():
    frame = pd.DataFrame({"member_id": ["a", "b", "c", "d"], "outcome": [0.5, 1.5, -2.0, 1.0]})
    rows = _rows("output", frame)
    assert rows.info["rows_clipped"] == 2
    assert (rows.values[:, 0] + 0.5).tolist() == [0.5, 1.0, 0.0, 1.0]
    with pytest.raises(InputError) as err:
        _rows("output", frame, out_of_range="refuse")
    assert (err.value.file, err.value.column, err.value.row) == (FILE, "outcome", 2)
    assert "--outcome-range" in str(err.value)
    assert _rows("output", frame, outcome_range="-2:2").info["rows_clipped"] == 0


def test_lot_raw_relevances_are_clipped_before_differencing():
    frame = _ranked([("q", 1, 3.0, "a"), ("q", 2, 0.5, "b"), ("q", 3, -1.0, "c")])
    rows = _rows("lot", frame, "raw")
    assert rows.info["rows_clipped"] == 2 and rows.values[:, 0].tolist() == [0.5, 0.5]
    with pytest.raises(InputError, match="relevance-range"):
        _rows("lot", frame, "raw", out_of_range="refuse")


def test_queries_beyond_the_cap_are_dropped_at_random_and_counted():
    rows = [(f"q{q}", 1, 1.0, "v0" if q < 9 else "v1") for q in range(12)]
    rows += [(f"q{q}", 2, float(q % 2), "v0" if q < 9 else "v1") for q in range(12)]
    frame = _ranked(rows)
    out = _rows("mqos-ndcg", frame, max_queries_per_viewer=4)
    assert out.info["queries_dropped"] == 5 and out.info["viewers_capped"] == 1 and out.info["queries"] == 7
    assert sorted(out.values[:, 1].tolist()) == [3.0, 4.0]
    kept = {tuple(_rows("mqos-ndcg", frame.copy(), max_queries_per_viewer=4).values[:, 0]) for _ in range(1)}
    assert kept  # (the draw is the Test-Client's own randomness)


def test_the_result_carries_the_declared_range_and_the_clipped_rows(tmp_path):
    rng = np.random.default_rng(3)
    ids = [f"m{i}" for i in range(150)]
    tester = pd.DataFrame({"member_id": ids, **{g: v for g, v in zip(GROUPS, rng.dirichlet(np.ones(3), 150).T)}})
    client = pd.DataFrame({"member_id": ids, "outcome": np.r_[rng.uniform(2, 4, 148), [9.0, -9.0]]})
    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=5, seed=1, params={"outcome_range": "2:4"})
    report, _, _ = local_audit(tester, client, spec=spec)
    assert report.params["outcome_range"] in ([2.0, 4.0], (2.0, 4.0)) and report.info["rows_clipped"] == 2
    p = tester[list(GROUPS)].to_numpy()
    y = np.clip(client["outcome"].to_numpy(), 2, 4)
    assert [g.estimate for g in report.by_group if g.group in GROUPS] == pytest.approx(
        (p.T @ y / p.sum(axis=0)).tolist(), abs=1e-6)
    from ppre.report import write_report
    html = write_report(report, tmp_path)[0].read_text()  # the report's parameters table
    assert "outcome_range" in html and "rows_clipped" in html
    # the table says, beside the verdict, that the results describe clipped values
    assert "warning: 2 of the Test-Client's 150 outcomes (1%) lay outside the declared range (outcome_range 2:4)" \
        in render_text(report)


def _hello_and_ack(params):
    ids = [f"m{i}" for i in range(120)]
    tester_df = pd.DataFrame({"member_id": ids, "a": 0.5, "b": 0.5})
    client_df = pd.DataFrame({"member_id": ids, "outcome": np.linspace(0, 1, 120)})
    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=5, seed=1, params=params)
    tester = TesterSession(spec, tester_df, min_modulus_bits=TEST_BITS)
    client = ClientSession(lambda name, metric: client_df.copy(), modulus_bits=TEST_BITS, allow_insecure=True)
    (hello,) = tester.start()
    return tester, client, hello


def test_the_handshake_carries_the_bounds_and_each_party_refuses_others():
    tester, client, hello = _hello_and_ack({"outcome_range": "0:2"})
    assert dict(hello.hello.value_bounds) == {"outcome_lo": 0.0, "outcome_hi": 2.0}
    (ack,) = client.receive(hello)
    assert dict(ack.hello_ack.value_bounds) == {"outcome_lo": 0.0, "outcome_hi": 2.0}
    ack.hello_ack.value_bounds["outcome_hi"] = 1e9  # a Test-Client that encoded a wider range
    with pytest.raises(ProtocolError, match="value bounds"):
        list(tester.receive(ack))
    tester.close()
    client.close()

    tester, client, hello = _hello_and_ack({})
    hello.hello.value_bounds["outcome_hi"] = 5.0  # bounds that the parameters do not give
    with pytest.raises(ProtocolError, match="value bounds"):
        list(client.receive(hello))
    tester.close()
    client.close()


def test_the_audit_log_records_the_declared_bounds():
    from tester_service.server import audit_record
    request = pb.AuditRequest(metric="output", client_dataset="d", metric_params={"outcome_range": "-1:3"})
    assert audit_record(request, "op", None, 0)["value_bounds"] == {"outcome_lo": -1.0, "outcome_hi": 3.0}
    request = pb.AuditRequest(metric="mqos-ndcg", client_dataset="d")
    assert audit_record(request, "op", None, 0)["value_bounds"] == {"max_queries_per_viewer": 5.0}
