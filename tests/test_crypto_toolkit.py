"""The HE toolkit and primitives of SPEC.md sections 3-4."""
from __future__ import annotations

import math
import secrets
from fractions import Fraction

import gmpy2
import numpy as np
import pytest

from common import commutative, encoding, paillier
from common.errors import EncodingOverflowError, ProtocolError
from common.masking import NOISE_BITS, AdditiveMask, RatioMask, masked_ratio
from common.symmetric import RowSealer, sealed_width

BITS = 1024


@pytest.fixture(scope="module")
def key() -> paillier.PrivateKey:
    return paillier.generate_keypair(BITS, allow_insecure=True)


# ---------------------------------------------------------------- commutative encryption
def test_commutative_encryption_commutes_and_hashes_onto_the_curve():
    salt = secrets.token_bytes(32)
    k1, k2 = commutative.CommutativeKey.generate(), commutative.CommutativeKey.generate()
    points = commutative.hash_ids(salt, ["alice", "bob", "carol"])
    assert len(points) == 96
    commutative.validate_points(points)  # on the curve
    a = k2.encrypt_packed(k1.encrypt_packed(points))
    b = k1.encrypt_packed(k2.encrypt_packed(points))
    assert a == b
    assert a != points
    # a fresh salt gives unrelated points (per-session random oracle)
    assert commutative.hash_ids(secrets.token_bytes(32), ["alice"]) != points[:32]


def test_peer_points_are_validated():
    key = commutative.CommutativeKey.generate()
    with pytest.raises(ProtocolError, match="multiple of 32"):
        key.encrypt_packed(b"\x01" * 33)
    twist = next(u for u in range(2, 1000) if not commutative._on_curve(u))
    with pytest.raises(ProtocolError, match="not on Curve25519"):
        key.encrypt_packed(twist.to_bytes(32, "little"))
    with pytest.raises(ProtocolError, match="not canonically encoded"):
        key.encrypt_packed((commutative.P + 5).to_bytes(32, "little"))
    with pytest.raises(ProtocolError):
        key.encrypt_packed(b"\x00" * 32)  # the identity / order-2 point
    # a point of small order on the curve itself: X25519 gives all zeros
    small = 325606250916557431795983626356110631294008115727848805560023387167927233504
    assert commutative._on_curve(small)
    with pytest.raises(ProtocolError, match="small order"):
        key.encrypt_packed(small.to_bytes(32, "little"))


def test_keys_do_not_print():
    assert "secret" in repr(commutative.CommutativeKey.generate())
    assert "secret" in repr(RowSealer.generate())


# ---------------------------------------------------------------- Paillier
def test_paillier_refuses_small_moduli():
    with pytest.raises(ValueError, match="2048"):
        paillier.generate_keypair(1024)
    small = paillier.generate_keypair(BITS, allow_insecure=True).public
    n, h = small.to_bytes()
    with pytest.raises(ProtocolError, match="refused"):
        paillier.PublicKey.from_bytes(n, h)


def test_paillier_round_trip_and_homomorphism(key):
    pub = key.public
    values = [0, 1, 12345, 2**200]
    cts = paillier.encrypt_chunk(pub.n, pub.h, values)
    assert key.decrypt_mod_p(cts) == values
    assert len(set(paillier.encrypt_chunk(pub.n, pub.h, [7, 7]))) == 2  # randomised
    weights = [3, 0, 5, 1]
    agg = paillier.multi_exp(cts, weights, pub.n2)
    assert key.decrypt_mod_p([agg])[0] == sum(v * w for v, w in zip(values, weights))
    assert key.decrypt_mod_p([paillier.add_plain(pub.n, cts[1], 41)])[0] == 42
    assert key.decrypt_mod_p([paillier.scalar_pow(pub.n, cts[2], 3)])[0] == 3 * 12345
    rr = paillier.rerandomize_chunk(pub.n, pub.h, [cts[2]])[0]
    assert rr != cts[2] and key.decrypt_mod_p([rr])[0] == 12345


def test_multi_exp_matches_naive_for_many_windows(key):
    pub = key.public
    rng = np.random.default_rng(3)
    for count, bits in [(1, 1), (5, 3), (40, 32), (300, 32)]:
        cts = paillier.encrypt_chunk(pub.n, pub.h, list(range(count)))
        ws = [int(x) for x in rng.integers(0, 2**bits, count, dtype=np.uint64)]
        assert paillier.multi_exp(cts, ws, pub.n2) == math.prod(
            int(gmpy2.powmod(c, w, pub.n2)) for c, w in zip(cts, ws)) % pub.n2


def test_ciphertexts_out_of_range_are_refused(key):
    pub = key.public
    width = pub.ciphertext_bytes
    for bad in (0, pub.n2, pub.n2 + 1, pub.n):  # zero, too large, not a unit
        with pytest.raises(ProtocolError, match="out of range"):
            paillier.ciphertexts_from_bytes(int(bad % (1 << (8 * width))).to_bytes(width, "big"), pub)
    with pytest.raises(ProtocolError, match="multiple"):
        paillier.ciphertexts_from_bytes(b"\x01" * (width + 1), pub)


# ---------------------------------------------------------------- encodings
def test_fixed_point_scale_is_tracked_through_products():
    a = encoding.FixedPoint(3 << 16, 16)  # 3.0
    b = encoding.FixedPoint(1 << 31, 32)  # 0.5
    assert (a * b).scale_bits == 48 and (a * b).to_float() == 1.5


