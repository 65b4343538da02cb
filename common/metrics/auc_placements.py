"""DeLong's placement variances: MQOS-AUC's interval under release noise (design §8.4;
`common.metrics.mqos_auc`, "Interval under release noise").

The Test-Client states, from its own rows, the variances of the positives' and the
negatives' placements (`placement_variances`); the finishing party reads the weighted
DeLong covariance of the cells' AUCs from them and the released pair items
(`placement_covariance`), each cell's placement variances raised by the equal-variance
binormal model's where its AUC is lower than overall's (`binormal_spread`).
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

#: significant digits of the stated placement variances
PLACEMENT_DIGITS = 9
#: quadrature points of the binormal placement variance (`binormal_spread`)
BINORMAL_POINTS = 4001


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties at their mean rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts
    return (start + (counts + 1) / 2.0)[inverse]


def placement_variances(y: np.ndarray, scores: np.ndarray) -> list[float]:
    """[σ1², σ0²] over all the Test-Client's rows (`common.metrics.mqos_auc`, "Interval
    under release noise"): the variances of the positives' placements V10 (the fraction
    of negatives scored below, ties ½) and of the negatives' V01 (the fraction of
    positives scored above, ties ½), DeLong's components; rounded to PLACEMENT_DIGITS
    significant digits."""
    pos = np.asarray(y).astype(bool)
    ranks = _midranks(np.asarray(scores, dtype=np.float64))
    n1, n0 = int(pos.sum()), int((~pos).sum())
    v10 = (ranks[pos] - _midranks(scores[pos])) / n0
    v01 = 1.0 - (ranks[~pos] - _midranks(scores[~pos])) / n1
    out = [float(np.var(v, ddof=1)) if len(v) > 1 else 0.0 for v in (v10, v01)]
    return [float(f"{x:.{PLACEMENT_DIGITS}g}") for x in out]


def binormal_spread(auc: np.ndarray) -> np.ndarray:
    """The placement variance of two equal-variance normal classes at this AUC,
    Φ₂(x, x; ½) − A² with x = Φ⁻¹(A) (symmetric about ½), Φ₂ by quadrature of
    ∫_{-∞}^x φ(z)·Φ((x − z/2)/√(3/4)) dz."""
    normal = NormalDist()
    a = np.clip(np.abs(np.nan_to_num(np.asarray(auc, dtype=np.float64), nan=0.5) - 0.5) + 0.5, 0.5, 0.9999)
    out = []
    for value in a:
        x = normal.inv_cdf(float(value))
        z = np.linspace(-9.0, x, BINORMAL_POINTS)
        inner = 0.5 * (1.0 + np.vectorize(math.erf)((x - 0.5 * z) / math.sqrt(0.75) / math.sqrt(2.0)))
        f = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) * inner
        out.append(float(np.sum((f[1:] + f[:-1]) * np.diff(z)) / 2.0) - float(value) ** 2)
    return np.clip(np.array(out), 0.0, None)


def placement_covariance(plan, moments, row, *, variances: tuple[float, float]) -> tuple[list[int], np.ndarray]:
    """The cells (groups, then overall) and the covariance of their AUCs
    (`common.metrics.mqos_auc`, "Interval under release noise"), from the released pair items S1_ab, S0_ab and the
    stated placement variances: ``σ1²·S1_ab/(P1_a·P1_b) + σ0²·S0_ab/(P0_a·P0_b)`` with the
    class totals P1_a = Σ_b S1_ab and P0_a = Σ_b S0_ab (a member's probabilities add up to
    1) and "overall" one more group of weight 1 (its pair sums with b are b's totals).
    Each cell's placement variances are raised by the binormal model's
    v(AUC_a) − v(AUC_overall) where positive (`binormal_spread`): a group whose AUC is
    lower than overall's has placements that spread more than the pooled ones."""
    from common.stats.correction import WEIGHT_SCALE, pair_matrix
    family = moments.families[0]
    k = len(moments.groups)
    s1 = np.clip(pair_matrix(row, family, family.num_slot, k), 0.0, None) / WEIGHT_SCALE
    s0 = np.clip(pair_matrix(row, family, family.den_slot, k), 0.0, None) / WEIGHT_SCALE
    overall = next(c for c, cell in enumerate(plan.cells) if cell.kind == "group" and cell.group == "overall")
    cells = list(family.cells) + [overall]

    def extended(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        totals = m.sum(axis=1)
        out = np.zeros((k + 1, k + 1))
        out[:k, :k] = m
        out[k, :k] = out[:k, k] = totals
        out[k, k] = totals.sum()
        return out, np.clip(np.append(totals, totals.sum()), 1.0, None)

    s1x, p1 = extended(s1)
    s0x, p0 = extended(s0)
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = np.array([0.5 + float(row[plan.cells[c].item][0]) / float(row[plan.cells[c].item][1])
                        if float(row[plan.cells[c].item][1]) > 0 else np.nan for c in cells])
    spread = binormal_spread(auc)
    shift = np.clip(spread - spread[-1], 0.0, None)
    v1, v0 = (np.sqrt(np.outer(v + shift, v + shift)) for v in variances)
    return cells, np.nan_to_num(v1 * s1x / np.outer(p1, p1) + v0 * s0x / np.outer(p0, p0))
