"""The raw cryptographic layer, the hazmat fence (design §3.1-§3.2 and §4.2-§4.7): Paillier
on raw integers (`paillier`), the commutative X25519 cipher of the private set intersection
(`commutative`), AES-256-GCM row sealing (`symmetric`), the ratio masks (`masking`) and the
fixed-point encoding that keeps every value inside its Paillier slot (`encoding`), and the
batch primitives under them with their two backends (`batch`: portable, or AVX-512 IFMA
through Intel's crypto_mb, `crypto_mb`, and our own kernel, `ifma_lanes`). Each key
does its own secret work: it prints no secret, refuses to be pickled, and hands a worker
process only a narrow, picklable task (`decrypt_task`, `multiply_task`), so the caller's
executor never holds a key. Nothing here knows of sessions, parties, the network or
executors: the modules of this package import nothing of the project but `common.errors`
and each other, a rule that tests/test_layering.py holds.
"""
