"""Steps 3 and 5's per-chunk work (design §3.3, §3.5), as tasks an executor sends to its workers.

Kept apart from the session (`tester_service.protocol`) so that a worker process imports
only the cryptography it runs (`common.crypto`), not the metric catalogue, pandas and the
protocol: a worker's first task would otherwise spend most of a small audit's PSI on
imports (bench/RESULTS.md, "A small audit from a fresh process").
"""
from __future__ import annotations

from common.crypto import commutative


def double_client_chunk(multiply: commutative.ScalarMultiplication, points: bytes, first: int) -> bytes:
    """Step 5 for one chunk of the Test-Client's rows: their points doubly encrypted (the
    task checks them, `commutative.validate_points`; `first`: the chunk's first row, for
    the error). The rows' ciphertexts stay with the session: only the rows that join are
    ever used, and their ciphertexts are checked where they are aggregated
    (`tester_service.aggregation.bucket_sums_packed`), so the others never travel to a
    worker. Top-level, so that an executor can send it to a worker process."""
    return multiply(points, first)


def check_shuffled_chunk(points: bytes, first: int) -> None:
    """Step 3 for one chunk of the shuffled table (our rows, doubly encrypted by the
    Test-Client): its points are canonical, on Curve25519 and not of small order
    (`commutative.check_points`; `first`: the chunk's first row, for the error). Nothing
    is returned: the session keeps the chunk it already holds."""
    commutative.check_points(points, first)
