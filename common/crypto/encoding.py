"""Fixed-point and signed encodings, and slot packing (design §4.2-§4.4).

* Fixed point: reals scaled by 2^c to integers. Probabilities are quantised per row
  so that the row still sums to exactly 2^c (largest-remainder rounding); a product
  of a 2^a-scaled and a 2^b-scaled value carries scale 2^(a+b) (`FixedPoint`).
* Signed: Z_m split in thirds: [0, m/3] positive, [m - m/3, m) negative (x + m), the
  middle third an overflow that raises `EncodingOverflowError`, never a wrapped number.
* Slots: several signed integers in one plaintext, slot s at bit s*S. Each slot must
  satisfy |v| < 2^(S-1); `SlotLayout.check_bound` is called before any homomorphic work
  with the largest magnitude the computation can produce, so overflow is refused up
  front, and `unpack` re-checks every slot after decryption.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from common.errors import EncodingOverflowError

PROBABILITY_BITS = 32


@dataclass(frozen=True)
class FixedPoint:
    """An integer together with its binary scale: value = integer / 2^scale_bits."""

    integer: int
    scale_bits: int

    def __mul__(self, other: "FixedPoint") -> "FixedPoint":
        return FixedPoint(self.integer * other.integer, self.scale_bits + other.scale_bits)

    def to_float(self) -> float:
        return self.integer / (1 << self.scale_bits)


def quantize_probabilities(p: np.ndarray, bits: int = PROBABILITY_BITS) -> np.ndarray:
    """Rows of probabilities -> int64 rows summing exactly to 2^bits (largest remainder)."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError("probabilities must be a 2-D array")
    scale = float(1 << bits)
    scaled = p / p.sum(axis=1, keepdims=True) * scale
    floor = np.floor(scaled).astype(np.int64)
    short = (1 << bits) - floor.sum(axis=1)
    order = np.argsort(-(scaled - floor), axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(p.shape[1])[None, :].repeat(p.shape[0], 0), axis=1)
    floor += (ranks < short[:, None]).astype(np.int64)
    return floor


def encode_signed(x: int, modulus: int) -> int:
    """x -> Z_modulus with negatives as x + modulus; |x| > modulus/3 is an overflow."""
    if abs(x) > modulus // 3:
        raise EncodingOverflowError(f"value of {abs(x).bit_length()} bits does not fit a third of the plaintext space")
    return x % modulus


def decode_signed(m: int, modulus: int) -> int:
    """Inverse of `encode_signed`; the middle third raises EncodingOverflowError."""
    third = modulus // 3
    if 0 <= m <= third:
        return m
    if modulus - third <= m < modulus:
        return m - modulus
    raise EncodingOverflowError("decrypted value lies in the overflow third of the plaintext space")


@dataclass(frozen=True)
class SlotLayout:
    """`n_slots` signed integers of `slot_bits` bits each, slot s at bit s * slot_bits."""

    slot_bits: int
    n_slots: int

    @property
    def limit(self) -> int:
        return 1 << (self.slot_bits - 1)

    def check_bound(self, magnitude: int, what: str = "value") -> None:
        """Refuse a computation whose values could reach `magnitude` (before doing it)."""
        if magnitude >= self.limit:
            raise EncodingOverflowError(
                f"{what} may reach {magnitude.bit_length()} bits; slots hold {self.slot_bits - 1} bits")

    def pack(self, values: Sequence[int]) -> int:
        if len(values) != self.n_slots:
            raise ValueError(f"expected {self.n_slots} slot values, got {len(values)}")
        total = 0
        for s, v in enumerate(values):
            if abs(v) >= self.limit:
                raise EncodingOverflowError(f"slot {s} value of {abs(v).bit_length()} bits does not fit")
            total += v << (s * self.slot_bits)
        return total

    def unpack(self, packed: int) -> list[int]:
        """Signed slot values; raises EncodingOverflowError if any slot is out of range."""
        out = []
        mask = (1 << self.slot_bits) - 1
        rest = packed
        for s in range(self.n_slots):
            low = rest & mask
            if low >= self.limit:
                low -= 1 << self.slot_bits
            out.append(low)
            rest = (rest - low) >> self.slot_bits
        if rest != 0:
            raise EncodingOverflowError("decrypted value overflows its slot layout")
        return out
