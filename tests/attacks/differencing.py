"""(b) Differencing: two audits that differ in one member (paper, Example 2).

The decoys carry the product team's real model outputs (the synth's ERO dataset), so
neither dataset looks contrived. Audit A holds the decoys; audit B_t holds the same
decoys plus target t as one more false positive (y_true = 0, y_pred = 1). Each goes
in as a fresh dataset file. Per group, with F_j and Δ_j the decoys' weighted false
positives and negatives,

    FPR_A = F_j / Δ_j,   FPR_B = (F_j + p_tj) / (Δ_j + p_tj)
    =>  p_tj = Δ_j · (FPR_B − FPR_A) / (1 − FPR_B),

with Δ_j taken from public BISG of the decoys' negatives. The Tester redraws clipping in
every audit (randomized response is drawn once per Tester epoch, and each `ppre audit
--local` is its own epoch), so a Self-ID decoy's vector can change between A
and B_t (a Self-ID false positive that flips moves a whole unit between two groups'
numerators, as much as the target itself): that, not the cryptography, is the noise
this attack meets with the defences off. The attacker beats it by repetition: `repeats`
audits A (shared by every target) and `repeats` audits B_t per target, and the median
of each group's FPR over them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from tests.attacks.harness import Attacker, Outcome, ero_frame, score

N_DECOYS = 150
REPEATS = 3


def run(attacker: Attacker, targets: Sequence[str], *, n_decoys: int = N_DECOYS, repeats: int = REPEATS,
        seed: int = 0) -> Outcome:
    pop = attacker.population
    rng = np.random.default_rng(seed)
    decoys = pop.others(n_decoys, rng, exclude=targets)
    outputs = pop.ero.set_index("member_id").loc[decoys]
    base = ero_frame(decoys, outputs["y_true"], outputs["y_pred"])
    negatives = [m for m, y in zip(decoys, outputs["y_true"]) if y == 0]
    decoy_mass = pop.public(negatives).sum(axis=0)  # Δ̂_j
    released_a = [attacker.audit(base) for _ in range(repeats)]
    fpr_a = _median([r.vector() for r in released_a])
    signals, informed = [], []
    for target in targets:
        frame = pd.concat([base, ero_frame([target], [0], [1])], ignore_index=True)
        released_b = [attacker.audit(frame) for _ in range(repeats)]
        fpr_b = _median([r.vector() for r in released_b])
        informed.append(any(r.answered for r in released_a) and any(r.answered for r in released_b))
        with np.errstate(divide="ignore", invalid="ignore"):
            signal = np.where(fpr_b < 1.0, decoy_mass * (fpr_b - fpr_a) / (1.0 - fpr_b), np.inf)
            signal[np.isnan(fpr_a) | np.isnan(fpr_b)] = np.nan  # nothing released
        signals.append(signal)
    return score("differencing", attacker, targets, signals, informed, seed=seed)


def _median(vectors: list[np.ndarray]) -> np.ndarray:
    """Per group, the median of the released values (NaN: never released)."""
    stacked = np.vstack(vectors)
    out = np.full(stacked.shape[1], np.nan)
    for j in range(stacked.shape[1]):
        col = stacked[:, j][~np.isnan(stacked[:, j])]
        if col.size:
            out[j] = float(np.median(col))
    return out
