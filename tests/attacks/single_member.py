"""(a) Single-member targeting with decoys (paper, Example 1, for the ERO metric).

One audit per target. The dataset is the target and `n_decoys` other users, every row a
true negative (y_true = 0); the target alone is predicted positive. ERO's FPR per group
is then

    FPR_j = p_tj / (p_tj + Δ_j),   Δ_j = Σ_decoys p_ij,

so p_tj = FPR_j · Δ_j / (1 − FPR_j). The attacker does not know the Tester's p_ij of the
decoys, but Δ_j is a sum over hundreds of members: public BISG gives it closely enough
(the target's released vector is one-hot-like, so a scale error of Δ_j cannot move its
argmax). It guesses the argmax of the recovered p_t (`harness.guess`).

The release controls are metric-generic, and so is the attack: with `metric="output"`
the dataset is the target with outcome 1 and the decoys with outcome 0, and the
per-group outcome rate is the same p_tj / (p_tj + Δ_j).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from tests.attacks.harness import Attacker, Outcome, ero_frame, score

N_DECOYS = 300


def recovered_vector(fpr: np.ndarray, decoy_mass: np.ndarray) -> np.ndarray:
    """p̂_t from the released FPRs (NaN stays NaN: nothing released for that group)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isnan(fpr), np.nan, np.where(fpr < 1.0, fpr * decoy_mass / (1.0 - fpr), np.inf))


def run(attacker: Attacker, targets: Sequence[str], *, n_decoys: int = N_DECOYS, seed: int = 0,
        metric: str = "ero") -> Outcome:
    pop = attacker.population
    rng = np.random.default_rng(seed)
    decoys = pop.others(n_decoys, rng, exclude=targets)
    decoy_mass = pop.public(decoys).sum(axis=0)  # Δ̂_j from public BISG
    signals, informed = [], []
    for target in targets:
        ids = [target, *decoys]
        if metric == "output":
            frame = pd.DataFrame({"member_id": ids, "outcome": [1.0] + [0.0] * len(decoys)})
            release = attacker.audit(frame, metric="output", option="")
        else:
            release = attacker.audit(ero_frame(ids, np.zeros(len(ids)), [1] + [0] * len(decoys)))
        signal = recovered_vector(release.vector(), decoy_mass)
        signals.append(signal)
        informed.append(release.answered)
    name = "single-member" if metric == "ero" else f"single-member ({metric})"
    return score(name, attacker, targets, signals, informed, seed=seed)
