"""Synthetic ranked-list datasets for the metric tests and benchmarks (test data only)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd


def lot_validation_data(n_queries: int, gaps: Sequence[float], rng: np.random.Generator,
                        noise: float = 1e-3) -> pd.DataFrame:
    """The paper's LOT validation data (section 8.2.1): ``n_queries`` queries of
    ``len(gaps) + 1`` ranks, each position a different member (``m000000``, ...).

    Relevance at rank 1 is uniform in [2, 3]; at rank r+1 it is the relevance at r minus
    ``gaps[r-1]`` plus N(0, ``noise``) noise, so the LOT of rank pair r-(r+1) in raw mode is
    ``gaps[r-1]`` for every group pair when the race probabilities are drawn independently.
    Values may go negative (only raw mode applies). Columns: query_id, member_id, rank,
    relevance; rows by query, then rank."""
    gaps = np.asarray(gaps, dtype=np.float64)
    length = len(gaps) + 1
    first = rng.uniform(2.0, 3.0, n_queries)
    steps = -gaps[None, :] + rng.normal(0.0, noise, (n_queries, len(gaps)))
    relevance = first[:, None] + np.concatenate([np.zeros((n_queries, 1)), np.cumsum(steps, axis=1)], axis=1)
    members = np.arange(n_queries * length)
    return pd.DataFrame({
        "query_id": np.repeat([f"q{q:06d}" for q in range(n_queries)], length).astype(object),
        "member_id": np.array([f"m{i:06d}" for i in members], dtype=object),
        "rank": np.tile(np.arange(1, length + 1, dtype=np.float64), n_queries),
        "relevance": relevance.ravel(),
    })


def random_ranked_lists(n_queries: int, rng: np.random.Generator, *, min_len: int = 1, max_len: int = 10,
                        grades: int | None = 5, n_members: int | None = None, viewers: int | None = None,
                        shuffle: bool = True) -> pd.DataFrame:
    """Random ranked lists of ``min_len``..``max_len`` items, as `read_table` returns them
    (member_id, rank, relevance, query_id; rank and relevance float64).

    Relevance: whole grades 0..``grades``-1, or uniform in [0, 3) with ``grades=None``.
    Candidate lists (``viewers=None``): distinct members within a query, drawn from
    ``n_members`` ids (default: every row its own member). Viewer lists: each query
    issued by one of ``viewers`` members, on every row of the query. ``shuffle``: rows in
    random order (queries interleaved, ranks out of order)."""
    sizes = rng.integers(min_len, max_len + 1, n_queries)
    n = int(sizes.sum())
    query = np.repeat(np.arange(n_queries), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.arange(n) - np.repeat(starts, sizes) + 1
    if grades is None:
        relevance = rng.uniform(0.0, 3.0, n)
    else:
        relevance = rng.integers(0, grades, n).astype(np.float64)
    if viewers is not None:
        member = rng.integers(0, viewers, n_queries)[query]
    elif n_members is None:
        member = rng.permutation(n)
    else:
        if n_members < max_len:
            raise ValueError("n_members must be at least max_len")
        # distinct within a query: a random offset plus the position, modulo n_members
        member = (rng.integers(0, n_members, n_queries)[query] + rank - 1) % n_members
    frame = pd.DataFrame({
        "member_id": np.array([f"m{i:06d}" for i in member], dtype=object),
        "rank": rank.astype(np.float64),
        "relevance": relevance,
        "query_id": np.array([f"q{q:06d}" for q in query], dtype=object),
    })
    if shuffle:
        frame = frame.iloc[rng.permutation(n)].reset_index(drop=True)
    return frame
