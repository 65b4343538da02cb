"""k-ary randomized response for Self-ID records (design §2.3; paper appendix A.3).

A record with true category ``i`` of ``k`` is kept with probability
``e^ε / (e^ε + k − 1)`` and moved to each other category with probability
``1 / (e^ε + k − 1)``. Its privacy loss is exactly ε: for every output, the largest
ratio of output probabilities over two inputs is ``e^ε`` (keep vs. move). With the
default ε = 4.5 and k = 6 the flip rate is ``5 / (e^4.5 + 5) ≈ 5.26%``.

The Tester draws each member's response once per epoch (`privatize_per_member`): the
uniforms come from ``HMAC-SHA256(epoch secret, member id, answer and ε)``
(`ResponseEpoch`), so every audit of the epoch releases the same privatised answer and
averaging audits recovers nothing beyond one draw. `privatize` (a generator's draws) is
the same mechanism for callers without member ids.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from typing import Sequence

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


def _check_categories(categories: np.ndarray, k: int) -> np.ndarray:
    cats = np.asarray(categories)
    if cats.size and (not np.issubdtype(cats.dtype, np.integer) or cats.min() < 0 or cats.max() >= k):
        raise InputError(f"categories must be whole numbers from 0 to {k - 1}", parameter="categories")
    return cats.astype(np.int64, copy=False)


def privatize(categories: np.ndarray, rng: np.random.Generator, epsilon: float = DEFAULT_EPSILON,
              k: int = K) -> np.ndarray:
    """Apply randomized response to integer categories ``0..k-1`` (design §2.3).

    Each value is kept with probability `keep_probability`, else replaced by one of the
    other ``k − 1`` categories chosen uniformly, independently per record.
    """
    eps, k = _check_epsilon(epsilon), _check_k(k)
    cats = _check_categories(categories, k)
    flip = rng.random(cats.shape) >= keep_probability(eps, k)
    # A uniform draw over the k-1 other categories: offset 1..k-1 added modulo k.
    offset = rng.integers(1, k, size=cats.shape)
    return np.where(flip, (cats + offset) % k, cats)


def privatize_one_hot(categories: np.ndarray, rng: np.random.Generator,
                      epsilon: float = DEFAULT_EPSILON, k: int = K) -> np.ndarray:
    """`privatize`, returned as ``(n, k)`` one-hot float rows (the Self-ID vectors of design §2.3)."""
    out = privatize(categories, rng, epsilon, k)
    return np.eye(k)[out]


# --------------------------------------------------------------------------------------
# One draw per member and epoch (design §2.3)
# --------------------------------------------------------------------------------------
#: length of an epoch secret (HMAC-SHA256 key)
SECRET_BYTES = 32
#: domain separation of the per-member streams (HMAC message prefix)
PURPOSE = b"ppre/self-id-randomized-response/v1"
_UNIT = 2.0 ** -53  # 53 random bits -> a uniform double in [0, 1), as numpy's random()


class ResponseEpoch:
    """The Tester's secret for one randomized-response epoch (design §2.3).

    Every member's draw comes from ``HMAC-SHA256(secret, PURPOSE ‖ k ‖ ε ‖ answer ‖ id)``,
    so the same member with the same answer gets the same privatised answer in every
    audit of the epoch, and repeated audits cannot average the randomization away; a
    changed answer or another ε gets an independent draw (a shared one would release
    the difference of two answers, or, between two ε, the answer itself whenever the
    two outputs differ).
    The secret lives in this object only: it prints as ``<secret>``, refuses pickling
    and copying, and is never logged or written; `fingerprint` names the epoch in logs.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes | bytearray) -> None:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
            raise InputError(f"must be {SECRET_BYTES} bytes", parameter="randomized-response epoch secret")
        self._secret = bytearray(secret)

    @classmethod
    def new(cls) -> "ResponseEpoch":
        """A fresh epoch: 32 bytes from the operating system's generator."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_seed(cls, seed: int) -> "ResponseEpoch":
        """A reproducible epoch for tests and benchmarks (a seeded preparation): anyone who
        knows the seed can recompute it, so it is no secret."""
        return cls(hashlib.sha256(b"ppre/seeded-epoch/v1:" + str(int(seed)).encode()).digest())

    @property
    def fingerprint(self) -> str:
        """A short name of the epoch for logs: an HMAC of a constant, which says nothing of
        the secret."""
        return hmac.new(self._secret, b"ppre/epoch-fingerprint/v1", hashlib.sha256).hexdigest()[:12]

    def uniforms(self, member_ids: Sequence[str], categories: np.ndarray, epsilon: float,
                 k: int = K) -> np.ndarray:
        """``(n, 2)`` uniforms in [0, 1) per member: the keep/flip draw and the offset draw,
        a deterministic function of (secret, k, ε, answer, member id)."""
        key = bytes(self._secret)
        eps = float(epsilon).hex().encode()
        words = bytearray()
        for member, cat in zip(member_ids, np.asarray(categories).tolist()):
            ident = str(member).encode("utf-8")
            msg = b"%s\x00%d\x00%s\x00%d\x00%d\x00%s" % (PURPOSE, k, eps, cat, len(ident), ident)
            words += hmac.digest(key, msg, "sha256")[:16]
        bits = np.frombuffer(bytes(words), dtype=">u8").reshape(-1, 2) >> np.uint64(11)
        return bits.astype(np.float64) * _UNIT

    def __repr__(self) -> str:
        return f"ResponseEpoch(<secret>, fingerprint={self.fingerprint})"

    __str__ = __repr__

    def __reduce_ex__(self, protocol):
        raise TypeError("a randomized-response epoch secret is never serialised (design §2.3)")

    __reduce__ = __reduce_ex__

    def __copy__(self):
        raise TypeError("a randomized-response epoch secret is never copied (design §2.3)")

    def __deepcopy__(self, memo):
        raise TypeError("a randomized-response epoch secret is never copied (design §2.3)")


def privatize_per_member(categories: np.ndarray, member_ids: Sequence[str], epoch: ResponseEpoch,
                         epsilon: float = DEFAULT_EPSILON, k: int = K) -> np.ndarray:
    """`privatize` with each member's draw fixed by ``epoch`` (design §2.3).

    The same flip probabilities as `privatize` (kept with `keep_probability`, else one of
    the other ``k − 1`` categories uniformly), drawn from the member's own HMAC stream
    (`ResponseEpoch.uniforms`) instead of a generator: within one epoch a member always
    gets the same output; across epochs, or for a changed answer or ε, the draws are
    independent.
    """
    eps, k = _check_epsilon(epsilon), _check_k(k)
    cats = _check_categories(categories, k)
    if len(member_ids) != cats.size:
        raise InputError(f"{len(member_ids)} member ids for {cats.size} answers", parameter="member_ids")
    u = epoch.uniforms(member_ids, cats, eps, k) if cats.size else np.zeros((0, 2))
    flip = u[:, 0] >= keep_probability(eps, k)
    offset = 1 + np.minimum(np.floor(u[:, 1] * (k - 1)).astype(np.int64), k - 2)
    return np.where(flip, (cats + offset) % k, cats)


def privatize_per_member_one_hot(categories: np.ndarray, member_ids: Sequence[str], epoch: ResponseEpoch,
                                 epsilon: float = DEFAULT_EPSILON, k: int = K) -> np.ndarray:
    """`privatize_per_member`, as ``(n, k)`` one-hot float rows (design §2.3)."""
    return np.eye(k)[privatize_per_member(categories, member_ids, epoch, epsilon, k)]
