"""Paillier helpers on raw integers (design §4.6).

Hazardous-primitive layer, in the spirit of pyca/cryptography's `hazmat`: plain
functions over Python/gmpy2 integers, no encoding policy (that is `common.crypto.encoding`)
and no protocol policy (that is each party's `protocol` module).

* Keys: `phe` generates the primes (2048-bit modulus; smaller refused unless
  `allow_insecure=True`, which only tests use). Keys live in memory only. A process
  started with `PPRE_TEST_KEY_BITS` (`test_key_bits`) makes and accepts keys of that
  smaller size: the test suite's services and commands run so, and say so at start-up.
* Encryption uses g = n + 1 and the Damgard-Jurik-Nielsen randomizer: instead of
  r^n mod n^2 for a fresh r, `h^alpha` with h = x^(2n) mod n^2 a fixed public n-th
  residue and alpha a fresh `RANDOMIZER_BITS`-bit secret (DJN 2010, sec. 4: short
  exponent; 512 bits = 4 x the 128-bit security level, so generic discrete-log
  attacks on alpha cost 2^256). With a fixed base, h^alpha is a table look-up
  product (`FixedBase`), about 30x cheaper than a full r^n.
* Aggregation: `multi_exp` computes prod c_i^(w_i) (= Enc(sum w_i m_i)) with
  Pippenger's bucket method; weights are non-negative integers.
* Decryption: the key owner decrypts modulo p only (`PrivateKey.decrypt_mod_p`),
  half the cost of full CRT decryption; every plaintext the protocol forms is
  bounded far below p/3 by its slot plan (`common.crypto.encoding`), and the signed
  decoding applies the thirds rule in Z_p, so an overflow is still detected.
* Decryption on worker processes (`PrivateKey.decrypt_task`): what travels to a
  worker, pickled into each chunk's task, is a `ModPDecryption`, the one operation
  "decrypt modulo p" with exactly what it needs, p and h_p = ((p-1)q)^-1 mod p,
  never the `PrivateKey` (which refuses to be pickled) and never q, lambda or phi as
  such; the protocol code only calls the key's methods and never names a factor.
  This narrows what crosses the process boundary and which code handles the factors;
  it does not hide the key from the worker: p alone factors the public n (q = n/p,
  then lambda), so a worker holds the equivalent of the whole private key while a
  chunk runs, as it did before (h_p, a function of q mod p, adds nothing to p). What
  protects it there is that the pool runs only our own code, fed over a pipe, in
  processes that never dump core and that drop each task when its chunk is done
  (`common.execution.parallel`). The signed decoding runs in the same task, so the protocol
  never handles p even for the thirds rule.

Key objects (`PrivateKey`, `ModPDecryption`) print as `<2048-bit, secret>` and hold
their secrets in fields left out of repr; `PrivateKey` refuses pickling and copying.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

import gmpy2
from gmpy2 import mpz

from common.crypto import batch
from common.errors import InputError, ProtocolError

MIN_MODULUS_BITS = 2048
#: the environment variable that sets a test process's key size (`test_key_bits`)
TEST_KEY_ENV = "PPRE_TEST_KEY_BITS"
#: the smallest test key: the slot plans of every metric at the suite's sizes fit in it
MIN_TEST_MODULUS_BITS = 1024
RANDOMIZER_BITS = 512
_WINDOW = 8


@dataclass(frozen=True)
class PublicKey:
    """Paillier public key (n, g = n + 1) plus the DJN randomizer base h."""

    n: int
    h: int

    @property
    def n2(self) -> int:
        return self.n * self.n

    @property
    def ciphertext_bytes(self) -> int:
        return (self.n2.bit_length() + 7) // 8

    def to_bytes(self) -> tuple[bytes, bytes]:
        size = (self.n.bit_length() + 7) // 8
        return self.n.to_bytes(size, "big"), self.h.to_bytes(2 * size, "big")

    @classmethod
    def from_bytes(cls, n_bytes: bytes, h_bytes: bytes, *, min_bits: int = MIN_MODULUS_BITS) -> "PublicKey":
        """Parse and check a peer's public key (size, parity, h a unit of Z_n^2)."""
        n = int.from_bytes(n_bytes, "big")
        h = int.from_bytes(h_bytes, "big")
        if n.bit_length() < min_bits:
            raise ProtocolError(f"Paillier modulus of {n.bit_length()} bits refused (minimum {min_bits})")
        if n % 2 == 0 or gmpy2.is_square(n) or gmpy2.is_prime(n):
            raise ProtocolError("Paillier modulus is malformed")
        if not 1 < h < n * n or gmpy2.gcd(h, n) != 1:
            raise ProtocolError("Paillier randomizer base is out of range")
        return cls(n, h)


