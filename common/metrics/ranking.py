"""Ranked lists: the Test-Client's plaintext side of LOT and MQOS-NDCG (design §5.3, §5.4;
paper sections 5.2-5.3, equations 7-9).

Everything here runs at the Test-Client (P2) in plaintext, before encryption ("pre-
encryption comparison": sorting, differencing and the NDCG division happen here, so the
encrypted path only adds weighted values).

**Input.** A Test-Client dataset as `common.tables.read_table` returns it with
``("rank", "relevance")`` numeric and ``query_id`` as text (member ids not unique): one
row per (query, position). `ranked_lists` checks it and orders it:

* ``rank`` is a whole number >= 1, and the ranks of a query are exactly 1..n, each
  once (a rank twice and a missing rank are refused);
* ``relevance`` is a finite number;
* ``query_id`` and ``member_id`` are not empty;
* candidate lists (LOT): a member appears at most once in a query;
* viewer lists (MQOS-NDCG, ``one_viewer_per_query``): ``member_id`` is the viewer who
  issued the query, the same on every row of the query.

Queries are numbered 0..Q-1 in order of first appearance in the file. Errors are
`InputError`s naming the file, the column and the 1-based data row; messages give ranks
and row numbers only, never a member id, a query id or a relevance.

**Gains** (`gain`, `dcg`, `idcg`): gain ``2^rel − 1``, discount ``log2(p + 1)`` at
positions p = 1..n; IDCG is the DCG of the same relevances sorted in descending order.
A gain needs ``rel >= 0``; a relevance so large that the IDCG overflows float64 is
refused.

**LOT** (`lot_rows`, equations 7-8): ``Ỹ = Y / IDCG(query)`` (option ``"idcg"``, the
paper's) or ``Ỹ = Y`` (option ``"raw"``). For every adjacent pair of positions (r, r+1)
of a query: the two members and the signed difference ``Ỹ_r − Ỹ_{r+1}``. The Tester
weights each pair with ``Pr(R_r = a)·Pr(R_{r+1} = b)``, overall and per rank pair
("1-2", "2-3", ...). A one-item query has no pair and is skipped; with ``"idcg"`` a
query whose relevances are all 0 has IDCG 0 (Ỹ undefined) and is skipped; both are
counted.

**MQOS-NDCG** (`viewer_ndcg`, equation 9): ``NDCG(q) = DCG(q)/IDCG(q)`` for the list as
shown (by rank); a query with IDCG 0 gets NDCG 0 (scikit-learn's convention) and is
counted. Summed per viewer: ``Σ_q NDCG(q)`` and the number of queries, which the
encrypted layer turns into ``Σ_q Pr(R_q = j)·NDCG(q) / Σ_q Pr(R_q = j)``. A one-item
query is kept (its NDCG is 1, or 0 when its relevance is 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from common.errors import InputError
from common.tables import ID_COLUMN, numeric_column

if TYPE_CHECKING:
    import pandas as pd

RANK_COLUMN = "rank"
RELEVANCE_COLUMN = "relevance"
QUERY_COLUMN = "query_id"
LOT_OPTIONS = ("idcg", "raw")

_LN2 = float(np.log(2.0))


def _frozen(values: np.ndarray) -> np.ndarray:
    values.setflags(write=False)
    return values


# --------------------------------------------------------------------------------------
# Checked, ordered lists
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RankedLists:
    """Checked ranked lists, rows ordered by (query, rank); arrays are read-only.

    ``starts[q]:starts[q + 1]`` are the rows of query q (``len(starts) == n_queries + 1``),
    so ``rank[starts[q] + k] == k + 1``. ``row`` is each row's 1-based data row in the
    file (for error messages)."""

    file: str
    member_ids: np.ndarray  # object (str)
    query: np.ndarray  # int64, 0..n_queries-1 in order of first appearance
    rank: np.ndarray  # int64, 1..n within each query
    relevance: np.ndarray  # float64, finite
    row: np.ndarray  # int64, 1-based data row in the file
    starts: np.ndarray  # int64, n_queries + 1 offsets
    n_queries: int
    one_viewer_per_query: bool

    @property
    def sizes(self) -> np.ndarray:
        """Items per query (int64, by query code)."""
        return np.diff(self.starts)


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes in order of first appearance, -1 for a missing or empty value; uniques)."""
    import pandas as pd
    codes, uniques = pd.factorize(values)
    codes = np.asarray(codes, dtype=np.int64)
    uniques = np.asarray(uniques, dtype=object)
    empty = np.flatnonzero(uniques == "")
    if len(empty):
        codes = np.where(codes == empty[0], -1, codes)
    return codes, uniques


