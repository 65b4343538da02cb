"""The HE toolkit and primitives of design §3-§4: commutative encryption (every
small-order point of Curve25519, enumerated from the curve's equation, refused), Paillier,
the encodings, the masks (a slot holds the largest value its recipient's mask makes; a
masked ratio is None only for a zero denominator) and the sealed rows."""
from __future__ import annotations

import hashlib
import math
import secrets
from fractions import Fraction

import gmpy2
import numpy as np
import pytest

from common.crypto import commutative, encoding, paillier
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.crypto.masking import PRECISION_BITS, AdditiveMask, RatioMask, masked_ratio
from common.crypto.symmetric import RowSealer, sealed_width
from tests.curve25519 import CURVE_P, ladder, small_order_u
from tests.helpers import apply_ratio_mask

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


def test_random_oracle_and_salt_are_fixed_functions():
    """Known answers for RO(id) = hash_to_curve(SHA-256(salt || id)) and the salt derivation
    (design §3.1). Both parties must compute the same function, whatever version each runs:
    a silent change would make every later PSI match nothing. The ids include ones whose
    first candidates are rejected (0 to 3 retries), so the rejection loop is pinned too."""
    salt = commutative.session_salt(hashlib.sha256(b"tester share").digest(),
                                    hashlib.sha256(b"client share").digest())
    assert salt.hex() == "74590267fbcb13a13f44c47f7999402e2f52ac991d1e09b3f71fff5f7eb749fa"
    salt = hashlib.sha256(b"ppre test vector salt").digest()
    expected = {  # id: (rejected candidates, point)
        "member-0003": (0, "d0cde5a12d2acee6e8ba059f04842b27c1b169534adaa579de82d7c96847dc38"),
        "member-0002": (1, "b36318c6227ba89a14d249cca7fee27a3f89203128eabc3a7cfef6cda918265a"),
        "member-0001": (2, "fe067e45f7539f7239f9e4d9b567ace8c180db9b260df4fc620da3c10b48114b"),
        "member-0005": (3, "aa7f652513f3299536e395c1bb54cf0594a76813a195e533c61456ea841bbe09"),
        "zoë-7": (0, "19e157c326900095651e0108e81e73aebd06cae8661f3b7c6d0e4e84483dcc58"),
    }
    for member, (_, point) in expected.items():
        assert commutative.hash_to_curve(salt, member).hex() == point, member
    # RO outputs are uniform points: both parities of u occur, and u < 2^255 always
    us = [int.from_bytes(p, "little") for p in commutative.split_points(
        commutative.hash_ids(salt, [f"m{i}" for i in range(64)]))]
    assert {u & 1 for u in us} == {0, 1} and max(us) < commutative.P


def test_peer_points_are_validated():
    key = commutative.CommutativeKey.generate()
    with pytest.raises(ProtocolError, match="multiple of 32"):
        key.encrypt_packed(b"\x01" * 33)
    twist = next(u for u in range(2, 1000) if not commutative._on_curve(u))
    with pytest.raises(ProtocolError, match="not on Curve25519"):
        key.encrypt_packed(twist.to_bytes(32, "little"))
    for non_canonical in (commutative.P, commutative.P + 5):  # P encodes 0, P + 5 encodes 5
        with pytest.raises(ProtocolError, match="not canonically encoded"):
            key.encrypt_packed(non_canonical.to_bytes(32, "little"))
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


def test_small_order_points_enumerated_from_the_curve_are_all_refused():
    from common.crypto import commutative
    found = small_order_u()
    assert len(found) == 4 and {0, 1} <= found  # order 2 (u = 0), 4 (u = 1) and the two of order 8
    for u in found:
        assert ladder(u, 8) is None  # each has order dividing 8
        for encoding_ in {u, u + CURVE_P}:  # canonical, and non-canonical where it fits
            if encoding_ >= 2**256:
                continue
            packed = encoding_.to_bytes(32, "little")
            with pytest.raises(ProtocolError):
                commutative.check_points(packed)
            with pytest.raises(ProtocolError):
                commutative.CommutativeKey.generate().encrypt_packed(packed)


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