@dataclass(frozen=True)
class PrivateKey:
    """Paillier private key; never serialised, never logged (design §7).

    `repr`/`str` show the modulus size only; pickling (and so copying, or passing the
    key to a worker process) raises TypeError: a worker gets `decrypt_task()` instead."""

    public: PublicKey = field(repr=False)
    p: int = field(repr=False)
    q: int = field(repr=False)

    def __repr__(self) -> str:
        return f"PrivateKey(<{self.public.n.bit_length()}-bit, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a Paillier private key is never serialised (use decrypt_task() for a worker)")

    def decrypt_mod_p(self, ciphertexts: Sequence[int]) -> list[int]:
        """m mod p for each ciphertext, in this process (for signed values, or on workers:
        `decrypt_task(signed=True)`)."""
        return decrypt_mod_p_chunk(self.p, self.q, list(ciphertexts))

    def decrypt_signed(self, ciphertexts: Sequence[int]) -> list[int]:
        """Full decryption (m mod p and m mod q joined by the CRT: twice `decrypt_mod_p`'s
        cost, for the few aggregates whose plaintexts use all of Z_n) and the signed value
        (`encoding.decode_signed` in Z_n; EncodingOverflowError on overflow), in this process."""
        from common.crypto.encoding import decode_signed
        p, q = mpz(self.p), mpz(self.q)
        n = p * q
        at_p = _decrypt_mod_p(p, p * p, p - 1, _h_p(p, q), ciphertexts)
        at_q = _decrypt_mod_p(q, q * q, q - 1, _h_p(q, p), ciphertexts)
        p_inv = gmpy2.invert(p, q)
        return [decode_signed(int(mp + p * ((mq - mp) * p_inv % q)), int(n)) for mp, mq in zip(at_p, at_q)]

    def encrypt_task(self) -> "OwnerEncryption":
        """The key owner's encryption (CRT, about twice as fast as `encrypt_chunk`) as a
        picklable task for worker processes: `task(plaintexts)` -> packed ciphertexts."""
        return OwnerEncryption(self.p, self.q, self.public.h, secrets.token_bytes(16),
                               self.public.ciphertext_bytes)

    def decrypt_task(self, *, signed: bool = False) -> "ModPDecryption":
        """The narrow, picklable operation a worker process runs on a chunk of ciphertexts
        (module docstring): `task(ciphertexts)` is m mod p for each, or with `signed` the
        signed value (`encoding.decode_signed` in Z_p; EncodingOverflowError on overflow)."""
        p = mpz(self.p)
        return ModPDecryption(p, _h_p(p, mpz(self.q)), signed, self.public.n.bit_length())


class ModPDecryption:
    """Paillier decryption modulo p as a task for an executor (`common.execution.parallel`): carries p and
    h_p only (module docstring: this narrows what travels, p still factors n).

    Deliberately picklable (it is built for workers), but prints no secret."""

    __slots__ = ("_p", "_p2", "_pm1", "_hp", "_signed", "_bits")

    def __init__(self, p: int, hp: int, signed: bool = False, bits: int = 0) -> None:
        self._p = mpz(p)
        self._p2 = self._p * self._p
        self._pm1 = self._p - 1
        self._hp = mpz(hp)
        self._signed = bool(signed)
        self._bits = int(bits)

    def __repr__(self) -> str:
        return f"ModPDecryption(<{self._bits}-bit, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        return (ModPDecryption, (self._p, self._hp, self._signed, self._bits))

    def __call__(self, ciphertexts: Sequence[int]) -> list[int]:
        plain = _decrypt_mod_p(self._p, self._p2, self._pm1, self._hp, ciphertexts)
        if not self._signed:
            return plain
        from common.crypto.encoding import decode_signed
        p = int(self._p)
        return [decode_signed(m, p) for m in plain]