def _column(frame: pd.DataFrame, column: str, file: str):
    if column not in frame.columns:
        raise InputError("required column is missing", file=file, column=column)
    return frame[column]


def ranked_lists(frame: pd.DataFrame, file: str, *, one_viewer_per_query: bool = False) -> RankedLists:
    """Check a ranked-list dataset and order it by (query, rank) (module docstring).

    ``one_viewer_per_query``: MQOS-NDCG lists, whose ``member_id`` is the viewer who issued
    the query (the same on every row of a query); otherwise (LOT) ``member_id`` is the
    ranked candidate and may appear at most once per query."""
    file = str(file)
    ids = _column(frame, ID_COLUMN, file).to_numpy(dtype=object)
    queries = _column(frame, QUERY_COLUMN, file).to_numpy(dtype=object)
    _column(frame, RANK_COLUMN, file)
    _column(frame, RELEVANCE_COLUMN, file)
    n = len(frame)
    if n == 0:
        raise InputError("has no data rows", file=file)
    rank_f = numeric_column(frame, RANK_COLUMN, file)
    relevance = numeric_column(frame, RELEVANCE_COLUMN, file)

    # Ranks: whole numbers >= 1 (NaN and infinities fail both tests).
    whole = rank_f >= 1
    whole[whole] = np.floor(rank_f[whole]) == rank_f[whole]
    whole &= np.isfinite(rank_f)
    if not whole.all():
        raise InputError("rank must be a whole number of 1 or more", file=file, column=RANK_COLUMN,
                         row=_first(~whole))
    bad = ~np.isfinite(relevance)
    if bad.any():
        raise InputError("relevance must be a finite number", file=file, column=RELEVANCE_COLUMN,
                         row=_first(bad))

    qcode, _ = _factorize(queries)
    if (qcode < 0).any():
        raise InputError("empty query id", file=file, column=QUERY_COLUMN, row=_first(qcode < 0))
    mcode, _ = _factorize(ids)
    if (mcode < 0).any():
        raise InputError("empty member id", file=file, column=ID_COLUMN, row=_first(mcode < 0))
    n_queries = int(qcode.max()) + 1
    sizes = np.bincount(qcode, minlength=n_queries).astype(np.int64)
    positions = np.arange(n, dtype=np.int64)

    # Rows grouped by query, file order inside a query: the first row of each query.
    by_query = np.argsort(qcode, kind="stable")
    starts = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    first_pos = by_query[starts[:-1]]  # position of each query's first row

    if one_viewer_per_query:
        other = mcode != mcode[first_pos[qcode]]
        if other.any():
            p = int(np.flatnonzero(other)[0])
            raise InputError(f"a query must come from one viewer: this row's member differs from data row "
                             f"{first_pos[qcode[p]] + 1}, the first row of the same query",
                             file=file, column=ID_COLUMN, row=p + 1)
    else:
        order = np.lexsort((positions, mcode, qcode))
        same = (qcode[order[1:]] == qcode[order[:-1]]) & (mcode[order[1:]] == mcode[order[:-1]])
        if same.any():
            p = int(order[1:][same].min())  # the earliest row that repeats an earlier one
            earlier = _first((qcode == qcode[p]) & (mcode == mcode[p]))
            raise InputError(f"the same member appears twice in one query (also at data row {earlier}, "
                             f"in the same query)", file=file, column=ID_COLUMN, row=p + 1)

    # Ranks above the query's size are capped at size + 1 (no overflow; they leave a gap).
    rank = np.minimum(rank_f, (sizes[qcode] + 1).astype(np.float64)).astype(np.int64)
    order = np.lexsort((positions, rank, qcode))
    q_sorted, r_sorted = qcode[order], rank[order]
    dup = (q_sorted[1:] == q_sorted[:-1]) & (r_sorted[1:] == r_sorted[:-1]) \
        & (r_sorted[1:] <= sizes[q_sorted[1:]])
    if dup.any():
        p = int(order[1:][dup].min())
        earlier = _first((qcode == qcode[p]) & (rank == rank[p]))
        raise InputError(f"rank {int(rank[p])} appears twice in one query: data row {earlier}, in the "
                         f"same query, has the same rank", file=file, column=RANK_COLUMN, row=p + 1)
    expected = np.arange(n, dtype=np.int64) - starts[q_sorted] + 1
    gap = r_sorted != expected
    if gap.any():
        s = int(np.flatnonzero(gap)[0])  # queries are in order of first row: the earliest query
        q = int(q_sorted[s])
        raise InputError(f"rank {int(expected[s])} is missing from the query that starts at this row "
                         f"(its {int(sizes[q])} rows must be ranked 1 to {int(sizes[q])})",
                         file=file, column=RANK_COLUMN, row=int(first_pos[q]) + 1)

    return RankedLists(
        file=file,
        member_ids=_frozen(ids[order]),
        query=_frozen(q_sorted.astype(np.int64)),
        rank=_frozen(r_sorted.astype(np.int64)),
        relevance=_frozen(relevance[order].astype(np.float64)),
        row=_frozen(order.astype(np.int64) + 1),
        starts=_frozen(starts),
        n_queries=n_queries,
        one_viewer_per_query=bool(one_viewer_per_query),
    )


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0]) + 1


