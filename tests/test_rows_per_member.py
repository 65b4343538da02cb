"""The cap on rows per member that the release noise is sized from (design §8.3;
`common.metrics.lot`, "Rows per member"; `common.metrics.mqos_ndcg`, "Sensitivity";
`Metric.member_rows_cap`): the Tester declares it, the Test-Client keeps its rows within
it and counts what it dropped, the Tester refuses a table above it where it sees the
rows, and the noise (the release's and the suppression's) grows in proportion to it,
whatever the Test-Client states. The attack it closes is
`tests/attacks/test_rows_per_member_attack.py`."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from common.errors import InputError, ProtocolError
from common.metrics import get_metric
from common.metrics.base import SECOND_MOMENTS
from common.metrics.lot import DEFAULT_ROWS_PER_MEMBER, OVER_CAP_INFO, BlindPairs, Lot, rows_within_cap
from common.metrics.mqos_ndcg import MqosNdcg
from common.stats import moments
from ppre.report.text import render_text
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import local_audit, one_key_inline_chunks

GROUPS = ("hsm", "non_hsm")
#: controls with a minimum intersection these small tables pass and the default noise
CONTROLS = ReleasePolicy(min_intersection=10, budget=math.inf)


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def probabilities(members, seed: int = 7) -> pd.DataFrame:
    p = np.random.default_rng(seed).dirichlet([0.6, 0.6], size=len(members))
    return pd.DataFrame({"member_id": list(members), GROUPS[0]: p[:, 0], GROUPS[1]: p[:, 1]})


def one_list_each(n_members: int = 120, length: int = 4, seed: int = 8) -> pd.DataFrame:
    """Ranked lists with every member in one list (at most 2 rows each)."""
    rng = np.random.default_rng(seed)
    members = [f"m{i:04d}" for i in rng.permutation(n_members)]
    return pd.DataFrame([{"query_id": f"q{q:03d}", "member_id": m, "rank": float(r + 1),
                          "relevance": float(rng.integers(0, 4))}
                         for q in range(n_members // length)
                         for r, m in enumerate(members[q * length:(q + 1) * length])])


def lot_spec(cap: int | None = None, **kw) -> AuditSpec:
    params = {"rows_per_member": str(cap)} if cap is not None else {}
    return AuditSpec(metric="lot", client_dataset="d", bootstrap=20, seed=3, params=params, **kw)


def noised(monkeypatch, tester, client, spec, release=CONTROLS):
    """One audit: the report, the noise sd per released slot the Test-Client received, and
    the sds of the Tester's noisy sizes that decide suppression (`suppress_small`)."""
    sds, thresholds = [], []
    original = moments.finish_release

    def keep(plan, correction, decoded, noise_sd, *args, **kwargs):
        sds.append(list(noise_sd))
        return original(plan, correction, decoded, noise_sd, *args, **kwargs)

    def threshold_draw(sigma):
        thresholds.append(sigma)
        return 0.0
    monkeypatch.setattr("client_service.protocol.moments.finish_release", keep)
    monkeypatch.setattr("tester_service.protocol.gaussian", threshold_draw)
    report, _, _ = local_audit(tester, client, spec=spec, release=release)
    return report, np.array(sds[0]), sorted(set(thresholds))


# ---------------------------------------------------------------- the Test-Client's cap
def test_rows_beyond_the_cap_are_dropped_in_order_while_both_members_are_below_it():
    """The rows in order (lists by first appearance, top rank first); a row kept only
    while both its members are below the cap."""
    heads = ["a", "b", "a", "a", "c", "a"]
    tails = ["b", "c", "c", "d", "d", "e"]
    keep = rows_within_cap(heads, tails, 2)
    # a: rows 0, 2 (then at the cap: 3 and 5 dropped); c: rows 1, 2 (then 4 dropped)
    assert keep.tolist() == [True, True, True, False, False, False]
    assert rows_within_cap(heads, tails, 4).all()
    assert rows_within_cap(heads, tails, 2).tolist() == keep.tolist()  # deterministic