def test_key_bits() -> int | None:
    """The Paillier modulus size a test process runs with: `PPRE_TEST_KEY_BITS`, read by
    the services and the commands that make keys (`ppre tester serve`, `ppre client serve`,
    `ppre audit --local`, `ppre demo`), None where it is unset (production: 2048 bits).

    It exists so that the test suite's end-to-end runs do not pay 2048-bit key generation
    and arithmetic in every audit; the encodings, noise and finishing are those of 2048-bit
    keys, only the modulus differs. It is never a production setting: the commands print
    `test_keys_label()` where they start. A value that is not a whole number of bits in
    [1024, 2048) is refused, naming the variable."""
    text = os.environ.get(TEST_KEY_ENV, "").strip()
    if not text:
        return None
    try:
        bits = int(text)
    except ValueError:
        bits = 0
    if not MIN_TEST_MODULUS_BITS <= bits < MIN_MODULUS_BITS:
        raise InputError(f"expected a test key size in bits from {MIN_TEST_MODULUS_BITS} to {MIN_MODULUS_BITS - 1}"
                         f", got {text!r} (unset it for production keys)", parameter=TEST_KEY_ENV)
    return bits


def process_key_size() -> tuple[int, bool]:
    """(modulus bits, allow_insecure) for the keys a service or command of this process
    makes: `test_key_bits()` where it is set, else the production 2048 bits."""
    bits = test_key_bits()
    return (MIN_MODULUS_BITS, False) if bits is None else (bits, True)


def test_keys_label() -> str | None:
    """What a command that makes keys says where it starts under `PPRE_TEST_KEY_BITS`."""
    bits = test_key_bits()
    if bits is None:
        return None
    return f"TEST KEYS: {TEST_KEY_ENV}={bits}, every Paillier key is {bits} bits (insecure: for tests only)"


def generate_keypair(bits: int = MIN_MODULUS_BITS, *, allow_insecure: bool = False) -> PrivateKey:
    """A fresh per-session key pair (design §3.1). Refuses moduli under 2048 bits outside tests."""
    if bits < MIN_MODULUS_BITS and not allow_insecure:
        raise ValueError(f"Paillier modulus of {bits} bits refused: at least {MIN_MODULUS_BITS} bits")
    from phe import paillier  # prime generation only

    pub, priv = paillier.generate_paillier_keypair(n_length=bits)
    n = int(pub.n)
    return PrivateKey(PublicKey(n, randomizer_base(n)), int(priv.p), int(priv.q))


def randomizer_base(n: int) -> int:
    """A fresh DJN randomizer base h = x^(2n) mod n^2 (x random in Z*_n): needs only n.

    The key owner publishes one for encryption; a party that rerandomises ciphertexts
    under someone else's key draws its own, so that an owner who announced a weak h
    (of small order, e.g. n^2 - 1) cannot switch that party's rerandomisation off."""
    while True:
        x = secrets.randbelow(n - 2) + 2
        if gmpy2.gcd(x, n) == 1:
            break
    return int(gmpy2.powmod(x, 2 * n, n * n))


FixedBase = batch.FixedBase


@lru_cache(maxsize=4)
def _randomizer_table(n: int, h: int, backend: str):
    """h^alpha mod n^2 for the process's backend (`batch.fixed_base`; the backend is part
    of the cache's key, so a process that switches gets the other's table)."""
    return batch.fixed_base(h, n * n, RANDOMIZER_BITS, _WINDOW)


def encrypt_chunk(n: int, h: int, plaintexts: Sequence[int]) -> list[int]:
    """Enc(m) = (1 + m*n) * h^alpha mod n^2 for each m (already reduced mod n)."""
    n_ = mpz(n)
    n2 = n_ * n_
    if any(not 0 <= m < n for m in plaintexts):
        raise ValueError("plaintext out of range: encode it first")
    powers = _randomizer_table(n, h, batch.backend()).pow_many([secrets.randbits(RANDOMIZER_BITS) for _ in plaintexts])
    return [int((1 + m * n_) % n2 * x % n2) for m, x in zip(plaintexts, powers)]


