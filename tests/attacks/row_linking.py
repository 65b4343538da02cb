"""(B) A curious Tester links the joined rows the Test-Client returns to its members.

The attacker is the Tester and its operator, running our code and reading everything
its session holds (design §9). In step 3 the Test-Client returns every sealed
probability vector (AES-GCM) byte for byte as the Tester made it, and in step 5 the
Tester opens the blobs of the joined rows. Two linkers, both inherent to the paper's
design (the Tester opens its own vectors, which are quasi-identifiers):

* the *blob linker* remembers which blob it sealed for which member (its upload, in its
  own table's order) and links every joined row to its member;
* the *vector-value linker* keeps no memory of the session: it recomputes public BISG
  from its members file (`ppre bisg`) and links a joined row to the one member whose
  BISG equals the opened vector (members neither in Self-ID nor clipped).

What matters is what a linked row carries besides its ids and its blob. For ERO, the
output metric, MQOS-NDCG and POT the Test-Client's rows hold its member ids and Paillier
ciphertexts only: a label decoder fed every plaintext column of the linked rows
(`decode_labels`, trained on half the members' true labels: stronger than any real
attacker) does exactly as well as the blind guess. Where rows still carry a plaintext
stratum, the linker reads it as member-level data (`read_lot`, `read_exact_auc`,
`read_pools`): LOT's rank pairs, MQOS-AUC exact's score ranks, the probabilistic
count's pools (docs/threat-model.md, "What it can still link"; the Tester-blind join is
in docs/roadmap.md).

The audits are the real sans-I/O sessions (`TesterSession`, `ClientSession`, 1024-bit
test keys), the Tester's table prepared from a `ppre synth` population as `ppre audit
--local` prepares it (BISG, privatised Self-ID, clipping), under the default release
controls. The Tester's view is read by a spy on its own session (`TesterView`): the
messages it sends and receives, and what `TesterSession._open` returns.
"""
from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binom, spearmanr

from common.metrics.base import ClientRows
from common.metrics.ero import Ero
from common.races import RACES
from proto import ppre_pb2 as pb
from tester_service.demographics.preparation import PreparationConfig
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import ReleasePolicy
from tester_service.server import prepare_from_files
from tests.attacks.harness import CHANCE_ALPHA, Population, make_population
from tests.helpers import local_audit

#: a population of its own: no other attack uses this seed
POPULATION = dict(members=500, seed=1807, self_id_share=0.15)
#: members in the Test-Client's datasets (all of them among the Tester's members)
JOINED = 240
#: LOT: queries of `LIST_LENGTH` members each, drawn from the joined members
LOT_QUERIES, LIST_LENGTH = 60, 5
#: vectors equal to public BISG up to the CSV's rounding (`ppre bisg` writes them)
VECTOR_TOLERANCE = 1e-9
#: the per-row plaintext columns of the Test-Client's rows (TableChunk fields) besides its ids
PLAINTEXT_COLUMNS = ("units", "strata")


# ----------------------------------------------------------------------------------
# What the Tester holds: a spy on its own session
# ----------------------------------------------------------------------------------
@dataclass
class TesterView:
    """Everything the curious Tester reads in one audit."""

    __test__ = False  # not a pytest class

    uploaded: list[bytes] = field(default_factory=list)  # blobs it sealed, in its table's order
    shuffled: list[bytes] = field(default_factory=list)  # blobs the Test-Client returned (step 3)
    #: the plaintext columns the Test-Client's rows arrived with (TableChunk fields)
    row_columns: set[str] = field(default_factory=set)
    blobs: list[list[bytes]] = field(default_factory=list)  # per id slot, per joined row
    vectors: list[np.ndarray] = field(default_factory=list)  # per id slot: the opened vectors
    units: np.ndarray | None = None
    strata: np.ndarray | None = None
    strata_labels: tuple[str, ...] = ()

    def tap(self, direction: str, msg: pb.PeerMessage) -> None:
        if msg.WhichOneof("body") != "chunk":
            return
        chunk = msg.chunk
        width = len(chunk.sealed) // chunk.rows if chunk.rows else 0
        if chunk.table == pb.TESTER_ROWS:
            self.uploaded += _split(chunk.sealed, width)
        elif chunk.table == pb.SHUFFLED_ROWS:
            self.shuffled += _split(chunk.sealed, width)
        elif chunk.table == pb.CLIENT_ROWS:
            self.row_columns |= {f.name for f, _ in chunk.ListFields()} - {"table", "rows", "points", "ciphertexts",
                                                                           "tester_ciphertexts"}

    def plaintext(self) -> dict[str, np.ndarray]:
        """The per-row plaintext the Tester holds for the joined rows (besides ids and blobs)."""
        return {name: values for name, values in (("units", self.units), ("strata", self.strata))
                if values is not None}


