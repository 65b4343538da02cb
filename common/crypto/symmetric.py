"""AES-256-GCM sealing of race-probability vectors (design §3.2-§3.6).

P1 seals each member's probability vector with a per-session key; P2 only stores and
returns the sealed blobs. Each blob is nonce(12) || ciphertext || tag(16) with a
random 96-bit nonce (a counter would let P1 recognise rows after P2's shuffle).
The row layout is k float64 values (little-endian).

The key lives only inside `RowSealer` (design §7): repr/str show `<secret>`, and pickling
or copying raises TypeError (sealing and opening run in the Tester's own process).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.errors import ProtocolError

NONCE_BYTES = 12
TAG_BYTES = 16
_AAD = b"ppre-race-probabilities-v1"


def sealed_width(k: int) -> int:
    return NONCE_BYTES + 8 * k + TAG_BYTES


@dataclass
class RowSealer:
    """The per-session symmetric key of P1 (memory only)."""

    _aead: AESGCM = field(repr=False)

    @classmethod
    def generate(cls) -> "RowSealer":
        return cls(AESGCM(AESGCM.generate_key(bit_length=256)))

    def __repr__(self) -> str:
        return "RowSealer(<AES-256-GCM key, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("the row-sealing key is never serialised")

    def seal_rows(self, rows: np.ndarray) -> bytes:
        rows = np.ascontiguousarray(rows, dtype="<f8")
        out = bytearray()
        for row in rows:
            nonce = secrets.token_bytes(NONCE_BYTES)
            out += nonce + self._aead.encrypt(nonce, row.tobytes(), _AAD)
        return bytes(out)

    def open_rows(self, packed: bytes, k: int) -> np.ndarray:
        width = sealed_width(k)
        if len(packed) % width:
            raise ProtocolError(f"sealed table of {len(packed)} bytes is not a multiple of {width}")
        rows = np.empty((len(packed) // width, k))
        for i in range(rows.shape[0]):
            blob = packed[i * width:(i + 1) * width]
            try:
                plain = self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _AAD)
            except InvalidTag:
                raise ProtocolError(f"sealed row {i} failed authentication") from None
            rows[i] = np.frombuffer(plain, dtype="<f8")
        return rows
