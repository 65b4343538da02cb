"""Batch primitives behind the hazmat fence, with two backends (design §4.9).

The protocol spends much of its CPU in two primitives done many times over: X25519
scalar multiplication (the commutative cipher, four per member) and modular
exponentiation with a variable base (Paillier decryption, the ratio masks' factors).
Each has a batch form here, computed by one of two backends that give identical results:

* ``portable``: pyca/cryptography's X25519 and gmpy2's ``powmod``, one operation at a
  time; runs everywhere.
* ``ifma``: Intel's crypto_mb (`common.crypto.crypto_mb`), eight operations at once in
  AVX-512 IFMA lanes: about 6x the portable X25519 and 3.5-5x its exponentiation on a
  CPU that has the instructions (`bench/bench_backends.py`).

The backend is chosen once per process, at first use: ``PPRE_CRYPTO_BACKEND`` =
``portable``, ``ifma`` (refused, with the reason, when this machine cannot run it) or
``auto`` (the default: ``ifma`` when the CPU has AVX-512 IFMA and the libraries load and
pass their known-answer check, else ``portable``); a value outside these, or ``ifma`` where
it cannot run, is an `InputError` naming the variable (the CLI chooses at start-up, so a
service refuses to start rather than run on a backend it was not told to). `select`
changes it in this process (tests and benchmarks); worker processes choose their own, from
the same variable.

Both backends keep the checks the protocol relies on: a point of small order is named
(`SmallOrderPoint`) by its index, never multiplied silently; a peer's points are
validated before either backend sees them (`common.crypto.commutative.validate_points`).
Exponents are read at a stated width (`exp_bits`): the IFMA backend's time then depends
on that width only, not on the exponent's value.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Sequence

import gmpy2
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from common.crypto import crypto_mb, ifma_lanes
from common.errors import InputError

BACKEND_ENV = "PPRE_CRYPTO_BACKEND"
BACKENDS = ("portable", "ifma")
CHOICES = ("auto",) + BACKENDS
POINT_BYTES = 32


class SmallOrderPoint(ValueError):
    """X25519 of a point of small order (an all-zero result): `index` names the point."""

    def __init__(self, index: int) -> None:
        super().__init__(f"point {index} has small order")
        self.index = index


class _State:
    name: str | None = None
    reason: str = ""
    ifma = None  # the bound crypto_mb library when `name` is "ifma"
    kernel = None  # our kernel (`ifma_lanes`): on ifma, where it was built


def _choose(choice: str) -> None:
    if choice not in CHOICES:
        raise InputError(f"{BACKEND_ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    _State.kernel = None
    if choice == "portable":
        _State.name, _State.ifma, _State.reason = "portable", None, f"{BACKEND_ENV}=portable"
        return
    try:
        bound = crypto_mb.load()
    except crypto_mb.Unavailable as exc:
        if choice == "ifma":
            raise InputError(f"{BACKEND_ENV}=ifma, but the IFMA backend cannot run here: {exc}") from None
        _State.name, _State.ifma, _State.reason = "portable", None, str(exc)
        return
    _State.name, _State.ifma = "ifma", bound
    _State.reason = f"{BACKEND_ENV}=ifma" if choice == "ifma" else "AVX-512 IFMA found, crypto_mb loaded"
    try:
        _State.kernel = ifma_lanes.load()
        _State.reason += "; IFMA kernel loaded"
    except ifma_lanes.Unavailable as exc:
        _State.reason += f"; fixed-base products and aggregation on gmpy2: {exc}"


def select(choice: str | None = None) -> str:
    """Choose the backend (``auto``, ``portable`` or ``ifma``; None: the environment's
    ``PPRE_CRYPTO_BACKEND``, else ``auto``) for this process; returns the one chosen."""
    _choose((choice if choice is not None else os.environ.get(BACKEND_ENV, "auto")).strip().lower())
    return _State.name


def backend() -> str:
    """The backend this process runs (chosen on first use)."""
    if _State.name is None:
        select()
    return _State.name


def backend_reason() -> str:
    """Why this process runs its backend (for the services' start-up line)."""
    backend()
    return _State.reason


def _ifma():
    return _State.ifma if backend() == "ifma" else None


def _kernel():
    return _State.kernel if backend() == "ifma" else None


def has_lanes() -> bool:
    """Whether `multi_exp_many` runs in the IFMA kernel's lanes in this process (else it
    is `multi_exp` per column, and a caller may have a better portable form)."""
    return _kernel() is not None


# ---------------------------------------------------------------------- X25519
def x25519_many(scalar: bytes, packed: bytes) -> bytes:
    """[scalar]P for each 32-byte u-coordinate of the packed table (on the curve, below p:
    validated by the caller), packed back to back; `SmallOrderPoint` for the first point of
    small order."""
    ifma = _ifma()
    if ifma is not None:
        out, low = ifma.x25519(scalar, packed)
        if low:
            raise SmallOrderPoint(low[0])
        return out
    return _x25519_portable(X25519PrivateKey.from_private_bytes(scalar), packed)


def _x25519_portable(key: X25519PrivateKey, packed: bytes) -> bytes:
    out = bytearray()
    exchange = key.exchange
    from_bytes = X25519PublicKey.from_public_bytes
    for i in range(len(packed) // POINT_BYTES):
        try:
            out += exchange(from_bytes(packed[POINT_BYTES * i:POINT_BYTES * (i + 1)]))
        except ValueError:  # the all-zero shared value
            raise SmallOrderPoint(i) from None
    return bytes(out)


# ---------------------------------------------------------------------- exponentiation
def powmod_many(bases: Sequence[int], exponents: Sequence[int] | int, modulus: int, exp_bits: int) -> list[int]:
    """bases[i]^exponents[i] mod modulus (odd), or every base to one exponent (an int);
    each exponent non-negative and below 2^exp_bits."""
    count = len(bases)
    exps = [int(exponents)] * count if isinstance(exponents, int) else [int(e) for e in exponents]
    if len(exps) != count:
        raise ValueError(f"{count} bases but {len(exps)} exponents")
    if any(e < 0 or e >> exp_bits for e in exps):
        raise ValueError(f"an exponent is negative or wider than {exp_bits} bits")
    modulus = int(modulus)
    ifma = _ifma()
    if ifma is not None and ifma.serves(modulus.bit_length()):
        return ifma.powmod([int(b) for b in bases], exps, modulus, exp_bits)
    m = gmpy2.mpz(modulus)
    return [int(gmpy2.powmod(gmpy2.mpz(b), e, m)) for b, e in zip(bases, exps)]


# ---------------------------------------------------------------------- fixed-base exponentiation
class FixedBase:
    """Windowed fixed-base exponentiation table: base^e mod m for e < 2^bits, one product
    of table entries per window of e (the portable backend's form of `fixed_base`)."""

    def __init__(self, base: int, modulus: int, bits: int, window: int) -> None:
        self.modulus = gmpy2.mpz(modulus)
        self.window = window
        self.rows = math.ceil(bits / window)
        self.table: list[list[gmpy2.mpz]] = []
        g = gmpy2.mpz(base) % self.modulus
        for _ in range(self.rows):
            row = [gmpy2.mpz(1), g]
            for _ in range(2, 1 << window):
                row.append(row[-1] * g % self.modulus)
            self.table.append(row)
            g = row[-1] * g % self.modulus  # g^(2^window)

    def pow(self, e: int) -> gmpy2.mpz:
        mask = (1 << self.window) - 1
        acc = gmpy2.mpz(1)
        m = self.modulus
        for row in self.table:
            d = e & mask
            if d:
                acc = acc * row[d] % m
            e >>= self.window
        return acc

    def pow_many(self, exponents: Sequence[int]) -> list[int]:
        return [int(self.pow(e)) for e in exponents]


def fixed_base(base: int, modulus: int, bits: int, window: int):
    """base^e mod modulus (odd) for e < 2^bits, e given many at a time (`pow_many`): the
    IFMA kernel's lanes (`common.crypto.ifma_lanes`) where this process runs the
    ifma backend and the kernel was built, else gmpy2's table (`FixedBase`); the same
    integers either way."""
    kernel = _kernel()
    if kernel is not None and int(modulus).bit_length() <= ifma_lanes.MAX_MODULUS_BITS:
        return ifma_lanes.FixedBaseLanes(kernel, base, modulus, bits, window)
    return FixedBase(base, modulus, bits, window)


# ---------------------------------------------------------------------- multi-exponentiation
def _window_for(count: int, bits: int) -> int:
    best, best_cost = 1, None
    for w in range(1, 13):
        cost = math.ceil(bits / w) * (count + (2 << w)) + bits
        if best_cost is None or cost < best_cost:
            best, best_cost = w, cost
    return best


def multi_exp(bases: Sequence[int], exponents: Sequence[int], modulus: int) -> int:
    """prod bases[i]^exponents[i] mod modulus by Pippenger's bucket method (exponents >= 0)."""
    m = gmpy2.mpz(modulus)
    pairs = [(gmpy2.mpz(b), int(e)) for b, e in zip(bases, exponents) if e]
    if not pairs:
        return 1
    if any(e < 0 for _, e in pairs):
        raise ValueError("multi_exp takes non-negative exponents")
    bits = max(e.bit_length() for _, e in pairs)
    w = _window_for(len(pairs), bits)
    mask = (1 << w) - 1
    result = gmpy2.mpz(1)
    for t in reversed(range(math.ceil(bits / w))):
        if result != 1:
            for _ in range(w):
                result = result * result % m
        shift = t * w
        buckets: list = [None] * (mask + 1)
        for b, e in pairs:
            d = (e >> shift) & mask
            if d:
                x = buckets[d]
                buckets[d] = b if x is None else x * b % m
        running = acc = None
        for d in range(mask, 0, -1):
            x = buckets[d]
            if x is not None:
                running = x if running is None else running * x % m
            if running is not None:
                acc = running if acc is None else acc * running % m
        if acc is not None:
            result = result * acc % m
    return int(result)


def multi_exp_many(bases: Sequence[int], columns: Sequence[Sequence[int]], modulus: int) -> list[int]:
    """prod_i bases[i]^column[i] mod modulus (odd) for each column of exponents: eight
    columns at a time in the IFMA kernel's lanes where this process has it (exponents in
    [0, 2^64)), else `multi_exp` per column (which also takes wider ones); the same integers
    either way."""
    kernel = _kernel()
    if kernel is not None and columns and bases and int(modulus).bit_length() <= ifma_lanes.MAX_MODULUS_BITS:
        cols = [[int(e) for e in col] for col in columns]
        bits = max((e.bit_length() for col in cols for e in col), default=0)
        if 0 < bits <= 64 and all(e >= 0 for col in cols for e in col):
            return ifma_lanes.multi_exp_lanes(kernel, _modulus_form(kernel, int(modulus)), bases, cols, bits,
                                              _window_for(len(bases), bits))
    return [multi_exp(bases, col, modulus) for col in columns]


#: the IFMA kernel's widest exponent: wider ones are cut into limbs of this many bits
LANE_EXP_BITS = 64


def multi_exp_wide(bases: Sequence[int], columns: Sequence[Sequence[int]], modulus: int) -> list[int]:
    """`multi_exp_many` for exponents of any width (non-negative): where the lanes run,
    each column is cut into `LANE_EXP_BITS`-bit limbs e = Σ_L e_L·2^(64L), every limb is
    a column of the lanes (eight at a time, the bases in Montgomery form once for all),
    and the limbs' products are joined by Horner's rule, Π_i b_i^(e_i) =
    Π_L (Π_i b_i^(e_iL))^(2^(64L)); else `multi_exp` per column. The same integers either way."""
    kernel = _kernel()
    if kernel is None or not columns or not bases or int(modulus).bit_length() > ifma_lanes.MAX_MODULUS_BITS:
        return [multi_exp(bases, col, modulus) for col in columns]
    cols = [[int(e) for e in col] for col in columns]
    if any(e < 0 for col in cols for e in col):
        raise ValueError("multi_exp_wide takes non-negative exponents")
    bits = max((e.bit_length() for col in cols for e in col), default=0)
    limbs = max(1, -(-bits // LANE_EXP_BITS))
    if limbs == 1:
        return multi_exp_many(bases, cols, modulus)
    width = -(-bits // limbs)  # limbs of equal width: the lanes' time follows the widest
    low = (1 << width) - 1
    parts = multi_exp_many(bases, [[(e >> (width * limb)) & low for e in col]
                                   for col in cols for limb in range(limbs)], modulus)
    m, shift = gmpy2.mpz(modulus), gmpy2.mpz(1) << width
    out = []
    for c in range(len(cols)):
        acc = gmpy2.mpz(1)
        for limb in reversed(range(limbs)):
            acc = gmpy2.powmod(acc, shift, m) * parts[c * limbs + limb] % m
        out.append(int(acc))
    return out


@lru_cache(maxsize=4)
def _modulus_form(kernel, modulus: int):
    return ifma_lanes.Modulus(kernel, modulus)
