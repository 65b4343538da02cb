"""MQOS-NDCG, minimum quality of service by NDCG (design §5.4; paper eq. 9).

Dataset: `query_id, member_id, rank, relevance`, where member_id is the viewer who
issued the query (the same on every row of a query). The Test-Client computes each
query's NDCG in plaintext (DCG = Σ (2^rel − 1)/log2(rank + 1) over the list as shown,
IDCG from the same relevances sorted; a query whose relevances are all 0 has NDCG 0,
scikit-learn's convention, and is counted) and aggregates per viewer before
encryption: f = Σ NDCG over the viewer's queries, d = the number of queries. So a
viewer with several queries is one row (NDCG[j] = Σ_q p_vj NDCG(q) / Σ_q p_vj exactly)
and the bootstrap resamples viewers. Cells: each group and overall. Verdict: a group
significantly below overall (rule "below_overall"; flagged when overall − group > τ).

**Declared bound: queries per viewer.** At most K queries of one viewer enter the
audit (`max_queries_per_viewer`, `--max-queries-per-viewer K`; default 5): the
Test-Client keeps K of a viewer's queries drawn at random (its own secret randomness)
and drops the rest before encryption, counting them (`info["queries_dropped"]`,
`info["viewers_capped"]`: counts over its own rows before the join, sent with the
other dataset facts). Per viewer it encodes f = Σ_q (NDCG(q) − 1/2) and d = n_v, the
viewer's kept queries, so |f| ≤ n_v/2 ≤ K/2 and 0 ≤ d ≤ K; each cell adds 1/2 back
(`Cell.offset`), the same query-weighted mean.

**Sensitivity** (`tester_service.release`; design §8.3). K is this metric's cap on a
member's rows: a viewer's rows are its queries, and the Test-Client folds the at most K
it keeps into one encrypted row, so the cap on encrypted rows per member is 1
(`member_rows_cap`). Replacing a viewer's probability vector (||Δp||₂ ≤ √2) moves group
j's numerator by Δp_j·f and its denominator by Δp_j·d: over all groups at most √2·K/2
and √2·K, the components' bounds K/2 and K (`Metric.slot_sensitivity`, times the one
row). So the noise grows in proportion to K, declared by the Tester, never with what the
Test-Client states or the 2^20 queries a viewer could have; a K far above the queries
viewers actually issue costs accuracy, one below them costs data (counted: the result's
`queries_dropped` says how many were left out; `ppre synth`'s viewers issue 1 to 3
queries, which the default K = 5 keeps whole). The effective sizes that decide
suppression count viewers (Σ p over their rows), which one viewer moves by at most
||Δp||₂ whatever K: their noise is sized by the one row. The Tester sees these rows: a
viewer in more than one of them is a Test-Client that broke the protocol, refused
(`ProtocolError`).

**Interval under release noise** (`common.stats.moments`, design §8.4). Released: the
estimate's sums and the pair items' S^d_ab = Σ p_a·p_b·d (as for ERO); the delta method
``Var(Num_j − R_j·Den_j) = σ²·S^d_jj`` then needs one spread per query σ², which the
Test-Client reads off its own rows: σ² = Σ (f − c·d)²/Σ d over all its viewers, c their
mean (`spread_facts`), sent with the other dataset facts under this release only
(`stated_facts`; `info`: `spread_per_query`, and `queries_squared` = Σ d² for
κ = Σ d²/Σ d, which enters the covariances across groups only). The squares are not
released under noise as the output metric's are: their bound (K² per viewer) is some
thousand times a real NDCG's spread (about 0.01 per query), and noise sized for it would
make σ² noise (measured: weighted coverage 0.85 for white at 100,000 members). The
assumption is that the joined viewers spread as all the Test-Client's viewers do; the
Tester learns σ² and Σ d² of the Test-Client's whole table (design §9.1).
"""
from __future__ import annotations

import numpy as np

from common.metrics.base import SECOND_MOMENTS, Cell, ClientRows, Component, Metric, Param, Plan, positive_int
from common.metrics.ranking import ranked_lists, viewer_ndcg

VALUE_BITS = 32
#: the most queries per viewer an operator may declare
MAX_QUERIES_PER_VIEWER = 1 << 20
#: queries per viewer when none is declared
DEFAULT_QUERIES_PER_VIEWER = 5
#: each query's NDCG is encoded relative to this (NDCG − 1/2 ∈ [−1/2, 1/2])
CENTRE = 0.5