def test_quantized_probabilities_sum_exactly():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), 1000)
    q = encoding.quantize_probabilities(p, 32)
    assert (q.sum(axis=1) == 2**32).all() and (q >= 0).all()
    assert np.abs(q / 2**32 - p).max() <= 2**-32 + 1e-15
    one_hot = np.eye(6)[[0, 5, 2]]
    assert (encoding.quantize_probabilities(one_hot) == one_hot.astype(np.int64) * 2**32).all()


def test_signed_encoding_and_overflow_detection():
    n = 1009 * 1013
    for x in (0, 1, -1, n // 3, -(n // 3)):
        assert encoding.decode_signed(encoding.encode_signed(x, n), n) == x
    with pytest.raises(EncodingOverflowError):
        encoding.encode_signed(n // 3 + 1, n)
    with pytest.raises(EncodingOverflowError):
        encoding.decode_signed(n // 2, n)  # the middle third: overflow, never a wrapped number


def test_slots_pack_signed_values_and_refuse_overflow():
    layout = encoding.SlotLayout(16, 3)
    for values in ([1, 2, 3], [-5, 7, -32767], [32767, -1, 0]):
        assert layout.unpack(layout.pack(values)) == values
    with pytest.raises(EncodingOverflowError):
        layout.pack([1 << 15, 0, 0])
    with pytest.raises(EncodingOverflowError):
        layout.unpack(1 << 48)
    with pytest.raises(EncodingOverflowError, match="slots hold 15 bits"):
        layout.check_bound(1 << 15, "a sum")


def test_homomorphic_overflow_is_reported_not_wrapped(key):
    """A sum past the plaintext third decodes as an error, not as a wrapped number."""
    pub = key.public
    big = key.p // 3 - 10
    cts = paillier.encrypt_chunk(pub.n, pub.h, [big, big])
    total = key.decrypt_mod_p([paillier.multi_exp(cts, [1, 1], pub.n2)])[0]
    with pytest.raises(EncodingOverflowError):
        encoding.decode_signed(total, key.p)


# ---------------------------------------------------------------- masking
def test_bare_common_factor_leaks_through_gcd_but_our_mask_does_not():
    num, den = 3 * 2**32 + 12345, 17 * 2**32 + 999
    q = secrets.randbits(64) | 1
    assert math.gcd(q * num, q * den) % q == 0  # the attack works on a bare factor
    recovered = []
    for _ in range(200):
        mask = RatioMask.draw()
        a, b = mask.apply_plain(num, den)
        g = math.gcd(a, b)
        assert g % mask.r != 0  # the gcd no longer reveals the mask
        assert a // g != num and b // g != den  # nor Num and Den
        recovered.append(g)
    assert max(recovered) < 2**NOISE_BITS * 2**16


def test_ratio_mask_keeps_the_ratio_and_flags_empty_groups():
    num, den = 5 * 2**32 + 3, 11 * 2**32 + 7
    for _ in range(100):
        a, b = RatioMask.draw().apply_plain(num, den)
        assert abs(masked_ratio(a, b) - num / den) <= 1e-12
    mask = RatioMask.draw()
    assert masked_ratio(*mask.apply_plain(0, den)) == 0.0
    assert masked_ratio(*mask.apply_plain(num, 0)) is None


def test_masked_ratio_round_trip_is_exact(key):
    """Only-P1 variant: P1 masks under HE, P2 decrypts, P1 unmasks: exactly Num/Den."""
    pub = key.public
    layout = encoding.SlotLayout(200, 2)
    num, den = 123456789 * 2**32 + 17, 987654321 * 2**32 + 5
    ct = paillier.encrypt_chunk(pub.n, pub.h, [layout.pack([num, den])])[0]
    mask = AdditiveMask.draw(2, 100)
    masked_ct = paillier.rerandomize_chunk(pub.n, pub.h, [paillier.add_plain(pub.n, ct, layout.pack(list(mask.pads)))])
    seen_by_p2 = encoding.decode_signed(key.decrypt_mod_p(masked_ct)[0], key.p)
    assert layout.unpack(seen_by_p2) != [num, den]
    n2, d2 = mask.remove(layout.unpack(seen_by_p2))
    assert Fraction(n2, d2) == Fraction(num, den)


# ---------------------------------------------------------------- AES-GCM rows
def test_sealed_rows_round_trip_and_tampering_is_detected():
    sealer = RowSealer.generate()
    rows = np.random.default_rng(1).dirichlet(np.ones(6), 5)
    blob = sealer.seal_rows(rows)
    assert len(blob) == 5 * sealed_width(6)
    assert np.array_equal(sealer.open_rows(blob, 6), rows)
    assert sealer.seal_rows(rows) != blob  # random nonces
    tampered = bytearray(blob)
    tampered[20] ^= 1
    with pytest.raises(ProtocolError, match="authentication"):
        sealer.open_rows(bytes(tampered), 6)
    with pytest.raises(ProtocolError):
        RowSealer.generate().open_rows(blob, 6)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_run_chunks_keeps_order_and_stops_at_a_failing_checkpoint(monkeypatch, workers):
    """common.parallel: results in order, inline and on the pool; a checkpoint that
    raises (a cancelled session) ends the call after the chunk it follows."""
    from common import parallel
    monkeypatch.setenv("PPRE_WORKERS", workers)
    tasks = [(3, e) for e in range(12)]
    assert parallel.run_chunks(pow, tasks) == [3 ** e for e in range(12)]
    calls = []

    def checkpoint():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        parallel.run_chunks(pow, tasks, checkpoint=checkpoint)
    assert len(calls) == 2