def test_lot_keeps_its_rows_within_the_cap_counts_the_rest_and_states_no_row_count():
    metric = Lot()
    frame = pd.DataFrame({"query_id": [f"q{q}" for q in range(5) for _ in range(3)],
                          "member_id": [m for _ in range(5) for m in ("a", "b", f"x{_}")],
                          "rank": [1.0, 2.0, 3.0] * 5, "relevance": [3.0, 2.0, 1.0] * 5})
    params = metric.parse_params({"rows_per_member": "4"})
    params[SECOND_MOMENTS] = True
    rows = metric.client_rows(frame, "d", "idcg", params, np.random.default_rng(0))
    counts = pd.Series(np.concatenate(rows.ids)).value_counts()
    assert counts.max() <= 4 and counts["b"] == 4  # b: head and tail in each of the first two lists
    assert rows.info[OVER_CAP_INFO] == 10 - rows.n_rows and rows.info["pairs"] == rows.n_rows
    assert "member_rows" not in rows.info and metric.stated_facts == ("gap_spread",)
    default = metric.client_rows(frame, "d", "idcg", metric.parse_params({}), np.random.default_rng(0))
    assert metric.member_rows_cap(metric.parse_params({})) == DEFAULT_ROWS_PER_MEMBER == 4
    assert default.n_rows == rows.n_rows


def test_the_cap_is_a_declared_bound_both_parties_check():
    """In the value bounds the HelloAck must echo; a cap that is no whole number from 1 is refused."""
    lot = Lot()
    assert lot.value_bounds("idcg", lot.parse_params({"rows_per_member": "2"}))["rows_per_member"] == 2.0
    assert lot.value_bounds("raw", lot.parse_params({}))["rows_per_member"] == 4.0
    for bad in ("0", "-1", "2.5", "many"):
        with pytest.raises(InputError, match="rows_per_member"):
            lot.parse_params({"rows_per_member": bad})
    assert MqosNdcg().member_rows_cap({}) == 1 and get_metric("ero").member_rows_cap({}) == 1


def test_the_blind_plans_masks_are_sized_from_the_cap_not_the_table():
    """A member's sums in one rank pair fold at most c rows: r is `STATISTICAL_BITS` above
    c rows' largest sum, whatever the Test-Client's row count."""
    def plan(cap, members=1000):
        return BlindPairs.derive(2, 3, ((0, 0),), ((0, 0),), rows_per_member=cap, n_members=members,
                                 gap_bound=1.0, tester_modulus_bits=2048)
    assert plan(8).mask_bits == plan(4).mask_bits + 1 == plan(2).mask_bits + 2
    assert plan(4, 10 ** 6).mask_bits == plan(4).mask_bits  # the members widen the totals' slots only
    assert plan(4, 10 ** 6).slot_bits > plan(4).slot_bits


# ---------------------------------------------------------------- the noise follows the cap
def test_lot_blind_noise_grows_in_proportion_to_the_cap(monkeypatch):
    """LOT on its blind path (the default controls): every released slot's noise sd, the
    denominators' (from which the finishing party withholds small cells: the blind path's
    suppression noise) among them, is twice as large under cap 4 as under cap 2, whatever
    the Test-Client states; the report says the m it was sized by."""
    client = one_list_each()
    tester = probabilities(sorted(set(client["member_id"])))
    monkeypatch.setattr(Lot, "client_rows", stating(Lot.client_rows, {"member_rows": [1.0, 1.0]}))
    two, sd2, _ = noised(monkeypatch, tester, client, lot_spec(2))
    four, sd4, _ = noised(monkeypatch, tester, client, lot_spec(4))
    assert len(sd2) == len(sd4) and (sd2 > 0).sum() > 0 and np.array_equal(sd2 > 0, sd4 > 0)
    np.testing.assert_allclose(sd4[sd4 > 0] / sd2[sd2 > 0], 2.0, rtol=1e-12)
    assert two.release["member_rows_max"] == 2 and four.release["member_rows_max"] == 4
    assert four.release["sigma_estimate"] == pytest.approx(2 * two.release["sigma_estimate"])
    assert two.info[OVER_CAP_INFO] == four.info[OVER_CAP_INFO] == 0


def test_lot_suppression_noise_grows_in_proportion_to_the_cap_where_the_tester_sees_rows(monkeypatch):
    """Where the Tester sees LOT's rows under the controls (the blind path switched off),
    it decides suppression on noisy sizes whose sd is the threshold's σ times the cap."""
    monkeypatch.setattr(Lot, "blind_pairs", False)
    client = one_list_each()
    tester = probabilities(sorted(set(client["member_id"])))
    _, sd2, t2 = noised(monkeypatch, tester, client, lot_spec(2))
    _, sd4, t4 = noised(monkeypatch, tester, client, lot_spec(4))
    assert t2 == [pytest.approx(2 * CONTROLS.threshold_sigma())] and t4 == [pytest.approx(4 * CONTROLS.threshold_sigma())]
    np.testing.assert_allclose(sd4[sd4 > 0] / sd2[sd2 > 0], 2.0, rtol=1e-12)


