"""The batch primitives' two backends (`common.crypto.batch`, design §4.9): the portable one
(pyca/cryptography, gmpy2) and the AVX-512 IFMA one (Intel's crypto_mb) give identical
bytes for every operation the protocol runs on them, refuse the same points, and the
choice between them is made, forced and reported as documented.

The IFMA half runs wherever the CPU has AVX-512 IFMA and the ``ifma`` extra is installed
(the README's install carries it); there a library that does not load is a failure, not a
skip. Installed without the extra (``'.[test]'``), or on a CPU without IFMA, the IFMA half
skips and says which of the two is missing: the portable half runs either way.
"""
from __future__ import annotations

import importlib.metadata
import math
import os
import secrets
import subprocess
import sys

import numpy as np
import pytest

from common.crypto import batch, commutative, crypto_mb, ifma_lanes, paillier
from common.crypto.masking import R_MAX_BITS, RatioMask
from common.errors import InputError, ProtocolError
from tester_service import aggregation
from tests.helpers import TEST_BITS, local_audit, make_inputs
from tests.curve25519 import small_order_u



def ifma_missing() -> str | None:
    """Why the IFMA backend is not expected here, or None where it must load: the CPU
    lacks AVX-512 IFMA, or the `ifma` extra (the wheel carrying crypto_mb) is not installed."""
    if not crypto_mb.cpu_has_ifma():
        return "this CPU has no AVX-512 IFMA"
    try:
        importlib.metadata.distribution("ipp-crypto")
    except importlib.metadata.PackageNotFoundError:
        return "the ifma extra is not installed (pip install -e '.[test,ifma]')"
    return None


HAS_IFMA = ifma_missing() is None
needs_ifma = pytest.mark.skipif(not HAS_IFMA, reason=str(ifma_missing()))


@pytest.fixture
def backend_restored():
    """Leave the process on the backend it had (tests switch it)."""
    batch.backend()
    before = (batch._State.name, batch._State.reason, batch._State.ifma)
    yield
    batch._State.name, batch._State.reason, batch._State.ifma = before


def on_each_backend(call):
    """`call()` on the portable backend and, where the CPU has IFMA, on crypto_mb."""
    out = {}
    for name in ("portable", "ifma") if HAS_IFMA else ("portable",):
        assert batch.select(name) == name
        out[name] = call()
    return out


def random_points(count: int) -> list[bytes]:
    key = commutative.CommutativeKey.generate()
    salt = secrets.token_bytes(32)
    return commutative.split_points(key.encrypt_points(commutative.split_points(
        commutative.hash_ids(salt, [f"m{i}" for i in range(count)]))))


@needs_ifma
def test_the_ifma_backend_loads_on_a_cpu_that_has_it(backend_restored):
    assert batch.select("auto") == "ifma", batch.backend_reason()
    assert batch.backend_reason() == "AVX-512 IFMA found, crypto_mb loaded; IFMA kernel loaded"


@pytest.mark.parametrize("count", [1, 7, 8, 9, 37])
def test_x25519_gives_the_same_bytes_on_both_backends(count, backend_restored):
    points = random_points(count)
    scalar = secrets.token_bytes(32)  # unclamped bytes: both backends clamp
    out = on_each_backend(lambda: batch.x25519_many(scalar, b"".join(points)))
    assert len(out["portable"]) == 32 * count
    assert len(set(out.values())) == 1


def test_x25519_reproduces_rfc7748s_vector_on_both_backends(backend_restored):
    out = on_each_backend(lambda: batch.x25519_many(crypto_mb._RFC7748_SCALAR, crypto_mb._RFC7748_U * 3))
    assert set(out.values()) == {crypto_mb._RFC7748_OUT * 3}


@pytest.mark.parametrize("position", [0, 5, 8, 12])
def test_a_point_of_small_order_is_named_by_both_backends(position, backend_restored):
    """Every u of order dividing 8, at several lanes of a batch: the index is the one at
    fault, and through the cipher it is a ProtocolError counting from the chunk's first
    (u = 0 and 1 are refused there before any multiplication, as not on the curve)."""
    points = random_points(13)
    multiply = commutative.CommutativeKey.generate().multiply_task()
    for u in sorted(small_order_u()):
        bad = points[:position] + [u.to_bytes(32, "little")] + points[position + 1:]

        def refused():
            with pytest.raises(batch.SmallOrderPoint) as info:
                batch.x25519_many(secrets.token_bytes(32), b"".join(bad))
            reason = "has small order" if u > 1 else "is not on Curve25519"
            with pytest.raises(ProtocolError, match=f"point {100 + position} {reason}"):
                multiply(b"".join(bad), 100)
            return info.value.index

        assert set(on_each_backend(refused).values()) == {position}