def _split(packed: bytes, width: int) -> list[bytes]:
    return [packed[i:i + width] for i in range(0, len(packed), width)] if width else []


@contextlib.contextmanager
def spying(view: TesterView) -> Iterator[None]:
    """`TesterSession._open` (or, on LOT's blind path, `_open_members`) as it runs, its
    inputs and its output kept in `view`: the joined rows' blobs per id slot (`_index`,
    `_matched_at`; the blind path: the joined members'), the opened vectors, the rows'
    units and strata."""
    import pytest

    original = TesterSession._open

    def _open(self):
        at = np.concatenate(self._matched_at)
        sealed = self._index[1]
        view.blobs = [[bytes(b) for b in sealed[at[:, s]]] for s in range(self.metric.n_ids)]
        view.strata_labels = tuple(self._strata_labels)
        probs, units, strata = original(self)
        view.vectors, view.units, view.strata = [np.asarray(p) for p in probs], units, strata
        return probs, units, strata

    opened = TesterSession._open_members

    def _open_members(self, sealed):  # the blind path (LOT under the controls): members, not rows
        view.blobs = [[bytes(b) for b in sealed]]
        view.strata_labels = tuple(self._strata_labels)
        probs = opened(self, sealed)
        view.vectors = [np.asarray(probs)]
        return probs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TesterSession, "_open", _open)
        mp.setattr(TesterSession, "_open_members", _open_members)
        yield


# ----------------------------------------------------------------------------------
# The population and the Test-Client's datasets
# ----------------------------------------------------------------------------------
@dataclass
class Setup:
    population: Population
    table: pd.DataFrame  # the Tester's prepared probabilities (its input to the session)
    joined: list[str]  # the members the Test-Client's datasets hold

    @property
    def ids(self) -> list[str]:
        return self.table["member_id"].astype(str).tolist()


def make_setup(directory: Path) -> Setup:
    population = make_population(directory, **POPULATION)
    table = prepare_from_files(population.members, population.self_id_file, PreparationConfig())
    rng = np.random.default_rng(POPULATION["seed"])
    held = table["member_id"].astype(str).to_numpy()
    joined = sorted(rng.choice(held, size=JOINED, replace=False).tolist())
    return Setup(population, table, joined)


def dataset(setup: Setup, metric: str) -> pd.DataFrame:
    """The synth's dataset for `metric`, cut to the joined members (LOT: `lot_dataset`)."""
    if metric == "lot":
        return lot_dataset(setup.joined)
    name = {"mqos-auc": "mqos_auc", "mqos-ndcg": "mqos_ndcg", "prob-count": "prob_count"}.get(metric, metric)
    frame = pd.read_csv(setup.population.directory / "client" / f"{name}.csv", dtype={"member_id": str})
    return frame[frame["member_id"].isin(set(setup.joined))].reset_index(drop=True)


def lot_dataset(members: Sequence[str], seed: int = POPULATION["seed"]) -> pd.DataFrame:
    """Ranked lists of `LIST_LENGTH` distinct members each (ranks 1..LIST_LENGTH)."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(LOT_QUERIES):
        for rank, member in enumerate(rng.choice(list(members), size=LIST_LENGTH, replace=False), start=1):
            rows.append({"query_id": f"q{q:03d}", "member_id": str(member), "rank": float(rank),
                         "relevance": float(rng.integers(0, 5))})
    return pd.DataFrame(rows)


#: the member-level value a label decoder tries to read, per metric (the Test-Client's data)
def truth(metric: str, frame: pd.DataFrame) -> dict[str, int]:
    if metric in ("ero", "mqos-auc"):
        return dict(zip(frame["member_id"], frame["y_true"].astype(int)))
    if metric == "output":
        return dict(zip(frame["member_id"], (frame["outcome"] > frame["outcome"].median()).astype(int)))
    if metric == "pot":
        return dict(zip(frame["member_id"], frame["outcome"].astype(int)))
    if metric == "mqos-ndcg":
        mean = frame.groupby("member_id")["relevance"].mean()
        return dict(zip(mean.index, (mean > mean.median()).astype(int)))
    raise ValueError(metric)


SPECS = {
    "ero": AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1),
    "output": AuditSpec(metric="output", client_dataset="d", bootstrap=10, seed=1,
                        params={"outcome_range": "-1:1"}),
    "mqos-ndcg": AuditSpec(metric="mqos-ndcg", client_dataset="d", bootstrap=10, seed=1),
    "pot": AuditSpec(metric="pot", client_dataset="d", bootstrap=10, seed=1),
    # every row kept (a member of `lot_dataset` is in up to 8): the rows are what the linker reads
    "lot": AuditSpec(metric="lot", client_dataset="d", bootstrap=10, seed=1, metric_option="raw",
                     params={"rows_per_member": "16"}),
    "mqos-auc": AuditSpec(metric="mqos-auc", client_dataset="d", bootstrap=10, seed=1, metric_option="exact"),
    "prob-count": AuditSpec(metric="prob-count", client_dataset="d", bootstrap=10, seed=1),
}


def run(setup: Setup, metric: str, release: ReleasePolicy | None = None,
        frame: pd.DataFrame | None = None) -> tuple[TesterView, pd.DataFrame]:
    """One audit of `metric` (the defaults unless `release`); the Tester's view of it."""
    frame = dataset(setup, metric) if frame is None else frame
    view = TesterView()
    with spying(view):
        local_audit(setup.table, frame, spec=SPECS[metric], tap=view.tap, n_buckets=16,
                    release=release if release is not None else ReleasePolicy())
    return view, frame


