"""Commutative encryption of member ids on Curve25519 (design §3.1-§3.5).

`RO(x) = hash_to_curve(SHA-256(salt || x))` maps an id to a point of Curve25519 (its
Montgomery u-coordinate) by rejection sampling; `Com.Enc_k(P) = [k]P` is X25519
scalar multiplication (Pohlig-Hellman on the curve). Clamped X25519 scalars are
multiples of the cofactor 8, so `[k1][k2]P = [k2][k1]P` and every encrypted point
lies in the prime-order subgroup.

Points cross the wire as 32-byte little-endian u-coordinates, packed back to back in
one `bytes` value per chunk. `validate_points` is the one place where a peer's points
are checked: canonical encoding, on the curve (not its twist), not of small order.

Session material never prints and is never pickled (design §7): `CommutativeKey` and
`SessionSalt` show `<secret>` in repr/str and raise TypeError when pickled or copied
(neither ever needs to reach a worker process). The salt is not a key: both shares
cross the wire, so the peer (and whoever could read the TLS link) knows it; it is still
session material and stays out of logs and files.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Sequence

import gmpy2
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from common.crypto import batch
from common.errors import ProtocolError

P = 2**255 - 19
A = 486662
POINT_BYTES = 32
_MAX_TRIES = 128  # each try succeeds with probability ~1/2: 2^-128 failure


def _on_curve(u: int) -> bool:
    """True when u is the u-coordinate of a point of Curve25519 itself (not the twist)."""
    rhs = (u * u * u + A * u * u + u) % P
    return gmpy2.jacobi(rhs, P) == 1


class SessionSalt(bytes):
    """The per-session RO salt: bytes that print as `SessionSalt(<secret>)` and refuse pickling."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SessionSalt(<secret>)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __reduce_ex__(self, protocol):
        raise TypeError("the session salt is never serialised (use hash_task() for a worker)")

    __reduce__ = __reduce_ex__

    def hash_task(self) -> "HashToCurve":
        """RO for worker processes: the one operation, picklable, printing no secret."""
        return HashToCurve(bytes(self))


def session_salt(tester_share: bytes, client_share: bytes) -> SessionSalt:
    """The per-session RO salt: both parties contribute 32 random bytes, neither chooses it."""
    if len(tester_share) != 32 or len(client_share) != 32:
        raise ProtocolError("salt shares must be 32 bytes each")
    return SessionSalt(hashlib.sha256(b"ppre-ro-salt-v1" + tester_share + client_share).digest())


def hash_to_curve(salt: bytes, member_id: str) -> bytes:
    """RO(id): SHA-256(salt || id), then rejection sampling onto Curve25519 (design §3.1)."""
    seed = hashlib.sha256(salt + member_id.encode("utf-8")).digest()
    for counter in range(_MAX_TRIES):
        digest = hashlib.sha256(seed + counter.to_bytes(2, "little")).digest()
        u = int.from_bytes(digest, "little") & ((1 << 255) - 1)
        if u < P and u > 1 and _on_curve(u):
            return u.to_bytes(32, "little")
    raise RuntimeError("hash_to_curve: no point found")  # pragma: no cover (prob. 2^-128)


def hash_ids(salt: bytes, member_ids: list[str]) -> bytes:
    """RO over a chunk of ids; returns the points packed back to back."""
    return b"".join(hash_to_curve(salt, m) for m in member_ids)


class HashToCurve:
    """RO(id) over a chunk of ids, as a task an executor can send to a worker process
    (`common.execution.parallel`): carries the session salt and nothing else. Deliberately
    picklable (built for workers); prints no secret."""

    __slots__ = ("_salt",)

    def __init__(self, salt: bytes) -> None:
        self._salt = bytes(salt)

    def __repr__(self) -> str:
        return "HashToCurve(<secret>)"

    __str__ = __repr__

    def __reduce__(self):
        return (HashToCurve, (self._salt,))

    def __call__(self, member_ids: Sequence[str]) -> bytes:
        return hash_ids(self._salt, member_ids)


def encrypt_ids(hash_task: HashToCurve, multiply: "ScalarMultiplication", member_ids: Sequence[str]) -> bytes:
    """Com.Enc_sk(RO(id)) for a chunk of ids, packed (one worker task for both steps)."""
    return multiply.points(hash_task(member_ids))