def test_a_malformed_public_key_from_the_client_is_refused(key):
    """P1 checks P2's Paillier key before using it (design §3.4): an even, square or prime
    modulus, and a randomizer base h that is 1 (P1's rerandomisation would do nothing)
    or not a unit of Z_{n^2}, are refused."""
    pub = key.public
    n_bytes, h_bytes = pub.to_bytes()
    assert paillier.PublicKey.from_bytes(n_bytes, h_bytes, min_bits=BITS) == pub
    size = len(n_bytes)
    for bad_n in (2 * pub.n, key.p * key.p, int(gmpy2.next_prime(pub.n))):  # even, square, prime
        with pytest.raises(ProtocolError, match="malformed"):
            paillier.PublicKey.from_bytes(bad_n.to_bytes(size + 1, "big"), h_bytes, min_bits=BITS - 16)
    for bad_h in (0, 1, pub.n2 + 1, pub.n2, key.p):
        with pytest.raises(ProtocolError, match="randomizer base"):
            paillier.PublicKey.from_bytes(n_bytes, bad_h.to_bytes(2 * size + 1, "big"), min_bits=BITS)


def test_fixed_base_table_computes_the_power():
    """The DJN randomizer h^alpha comes from a fixed-base table (design §3.6 rerandomisation):
    a wrong table still yields n-th residues, so decryption would never notice; compare
    it with plain modular exponentiation across every window position instead."""
    m = (1 << 127) - 1
    table = paillier.FixedBase(3, m, bits=64, window=8)
    rng = np.random.default_rng(6)
    for e in [0, 1, 255, 256, (1 << 64) - 1] + [int(x) for x in rng.integers(0, 2**63, 20, dtype=np.int64)]:
        assert table.pow(e) == pow(3, e, m), e


def test_multi_exp_matches_naive_for_many_windows(key):
    pub = key.public
    rng = np.random.default_rng(3)
    for count, bits in [(1, 1), (5, 3), (40, 32), (300, 32)]:
        cts = paillier.encrypt_chunk(pub.n, pub.h, list(range(count)))
        ws = [int(x) for x in rng.integers(0, 2**bits, count, dtype=np.uint64)]
        assert paillier.multi_exp(cts, ws, pub.n2) == math.prod(
            int(gmpy2.powmod(c, w, pub.n2)) for c, w in zip(cts, ws)) % pub.n2


def test_shares_of_a_total_add_up_under_encryption(key):
    pub = key.public
    shares = [paillier.encrypt_chunk(pub.n, pub.h, [i, 2 * i, 3]) for i in range(4)]
    assert key.decrypt_signed(paillier.add_encrypted(shares, pub.n2)) == [6, 12, 12]
    with pytest.raises(ValueError, match="lengths"):
        paillier.add_encrypted([shares[0], shares[1][:2]], pub.n2)


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
    assert q.dtype == np.int64
    assert (q.sum(axis=1) == 2**32).all() and (q >= 0).all()
    assert np.abs(q / 2**32 - p).max() <= 2**-32 + 1e-15
    one_hot = np.eye(6)[[0, 5, 2]]
    assert (encoding.quantize_probabilities(one_hot) == one_hot.astype(np.int64) * 2**32).all()
    # rows are normalised first: unnormalised weights give the same exact sums
    assert (encoding.quantize_probabilities(3 * p, 32).sum(axis=1) == 2**32).all()
    # largest remainder: 8 * (0.5, 0.3, 0.2) = (4, 2.4, 1.6): the one unit left goes to 1.6
    assert encoding.quantize_probabilities(np.array([[0.5, 0.3, 0.2]]), 3).tolist() == [[4, 2, 2]]


