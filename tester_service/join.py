"""Step 5's per-chunk work (design §3.5), as a task an executor sends to its workers.

Kept apart from the session (`tester_service.protocol`) so that a worker process imports
only the cryptography it runs (`common.crypto`), not the metric catalogue, pandas and the
protocol: a worker's first task would otherwise spend most of a small audit's PSI on
imports (bench/RESULTS.md, "A small audit from a fresh process").
"""
from __future__ import annotations

from common.crypto import commutative, paillier


def double_client_chunk(multiply: commutative.ScalarMultiplication, points: bytes, first: int, ciphertexts: bytes,
                        public_key: paillier.PublicKey | None) -> bytes:
    """Step 5 for one chunk of the Test-Client's rows: check its ciphertexts (each a unit
    of Z_{n²} under the Test-Client's key, `paillier.ciphertexts_from_bytes`, as
    `common.protocol.validation.check_ciphertexts` does) and return its points doubly
    encrypted (the task checks them, `commutative.validate_points`). Top-level, so that
    an executor can send it to a worker process."""
    if ciphertexts:
        paillier.ciphertexts_from_bytes(ciphertexts, public_key)
    return multiply(points, first)