def viewers(n: int = 60, queries: int = 6, seed: int = 9) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame([{"query_id": f"v{v}q{q}", "member_id": f"v{v:03d}", "rank": float(r + 1),
                          "relevance": float(rng.integers(0, 4))}
                         for v in range(n) for q in range(queries) for r in range(3)])


def test_mqos_ndcg_noise_grows_in_proportion_to_its_cap_and_its_sizes_count_viewers(monkeypatch):
    """MQOS-NDCG's cap on a viewer's queries, K (`max_queries_per_viewer`): the release
    noise's sd doubles from K = 2 to K = 4; the noisy sizes that decide suppression count
    viewers, one row each, and keep the threshold's σ."""
    client = viewers()
    tester = probabilities(sorted(set(client["member_id"])))

    def spec(k):
        return AuditSpec(metric="mqos-ndcg", client_dataset="d", bootstrap=20, seed=3,
                         params={"max_queries_per_viewer": str(k)})
    two, sd2, t2 = noised(monkeypatch, tester, client, spec(2))
    four, sd4, t4 = noised(monkeypatch, tester, client, spec(4))
    assert (sd2 > 0).sum() > 0 and np.array_equal(sd2 > 0, sd4 > 0)
    np.testing.assert_allclose(sd4[sd4 > 0] / sd2[sd2 > 0], 2.0, rtol=1e-9)
    assert t2 == t4 == [pytest.approx(CONTROLS.threshold_sigma())]
    assert two.release["member_rows_max"] == four.release["member_rows_max"] == 1
    assert two.info["queries_dropped"] == 60 * 4 and four.info["queries_dropped"] == 60 * 2


# ---------------------------------------------------------------- a Test-Client above the cap
def stating(client_rows, extra: dict):
    """`client_rows` with `extra` added to the dataset facts (what a modified Test-Client states)."""
    def rows(self, frame, file, option, params, rng):
        out = client_rows(self, frame, file, option, params, rng)
        out.info.update(extra)
        return out
    return rows


def test_a_lot_table_above_the_cap_is_refused_where_the_tester_sees_rows(monkeypatch):
    """A Test-Client that skips its cap (every member in up to 4 rows, the cap 2): the
    Tester counts the rows itself (controls off) and refuses, naming the cap."""
    client = pd.concat([one_list_each(seed=8), one_list_each(seed=9).assign(
        query_id=lambda f: "r" + f["query_id"])], ignore_index=True)
    tester = probabilities(sorted(set(client["member_id"])))
    monkeypatch.setattr("common.metrics.lot.rows_within_cap", lambda h, t, cap: np.ones(len(h), dtype=bool))
    with pytest.raises(ProtocolError, match=r"above the cap of 2 rows per member \(rows_per_member\)"):
        local_audit(tester, client, spec=lot_spec(2), release=ReleasePolicy.off())
    report, _, _ = local_audit(tester, client, spec=lot_spec(4), release=ReleasePolicy.off())
    assert report.cells


def test_a_viewer_in_two_rows_is_refused(monkeypatch):
    """MQOS-NDCG folds a viewer's queries into one row: a Test-Client that sends a viewer
    twice broke the protocol (the noise is sized from one row)."""
    client = viewers()
    tester = probabilities(sorted(set(client["member_id"])))
    rows = MqosNdcg.client_rows

    def doubled(self, frame, file, option, params, rng):
        out = rows(self, frame, file, option, params, rng)
        out.ids = (np.concatenate([out.ids[0], out.ids[0][:1]]),)
        out.values = np.vstack([out.values, out.values[:1]])
        return out
    monkeypatch.setattr(MqosNdcg, "client_rows", doubled)
    with pytest.raises(ProtocolError, match="above the cap of 1 rows per member"):
        local_audit(tester, client, spec=AuditSpec(metric="mqos-ndcg", client_dataset="d", bootstrap=20, seed=3),
                    release=CONTROLS)


def test_the_result_says_how_many_rows_the_cap_dropped():
    """Every member in two lists of three (up to 4 rows), the cap 2: rows dropped, counted
    in `info`, and said beside the verdict."""
    client = pd.concat([one_list_each(length=3, seed=8), one_list_each(length=3, seed=9).assign(
        query_id=lambda f: "r" + f["query_id"])], ignore_index=True)
    tester = probabilities(sorted(set(client["member_id"])))
    report, _, _ = local_audit(tester, client, spec=lot_spec(2), release=ReleasePolicy.off())
    dropped = report.info[OVER_CAP_INFO]
    assert dropped > 0
    assert f"{dropped:,} rows" in render_text(report) and "rows_per_member" in render_text(report)
