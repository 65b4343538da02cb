"""MQOS-NDCG, minimum quality of service by NDCG (SPEC.md section 5; paper eq. 9).

Dataset: `query_id, member_id, rank, relevance`, where member_id is the viewer who
issued the query (the same on every row of a query). The Test-Client computes each
query's NDCG in plaintext (DCG = Σ (2^rel − 1)/log2(rank + 1) over the list as shown,
IDCG from the same relevances sorted; a query whose relevances are all 0 has NDCG 0,
scikit-learn's convention, and is counted) and aggregates per viewer before
encryption: f = Σ NDCG over the viewer's queries, d = the number of queries. So a
viewer with several queries is one row (NDCG[j] = Σ_q p_vj NDCG(q) / Σ_q p_vj exactly)
and the bootstrap resamples viewers. Cells: each group and overall. Verdict: a group
significantly below overall (rule "below_overall"; flagged when overall − group > τ).
"""
from __future__ import annotations

import numpy as np

from common.errors import InputError
from common.metrics.base import ClientRows, Component, Metric
from common.metrics.ranking import ranked_lists, viewer_ndcg

VALUE_BITS = 32
#: most queries one viewer may have (the values' bound)
MAX_QUERIES_PER_VIEWER = 1 << 20


class MqosNdcg(Metric):
    name = "mqos-ndcg"
    corrects = True
    description = "minimum quality of service: per-group mean NDCG of the viewers' queries"
    numeric_columns = ("rank", "relevance")
    text_columns = ("query_id",)
    unique_ids = False
    verdict_rule = "below_overall"

    def components(self, option, params, info):
        bound = MAX_QUERIES_PER_VIEWER << VALUE_BITS
        return (Component("ndcg_sum", VALUE_BITS, bound), Component("queries", VALUE_BITS, bound))

    def client_rows(self, frame, file, option, params, rng):
        v = viewer_ndcg(ranked_lists(frame, file, one_viewer_per_query=True))
        if v.n_queries.max() > MAX_QUERIES_PER_VIEWER:
            raise InputError(f"a viewer has more than {MAX_QUERIES_PER_VIEWER} queries", file=file,
                             column="member_id")
        info = {"queries": int(v.total_queries), "viewers": len(v.viewer_ids),
                "zero_idcg_queries": int(v.zero_idcg_queries)}
        return ClientRows(ids=(np.asarray(v.viewer_ids, dtype=object),),
                          values=np.column_stack([v.ndcg_sum, v.n_queries.astype(np.float64)]), info=info)


METRIC = MqosNdcg()