@pytest.mark.parametrize("bits", [1024, 2047, 2048, 4096, 1500])
def test_exponentiation_gives_the_same_integers_on_both_backends(bits, backend_restored):
    """Moduli crypto_mb serves (1024, 2048, 4096 bits, and 2047 as p^2 can be) and one it
    does not (1500 bits: the IFMA process falls back to gmpy2 for it)."""
    modulus = secrets.randbits(bits) | (1 << (bits - 1)) | 1
    bases = [secrets.randbelow(modulus) for _ in range(11)] + [modulus + 5]  # one base above the modulus
    exps = [secrets.randbits(80) for _ in range(12)]
    out = on_each_backend(lambda: batch.powmod_many(bases, exps, modulus, 80))
    expected = [pow(b, e, modulus) for b, e in zip(bases, exps)]
    assert all(v == expected for v in out.values())
    shared = on_each_backend(lambda: batch.powmod_many(bases, 3, modulus, 2))
    assert all(v == [pow(b, 3, modulus) for b in bases] for v in shared.values())


def test_an_exponent_wider_than_its_stated_width_is_refused(backend_restored):
    for name in on_each_backend(lambda: batch.backend()):
        batch.select(name)
        with pytest.raises(ValueError, match="wider than 80 bits"):
            batch.powmod_many([3], [1 << 80], (1 << 2047) + 1, 80)
        with pytest.raises(ValueError, match="2 bases but 1 exponents"):
            batch.powmod_many([3, 4], [1], (1 << 2047) + 1, 80)


@pytest.fixture(scope="module")
def key() -> paillier.PrivateKey:
    return paillier.generate_keypair(TEST_BITS, allow_insecure=True)


def test_decryption_gives_the_same_plaintexts_on_both_backends(key, backend_restored):
    values = [secrets.randbelow(1 << 200) for _ in range(19)]
    cts = paillier.encrypt_chunk(key.public.n, key.public.h, values)
    out = on_each_backend(lambda: (key.decrypt_mod_p(cts), key.decrypt_task(signed=True)(cts), key.decrypt_signed(cts)))
    assert len(set(map(repr, out.values()))) == 1
    assert out["portable"][0] == values and out["portable"][2] == values


def test_owner_encryption_gives_the_same_ciphertexts_on_both_backends(key, backend_restored):
    """The same plaintexts and randomizer exponents give the same bytes in a process on
    either backend (the tables stay on gmpy2 on both, design §4.9), and they are the
    textbook (1 + m n) h^alpha mod n^2."""
    n = key.public.n
    values = [secrets.randbelow(n) for _ in range(10)]
    alphas = [secrets.randbits(paillier.RANDOMIZER_BITS) for _ in values]
    out = on_each_backend(lambda: key.encrypt_task().with_randomizers(values, alphas))
    assert len(set(out.values())) == 1
    width = key.public.ciphertext_bytes
    expected = b"".join(((1 + m * n) * pow(key.public.h, a, n * n) % (n * n)).to_bytes(width, "big")
                        for m, a in zip(values, alphas))
    assert out["portable"] == expected


def test_masking_gives_the_same_masked_values_on_both_backends(key, backend_restored):
    """The ratio masks' factors as one batch at R_MAX_BITS: what decrypts is r·X + noise
    on both backends (the rerandomisation differs, as it must)."""
    n = key.public.n
    values = [secrets.randbelow(1 << 40) for _ in range(9)]
    cts = paillier.encrypt_chunk(n, key.public.h, values)
    masks = [RatioMask.draw() for _ in values]
    assert all(m.r < 1 << R_MAX_BITS for m in masks)
    pairs = [(m.r, m.e_num) for m in masks]
    out = on_each_backend(lambda: key.decrypt_signed(aggregation.mask_chunk(n, key.public.h, cts, pairs, None)))
    assert all(v == [m.r * x + m.e_num for m, x in zip(masks, values)] for v in out.values())


def test_an_audit_gives_the_same_result_on_both_backends(backend_restored):
    """The same audit (no release controls, seeded bootstrap) on each backend: the same
    estimates and intervals, to the ratio masks' stated precision (their noise is fresh)."""
    tester_df, client_df = make_inputs(300, 300, 200, seed=3)

    def audit():
        result, _, _ = local_audit(tester_df, client_df)
        return tuple((g.group, round(g.estimate, 9), round(g.ci_low, 9), round(g.ci_high, 9)) for g in result.groups)

    out = on_each_backend(audit)
    assert len(set(out.values())) == 1