def capped_viewers(query_viewer: np.ndarray, query_ndcg: np.ndarray, n_viewers: int, cap: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(Σ (NDCG − 1/2), kept queries) per viewer, keeping at most `cap` queries of each,
    drawn at random; and (queries dropped, viewers capped)."""
    order = np.lexsort((rng.random(len(query_viewer)), query_viewer))  # by viewer, random within
    viewer = query_viewer[order]
    starts = np.searchsorted(viewer, viewer, side="left")
    keep = order[(np.arange(len(viewer)) - starts) < cap]
    counts = np.bincount(query_viewer, minlength=n_viewers)
    kept_viewer = query_viewer[keep]
    sums = np.bincount(kept_viewer, weights=query_ndcg[keep] - CENTRE, minlength=n_viewers)
    kept = np.bincount(kept_viewer, minlength=n_viewers)
    return sums, kept, int(len(query_viewer) - len(keep)), int((counts > cap).sum())


#: the Test-Client's facts the interval under release noise reads (`spread_facts`)
SPREAD_INFO = "spread_per_query"
SQUARED_QUERIES_INFO = "queries_squared"


def spread_facts(sums: np.ndarray, kept: np.ndarray) -> dict:
    """Over all the Test-Client's viewers (f their NDCG sums around ½, d their kept
    queries): the spread per query σ² = Σ (f − c·d)²/Σ d around their mean c = Σ f/Σ d,
    and Σ d² (module docstring, "Interval under release noise")."""
    total = float(kept.sum())
    centre = float(sums.sum()) / total if total > 0 else 0.0
    spread = float(((sums - centre * kept) ** 2).sum() / total) if total > 0 else 0.0
    return {SPREAD_INFO: round(spread, 9), SQUARED_QUERIES_INFO: int((kept.astype(np.int64) ** 2).sum())}


class MqosNdcg(Metric):
    name = "mqos-ndcg"
    corrects = True
    moment_interval = True
    stated_facts = (SPREAD_INFO, SQUARED_QUERIES_INFO)
    description = "minimum quality of service: per-group mean NDCG of the viewers' queries"
    numeric_columns = ("rank", "relevance")
    text_columns = ("query_id",)
    unique_ids = False
    verdict_rule = "below_overall"
    params = (Param("max_queries_per_viewer", f"K: at most K queries of a viewer enter the audit, drawn at "
                    f"random (the rest are dropped and counted); the release noise grows with K "
                    f"(default {DEFAULT_QUERIES_PER_VIEWER})", positive_int(MAX_QUERIES_PER_VIEWER),
                    DEFAULT_QUERIES_PER_VIEWER),)

    member_rows_cap_name = "one row per viewer, its queries folded in"

    def member_rows_cap(self, params) -> int:
        """One encrypted row per viewer (module docstring, "Sensitivity"): its queries,
        at most `max_queries_per_viewer`, are folded into it."""
        return 1

    @staticmethod
    def _cap(params) -> int:
        return int(params.get("max_queries_per_viewer") or DEFAULT_QUERIES_PER_VIEWER)

    def value_bounds(self, option, params):
        return {"max_queries_per_viewer": float(self._cap(params))}

    def value_range(self, option, params):
        return (0.0, 1.0)

    def components(self, option, params, info):
        cap = self._cap(params)
        return (Component("ndcg_sum", VALUE_BITS, (cap << VALUE_BITS) // 2 + 1),
                Component("queries", VALUE_BITS, cap << VALUE_BITS))

    def moment_shape(self, option, params, info, layout):
        """The spread per query and κ = Σ d²/Σ d, from the Test-Client's own facts
        (module docstring, "Interval under release noise")."""
        shape = super().moment_shape(option, params, info, layout)
        queries = max(int(info.get("queries", 0)), 1)
        shape["spread"] = float(info.get(SPREAD_INFO, 0.0))
        shape["den_square"] = max(float(info.get(SQUARED_QUERIES_INFO, queries)) / queries, 1.0)
        return shape

    def client_rows(self, frame, file, option, params, rng):
        v = viewer_ndcg(ranked_lists(frame, file, one_viewer_per_query=True))
        sums, kept, dropped, capped = capped_viewers(v.query_viewer, v.query_ndcg, len(v.viewer_ids),
                                                     self._cap(params), rng)
        info = {"queries": int(v.total_queries) - dropped, "viewers": len(v.viewer_ids),
                "zero_idcg_queries": int(v.zero_idcg_queries), "queries_dropped": dropped,
                "viewers_capped": capped}
        if params.get(SECOND_MOMENTS):  # stated for the interval under release noise alone
            info.update(spread_facts(sums, kept))
        return ClientRows(ids=(np.asarray(v.viewer_ids, dtype=object),),
                          values=np.column_stack([sums, kept.astype(np.float64)]), info=info)

    def check_info(self, info, strata_labels):
        if min(int(info.get("queries_dropped", 0)), int(info.get("viewers_capped", 0))) < 0:
            raise ValueError("dropped queries")
        spread, squared = float(info.get(SPREAD_INFO, 0.0)), int(info.get(SQUARED_QUERIES_INFO, 0))
        if not (0.0 <= spread <= MAX_QUERIES_PER_VIEWER) or squared < 0:
            raise ValueError("spread per query")

    def plan(self, groups, strata_labels, layout, option, params, info):
        base = super().plan(groups, strata_labels, layout, option, params, info)
        return Plan(tuple(Cell(c.kind, c.group, item=c.item, num_slot=c.num_slot, den_slot=c.den_slot,
                               scale_shift=c.scale_shift, offset=CENTRE) for c in base.cells),
                    base.items, base.item_slots)


METRIC = MqosNdcg()