def split_points(packed: bytes) -> list[bytes]:
    if len(packed) % POINT_BYTES:
        raise ProtocolError(f"point table of {len(packed)} bytes is not a multiple of {POINT_BYTES}")
    return [packed[i:i + POINT_BYTES] for i in range(0, len(packed), POINT_BYTES)]


#: u-coordinates of the points of small order on Curve25519 that are on the curve
#: itself (order 4 and 8; 0 and the twist's are refused as off the curve)
SMALL_ORDER_U = frozenset({
    1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
})


def check_points(packed: bytes, first: int = 0) -> list[bytes]:
    """A peer's packed points that no scalar multiplication will check (the shuffled
    table, compared only): `validate_points`, and none of small order (`first`: the
    index of the first point, for the error message). Top-level, so that the Tester
    can run it on its executor as the table arrives."""
    points = validate_points(packed, first)
    for i, pt in enumerate(points):
        if int.from_bytes(pt, "little") in SMALL_ORDER_U:
            raise ProtocolError(f"point {first + i} has small order")
    return points


def validate_points(packed: bytes, first: int = 0) -> list[bytes]:
    """Check a peer's packed points: canonical, on the curve, not the identity (`first`:
    the index of the first point, for the error message).

    Small-order points are rejected later by X25519 itself (all-zero output), which
    `CommutativeKey.encrypt` turns into a ProtocolError.
    """
    points = split_points(packed)
    for i, pt in enumerate(points):
        u = int.from_bytes(pt, "little")
        if u >= P:
            raise ProtocolError(f"point {first + i} is not canonically encoded")
        if u < 2 or not _on_curve(u):
            raise ProtocolError(f"point {first + i} is not on Curve25519")
    return points


@dataclass
class CommutativeKey:
    """A per-session commutative key sk (X25519 scalar). Held in memory only."""

    _key: X25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> "CommutativeKey":
        return cls(X25519PrivateKey.from_private_bytes(secrets.token_bytes(32)))

    def __repr__(self) -> str:  # never print key material
        return "CommutativeKey(<X25519 scalar, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a commutative key is never serialised (use multiply_task() for a worker)")

    def multiply_task(self) -> "ScalarMultiplication":
        """Com.Enc_sk for worker processes: the one operation, picklable, printing no secret
        (the scalar travels to the worker through the executor, in memory only)."""
        return ScalarMultiplication(self._key.private_bytes_raw())

    def encrypt_points(self, points: list[bytes]) -> bytes:
        """Com.Enc_sk on already validated points; returns packed points."""
        return _multiply(self._key.private_bytes_raw(), b"".join(points))

    def encrypt_packed(self, packed: bytes) -> bytes:
        """Validate a peer's packed points and encrypt them."""
        validate_points(packed)
        return _multiply(self._key.private_bytes_raw(), packed)


def _multiply(scalar: bytes, packed: bytes, first: int = 0) -> bytes:
    """[k]P for each point of a packed table, on the process's batch backend
    (`common.crypto.batch`); a point of small order (all-zero result) is a ProtocolError
    naming it."""
    try:
        return batch.x25519_many(scalar, packed)
    except batch.SmallOrderPoint as exc:
        raise ProtocolError(f"point {first + exc.index} has small order") from None


class ScalarMultiplication:
    """Com.Enc_sk as a task an executor can send to a worker process: carries the X25519
    scalar and nothing else. Deliberately picklable (built for workers); prints no secret."""

    __slots__ = ("_scalar",)

    def __init__(self, scalar: bytes) -> None:
        if len(scalar) != POINT_BYTES:
            raise ValueError("an X25519 scalar is 32 bytes")
        self._scalar = bytes(scalar)

    def __repr__(self) -> str:
        return "ScalarMultiplication(<X25519 scalar, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        return (ScalarMultiplication, (self._scalar,))

    def points(self, packed: bytes) -> bytes:
        """[sk]P for a packed table of points we made ourselves (already on the curve)."""
        return _multiply(self._scalar, packed)

    def __call__(self, packed: bytes, first: int = 0) -> bytes:
        """Validate a peer's packed points (`validate_points`; `first`: the index of the
        chunk's first point, for the error message) and multiply them: packed result."""
        validate_points(packed, first)
        return _multiply(self._scalar, packed, first)
