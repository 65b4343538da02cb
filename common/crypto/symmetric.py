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
        """Each row sealed under its own random nonce (all the chunk's nonces read from
        the OS in one call: a third of the per-row cost was the call)."""
        rows = np.ascontiguousarray(rows, dtype="<f8")
        nonces = secrets.token_bytes(NONCE_BYTES * len(rows))
        out = bytearray()
        for i, row in enumerate(rows):
            nonce = nonces[i * NONCE_BYTES:(i + 1) * NONCE_BYTES]
            out += nonce + self._aead.encrypt(nonce, row.tobytes(), _AAD)
        return bytes(out)

    def open_rows(self, packed: bytes, k: int) -> np.ndarray:
        width = sealed_width(k)
        if len(packed) % width:
            raise ProtocolError(f"sealed table of {len(packed)} bytes is not a multiple of {width}")
        view, decrypt, plains = memoryview(packed), self._aead.decrypt, []
        for i, start in enumerate(range(0, len(packed), width)):
            try:
                plains.append(decrypt(view[start:start + NONCE_BYTES], view[start + NONCE_BYTES:start + width], _AAD))
            except InvalidTag:
                raise ProtocolError(f"sealed row {i} failed authentication") from None
        return np.frombuffer(b"".join(plains), dtype="<f8").reshape(len(plains), k).astype(np.float64)
