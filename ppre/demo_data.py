"""Synthetic demo inputs with a known, injected disparity (issue 2, point 8).

Members get a true race from national shares; the Tester's probability rows are
noisy (Dirichlet) estimates centred on the truth, as BISG would give; the model's
false-positive rate is `base_fpr` for everyone and `base_fpr + disparity` for the
`disadvantaged` group. The hidden truth lets the demo print, beside each privacy-
preserving estimate, the value computed with the true races.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from common.races import RACES

#: approximate 2010 Census national shares, in RACES order
NATIONAL_SHARES = np.array([0.637, 0.122, 0.048, 0.007, 0.023, 0.163])


@dataclass
class DemoData:
    probabilities: pd.DataFrame  # the Tester's table
    outputs: pd.DataFrame        # the Test-Client's ERO dataset
    truth: pd.DataFrame          # member_id, race (never given to either service)

    def true_fpr(self) -> dict[str, float]:
        merged = self.outputs.merge(self.truth, on="member_id")
        negatives = merged[merged.y_true == 0]
        rates = negatives.groupby("race").y_pred.mean()
        return {race: float(rates.get(race, float("nan"))) for race in RACES}


def make_demo_data(members: int = 4000, *, overlap: float = 0.8, base_fpr: float = 0.10,
                   disparity: float = 0.10, disadvantaged: str = "black", seed: int = 4) -> DemoData:
    rng = np.random.default_rng(seed)
    race = rng.choice(len(RACES), size=members, p=NATIONAL_SHARES / NATIONAL_SHARES.sum())
    ids = np.array([f"M{i:07d}" for i in range(members)])
    concentration = np.full((members, len(RACES)), 0.4)
    concentration[np.arange(members), race] += 6.0
    probs = np.vstack([rng.dirichlet(c) for c in concentration])
    probabilities = pd.DataFrame(probs, columns=list(RACES))
    probabilities.insert(0, "member_id", ids)

    n_client = members
    n_common = int(members * overlap)
    client_idx = rng.choice(members, size=n_common, replace=False)
    extra = np.array([f"N{i:07d}" for i in range(n_client - n_common)])
    y_true = rng.random(n_common) < 0.4
    fpr = np.where(race[client_idx] == RACES.index(disadvantaged), base_fpr + disparity, base_fpr)
    y_pred = np.where(y_true, rng.random(n_common) < 0.85, rng.random(n_common) < fpr)
    outputs = pd.DataFrame({"member_id": np.concatenate([ids[client_idx], extra]),
                            "y_true": np.concatenate([y_true, rng.random(len(extra)) < 0.4]).astype(int),
                            "y_pred": np.concatenate([y_pred, rng.random(len(extra)) < 0.2]).astype(int)})
    outputs = outputs.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    truth = pd.DataFrame({"member_id": ids, "race": np.array(RACES)[race]})
    return DemoData(probabilities, outputs, truth)