# --------------------------------------------------------------------------------------
# Gains, DCG, IDCG
# --------------------------------------------------------------------------------------
def gain(relevance: np.ndarray) -> np.ndarray:
    """``2^rel − 1`` (float64): exact for whole grades, accurate for small ``rel`` too."""
    rel = np.asarray(relevance, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(rel >= 1.0, np.exp2(rel) - 1.0, np.expm1(rel * _LN2))


def _list_starts(n: int, starts: np.ndarray | None) -> np.ndarray:
    if starts is None:
        return np.array([0, n], dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    if len(starts) < 2 or starts[0] != 0 or starts[-1] != n or (np.diff(starts) <= 0).any():
        raise ValueError("starts must rise strictly from 0 to the number of items")
    return starts


def dcg(relevance: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """DCG of each list: ``Σ_p (2^rel_p − 1)/log2(p + 1)``, p = 1..n in the order given.

    ``relevance`` holds the lists one after the other; list q is
    ``relevance[starts[q]:starts[q + 1]]`` (``starts=None``: one list). Returns one
    float64 per list (lists must not be empty)."""
    rel = np.asarray(relevance, dtype=np.float64)
    starts = _list_starts(len(rel), starts)
    sizes = np.diff(starts)
    position = np.arange(len(rel), dtype=np.int64) - np.repeat(starts[:-1], sizes) + 1
    with np.errstate(over="ignore", invalid="ignore"):
        return np.add.reduceat(gain(rel) / np.log2(position + 1.0), starts[:-1])


def idcg(relevance: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """IDCG of each list: the DCG of its relevances sorted in descending order (`dcg`)."""
    rel = np.asarray(relevance, dtype=np.float64)
    starts = _list_starts(len(rel), starts)
    owner = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    return dcg(rel[np.lexsort((-rel, owner))], starts)


def _checked_idcg(lists: RankedLists, what: str) -> np.ndarray:
    """IDCG per query, after refusing relevances that have no gain (< 0) or overflow it."""
    neg = lists.relevance < 0
    if neg.any():
        raise InputError(f"relevance must be 0 or more ({what} uses the gain 2^relevance − 1)",
                         file=lists.file, column=RELEVANCE_COLUMN, row=int(lists.row[neg].min()))
    ideal = idcg(lists.relevance, lists.starts)
    over = ~np.isfinite(ideal)
    if over.any():
        top = np.maximum.reduceat(lists.relevance, lists.starts[:-1])
        rows = over[lists.query] & (lists.relevance == top[lists.query])
        raise InputError(f"relevance is too large: the gain 2^relevance − 1 of its query overflows "
                         f"({what})", file=lists.file, column=RELEVANCE_COLUMN,
                         row=int(lists.row[rows].min()))
    return ideal


# --------------------------------------------------------------------------------------
# LOT: adjacent pairs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LotRows:
    """One row per adjacent pair (r, r+1) of a used query; arrays are read-only.

    ``delta = Ỹ_r − Ỹ_{r+1}`` (signed); ``rank_pair = r − 1`` (0 is "1-2"), labelled by
    ``rank_pair_labels`` up to the longest used list."""

    file: str
    option: str  # "idcg" or "raw"
    higher_ids: np.ndarray  # object: the member at rank r
    lower_ids: np.ndarray  # object: the member at rank r + 1
    delta: np.ndarray  # float64
    rank_pair: np.ndarray  # int64, 0-based
    query: np.ndarray  # int64 query code
    n_queries: int  # queries used (at least one pair)
    skipped_single_item: int  # queries with one item: no pair
    skipped_zero_idcg: int  # "idcg" only: queries of two or more items whose relevances are all 0
    rank_pair_labels: tuple[str, ...]

    @property
    def n_pairs(self) -> int:
        return len(self.delta)


def lot_rows(lists: RankedLists, option: str = "idcg") -> LotRows:
    """The adjacent pairs of LOT (equations 7-8; module docstring): ``Ỹ = Y / IDCG(query)``
    with ``option="idcg"`` (relevance must be >= 0), ``Ỹ = Y`` with ``option="raw"``."""
    if option not in LOT_OPTIONS:
        raise InputError(f"must be one of {', '.join(LOT_OPTIONS)}", parameter="option")
    sizes = lists.sizes
    single = sizes == 1
    keep = ~single
    zero = np.zeros(lists.n_queries, dtype=bool)
    if option == "idcg":
        ideal = _checked_idcg(lists, "LOT with IDCG normalisation")
        zero = keep & (ideal == 0)
        keep &= ~zero
        with np.errstate(divide="ignore", invalid="ignore"):
            y = lists.relevance / ideal[lists.query]
    else:
        y = lists.relevance
    q = lists.query
    pair = (q[1:] == q[:-1]) & keep[q[:-1]]
    if not pair.any():
        why = " (the others have every relevance 0, so no IDCG)" if zero.any() else ""
        raise InputError(f"no query has two ranked items{why}: LOT needs adjacent pairs", file=lists.file)
    hi = np.flatnonzero(pair)
    rank_pair = lists.rank[hi] - 1
    longest = int(rank_pair.max()) + 1
    return LotRows(
        file=lists.file,
        option=option,
        higher_ids=_frozen(lists.member_ids[hi]),
        lower_ids=_frozen(lists.member_ids[hi + 1]),
        delta=_frozen((y[hi] - y[hi + 1]).astype(np.float64)),
        rank_pair=_frozen(rank_pair.astype(np.int64)),
        query=_frozen(q[hi].astype(np.int64)),
        n_queries=int(keep.sum()),
        skipped_single_item=int(single.sum()),
        skipped_zero_idcg=int(zero.sum()),
        rank_pair_labels=tuple(f"{r + 1}-{r + 2}" for r in range(longest)),
    )


# --------------------------------------------------------------------------------------
# MQOS-NDCG: NDCG per query, summed per viewer
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ViewerNdcg:
    """NDCG per query and its sums per viewer; arrays are read-only.

    ``viewer_ids[v]`` issued ``n_queries[v]`` queries whose NDCGs sum to ``ndcg_sum[v]``
    (viewers in order of first appearance). ``query_ndcg[q]`` and ``query_viewer[q]``
    (an index into ``viewer_ids``) are by query code."""

    file: str
    viewer_ids: np.ndarray  # object, unique
    ndcg_sum: np.ndarray  # float64 per viewer
    n_queries: np.ndarray  # int64 per viewer
    query_ndcg: np.ndarray  # float64 per query
    query_viewer: np.ndarray  # int64 per query
    total_queries: int
    total_ndcg: float  # Σ over all queries
    zero_idcg_queries: int  # queries with every relevance 0: NDCG 0

    @property
    def overall(self) -> float:
        """Mean NDCG over all queries (the unweighted "overall" of MQOS)."""
        return self.total_ndcg / self.total_queries


def viewer_ndcg(lists: RankedLists) -> ViewerNdcg:
    """NDCG of each query as shown, summed per viewer (equation 9; module docstring).
    ``lists`` must come from `ranked_lists` with ``one_viewer_per_query=True``."""
    if not lists.one_viewer_per_query:
        raise ValueError("viewer_ndcg needs lists checked with one_viewer_per_query=True")
    ideal = _checked_idcg(lists, "NDCG")
    shown = dcg(lists.relevance, lists.starts)
    zero = ideal == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ndcg = np.where(zero, 0.0, shown / np.where(zero, 1.0, ideal))
    import pandas as pd
    codes, uniques = pd.factorize(lists.member_ids[lists.starts[:-1]])
    codes = np.asarray(codes, dtype=np.int64)
    n_viewers = len(uniques)
    return ViewerNdcg(
        file=lists.file,
        viewer_ids=_frozen(np.asarray(uniques, dtype=object)),
        ndcg_sum=_frozen(np.bincount(codes, weights=ndcg, minlength=n_viewers).astype(np.float64)),
        n_queries=_frozen(np.bincount(codes, minlength=n_viewers).astype(np.int64)),
        query_ndcg=_frozen(ndcg.astype(np.float64)),
        query_viewer=_frozen(codes),
        total_queries=lists.n_queries,
        total_ndcg=float(ndcg.sum()),
        zero_idcg_queries=int(zero.sum()),
    )
