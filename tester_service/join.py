"""Steps 3 and 5's per-chunk work (design §3.3, §3.5), as tasks an executor sends to its workers.

Kept apart from the session (`tester_service.protocol`) so that a worker process imports
only the cryptography it runs (`common.crypto`), not the metric catalogue, pandas and the
protocol: a worker's first task would otherwise spend most of a small audit's PSI on
imports (bench/RESULTS.md, "A small audit from a fresh process").
"""
from __future__ import annotations

from common.crypto import commutative, paillier


def double_client_chunk(multiply: commutative.ScalarMultiplication, points: bytes, first: int, ciphertexts: bytes,
                        public_key: paillier.PublicKey | None) -> bytes:
    """Step 5 for one chunk of the Test-Client's rows: check its ciphertexts, every row's
    whether it joins or not (`paillier.ciphertexts_from_bytes`, as
    `common.protocol.validation.check_ciphertexts` does: a check of the joined rows alone
    would tell a Test-Client which of its members we hold, by failing or not), and return
    its points doubly encrypted (the task checks them, `commutative.validate_points`).
    Top-level, so that an executor can send it to a worker process."""
    if ciphertexts:
        paillier.ciphertexts_from_bytes(ciphertexts, public_key)
    return multiply(points, first)


def check_shuffled_chunk(points: bytes, first: int) -> None:
    """Step 3 for one chunk of the shuffled table (our rows, doubly encrypted by the
    Test-Client): its points are canonical, on Curve25519 and not of small order
    (`commutative.check_points`; `first`: the chunk's first row, for the error). Nothing
    is returned: the session keeps the chunk it already holds."""
    commutative.check_points(points, first)
