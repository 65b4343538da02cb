"""LOT, the listwise outcome test (SPEC.md section 5; paper eqs. 7-8, section 5.2).

Dataset: `query_id, member_id, rank, relevance` (ranks 1..n within a query; a member
appears at most once per query, in any number of queries). The Test-Client forms, in
plaintext, one row per adjacent pair of positions (r, r+1) of every list: both
members' ids, the signed difference ΔỸ = Ỹ_r − Ỹ_{r+1} and the rank pair (a plaintext
stratum). Ỹ = relevance / IDCG(query) (option `idcg`: gain 2^rel − 1, discount
log2(position + 1), as in MQOS-NDCG) or the relevance as given (option `raw`, for
scores already normalised; |relevance| <= 2^20). Queries with one item have no pair
and, in `idcg` mode, queries whose relevances are all 0 have no Ỹ: both are skipped
and counted (`info`).

The Tester weights a row for the ordered group pair (a, b) by p_ra·p_(r+1)b. Cells:
every ordered pair of different groups (same-group pairs with the parameter
`same_group_pairs`), per rank pair and pooled over rank pairs:
LOT_ab = Σ ΔỸ·p_ra·p_(r+1)b / Σ p_ra·p_(r+1)b. The bootstrap resamples whole
queries: the Test-Client maps each query to a random bucket, so a query's pairs stay
together and the Tester never sees a query id. Verdict: a cell significantly below 0
(the lower-ranked member measurably more relevant) is a disparity (rule
"negative_cells"). Usually run on the coarsened hsm/non_hsm split.
"""
from __future__ import annotations

import numpy as np

from common.metrics.base import Cell, ClientRows, Component, Item, Metric, Param, Plan, boolean, finite_column
from common.metrics.ranking import lot_rows, ranked_lists

#: raw relevances are bounded (their differences are encoded with 32 fractional bits)
MAX_RAW_RELEVANCE = float(1 << 20)
VALUE_BITS = 32


class Lot(Metric):
    name = "lot"
    description = "listwise outcome test: signed relevance gaps between adjacent ranks, per group pair"
    options = ("idcg", "raw")
    option_help = "idcg (default): Ỹ = relevance / IDCG(query); raw: Ỹ = relevance"
    params = (Param("same_group_pairs", "also report same-group cells (a, a): true or false", boolean, False),)
    numeric_columns = ("rank", "relevance")
    text_columns = ("query_id",)
    unique_ids = False
    n_ids = 2
    resampling = "unit"
    strata_cells = True
    uses_strata = True
    verdict_rule = "negative_cells"

    def components(self, option, params, info):
        top = 2.0 if option == "idcg" else 2 * MAX_RAW_RELEVANCE
        return (Component("delta", VALUE_BITS, int(top * (1 << VALUE_BITS)) + 1),
                Component("one", VALUE_BITS, 1 << VALUE_BITS))

    def client_rows(self, frame, file, option, params, rng):
        if option == "raw":
            finite_column(frame, "relevance", file, limit=MAX_RAW_RELEVANCE)
        rows = lot_rows(ranked_lists(frame, file), option)
        values = np.column_stack([rows.delta, np.ones_like(rows.delta)])
        info = {"queries": rows.n_queries, "pairs": rows.n_pairs, "skipped_single_item": rows.skipped_single_item,
                "skipped_zero_idcg": rows.skipped_zero_idcg}
        return ClientRows(ids=(np.asarray(rows.higher_ids, dtype=object), np.asarray(rows.lower_ids, dtype=object)),
                          values=values, units=np.asarray(rows.query), strata=np.asarray(rows.rank_pair),
                          strata_labels=tuple(rows.rank_pair_labels), info=info)

    def check_info(self, info, strata_labels):
        if not 1 <= len(strata_labels):
            raise ValueError("no rank pairs")

    @staticmethod
    def _pairs(groups, params):
        k = len(groups)
        return [(a, b) for a in range(k) for b in range(k) if a != b or params.get("same_group_pairs")]

    def weights(self, q, strata, units, groups, option, params):
        qa, qb = (x.astype(object) for x in q)
        return [qa[:, a] * qb[:, b] for a, b in self._pairs(groups, params)]

    def plan(self, groups, strata_labels, layout, option, params, info):
        ct, num_slot = layout.position(0)
        _, den_slot = layout.position(1)
        items, cells = [], []
        for s, label in [(None, None)] + list(enumerate(strata_labels)):
            for w, (a, b) in enumerate(self._pairs(groups, params)):
                cells.append(Cell("pair", groups[a], groups[b], rank_pair=label, item=len(items),
                                  num_slot=num_slot, den_slot=den_slot))
                items.append(Item(w, ct, s))
        return Plan(tuple(cells), tuple(items), layout.slots)


METRIC = Lot()
