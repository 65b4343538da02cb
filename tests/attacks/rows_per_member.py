"""(C) A Test-Client that under-states its rows per member on LOT's blind path.

The release noise is sized for the most rows one member can be in (design §8.3;
`common.metrics.lot`, "Sensitivity"): a member in m rows moves the released cells m
times as far as a member in one. On LOT's blind path (the default under the release
controls) the Tester never sees a row, so it cannot count m itself.

The attack, by a Test-Client whose only change is what it says of its rows per member
(every value in range, its rows as our Test-Client forms them): `LISTS` ranked lists
that all start with the same `TARGETS` targets, t_1 at rank 1 down to t_T at rank T,
then one decoy per list; and `PADDING` lists of two fresh decoys each, so that the
intersection is large whatever the Test-Client keeps. In rank pair s = t-(t+1) every row
has head t_t, so the released weights' denominators, per ordered group pair (a, b),

    Den_ab(s) = Σ_rows p_(t_t)a·p_(tail)b = LISTS·p_(t_t)a·p̄_b,

(p̄ the tails' mean vector) form a rank-one matrix whose left factor is the target's
vector, read by alternating least squares over the off-diagonal cells
(`read_heads`). Each target is in 2·LISTS rows; a Tester that sized the noise from one
row releases Den to about one member's noise, far below LISTS·p·p̄.

Measured: 14 of 15 targets' groups read in one default audit while the Tester sized the
noise from the rows the Test-Client stated; 3 of 15 (blind 2.5) since it sizes them from
its own cap, `rows_per_member` (default 4), which our Test-Client keeps to: each target
keeps 4 of its 800 rows, and the statement is read by no one
(`test_rows_per_member_attack`). A Test-Client that also skips its cap is out of model,
as one that exceeds its value bounds (docs/threat-model.md, "Declared value bounds").

Run on the sans-I/O sessions (1024-bit test keys) under the default release controls,
one audit of all the targets; the modified Test-Client reads the noised aggregates it
decrypted (a spy on `common.stats.moments.finish_release`, which receives them), before
any cell is withheld for its size.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from common.crypto.encoding import PROBABILITY_BITS
from common.metrics.lot import Lot
from common.races import RACES
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.attacks.harness import CHANCE_ALPHA, record_finished_releases
from tests.helpers import local_audit

#: the targets, one per rank pair of the attack's lists
TARGETS = 15
#: the attack's lists (each target is in 2·LISTS rows: head of one, tail of another)
LISTS = 400
#: lists of two fresh decoys each, beside the attack's lists
PADDING = 120
#: what the modified Test-Client states of its rows: one row per member, one rank pair
STATED = [1.0, 1.0]
#: the dataset fact the Tester read its row counts from on the blind path, before the
#: cap it sets itself (`rows_per_member`) replaced it
STATED_KEY = "member_rows"
#: a population seed of its own
SEED = 1809
SPEC = AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1)
#: the scale of a released denominator: two probabilities (2^32 each) times the "one" component (2^32)
DEN_SCALE = float(1 << (3 * PROBABILITY_BITS))


@dataclass
class Outcome:
    targets: int
    recovered: int  # targets whose group (their vector's argmax) the attacker read
    blind: float  # a uniform guess over the six groups
    margin: int  # what a blind guesser exceeds with probability below CHANCE_ALPHA
    answered: bool

    @property
    def above_blind(self) -> bool:
        return self.recovered > self.margin

    def __str__(self) -> str:
        return (f"under-stated rows per member: {self.recovered}/{self.targets} targets' groups read "
                f"(blind {self.blind:.1f}, margin {self.margin}; audit {'answered' if self.answered else 'refused'})")


def population(seed: int = SEED) -> pd.DataFrame:
    """The Tester's table: Dirichlet probabilities for the targets, then the decoys."""
    rng = np.random.default_rng(seed)
    n = TARGETS + LISTS + 2 * PADDING
    table = pd.DataFrame(rng.dirichlet(np.full(len(RACES), 0.5), n), columns=list(RACES))
    table.insert(0, "member_id", [f"m{i:05d}" for i in range(n)])
    return table