#: window of the key owner's fixed-base tables (one per prime square; 2^w entries per
#: row, ceil(RANDOMIZER_BITS / w) rows: 47 x 2048 x 256 bytes x 2 = 49 MB at 2048 bits
#: on gmpy2, 47 x 2048 x 40 digits x 8 bytes x 2 = 62 MB in the IFMA kernel's form)
OWNER_WINDOW = 11
#: the owner's tables of the current session, per worker process: {(session token, backend): tables}
_owner_tables: dict[tuple, tuple] = {}


class OwnerEncryption:
    """Encryption by the key owner, as a task an executor can send to a worker process
    (`PrivateKey.encrypt_task()`): the same ciphertexts as `encrypt_chunk` (g = n + 1,
    randomizer h^alpha with a fresh `RANDOMIZER_BITS`-bit alpha), computed modulo p^2
    and q^2 with fixed-base tables of h there and joined by the CRT: 2048-bit products
    instead of 4096-bit ones, about half the cost.

    It carries p and q (the whole private key, as `ModPDecryption` carries p, which
    factors n anyway): deliberately picklable, built for workers, printing no secret. A
    worker keeps the tables of one session only (`_owner_tables`): the next session's
    task replaces them, and they die with the worker."""

    __slots__ = ("_p", "_q", "_h", "_token", "_width", "_bits")

    def __init__(self, p: int, q: int, h: int, token: bytes, width: int) -> None:
        self._p, self._q, self._h = int(p), int(q), int(h)
        self._token = token
        self._width = int(width)
        self._bits = (self._p * self._q).bit_length()

    def __repr__(self) -> str:
        return f"OwnerEncryption(<{self._bits}-bit, secret>)"

    __str__ = __repr__

    def __reduce__(self):
        return (OwnerEncryption, (self._p, self._q, self._h, self._token, self._width))

    def _tables(self) -> tuple:
        key = (self._token, batch.backend())
        tables = _owner_tables.get(key)
        if tables is None:
            _owner_tables.clear()  # never more than one session's tables in a process
            p, q = mpz(self._p), mpz(self._q)
            p2, q2 = p * p, q * q
            tables = (p2, q2, p * q, batch.fixed_base(self._h % p2, p2, RANDOMIZER_BITS, OWNER_WINDOW),
                      batch.fixed_base(self._h % q2, q2, RANDOMIZER_BITS, OWNER_WINDOW), gmpy2.invert(p2, q2))
            _owner_tables[key] = tables
        return tables

    def __call__(self, plaintexts: Sequence[int]) -> bytes:
        """Packed ciphertexts (big-endian, the key's ciphertext width) of `plaintexts`,
        each already reduced mod n."""
        n = self._p * self._q
        if any(not 0 <= m < n for m in plaintexts):
            raise ValueError("plaintext out of range: encode it first")
        return self.with_randomizers(plaintexts, [secrets.randbits(RANDOMIZER_BITS) for _ in plaintexts])

    def with_randomizers(self, plaintexts: Sequence[int], alphas: Sequence[int]) -> bytes:
        """The ciphertexts of `plaintexts` under the given randomizer exponents (each below
        2^RANDOMIZER_BITS): (1 + m n) h^alpha mod p^2 and mod q^2 from the fixed-base
        tables (`batch.fixed_base`: gmpy2's, or the IFMA kernel's eight at a time), joined
        by the CRT."""
        p2, q2, n, tp, tq, p2_inv = self._tables()
        width = self._width
        out = bytearray()
        for m, xp, xq in zip(plaintexts, tp.pow_many(alphas), tq.pow_many(alphas)):
            gm = 1 + m * n  # (1 + n)^m mod n^2
            cp = gm % p2 * xp % p2
            cq = gm % q2 * xq % q2
            c = cp + p2 * ((cq - cp) * p2_inv % q2)
            out += int(c).to_bytes(width, "big")
        return bytes(out)


def rerandomize_chunk(n: int, h: int, ciphertexts: Sequence[int]) -> list[int]:
    """Multiply each ciphertext by a fresh encryption of zero."""
    n2 = mpz(n) * n
    powers = _randomizer_table(n, h, batch.backend()).pow_many([secrets.randbits(RANDOMIZER_BITS) for _ in ciphertexts])
    return [int(mpz(c) * x % n2) for c, x in zip(ciphertexts, powers)]


