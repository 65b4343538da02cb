"""No tests: they live in the files of the behaviours they test. This module stays only
while tests/test_crypto_backends.py imports `small_order_u` from it; the function lives in
tests/curve25519.py, and this file goes once that import names it there."""
from tests.curve25519 import small_order_u  # noqa: F401
