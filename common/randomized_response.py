"""k-ary randomized response for Self-ID records (design §2.3; paper appendix A.3).

A record with true category ``i`` of ``k`` is kept with probability
``e^ε / (e^ε + k − 1)`` and moved to each other category with probability
``1 / (e^ε + k − 1)``. Its privacy loss is exactly ε: for every output, the largest
ratio of output probabilities over two inputs is ``e^ε`` (keep vs. move). With the
default ε = 4.5 and k = 6 the flip rate is ``5 / (e^4.5 + 5) ≈ 5.26%``.
"""
from __future__ import annotations

import math

import numpy as np

from common.errors import InputError
from common.races import K

#: Production default (design §6).
DEFAULT_EPSILON = 4.5


def _check_epsilon(epsilon: float) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise InputError("must be a number", parameter="epsilon") from None
    if not math.isfinite(eps) or eps <= 0:
        raise InputError("must be a finite number greater than 0", parameter="epsilon")
    return eps


def _check_k(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or k < 2:
        raise InputError("must be a whole number of at least 2", parameter="k")
    return int(k)


def keep_probability(epsilon: float = DEFAULT_EPSILON, k: int = K) -> float:
    """``e^ε / (e^ε + k − 1)`` (design §2.3), computed stably for large ε."""
    eps, k = _check_epsilon(epsilon), _check_k(k)
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def flip_rate(epsilon: float = DEFAULT_EPSILON, k: int = K) -> float:
    """Probability that the reported category differs from the true one: ``(k−1)/(e^ε+k−1)``."""
    return 1.0 - keep_probability(epsilon, k)


def transition_matrix(epsilon: float = DEFAULT_EPSILON, k: int = K) -> np.ndarray:
    """Exact ``(k, k)`` matrix ``M[i, j] = Pr(output j | input i)`` (design §2.3); rows sum to 1."""
    eps, k = _check_epsilon(epsilon), _check_k(k)
    move = math.exp(-eps) / (1.0 + (k - 1) * math.exp(-eps))  # = 1 / (e^ε + k − 1)
    m = np.full((k, k), move)
    np.fill_diagonal(m, keep_probability(eps, k))
    return m


def privatize(categories: np.ndarray, rng: np.random.Generator, epsilon: float = DEFAULT_EPSILON,
              k: int = K) -> np.ndarray:
    """Apply randomized response to integer categories ``0..k-1`` (design §2.3).

    Each value is kept with probability `keep_probability`, else replaced by one of the
    other ``k − 1`` categories chosen uniformly, independently per record.
    """
    eps, k = _check_epsilon(epsilon), _check_k(k)
    cats = np.asarray(categories)
    if cats.size and (not np.issubdtype(cats.dtype, np.integer) or cats.min() < 0 or cats.max() >= k):
        raise InputError(f"categories must be whole numbers from 0 to {k - 1}", parameter="categories")
    cats = cats.astype(np.int64, copy=False)
    flip = rng.random(cats.shape) >= keep_probability(eps, k)
    # A uniform draw over the k-1 other categories: offset 1..k-1 added modulo k.
    offset = rng.integers(1, k, size=cats.shape)
    return np.where(flip, (cats + offset) % k, cats)


def privatize_one_hot(categories: np.ndarray, rng: np.random.Generator,
                      epsilon: float = DEFAULT_EPSILON, k: int = K) -> np.ndarray:
    """`privatize`, returned as ``(n, k)`` one-hot float rows (the Self-ID vectors of design §2.3)."""
    out = privatize(categories, rng, epsilon, k)
    return np.eye(k)[out]