def add_plain(n: int, c: int, m: int) -> int:
    """Enc(x) -> Enc(x + m) without fresh randomness (follow with a rerandomization)."""
    n_ = mpz(n)
    n2 = n_ * n_
    return int(mpz(c) * ((1 + (m % n_) * n_) % n2) % n2)


def scalar_pow(n: int, c: int, k: int) -> int:
    """Enc(x) -> Enc(k*x) for an integer k >= 0."""
    return int(gmpy2.powmod(mpz(c), mpz(k), mpz(n) * n))


def scalar_pow_many(n: int, ciphertexts: Sequence[int], factors: Sequence[int], bits: int) -> list[int]:
    """Enc(x_i) -> Enc(k_i*x_i) for factors 0 <= k_i < 2^bits, as one batch read at that
    width (`batch.powmod_many`: on the IFMA backend its time does not show any k_i's length)."""
    return batch.powmod_many(ciphertexts, factors, n * n, bits)


def _h_p(p: mpz, q: mpz) -> mpz:
    """h_p = L_p(g^(p-1) mod p^2)^-1 mod p for g = n + 1, i.e. ((p-1) q)^-1 mod p."""
    return gmpy2.invert((p - 1) * q % p, p)


def _decrypt_mod_p(p: mpz, p2: mpz, pm1: mpz, hp: mpz, ciphertexts: Sequence[int]) -> list[int]:
    """L_p(c^(p-1) mod p^2) * h_p mod p for each c, the exponentiations as one batch
    (`batch.powmod_many`, read at p's width)."""
    powers = batch.powmod_many([mpz(c) % p2 for c in ciphertexts], int(pm1), int(p2), int(p).bit_length())
    return [int((mpz(x) - 1) // p * hp % p) for x in powers]


def decrypt_mod_p_chunk(p: int, q: int, ciphertexts: Sequence[int]) -> list[int]:
    """Paillier decryption modulo p: m mod p = L_p(c^(p-1) mod p^2) * h_p mod p.

    The key owner's in-process primitive (`PrivateKey.decrypt_mod_p`); worker processes
    run `PrivateKey.decrypt_task()` instead, which carries no q."""
    p_ = mpz(p)
    return _decrypt_mod_p(p_, p_ * p_, p_ - 1, _h_p(p_, mpz(q)), ciphertexts)


multi_exp = batch.multi_exp


def add_encrypted(vectors: Sequence[Sequence[int]], modulus: int) -> list[int]:
    """Enc(Σ_v x_vi) per position i: the elementwise product mod `modulus` (n^2) of
    equally long lists of ciphertexts (the shares of a total formed part by part)."""
    m = mpz(modulus)
    total = [mpz(x) for x in vectors[0]]
    for vector in vectors[1:]:
        if len(vector) != len(total):
            raise ValueError("ciphertext lists of different lengths")
        total = [a * b % m for a, b in zip(total, vector)]
    return [int(x) for x in total]


def ciphertexts_to_bytes(ciphertexts: Iterable[int], width: int) -> bytes:
    return b"".join(int(c).to_bytes(width, "big") for c in ciphertexts)


def ciphertexts_from_bytes(packed: bytes, pub: PublicKey) -> list[int]:
    """Parse a peer's packed ciphertexts; each must be a unit of Z_{n^2}: in (0, n²) and
    prime to n (design §4.7). One gcd serves the whole table: with n = p·q, the product of
    the ciphertexts mod n is divisible by p (or q) exactly when one of them is, so only a
    table that fails it is checked ciphertext by ciphertext, to name the one at fault."""
    width = pub.ciphertext_bytes
    if len(packed) % width:
        raise ProtocolError(f"ciphertext table of {len(packed)} bytes is not a multiple of {width}")
    n2 = pub.n2
    n = mpz(pub.n)
    out = [int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)]
    product = mpz(1)
    for i, c in enumerate(out):
        if not 0 < c < n2:
            raise ProtocolError(f"ciphertext {i} is out of range")
        product = product * (c % n) % n
    if gmpy2.gcd(product, n) != 1:
        bad = next(i for i, c in enumerate(out) if gmpy2.gcd(c, n) != 1)
        raise ProtocolError(f"ciphertext {bad} is out of range")
    return out
