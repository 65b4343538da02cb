"""Masking of encrypted aggregates before P2 decrypts them (SPEC.md sections 3.6-3.7, 4).

Two masks, one per result variant:

* `RatioMask` (P2 learns the result): each (Num, Den) pair is multiplied by a fresh
  random r and receives independent additive noise, (r*Num + e1, r*Den + e2).
  A bare common factor leaks r through gcd(r*Num, r*Den) (SPEC 4, decision); the noise
  e < 2^NOISE_BITS makes that gcd a small random number (tests run the attack).
  r has a log-uniform bit length in [R_MIN_BITS, R_MAX_BITS], so r*Den hides the
  magnitude of Den across ~48 bits, while e/r < 2^-16 of one fixed-point unit keeps
  the ratio exact to far below the 2^-32 probability precision. Because
  r >= 2^R_MIN_BITS > e, a zero Num or Den stays recognisable (masked value < 2^NOISE_BITS),
  which P2 needs to report an empty group rather than a ratio of two noises.
* `AdditiveMask` (only P1 learns the result): each slot gets a one-time pad
  s < 2^(bound_bits + STATISTICAL_BITS), so P2 learns nothing (statistical distance
  2^-64) and P1 removes the pad exactly.

Masks come from `secrets`, never from the audit's `--seed`.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from fractions import Fraction

R_MIN_BITS = 32
R_MAX_BITS = 80
NOISE_BITS = 16
STATISTICAL_BITS = 64


@dataclass(frozen=True)
class RatioMask:
    r: int
    e_num: int
    e_den: int

    @classmethod
    def draw(cls) -> "RatioMask":
        bits = R_MIN_BITS + secrets.randbelow(R_MAX_BITS - R_MIN_BITS + 1)
        r = (1 << (bits - 1)) | secrets.randbits(bits - 1) | 1
        return cls(r, secrets.randbits(NOISE_BITS), secrets.randbits(NOISE_BITS))

    @staticmethod
    def max_bits(value_bits: int) -> int:
        return value_bits + R_MAX_BITS + 1


def masked_ratio(masked_num: int, masked_den: int) -> float | None:
    """P2's ratio of a masked pair; None when Den is zero (nothing to divide by)."""
    if masked_den < (1 << NOISE_BITS):
        return None
    if 0 <= masked_num < (1 << NOISE_BITS):
        return 0.0
    return float(Fraction(masked_num, masked_den))


@dataclass(frozen=True)
class AdditiveMask:
    pads: tuple[int, ...]

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
