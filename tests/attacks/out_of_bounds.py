"""(C) Out of model: a modified Test-Client encodes a value beyond its declared bound.

The release noise is sized from each metric's declared bound on the Test-Client's
values (docs/threat-model.md, "Declared value bounds"): ERO's f and d are 0 or 1. Our
Test-Client refuses a label that is not 0/1 (`common.tables.binary_column`) and, for
every metric, a value beyond its component's bound (`Component.quantize`); the output
metric and POT clip an outcome outside `--outcome-range` (or refuse it with
`--out-of-range refuse`). The values are encrypted, so the Tester cannot check them.

The attack, by a Test-Client that does not run our code: an ERO dataset of one target
and decoys, all true negatives, the target a false positive whose f it encodes as
2^16 instead of 1 (skipping its own bound check). The noise on Σ p_ij·f is sized for
f ≤ 1, so the released Num_j = 2^16·p_tj + noise reads the target's probability vector
to about noise/2^16. Out of this threat model until range proofs exist (docs/roadmap.md).

Run on the sans-I/O sessions (1024-bit test keys) under the default release controls;
the modified Test-Client reads the noised aggregates it decrypted (a spy on
`common.stats.moments.finish_release`, which receives them).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import pytest

from client_service.protocol import ClientSession
from common.crypto.encoding import PROBABILITY_BITS
from common.metrics.base import Component
from common.metrics.ero import Ero
from common.races import RACES
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.attacks.harness import record_finished_releases
from tests.helpers import local_audit

#: the value the modified Test-Client encodes for its target's f
BOOST = 2 ** 16
#: decoys beside each target: every group above the default minimum effective size (30)
DECOYS = 400
#: a population seed of its own
SEED = 1808


@dataclass
class Outcome:
    targets: int
    recovered: int  # targets whose vector's argmax the attacker read
    blind: float  # a uniform guess over the six groups
    max_error: float  # largest |p̂_tj − p_tj| over the targets and groups

    def __str__(self) -> str:
        return (f"modified Test-Client (f = 2^16): {self.recovered}/{self.targets} targets' groups read "
                f"(blind {self.blind:.1f}), largest error on a probability {self.max_error:.1e}")


def population(n_targets: int, seed: int = SEED) -> pd.DataFrame:
    """The Tester's table: Dirichlet probabilities for targets and decoys."""
    rng = np.random.default_rng(seed)
    n = n_targets + DECOYS
    table = pd.DataFrame(rng.dirichlet(np.full(len(RACES), 0.5), n), columns=list(RACES))
    table.insert(0, "member_id", [f"m{i:05d}" for i in range(n)])
    return table


def dataset(target: str, table: pd.DataFrame, n_targets: int) -> pd.DataFrame:
    """The target a false positive, every decoy a true negative."""
    decoys = table["member_id"].iloc[n_targets:].tolist()
    ids = [target, *decoys]
    return pd.DataFrame({"member_id": ids, "y_true": 0, "y_pred": [1] + [0] * len(decoys)})


@contextlib.contextmanager
def modified_test_client(mp, target: str) -> Iterator[list]:
    """The Test-Client's code changed: the target's f is encoded as BOOST and its bound
    check (`Component.quantize`) skipped, in its own session only (the Tester's code, in
    this same process, is unchanged). Yields the noised aggregates it decrypts."""
    rows, quantize, on_hello = Ero.client_rows, Component.quantize, ClientSession._on_hello

    def client_rows(self, frame, file, option, params, rng):
        out = rows(self, frame, file, option, params, rng)
        out.values[np.asarray(out.ids[0]) == target, 0] = BOOST
        return out

    def unchecked(self, values):
        return np.rint(np.asarray(values, dtype=np.float64) * float(1 << self.scale_bits)).astype(np.int64)

    def hello(self, *args):
        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(Ero, "client_rows", client_rows)
            inner.setattr(Component, "quantize", unchecked)
            return on_hello(self, *args)

    mp.setattr(ClientSession, "_on_hello", hello)
    yield record_finished_releases(mp)


def read_vector(plan, row) -> np.ndarray:
    """p̂_t from the released Num_j of each group cell: Num_j / (2^16 · 2^PROBABILITY_BITS)."""
    cells = {c.group: c for c in plan.cells if c.kind == "group"}
    return np.array([row[cells[g].item][cells[g].num_slot] for g in RACES], dtype=np.float64) / (
        BOOST * 2.0 ** PROBABILITY_BITS)


def run(n_targets: int, *, release: ReleasePolicy | None = None) -> Outcome:
    table = population(n_targets)
    truth = table[list(RACES)].to_numpy()[:n_targets]
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)
    recovered, errors = 0, []
    for t in range(n_targets):
        target = table["member_id"].iloc[t]
        with pytest.MonkeyPatch.context() as mp, modified_test_client(mp, target) as seen:
            local_audit(table, dataset(target, table, n_targets), spec=spec,
                        release=release if release is not None else ReleasePolicy())
        p_hat = read_vector(*seen[-1])
        errors.append(float(np.max(np.abs(p_hat - truth[t]))))
        recovered += int(np.argmax(p_hat) == np.argmax(truth[t]))
    return Outcome(n_targets, recovered, n_targets / len(RACES), max(errors))
