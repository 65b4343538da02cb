"""Curve25519 written out from its equation (RFC 7748), independent of
`common.crypto.commutative`: the tests enumerate its small-order points with it."""
from __future__ import annotations

CURVE_P = 2**255 - 19
CURVE_A = 486662
#: the order of Curve25519's prime subgroup (RFC 7748, section 4.1)
CURVE_L = 2**252 + 27742317777372353535851937790883648493


def ladder(u: int, k: int) -> int | None:
    """x-only Montgomery ladder on v² = u³ + A·u² + u (RFC 7748's formulas, affine u in,
    None for the point at infinity), written here from the curve equation."""
    p, a24 = CURVE_P, (CURVE_A - 2) // 4  # 121665
    x2, z2, x3, z3 = 1, 0, u, 1
    for bit in reversed(range(k.bit_length())):
        if (k >> bit) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
        # differential addition and doubling
        a, b = (x2 + z2) % p, (x2 - z2) % p
        c, d = (x3 + z3) % p, (x3 - z3) % p
        da, cb = d * a % p, c * b % p
        x3, z3 = (da + cb) ** 2 % p, u * (da - cb) ** 2 % p
        aa, bb = a * a % p, b * b % p
        e = (aa - bb) % p
        x2, z2 = aa * bb % p, e * (aa + a24 * e) % p
        if (k >> bit) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
    return None if z2 == 0 else x2 * pow(z2, p - 2, p) % p


def small_order_u() -> set[int]:
    """The u-coordinates of Curve25519's points of order dividing 8, found as [L]·P for
    points P of the curve (the curve's group is Z/8 × Z/L): every small-order point is
    such a multiple, and 40 random points reach each of the 4 u-values."""
    found: set[int] = set()
    u = 2
    while len(found) < 4 and u < 400:
        rhs = (u**3 + CURVE_A * u * u + u) % CURVE_P
        if pow(rhs, (CURVE_P - 1) // 2, CURVE_P) == 1:  # on the curve, not its twist
            low = ladder(u, CURVE_L)
            if low is not None:
                found.add(low)
        u += 1
    return found