def label_as_stratum(mp) -> None:
    """The defence removed: ERO sends each row's y_true beside it as a plaintext stratum
    (as LOT sends its rank pair), through `mp` (a pytest MonkeyPatch)."""
    rows = Ero.client_rows

    def with_label(self, frame, file, option, params, rng):
        out = rows(self, frame, file, option, params, rng)
        return ClientRows(ids=out.ids, values=out.values, strata=frame["y_true"].to_numpy(dtype=np.int64),
                          strata_labels=("y=0", "y=1"))

    mp.setattr(Ero, "uses_strata", True)
    mp.setattr(Ero, "client_rows", with_label)


# ----------------------------------------------------------------------------------
# The linkers
# ----------------------------------------------------------------------------------
def blob_linker(setup: Setup, view: TesterView) -> list[list[str | None]]:
    """Per id slot, per joined row: the member whose blob it is (the Tester's memory of
    its upload), or None."""
    memory = dict(zip(view.uploaded, setup.ids))
    return [[memory.get(b) for b in slot] for slot in view.blobs]


def vector_linker(setup: Setup, view: TesterView) -> list[list[str | None]]:
    """Per id slot, per joined row: the one member whose public BISG (recomputed from the
    members file) equals the opened vector, or None (no match, or several)."""
    bisg = setup.population.bisg.loc[setup.ids, list(RACES)]
    public, names = bisg.to_numpy(dtype=np.float64), bisg.index.to_numpy()
    linked = []
    for vectors in view.vectors:
        slot = []
        for v in vectors:
            hits = np.flatnonzero(np.max(np.abs(public - v), axis=1) <= VECTOR_TOLERANCE)
            slot.append(str(names[hits[0]]) if len(hits) == 1 else None)
        linked.append(slot)
    return linked


@dataclass
class Linking:
    """How many joined members a linker named, and how many of its links are right."""

    linker: str
    joined: int  # distinct members behind the joined rows
    linked: int  # distinct members it named
    wrong: int  # rows it named a member for that is not the row's (checked on the blob)

    def __str__(self) -> str:
        return f"{self.linker} linker: {self.linked}/{self.joined} joined members linked, {self.wrong} wrong rows"


def linking(setup: Setup, view: TesterView, linker: str) -> Linking:
    truth_of = dict(zip(view.uploaded, setup.ids))  # which member each blob was sealed for
    named = (blob_linker if linker == "blob" else vector_linker)(setup, view)
    joined = {truth_of[b] for slot in view.blobs for b in slot}
    wrong = sum(m is not None and m != truth_of[b] for slot, ms in zip(view.blobs, named) for b, m in zip(slot, ms))
    linked = {m for slot in named for m in slot if m is not None}
    return Linking(linker, len(joined), len(linked & joined), wrong)


# ----------------------------------------------------------------------------------
# What the linked rows give: a label decoder, and the strata readers
# ----------------------------------------------------------------------------------
@dataclass
class Read:
    """What the linker recovered of the Test-Client's data, against a blind guess."""

    attack: str
    recovered: float
    blind: float
    total: int
    what: str
    margin: float = 0.0  # what a blind guesser exceeds with probability below CHANCE_ALPHA

    @property
    def above_blind(self) -> bool:
        return self.recovered > self.margin

    def __str__(self) -> str:
        return (f"{self.attack}: {self.what}: {self.recovered:g} of {self.total} "
                f"(blind {self.blind:g}, margin {self.margin:g})")