# ---------------------------------------------------------------------- the choice
def test_an_unknown_backend_is_refused_naming_the_variable(backend_restored):
    with pytest.raises(InputError, match="PPRE_CRYPTO_BACKEND='fast': expected one of auto, portable, ifma"):
        batch.select("fast")


def test_an_unavailable_ifma_backend_falls_back_or_refuses(monkeypatch, backend_restored):
    def unavailable():
        raise crypto_mb.Unavailable("this CPU has no AVX-512 IFMA (no avx512ifma in /proc/cpuinfo)")

    monkeypatch.setattr(crypto_mb, "load", unavailable)
    assert batch.select("auto") == "portable"
    assert "no AVX-512 IFMA" in batch.backend_reason()
    with pytest.raises(InputError, match="PPRE_CRYPTO_BACKEND=ifma, but the IFMA backend cannot run here: "
                                           "this CPU has no AVX-512 IFMA"):
        batch.select("ifma")


@needs_ifma
def test_a_library_that_fails_its_known_answers_is_not_used(monkeypatch, backend_restored):
    real = crypto_mb.CryptoMB.x25519

    def wrong(self, scalar, packed):
        out, low = real(self, scalar, packed)
        return bytes(len(out)), low

    monkeypatch.setattr(crypto_mb.CryptoMB, "x25519", wrong)
    assert batch.select("auto") == "portable"
    assert batch.backend_reason() == "crypto_mb failed its X25519 known-answer check"


