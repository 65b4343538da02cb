"""Student's t quantile, numpy only: the intervals' (`common.stats.intervals`) and the
metrics' (`common.metrics`, MQOS-AUC's random-groups interval) one source of it. It
imports nothing of the project, so the statistics need no metric to form an interval.
"""
from __future__ import annotations

import numpy as np

__all__ = ["student_t_quantile", "t_quantile"]


def _student_t_two_sided(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    """Pr(|T| < t) for Student's t with integer df >= 1, t >= 0 (Abramowitz & Stegun
    26.7.3-26.7.4: a finite trigonometric series, exact up to rounding)."""
    theta = np.arctan(t / np.sqrt(df))
    c2 = np.cos(theta) ** 2
    sin = np.sin(theta)
    odd = df % 2 == 1
    # even df: sin(theta) (1 + 1/2 c^2 + 1.3/(2.4) c^4 + ... up to c^(df-2))
    # odd df:  2/pi (theta + sin cos (1 + 2/3 c^2 + 2.4/(3.5) c^4 + ... up to c^(df-3)))
    term = np.ones_like(theta)
    total = np.ones_like(theta)
    top = int(df.max()) if df.size else 0
    for m in range(1, (top - 1) // 2 + 1):
        # the m-th factor: even df (2m-1)/(2m), odd df (2m)/(2m+1)
        factor = np.where(odd, 2.0 * m / (2 * m + 1), (2.0 * m - 1) / (2 * m))
        used = np.where(odd, 2 * m <= df - 3, 2 * m <= df - 2)
        term = term * factor * c2
        total = total + np.where(used, term, 0.0)
    even_value = sin * total
    odd_value = np.where(df == 1, 2 * theta / np.pi,
                         2 / np.pi * (theta + sin * np.sqrt(c2) * total))
    return np.where(odd, odd_value, even_value)


def student_t_quantile(level: float, df: np.ndarray) -> np.ndarray:
    """The ``level`` quantile (0.5 < level < 1) of Student's t with integer df >= 1,
    elementwise over ``df`` (bisection on the exact CDF; numpy only)."""
    df = np.asarray(df, dtype=np.int64)
    if not 0.5 < level < 1:
        raise ValueError("level must lie in (0.5, 1)")
    if (df < 1).any():
        raise ValueError("degrees of freedom must be at least 1")
    target = 2.0 * level - 1.0                 # Pr(|T| < t)
    dff = df.astype(np.float64)
    lo = np.zeros(df.shape)
    hi = np.ones(df.shape)
    while True:                                 # bracket: grow hi until it covers target
        short = _student_t_two_sided(hi, dff) < target
        if not short.any():
            break
        hi = np.where(short, hi * 4.0, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        below = _student_t_two_sided(mid, dff) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
        if (hi - lo <= 1e-13 * hi).all():
            break
    return 0.5 * (lo + hi)



def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, as a float."""
    return float(student_t_quantile(p, df))