def decode_labels(setup: Setup, view: TesterView, labels: dict[str, int], attack: str, *, seed: int = 0) -> Read:
    """The strongest reader of one-id rows' plaintext: linked by blob, half the members'
    true labels given, it learns each plaintext value's majority label, then guesses each
    other member's label by its rows' votes. With no plaintext per row its guess is the
    training majority for everyone: the blind guess."""
    (members,) = blob_linker(setup, view)
    columns = view.plaintext()
    keys = list(zip(*columns.values())) if columns else [()] * len(members)
    distinct = sorted(set(members))
    train = set(np.random.default_rng(seed).permutation(distinct)[: len(distinct) // 2].tolist())
    test = [m for m in distinct if m not in train]
    by_key: dict[tuple, Counter] = defaultdict(Counter)
    for m, key in zip(members, keys):
        if m in train:
            by_key[key][labels[m]] += 1
    majority = Counter(labels[m] for m in train).most_common(1)[0][0]
    votes: dict[str, Counter] = defaultdict(Counter)
    for m, key in zip(members, keys):
        if m not in train:
            votes[m][by_key[key].most_common(1)[0][0] if by_key[key] else majority] += 1
    guesses = {m: _top(votes[m], majority) for m in test}
    recovered = sum(guesses[m] == labels[m] for m in test)
    blind = sum(majority == labels[m] for m in test)
    return Read(attack, recovered, blind, len(test), "labels read from the linked rows' plaintext",
                margin=float(binom.ppf(1 - CHANCE_ALPHA, len(test), blind / len(test))))


def _top(votes: Counter, default: int) -> int:
    ranked = votes.most_common()
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return default
    return ranked[0][0]


def read_lot(setup: Setup, view: TesterView, frame: pd.DataFrame) -> Read:
    """LOT: each joined row's two members (blob linker) and its rank pair (the stratum):
    how many rows give both members' ranks in a list of the dataset, against the blind
    guess of the commonest rank pair for every row."""
    truth_pairs = set()
    for q, group in frame.groupby("query_id"):
        order = dict(zip(group["rank"].astype(int), group["member_id"]))
        truth_pairs |= {(order[r], order[r + 1], f"{r}-{r + 1}") for r in order if r + 1 in order}
    truth = [lab for _, _, lab in truth_pairs]
    common = Counter(truth).most_common(1)[0][1]
    linked = blob_linker(setup, view)
    if len(linked) == 2 and view.strata is not None:  # rows with both members and their rank pair
        first, second = linked
        labels = [view.strata_labels[s] for s in view.strata]
        recovered = sum((a, b, lab) in truth_pairs for a, b, lab in zip(first, second, labels))
    else:  # members one at a time, no rank pair: no (member, member, ranks) to read off a row
        recovered = 0
    return Read("LOT", recovered, common, len(truth), "rank pairs read (both members and their ranks)",
                margin=float(binom.ppf(1 - CHANCE_ALPHA, len(truth), common / len(truth))))


def read_exact_auc(setup: Setup, view: TesterView, frame: pd.DataFrame) -> tuple[float, int]:
    """MQOS-AUC exact: Spearman between each linked member's stratum (its score rank,
    where the rows carry one; else the place its row arrived in, all the Tester holds of
    an order) and its true score; (rho, members)."""
    (members,) = blob_linker(setup, view)
    score = dict(zip(frame["member_id"], frame["score"]))
    order = view.strata if view.strata is not None else np.arange(len(members))
    rho = spearmanr(order, [score[m] for m in members]).statistic
    return float(rho), len(members)


def read_pools(setup: Setup, view: TesterView, frame: pd.DataFrame) -> Read:
    """Probabilistic count: each linked member's pool (its stratum's label, where the rows
    carry one), against the blind guess of the commonest pool."""
    (members,) = blob_linker(setup, view)
    pool = dict(zip(frame["member_id"], frame["pool"].astype(str)))
    read = [view.strata_labels[s] for s in view.strata] if view.strata is not None else []
    recovered = sum(r == pool[m] for r, m in zip(read, members))
    common = Counter(pool[m] for m in members).most_common(1)[0][1]
    return Read("prob-count", recovered, common, len(members), "members' pools read",
                margin=float(binom.ppf(1 - CHANCE_ALPHA, len(members), common / len(members))))