def test_signed_encoding_and_overflow_detection():
    n = 1009 * 1013
    for x in (0, 1, -1, n // 3, -(n // 3)):
        assert encoding.decode_signed(encoding.encode_signed(x, n), n) == x
    with pytest.raises(EncodingOverflowError):
        encoding.encode_signed(n // 3 + 1, n)
    with pytest.raises(EncodingOverflowError):
        encoding.decode_signed(n // 2, n)  # the middle third: overflow, never a wrapped number
    big = (1 << 2048) - 159  # a plaintext space the size of a 2048-bit n^2: exact integer arithmetic
    for x in (big // 3, -(big // 3)):
        assert encoding.decode_signed(encoding.encode_signed(x, big), big) == x
    with pytest.raises(EncodingOverflowError):
        encoding.encode_signed(big // 3 + 1, big)


def test_slots_pack_signed_values_and_refuse_overflow():
    layout = encoding.SlotLayout(16, 3)
    for values in ([1, 2, 3], [-5, 7, -32767], [32767, -1, 0]):
        assert layout.unpack(layout.pack(values)) == values
    with pytest.raises(EncodingOverflowError):
        layout.pack([1 << 15, 0, 0])
    with pytest.raises(EncodingOverflowError):
        layout.unpack(1 << 48)
    with pytest.raises(EncodingOverflowError):  # a top slot at +2^15 is out of range, not 2^15
        encoding.SlotLayout(16, 1).unpack(1 << 15)
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
        a, b = apply_ratio_mask(mask, num, den)
        g = math.gcd(a, b)
        assert g % mask.r != 0  # the gcd no longer reveals the mask
        assert a // g != num and b // g != den  # nor Num and Den
        recovered.append(g)
    assert max(recovered) < 2**40  # the gcd of two unrelated numbers: small and random


def test_ratio_mask_keeps_the_ratio_to_its_stated_precision():
    """P2 learns (Num + u1) / (Den + u2) with u < 2^PRECISION_BITS fixed-point units."""
    num, den = 5 * 2**32 + 3, 11 * 2**32 + 7
    bound = 2**PRECISION_BITS * (1 + num / den) / den
    errors = []
    for _ in range(300):
        a, b = apply_ratio_mask(RatioMask.draw(), num, den)
        errors.append(abs(masked_ratio(a, b) - num / den))
    assert max(errors) <= bound
    assert max(errors) > bound / 100  # the noise is really there, not rounded away
    assert 0 <= masked_ratio(*apply_ratio_mask(RatioMask.draw(), 0, den)) <= 2**PRECISION_BITS / den


def _convergents(a: int, b: int):
    """The continued-fraction convergents p/q of a/b."""
    p0, q0, p1, q1 = 0, 1, 1, 0
    while b:
        t = a // b
        a, b = b, a - t * b
        p0, q0, p1, q1 = p1, q1, t * p1 + p0, t * q1 + q0
        yield p1, q1


def test_continued_fraction_attack_recovers_cells_from_a_small_noise_mask_but_not_from_ours():
    """Design §4.7, masking: with noise far below r, the masked ratio is
    within 1/(2 Den^2) of Num/Den, so Num/Den (in lowest terms, often Num and Den
    themselves) is one of its convergents. Cells with Den ~ 2^40 fixed-point units (a
    few hundred members' weight): the old 16-bit-noise mask gives most of them away;
    ours, with noise as large as r, none."""
    rng = np.random.default_rng(5)
    cells = [(int(rng.integers(1, 2**39)), int(rng.integers(2**39, 2**41))) for _ in range(300)]

    def recovered(mask_pair) -> tuple[int, int]:
        lowest = exact = 0
        for num, den in cells:
            a, b = mask_pair(num, den)
            g = math.gcd(num, den)
            conv = set(_convergents(a, b))
            lowest += (num // g, den // g) in conv
            exact += (num, den) in conv
        return lowest, exact

    def small_noise(num, den):  # the mask before: r up to 2^80, noise below 2^16
        r = RatioMask.draw().r
        return r * num + secrets.randbits(16), r * den + secrets.randbits(16)

    old_lowest, old_exact = recovered(small_noise)
    assert old_lowest > 100 and old_exact > 50  # the attack works on that mask
    assert recovered(lambda num, den: apply_ratio_mask(RatioMask.draw(), num, den)) == (0, 0)


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


@pytest.mark.parametrize("recipient", ["client", "tester"])
@pytest.mark.parametrize("item_bits", [40, 96, 200])
def test_a_slot_holds_the_largest_masked_value_its_recipients_mask_makes(recipient, item_bits):
    """The layout's slot width (`choose_layout` with `mask_bits(recipient)`) holds, signed,
    the largest value the recipient's mask can make of a cell value of `item_bits` bits:
    the ratio mask's r·v + e with r < 2^R_MAX_BITS and e < r·2^PRECISION_BITS (the
    Test-Client learns the result), the additive pad's v + s with s < 2^(item_bits +
    STATISTICAL_BITS) (the Tester does). Checked at the largest value itself: values far
    below the bound would not tell the two masks' widths apart."""
    from common.crypto.masking import PRECISION_BITS, R_MAX_BITS, STATISTICAL_BITS, mask_bits
    from common.metrics.base import choose_layout
    layout = choose_layout(item_bits, mask_bits(recipient), 4, 8192)
    v = (1 << item_bits) - 1
    if recipient == "client":
        r = (1 << R_MAX_BITS) - 1
        largest = r * v + (r << PRECISION_BITS) - 1
    else:
        largest = v + (1 << (item_bits + STATISTICAL_BITS)) - 1
    assert largest.bit_length() + 1 <= layout.slot_bits  # with its sign
    assert mask_bits("client") > mask_bits("tester")     # the ratio mask is the wider


def test_a_masked_ratio_is_none_only_for_a_zero_denominator():
    """The Test-Client's ratio of a masked pair: None for a masked Den of exactly 0 (a
    cell the Tester never releases), the plain quotient for every other one, 1 included."""
    from common.crypto.masking import masked_ratio
    assert masked_ratio(7, 0) is None
    assert masked_ratio(7, 1) == 7.0
    assert masked_ratio(-3, 2) == -1.5


# ---------------------------------------------------------------- AES-GCM rows
def test_every_sealed_row_of_a_chunk_has_a_nonce_of_its_own():
    """The chunk's nonces are read from the OS in one call and cut per row: identical
    vectors in one chunk still seal to different blobs (a shared nonce would show the
    Test-Client which members share a vector, and break AES-GCM)."""
    from common.crypto.symmetric import NONCE_BYTES
    sealer = RowSealer.generate()
    rows = np.tile(np.full(6, 1 / 6), (400, 1))
    blob = sealer.seal_rows(rows)
    width = sealed_width(6)
    blobs = {blob[i:i + width] for i in range(0, len(blob), width)}
    nonces = {blob[i:i + NONCE_BYTES] for i in range(0, len(blob), width)}
    assert len(blobs) == len(nonces) == 400
    assert np.array_equal(sealer.open_rows(blob, 6), rows)


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
    with pytest.raises(ProtocolError, match="not a multiple"):
        sealer.open_rows(blob[:-1], 6)
    # the row layout is float64 whatever the input dtype (one-hot Self-ID rows may be ints)
    ints = np.eye(6, dtype=np.int32)[[1, 4]]
    assert len(sealer.seal_rows(ints)) == 2 * sealed_width(6)
    assert np.array_equal(sealer.open_rows(sealer.seal_rows(ints), 6), ints)


@pytest.mark.parametrize("spec", ["inline", "processes:1", "processes:2"])
def test_run_chunks_keeps_order_and_stops_at_a_failing_checkpoint(spec):
    """common.execution.parallel: results in order, inline and on a pool; a checkpoint that
    raises (a cancelled session) ends the call after the chunk it follows; `stream`
    yields in order too, and a failing chunk's error reaches the caller."""
    from common.execution.executors import executor_from_spec
    executor = executor_from_spec(spec)
    try:
        tasks = [(3, e) for e in range(12)]
        assert executor.run_chunks(pow, tasks) == [3 ** e for e in range(12)]
        assert list(executor.stream(pow, iter(tasks), window=3)) == [3 ** e for e in range(12)]
        calls = []

        def checkpoint():
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("cancelled")

        with pytest.raises(RuntimeError, match="cancelled"):
            executor.run_chunks(pow, tasks, checkpoint=checkpoint)
        assert len(calls) == 2
        with pytest.raises(ZeroDivisionError):
            executor.run_chunks(divmod, [(1, 1), (1, 0), (2, 1)])
    finally:
        executor.shutdown()


@pytest.mark.parametrize("spec", ["processes:0", "process", "dask:/x", "threads"])
def test_an_unknown_executor_is_refused_naming_the_flag(spec):
    from common.execution.executors import executor_from_spec
    with pytest.raises(InputError, match="--executor"):
        executor_from_spec(spec)


def test_a_factor_of_n_among_good_ciphertexts_is_refused_and_named(key):
    """The table's one gcd (of the product mod n) must still catch a single non-unit
    anywhere in it, and the error names that ciphertext."""
    pub = key.public
    width = pub.ciphertext_bytes
    good = paillier.encrypt_chunk(pub.n, pub.h, list(range(9)))
    for position in (0, 4, 9):
        for bad in (key.p, key.q * 7, pub.n * 3):
            table = good[:position] + [bad] + good[position:]
            with pytest.raises(ProtocolError, match=f"ciphertext {position} is out of range"):
                paillier.ciphertexts_from_bytes(paillier.ciphertexts_to_bytes(table, width), pub)
    assert paillier.ciphertexts_from_bytes(paillier.ciphertexts_to_bytes(good, width), pub) == good
