"""Our AVX-512 IFMA kernel (`ifma_lanes.c`, design §4.9): the IFMA backend's forms of
`batch.FixedBase` (`FixedBaseLanes`) and of the aggregation's multi-exponentiations
(`multi_exp_lanes`), eight at a time in the lanes, in Montgomery form (radix 2^52).

crypto_mb has no fixed-base exponentiation, and eight variable-base ones in its lanes are
slower than gmpy2's table products; the kernel does the table products themselves: eight
exponents at a time, each lane gathering the entries its own exponent's windows select.
The table is built by the kernel too (eight rows at a time), from the bases
g_r = base^(2^(window·r)). The multi-exponentiation is Pippenger's method for eight
exponent columns over the same bases, each lane with its own buckets.

The kernel is an optional extension, compiled at install time where a C compiler that
knows ``-mavx512ifma`` is present (`setup.py`); `load()` raises `Unavailable` when it was
not built or fails its known-answer check, and the batch layer then stays on gmpy2.
"""
from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Sequence

from common.crypto import crypto_mb

#: radix of the kernel's digits
DIGIT_BITS = 52
#: the kernel's largest operand: 80 digits
MAX_MODULUS_BITS = 80 * DIGIT_BITS - 2


class Unavailable(RuntimeError):
    """The kernel is not built here, or computes wrong answers."""


def _library_path() -> Path | None:
    found = sorted(Path(__file__).resolve().parent.glob("_ifma_lanes*.so"))
    return found[0] if found else None


