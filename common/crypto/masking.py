"""Masking of encrypted aggregates before P2 decrypts them (design §3.6, §3.7, §4.7).

Two masks, one per result variant:

* `RatioMask` (P2 learns the result): each (Num, Den) pair is multiplied by a fresh
  random r and receives independent additive noise as large as r itself,
  (r*Num + e1, r*Den + e2) with e uniform in [0, r * 2^PRECISION_BITS): P2 learns the
  ratio (Num + u1) / (Den + u2), u = e/r uniform below 2^PRECISION_BITS fixed-point
  units (one unit: 2^-32 of one member's weight, the stated precision; a ratio of
  cells of 30 members' weight or more is exact to 1e-11), and nothing of Num or Den
  apart. Two attacks are closed, and the tests run both: a bare common factor leaks r
  through gcd(r*Num, r*Den) (design §4.7), and a noise far below r lets the
  continued-fraction expansion of the masked ratio contain Num/Den itself whenever
  r > 2*e*Den (with 16-bit noise and r up to 2^80 it gave Num/Den in 171 of 300
  cells, the exact (Num, Den) in 101). With u of the order of one unit, the masked
  ratio falls within 1/(2*Den^2) of Num/Den only by a chance of about 1/(2*Den).
  r has a log-uniform bit length in [R_MIN_BITS, R_MAX_BITS], so r*Den hides the
  magnitude of Den across ~48 bits. The price: a zero Den is no longer recognisable
  (it reads as a ratio of two noises), so empty cells never reach P2: the Tester
  suppresses every cell whose effective size is 0 (`tester_service.release`).
* `AdditiveMask` (only P1 learns the result): each slot gets a one-time pad
  s < 2^(bound_bits + STATISTICAL_BITS), so P2 learns nothing (statistical distance
  2^-64) and P1 removes the pad exactly.

Masks come from `secrets`, never from the audit's `--seed`. A mask object prints as
`RatioMask(<secret>)` and refuses pickling and copying (design §7: the masks are what keeps
P2 from reading the aggregates; a worker gets the raw integers it needs, never the object).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from fractions import Fraction

R_MIN_BITS = 32
R_MAX_BITS = 80
PRECISION_BITS = 0
STATISTICAL_BITS = 64


@dataclass(frozen=True)
class RatioMask:
    r: int = field(repr=False)
    e_num: int = field(repr=False)
    e_den: int = field(repr=False)

    def __repr__(self) -> str:
        return "RatioMask(<secret>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a mask is never serialised")

    @classmethod
    def draw(cls) -> "RatioMask":
        bits = R_MIN_BITS + secrets.randbelow(R_MAX_BITS - R_MIN_BITS + 1)
        r = (1 << (bits - 1)) | secrets.randbits(bits - 1) | 1
        return cls(r, cls.noise(r), cls.noise(r))

    @staticmethod
    def noise(r: int) -> int:
        """One slot's noise for factor r: uniform in [0, r * 2^PRECISION_BITS)."""
        return secrets.randbelow(r << PRECISION_BITS)

    @staticmethod
    def max_bits(value_bits: int) -> int:
        return value_bits + R_MAX_BITS + PRECISION_BITS + 2


def masked_ratio(masked_num: int, masked_den: int) -> float | None:
    """P2's ratio of a masked pair (None only for a masked Den of 0, which a cell the
    Tester released cannot have)."""
    if masked_den == 0:
        return None
    return float(Fraction(masked_num, masked_den))


@dataclass(frozen=True)
class AdditiveMask:
    pads: tuple[int, ...] = field(repr=False)

    def __repr__(self) -> str:
        return f"AdditiveMask(<{len(self.pads)} pads, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a mask is never serialised")

    @classmethod
    def draw(cls, n_slots: int, bound_bits: int) -> "AdditiveMask":
        return cls(tuple(secrets.randbits(bound_bits + STATISTICAL_BITS) for _ in range(n_slots)))

    def remove(self, masked: list[int]) -> list[int]:
        return [m - s for m, s in zip(masked, self.pads)]

    @staticmethod
    def max_bits(bound_bits: int) -> int:
        return bound_bits + STATISTICAL_BITS + 1


def mask_bits(recipient: str) -> int:
    """Bits a mask adds to a cell value: the ratio mask's factor when the Test-Client
    learns the result ("client"), the additive pad when only the Tester does."""
    return RatioMask.max_bits(0) if recipient == "client" else AdditiveMask.max_bits(0)