def test_the_environment_forces_the_portable_backend_in_a_fresh_process():
    code = "from common.crypto import batch, commutative; print(batch.backend(), batch.backend_reason())"
    for value, expected in [("portable", "portable PPRE_CRYPTO_BACKEND=portable")] + (
            [("ifma", "ifma PPRE_CRYPTO_BACKEND=ifma; IFMA kernel loaded")] if HAS_IFMA else []):
        env = dict(os.environ, PPRE_CRYPTO_BACKEND=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected


def test_a_command_refuses_an_unknown_backend_before_any_work(tmp_path):
    env = dict(os.environ, PPRE_CRYPTO_BACKEND="bogus")
    out = subprocess.run([sys.executable, "-m", "ppre.cli", "certs", "init", str(tmp_path / "certs")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "ppre certs: error: PPRE_CRYPTO_BACKEND='bogus': expected one of auto, portable, ifma" in out.stderr
    assert not (tmp_path / "certs").exists()


# ---------------------------------------------------------------------- our fixed-base kernel
@needs_ifma
@pytest.mark.parametrize("bits,window", [(1023, 8), (2047, 11), (2048, 5), (4096, 8), (ifma_lanes.MAX_MODULUS_BITS, 3)])
def test_the_fixed_base_kernel_gives_gmpy2s_integers(bits, window, backend_restored):
    """The kernel's lanes against gmpy2's table for moduli from the tests' p^2 to its
    largest, exponents 0, 1, the widest and random ones, in batches not a multiple of 8."""
    assert batch.select("ifma") == "ifma" and batch._State.kernel is not None, batch.backend_reason()
    modulus = secrets.randbits(bits) | (1 << (bits - 1)) | 1
    base = secrets.randbelow(modulus)
    lanes = batch.fixed_base(base, modulus, 512, window)
    assert isinstance(lanes, ifma_lanes.FixedBaseLanes)
    exps = [0, 1, (1 << 512) - 1] + [secrets.randbits(512) for _ in range(18)]
    expected = [pow(base, e, modulus) for e in exps]
    assert lanes.pow_many(exps) == expected
    assert lanes.pow_many(exps[:5]) == expected[:5] and lanes.pow_many([]) == []
    assert batch.FixedBase(base, modulus, 512, window).pow_many(exps) == expected
    with pytest.raises(ValueError, match="wider than 512 bits"):
        lanes.pow_many([1 << 512])


@needs_ifma
def test_a_kernel_that_is_not_built_or_fails_its_known_answers_leaves_the_tables_on_gmpy2(monkeypatch, backend_restored):
    monkeypatch.setattr(ifma_lanes, "_library_path", lambda: None)
    assert batch.select("ifma") == "ifma"
    assert batch.backend_reason().endswith("fixed-base products and aggregation on gmpy2: the IFMA kernel was not "
                                           "built at install (no C compiler with -mavx512ifma)")
    assert isinstance(batch.fixed_base(3, (1 << 2047) + 1, 64, 4), batch.FixedBase)
    monkeypatch.undo()
    monkeypatch.setattr(ifma_lanes.FixedBaseLanes, "pow_many", lambda self, exps: [0] * len(exps))
    assert batch.select("ifma") == "ifma"
    assert batch.backend_reason().endswith("the IFMA kernel failed its known-answer check")
    assert batch._State.kernel is None


@pytest.mark.parametrize("bits", [1024, 2048, 4096])
def test_multi_exponentiation_gives_the_same_integers_on_both_backends(bits, backend_restored):
    """Columns of weights over one bucket's ciphertexts, as the aggregation forms them:
    more columns than lanes, zeros, the widest 32- and 64-bit weights, a column wider than
    64 bits and one with a negative weight (both for gmpy2, also on the IFMA backend)."""
    modulus = secrets.randbits(bits) | (1 << (bits - 1)) | 1
    bases = [secrets.randbelow(modulus) for _ in range(37)]
    columns = [[secrets.randbits(32) for _ in bases] for _ in range(11)]
    columns += [[0] * 37, [(1 << 32) - 1] * 37, [(1 << 64) - 1] + [0] * 36]
    expected = [math.prod(pow(b, e, modulus) for b, e in zip(bases, col)) % modulus for col in columns]
    out = on_each_backend(lambda: batch.multi_exp_many(bases, columns, modulus))
    assert all(v == expected for v in out.values())
    wide = [[1 << 70] + [1] * 36]
    assert all(v == [math.prod(pow(b, e, modulus) for b, e in zip(bases, wide[0])) % modulus]
               for v in on_each_backend(lambda: batch.multi_exp_many(bases, wide, modulus)).values())
    with pytest.raises(ValueError, match="non-negative"):
        batch.multi_exp_many(bases, [[-1] + [0] * 36], modulus)


@pytest.mark.parametrize("bits", [1024, 4096])
def test_a_wide_multi_exponentiation_gives_the_same_integers_on_both_backends(bits, backend_restored):
    """Exponents of any width (LOT's masks: 100-160 bits) in 64-bit limbs on the lanes,
    joined by Horner's rule: the same integers as gmpy2's Pippenger, for one limb, a limb
    and a bit, several limbs, a zero column and more columns than lanes."""
    modulus = secrets.randbits(bits) | (1 << (bits - 1)) | 1
    bases = [secrets.randbelow(modulus) for _ in range(23)]
    for width in (1, 64, 65, 146, 200):
        columns = [[secrets.randbits(width) for _ in bases] for _ in range(9)] + [[0] * 23, [(1 << width) - 1] * 23]
        expected = [math.prod(pow(b, e, modulus) for b, e in zip(bases, col)) % modulus for col in columns]
        assert all(v == expected for v in on_each_backend(
            lambda: batch.multi_exp_wide(bases, columns, modulus)).values()), width
    with pytest.raises(ValueError, match="non-negative"):
        batch.multi_exp_wide(bases, [[-1] + [0] * 22], modulus)


def test_the_aggregation_gives_the_same_bucket_sums_on_both_backends(key, backend_restored):
    """`bucket_sums_chunk` with one column of signed weights (a derived pair weight a few
    units below 0) beside non-negative ones: the same ciphertexts on both backends, and
    they decrypt to the weighted sums."""
    n = key.public.n
    values = [secrets.randbelow(1 << 20) for _ in range(23)]
    cts = paillier.encrypt_chunk(n, key.public.h, values)
    columns = [[secrets.randbits(32) for _ in values] for _ in range(9)] + [[-3] + [5] * 22]
    out = on_each_backend(lambda: aggregation.bucket_sums_chunk(n, [(cts, columns)]))
    assert len(set(map(repr, out.values()))) == 1
    sums = key.decrypt_signed(out["portable"][0])
    assert sums == [sum(w * v for w, v in zip(col, values)) for col in columns]


def test_the_replicates_are_the_same_integers_on_both_backends(backend_restored):
    """`aggregation.replicate_chunk`: the subset tables on gmpy2 (portable) and one
    multi-exponentiation per replicate in the kernel's lanes (ifma) give every replicate
    as the plain product Π_m C[m]^count, for multinomial-like counts, a row of zeros,
    one replicate and a number of replicates that is no multiple of eight."""
    modulus = secrets.randbits(2048) | (1 << 2047) | 1
    n2 = modulus * modulus
    rng = np.random.default_rng(11)
    for m, rows in ((128, 13), (7, 1), (40, 9)):
        columns = [[secrets.randbelow(n2 - 2) + 2 for _ in range(m)] for _ in range(3)]
        counts = rng.poisson(1.0, size=(rows, m))
        counts[0] = 0
        expected = [math.prod(pow(b, int(e), n2) for b, e in zip(col, row)) % n2
                    for row in counts.tolist() for col in columns]
        out = on_each_backend(lambda: aggregation.replicate_chunk(modulus, columns, counts.tolist()))
        assert all(v == expected for v in out.values()), {k: v == expected for k, v in out.items()}