def dataset(table: pd.DataFrame) -> pd.DataFrame:
    """The attack's lists (targets at ranks 1..T, a decoy at T + 1), then the padding;
    whole-number relevances (idcg: every gap within its bound)."""
    ids = table["member_id"].tolist()
    targets, decoys = ids[:TARGETS], ids[TARGETS:]
    rows = []
    for q in range(LISTS):
        for rank, member in enumerate([*targets, decoys[q]], start=1):
            rows.append((f"q{q:04d}", member, rank, float((q + rank) % 3)))
    for q in range(PADDING):
        pair = decoys[LISTS + 2 * q:LISTS + 2 * q + 2]
        for rank, member in enumerate(pair, start=1):
            rows.append((f"p{q:04d}", member, rank, float(2 - rank)))
    return pd.DataFrame(rows, columns=["query_id", "member_id", "rank", "relevance"])


@contextlib.contextmanager
def modified_test_client(mp) -> Iterator[list]:
    """The Test-Client's code changed in one thing: its dataset facts state one row per
    member (`STATED`) whatever its rows. Yields the noised aggregates it decrypts."""
    rows = Lot.client_rows

    def client_rows(self, frame, file, option, params, rng):
        out = rows(self, frame, file, option, params, rng)
        out.info[STATED_KEY] = list(STATED)
        return out

    mp.setattr(Lot, "client_rows", client_rows)
    yield record_finished_releases(mp)


def rank_one_left(d: np.ndarray, iterations: int = 200) -> np.ndarray:
    """u of the rank-one fit d_ab ≈ u_a·v_b over the off-diagonal entries (alternating
    least squares)."""
    k = len(d)
    off = ~np.eye(k, dtype=bool)
    u, v = np.ones(k), np.ones(k)
    for _ in range(iterations):
        u = np.array([np.sum(d[a, off[a]] * v[off[a]]) / max(np.sum(v[off[a]] ** 2), 1e-12) for a in range(k)])
        v = np.array([np.sum(d[off[:, b], b] * u[off[:, b]]) / max(np.sum(u[off[:, b]] ** 2), 1e-12)
                      for b in range(k)])
    return u


def read_heads(plan, row) -> list[np.ndarray]:
    """Per rank pair t-(t+1), t ≤ TARGETS: the rank-one left factor of its released
    denominators, the head's vector up to scale."""
    index = {g: j for j, g in enumerate(RACES)}
    out = []
    for t in range(1, TARGETS + 1):
        d = np.zeros((len(RACES), len(RACES)))
        for cell in plan.cells:
            if cell.kind == "pair" and cell.rank_pair == f"{t}-{t + 1}":
                d[index[cell.group], index[cell.other]] = float(row[cell.item][cell.den_slot]) / DEN_SCALE
        out.append(rank_one_left(d))
    return out


def run(*, release: ReleasePolicy | None = None) -> Outcome:
    table = population()
    truth = table[list(RACES)].to_numpy()[:TARGETS]
    blind = TARGETS / len(RACES)
    margin = int(binom.ppf(1 - CHANCE_ALPHA, TARGETS, 1 / len(RACES)))
    with pytest.MonkeyPatch.context() as mp, modified_test_client(mp) as seen:
        try:
            local_audit(table, dataset(table), spec=SPEC, release=release if release is not None else ReleasePolicy())
        except Exception as exc:  # noqa: BLE001 - a refused audit releases nothing: the blind guess
            if not seen:
                print(f"audit refused: {exc}")
    if not seen:
        rng = np.random.default_rng(SEED)
        guesses = rng.integers(0, len(RACES), TARGETS)
        return Outcome(TARGETS, int(np.sum(guesses == truth.argmax(axis=1))), blind, margin, False)
    heads = read_heads(*seen[-1])
    recovered = sum(int(np.argmax(u) == np.argmax(p)) for u, p in zip(heads, truth))
    return Outcome(TARGETS, recovered, blind, margin, True)
