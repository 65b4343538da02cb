"""(B) The pair-graph linker: a curious Tester reads labels off sampled MQOS-AUC's rows.

The attacker is the Tester. It opens its own probability vectors, so it can link each
of the Test-Client's rows to its members (tests/attacks/row_linking.py; here the link
is taken as known: the Tester holds every row's two member ids). Sampled MQOS-AUC's rows
are pairs of members. If every row were a positive and a negative, the rows' graph
would be bipartite by label: the attacker two-colours each connected component (a
max-cut local search where it is not bipartite) and, knowing which label is the
majority, gives it to the larger colour class of each component and to every member in
no row. Blind baseline: the majority label for everyone.

The defence (`common.metrics.scoring.sample_pair_graph`, docs/metrics/mqos-auc.md "What
the Tester sees"): the rows are a random graph over all members drawn without the
labels, the edges that are not positive-negative being dummies of two encrypted zeros.
Any guess made from the graph is then independent of the labels, so it cannot beat the
majority guess. The rows are the real Test-Client's (`SampledAuc.client_rows`) on the
synth's MQOS-AUC dataset; the defence is removed by putting back the earlier sampler
(positive-negative pairs only, `sample_capped_pairs`).
"""
from __future__ import annotations

import contextlib
import io
from collections import deque

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from common.metrics import mqos_auc
from common.metrics.scoring import sample_capped_pairs
from ppre.cli import main as ppre_main
from tests.attacks.harness import CHANCE_ALPHA

#: a population of its own (`ppre synth`): no other attack uses this seed
MEMBERS, SEED = 800, 1831
#: audits read (one Test-Client row draw each)
AUDITS = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("pair-graph")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert ppre_main(["synth", "--members", str(MEMBERS), "--seed", str(SEED), "--out", str(out)]) == 0
    return pd.read_csv(out / "client" / "mqos_auc.csv", dtype={"member_id": str})


def pair_rows(frame: pd.DataFrame, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The member ids of each row the real Test-Client sends (default parameters)."""
    metric = mqos_auc.SAMPLED
    rows = metric.client_rows(frame, "mqos_auc.csv", "sampled", metric.parse_params({}),
                              np.random.default_rng([SEED, seed]))
    return rows.ids


def colour(members: list[str], first: np.ndarray, second: np.ndarray) -> dict[str, tuple[int, int]]:
    """Per member in some row: (its component, its colour 0/1): a BFS two-colouring, then
    a local search that flips any member with more neighbours of its colour than of the
    other (a max-cut step; it changes nothing in a bipartite component)."""
    neighbours: dict[str, list[str]] = {m: [] for m in members}
    for a, b in zip(first, second):
        neighbours[a].append(b)
        neighbours[b].append(a)
    side: dict[str, tuple[int, int]] = {}
    for start in members:
        if start in side or not neighbours[start]:
            continue
        side[start] = (len(side), 0)
        queue = deque([start])
        while queue:
            m = queue.popleft()
            for o in neighbours[m]:
                if o not in side:
                    side[o] = (side[start][0], 1 - side[m][1])
                    queue.append(o)
    for _ in range(20):
        flipped = 0
        for m, (comp, c) in list(side.items()):
            same = sum(side[o][1] == c for o in neighbours[m])
            if 2 * same > len(neighbours[m]):
                side[m], flipped = (comp, 1 - c), flipped + 1
        if not flipped:
            break
    return side


def guess_labels(frame: pd.DataFrame, first: np.ndarray, second: np.ndarray, majority: int) -> dict[str, int]:
    """The majority label for the larger colour class of each component and for every
    member in no row; the other label for the smaller class (ties: the majority)."""
    members = frame["member_id"].tolist()
    side = colour(members, first, second)
    sizes: dict[tuple[int, int], int] = {}
    for key in side.values():
        sizes[key] = sizes.get(key, 0) + 1
    guess = {}
    for m in members:
        if m not in side:
            guess[m] = majority
            continue
        comp, c = side[m]
        guess[m] = majority if sizes.get((comp, c), 0) >= sizes.get((comp, 1 - c), 0) else 1 - majority
    return guess


def attack(frame: pd.DataFrame) -> tuple[int, int, int, float]:
    """(labels recovered, blind baseline's, guesses, the count a blind guesser exceeds
    with probability below CHANCE_ALPHA) over `AUDITS` row draws."""
    labels = dict(zip(frame["member_id"], frame["y_true"].astype(int)))
    majority = int(np.mean(list(labels.values())) >= 0.5)
    recovered = 0
    for audit in range(AUDITS):
        first, second = pair_rows(frame, audit)
        guess = guess_labels(frame, first, second, majority)
        recovered += sum(guess[m] == y for m, y in labels.items())
    total = AUDITS * len(labels)
    blind = AUDITS * sum(y == majority for y in labels.values())
    return recovered, blind, total, float(binom.ppf(1 - CHANCE_ALPHA, total, blind / total))


def test_pair_graph_gives_no_labels_with_the_defence(dataset):
    recovered, blind, total, margin = attack(dataset)
    print(f"pair-graph linker, defence on: {recovered}/{total} labels (blind {blind}, margin {margin:g})")
    assert recovered <= margin, (recovered, blind, margin)


def test_pair_graph_gives_every_label_without_the_defence(dataset, monkeypatch):
    """The defence removed: rows of positive-negative pairs only (the earlier sampler)."""
    def pairs_only(y, scores, m, cap, rng, file):
        first, second, indicator = sample_capped_pairs(y, scores, m, cap, rng, file)
        return first, second, np.column_stack([indicator, np.ones_like(indicator)]), len(first)
    monkeypatch.setattr(mqos_auc, "sample_pair_graph", pairs_only)
    recovered, blind, total, margin = attack(dataset)
    print(f"pair-graph linker, defence off: {recovered}/{total} labels (blind {blind}, margin {margin:g})")
    assert recovered >= 0.99 * total and recovered > margin, (recovered, blind, margin)