class Kernel:
    """The loaded kernel: its entry points and the radix conversion."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._radix = lib.ppre_to_radix52
        self._radix.restype = None
        self._radix.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self._table = lib.ppre_fixed_base_table_mb8
        self._table.restype = ctypes.c_int
        self._table.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
        self._montgomery = lib.ppre_to_montgomery_mb8
        self._montgomery.restype = ctypes.c_int
        self._montgomery.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
        self._multi = lib.ppre_multi_exp_mb8
        self._multi.restype = ctypes.c_int
        self._multi.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p]
        self._pow = lib.ppre_fixed_base_mb8
        self._pow.restype = ctypes.c_int
        self._pow.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_int]

    def digits(self, values: Sequence[int], words: int, n: int) -> ctypes.Array:
        """`values` (each below 2^(64 words)) as n radix-2^52 digits each."""
        packed = ctypes.create_string_buffer(b"".join(int(v).to_bytes(8 * words, "little") for v in values))
        out = (ctypes.c_uint64 * (n * len(values)))()
        self._radix(packed, words, out, n, len(values))
        return out


class Modulus:
    """An odd modulus in the kernel's form: its digits, R^2 and R mod m, -m^-1 mod 2^52."""

    def __init__(self, kernel: Kernel, modulus: int) -> None:
        m = int(modulus)
        if m % 2 == 0 or m.bit_length() > MAX_MODULUS_BITS:
            raise ValueError(f"the IFMA kernel takes odd moduli of at most {MAX_MODULUS_BITS} bits")
        self.value = m
        self.n = -(-(m.bit_length() + 2) // DIGIT_BITS)  # R = 2^(52 n) > 4 m
        self.words = -(-m.bit_length() // 64)
        r = 1 << (DIGIT_BITS * self.n)
        self.k0 = (-pow(m, -1, 1 << DIGIT_BITS)) % (1 << DIGIT_BITS)
        self.digits = kernel.digits([m], self.words, self.n)
        self.r_digits = kernel.digits([r % m], self.words, self.n)
        self.r2_digits = kernel.digits([r * r % m], self.words, self.n)

    def numbers(self, raw: bytes, count: int) -> list[int]:
        """`count` kernel results (words, each below 2m) as integers reduced mod m."""
        width, m = 8 * self.words, self.value
        return [int.from_bytes(raw[i * width:(i + 1) * width], "little") % m for i in range(count)]


def multi_exp_lanes(kernel: Kernel, modulus: Modulus, bases: Sequence[int], columns: Sequence[Sequence[int]],
                    bits: int, window: int) -> list[int]:
    """For each column of exponents (each in [0, 2^bits), bits <= 64), prod_i bases[i]^col[i]
    mod the modulus: eight columns at a time in the lanes (Pippenger's method per lane, with
    windows of `window` bits)."""
    count = len(bases)
    if not columns:
        return []
    m = modulus.value
    if count == 0:
        return [1 % m] * len(columns)
    if not 1 <= bits <= 64:
        raise ValueError("the IFMA multi-exponentiation takes exponents of 1 to 64 bits")
    words, n = modulus.words, modulus.n
    packed = ctypes.create_string_buffer(b"".join((int(b) % m).to_bytes(8 * words, "little") for b in bases))
    mont = (ctypes.c_uint64 * (count * n))()  # the bases in Montgomery form, once for every column
    if kernel._montgomery(packed, count, words, n, modulus.digits, modulus.k0, modulus.r2_digits, mont):
        raise ValueError("the IFMA kernel refused the sizes")
    buckets = (ctypes.c_uint64 * ((1 << window) * n * 8))()
    out_all: list[int] = []
    for first in range(0, len(columns), 8):
        group = list(columns[first:first + 8])
        lanes = len(group)
        group += [[0] * count] * (8 - lanes)
        if any(len(col) != count for col in group):
            raise ValueError(f"every exponent column needs {count} exponents")
        exps = (ctypes.c_uint64 * (count * 8))(*[int(group[l][i]) for i in range(count) for l in range(8)])
        out = (ctypes.c_uint64 * (8 * words))()
        status = kernel._multi(mont, count, words, exps, bits, window, n, modulus.digits, modulus.k0,
                               modulus.r_digits, buckets, out)
        if status:
            raise ValueError("the IFMA multi-exponentiation refused the sizes")
        out_all += modulus.numbers(bytes(out), lanes)
    return out_all


class FixedBaseLanes:
    """base^e mod modulus (odd, at most `MAX_MODULUS_BITS` bits) for e < 2^bits, eight
    exponents at a time (`pow_many`); the same integers as `batch.FixedBase`."""

    def __init__(self, kernel: Kernel, base: int, modulus: int, bits: int, window: int) -> None:
        self._kernel = kernel
        self._m = m = Modulus(kernel, modulus)
        self.modulus = m.value
        self.bits, self.window = int(bits), int(window)
        self.rows = math.ceil(self.bits / self.window)
        self._exp_bytes = -(-self.rows * self.window // 8) + 1
        r = 1 << (DIGIT_BITS * m.n)
        g, bases = int(base) % m.value, []
        for _ in range(self.rows):
            bases.append(g * r % m.value)
            g = pow(g, 1 << self.window, m.value)
        entries = 1 << self.window
        self._table = (ctypes.c_uint64 * (self.rows * entries * m.n))()
        status = kernel._table(kernel.digits(bases, m.words, m.n), self.rows, entries, m.n, m.digits, m.k0,
                               m.r_digits, self._table)
        if status:
            raise ValueError("the IFMA kernel refused the table's sizes")

    def pow_many(self, exponents: Sequence[int]) -> list[int]:
        count = len(exponents)
        if count == 0:
            return []
        if any(e < 0 or e >> self.bits for e in exponents):
            raise ValueError(f"an exponent is negative or wider than {self.bits} bits")
        m = self._m
        exps = ctypes.create_string_buffer(b"".join(int(e).to_bytes(self._exp_bytes, "little") for e in exponents))
        out = (ctypes.c_uint64 * (count * m.words))()
        try:
            status = self._kernel._pow(self._table, self.rows, self.window, m.n, m.digits, m.k0,
                                       exps, self._exp_bytes, count, out, m.words)
        finally:
            ctypes.memset(exps, 0, len(exps))
        if status:
            raise ValueError("the IFMA kernel refused the sizes")
        return m.numbers(bytes(out), count)


def load() -> Kernel:
    """The kernel, after a known-answer check (a 2048-bit modulus: 9 fixed-base powers and
    two multi-exponentiations against Python's `pow`); `Unavailable` says why not."""
    if not crypto_mb.cpu_has_ifma():
        raise Unavailable("this CPU has no AVX-512 IFMA (no avx512ifma in /proc/cpuinfo)")
    path = _library_path()
    if path is None:
        raise Unavailable("the IFMA kernel was not built at install (no C compiler with -mavx512ifma)")
    try:
        kernel = Kernel(ctypes.CDLL(str(path)))
    except (OSError, AttributeError) as exc:
        raise Unavailable(f"the IFMA kernel did not load ({exc})") from None
    modulus = (1 << 2047) + 0x1DB
    exps = [(1 << 63) + 977 * i for i in range(8)] + [0]
    bases = [3 + i for i in range(9)]
    expected = [math.prod(pow(b, e, modulus) for b, e in zip(bases, col)) % modulus for col in (exps, exps[::-1])]
    if (FixedBaseLanes(kernel, 3, modulus, 64, 5).pow_many(exps) != [pow(3, e, modulus) for e in exps]
            or multi_exp_lanes(kernel, Modulus(kernel, modulus), bases, [exps, exps[::-1]], 64, 4) != expected):
        raise Unavailable("the IFMA kernel failed its known-answer check")
    return kernel
