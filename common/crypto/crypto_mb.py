"""The AVX-512 IFMA backend of the batch primitives (`common.crypto.batch`): a ctypes
binding of Intel's crypto_mb, the multi-buffer part of the Intel Cryptography Primitives
Library (the ``ipp-crypto`` wheel ships ``libcrypto_mb.so``; Apache-2.0), which computes
eight independent operations at once in the 52-bit lanes of AVX-512 IFMA registers.

Two public functions of crypto_mb are bound, nothing internal:

* ``mbx_x25519_mb8``: X25519 (RFC 7748, the scalar clamped by the library as by every
  X25519) for eight u-coordinates at once; a lane whose result is the all-zero value
  (a point of small order) reports ``MBX_STATUS_LOW_ORDER_ERR`` and is named by its index,
  as pyca/cryptography's ``exchange`` raises for it.
* ``mbx_exp_mb8``: base^e mod m for eight (base, e) pairs under one modulus, with the
  exponent read at a stated bit width whatever its value (crypto_mb's exponentiation is
  its RSA kernel, constant-time in the exponent for a given width). Moduli of 1024, 2048,
  3072 and 4096 bits (and a few bits less: ``mbx_exp_BufferSize`` says which) are served;
  any other size is for the portable backend.

Loading needs the library and the Intel compiler runtime it links against (``libintlc``,
``libimf``, ``libsvml``, ``libirng``: the ``intel-cmplr-lib-rt`` wheel, under Intel's End
User License Agreement for Developer Tools); both wheels install their libraries under
the environment's ``lib/``. `load()` returns the bound library, or raises `Unavailable`
saying why (no such CPU, no library, a library that fails its known-answer check): the
batch layer then runs the portable backend, or refuses to start when ``ifma`` was asked
for by name.

Secrets cross into C only in buffers this module allocates for one call and zeroes
before returning (the X25519 scalar); nothing here keeps a key.
"""
from __future__ import annotations

import ctypes
import platform
import sys
from array import array
from pathlib import Path
from typing import Sequence

#: the libraries to load, in dependency order (the compiler runtime first, so that the
#: crypto library's own dependencies resolve to them by soname)
RUNTIME_LIBRARIES = ("libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so")
LIBRARY = "libcrypto_mb.so.13"
#: crypto_mb's per-lane status: 4 bits per lane, this value for a point of small order
LOW_ORDER = 4
LANES = 8
POINT_BYTES = 32
#: u = 9, the base point: the filler of a batch's unused lanes
_FILLER_POINT = (9).to_bytes(POINT_BYTES, "little")

_Pointers = ctypes.c_void_p * LANES


class Unavailable(RuntimeError):
    """The IFMA backend cannot run here; the message says why."""


def library_dirs() -> list[Path]:
    """Where the wheels put their libraries: the environment's ``lib/`` (a virtual
    environment's prefix first, then the base installation's)."""
    dirs = []
    for prefix in (sys.prefix, sys.base_prefix):
        d = Path(prefix) / "lib"
        if d not in dirs:
            dirs.append(d)
    return dirs


def cpu_has_ifma() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512ifma" in line.split()
    except OSError:
        return False
    return False


def _find(name: str) -> str:
    for d in library_dirs():
        if (d / name).exists():
            return str(d / name)
    return name  # the system's loader path, if it has one


class CryptoMB:
    """The bound library: two batch operations over Python integers and bytes."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._x25519 = lib.mbx_x25519_mb8
        self._x25519.restype = ctypes.c_uint32
        self._x25519.argtypes = [ctypes.c_void_p] * 3
        self._exp = lib.mbx_exp_mb8
        self._exp.restype = ctypes.c_uint32
        self._exp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self._buffer_size = lib.mbx_exp_BufferSize
        self._buffer_size.restype = ctypes.c_int
        self._buffer_size.argtypes = [ctypes.c_int]
        self._sizes: dict[int, int] = {}

    # ------------------------------------------------------------------ X25519
    def x25519(self, scalar: bytes, packed: bytes) -> tuple[bytes, list[int]]:
        """[scalar]P for every 32-byte u-coordinate in `packed` (already validated: below
        p, on the curve): the packed results and the indices of the points of small order."""
        count = len(packed) // POINT_BYTES
        lanes = -(-count // LANES) * LANES
        src = ctypes.create_string_buffer(packed + _FILLER_POINT * (lanes - count), lanes * POINT_BYTES)
        dst = ctypes.create_string_buffer(lanes * POINT_BYTES)
        key = ctypes.create_string_buffer(bytes(scalar), POINT_BYTES)
        try:
            keys = _Pointers(*([ctypes.addressof(key)] * LANES))
            src_ptrs = _addresses(ctypes.addressof(src), lanes, POINT_BYTES)
            dst_ptrs = _addresses(ctypes.addressof(dst), lanes, POINT_BYTES)
            s_base, d_base = src_ptrs.buffer_info()[0], dst_ptrs.buffer_info()[0]
            step = LANES * ctypes.sizeof(ctypes.c_void_p)
            low_order = []
            for group, offset in enumerate(range(0, lanes * ctypes.sizeof(ctypes.c_void_p), step)):
                status = self._x25519(d_base + offset, keys, s_base + offset)
                if status:
                    low_order += _failed_lanes(status, group, count)
        finally:
            ctypes.memset(key, 0, POINT_BYTES)
        return dst.raw[:count * POINT_BYTES], low_order

    # ------------------------------------------------------------------ exponentiation
    def serves(self, modulus_bits: int) -> bool:
        """True when `mbx_exp_mb8` takes a modulus of this many bits."""
        size = self._sizes.get(modulus_bits)
        if size is None:
            size = self._sizes[modulus_bits] = int(self._buffer_size(modulus_bits))
        return size > 0

    def powmod(self, bases: Sequence[int], exponents: Sequence[int], modulus: int, exp_bits: int) -> list[int]:
        """bases[i]^exponents[i] mod modulus (odd, of a size `serves`), every exponent below
        2^exp_bits and read at that width."""
        mod_bits = modulus.bit_length()
        if not self.serves(mod_bits):
            raise ValueError(f"crypto_mb has no exponentiation for a {mod_bits}-bit modulus")
        count = len(bases)
        if count == 0:
            return []
        words = -(-max(mod_bits, exp_bits) // 64)
        width = words * 8
        lanes = -(-count // LANES) * LANES
        base_buf = ctypes.create_string_buffer(
            b"".join((b % modulus).to_bytes(width, "little") for b in bases) + (1).to_bytes(width, "little") * (lanes - count))
        exp_buf = ctypes.create_string_buffer(
            b"".join(int(e).to_bytes(width, "little") for e in exponents) + bytes(width) * (lanes - count))
        mod_buf = ctypes.create_string_buffer(modulus.to_bytes(width, "little"))
        out_buf = ctypes.create_string_buffer(lanes * width)
        scratch_len = self._sizes[mod_bits]
        scratch = ctypes.create_string_buffer(scratch_len)
        try:
            mods = _Pointers(*([ctypes.addressof(mod_buf)] * LANES))
            base_ptrs = _addresses(ctypes.addressof(base_buf), lanes, width)
            exp_ptrs = _addresses(ctypes.addressof(exp_buf), lanes, width)
            out_ptrs = _addresses(ctypes.addressof(out_buf), lanes, width)
            b0, e0, o0 = (a.buffer_info()[0] for a in (base_ptrs, exp_ptrs, out_ptrs))
            step = LANES * ctypes.sizeof(ctypes.c_void_p)
            for offset in range(0, lanes * ctypes.sizeof(ctypes.c_void_p), step):
                status = self._exp(o0 + offset, b0 + offset, e0 + offset, exp_bits, mods, mod_bits,
                                   scratch, scratch_len)
                if status:
                    raise RuntimeError(f"crypto_mb exponentiation failed (status {status:#x})")
            raw = out_buf.raw
        finally:
            ctypes.memset(exp_buf, 0, len(exp_buf))
            ctypes.memset(scratch, 0, scratch_len)
        return [int.from_bytes(raw[i * width:(i + 1) * width], "little") for i in range(count)]


def _addresses(start: int, count: int, stride: int) -> array:
    """A C array of `count` pointers into one buffer, `stride` bytes apart."""
    return array("Q", range(start, start + count * stride, stride))


def _failed_lanes(status: int, group: int, count: int) -> list[int]:
    """The indices of a batch's points of small order, from its per-lane status; any other
    failure is the library's, not the peer's."""
    out = []
    for lane in range(LANES):
        code = (status >> (4 * lane)) & 0xF
        index = group * LANES + lane
        if code == LOW_ORDER and index < count:
            out.append(index)
        elif code:
            raise RuntimeError(f"crypto_mb X25519 failed (status {status:#x})")
    return out


def load() -> CryptoMB:
    """The bound library, after a known-answer check of both operations; `Unavailable`
    when this machine cannot run it (says why)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise Unavailable(f"crypto_mb runs on x86-64 Linux only (this is {sys.platform}/{platform.machine()})")
    if not cpu_has_ifma():
        raise Unavailable("this CPU has no AVX-512 IFMA (no avx512ifma in /proc/cpuinfo)")
    try:
        for name in RUNTIME_LIBRARIES:
            ctypes.CDLL(_find(name), mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(_find(LIBRARY))
    except OSError as exc:
        raise Unavailable(f"crypto_mb or the Intel compiler runtime did not load ({exc}); install "
                          "the 'ifma' extra (pip install 'ppre[ifma]')") from None
    lib.mbx_is_crypto_mb_applicable.restype = ctypes.c_int
    lib.mbx_is_crypto_mb_applicable.argtypes = [ctypes.c_uint64]
    if not lib.mbx_is_crypto_mb_applicable(0):
        raise Unavailable("crypto_mb reports that it cannot run on this CPU")
    bound = CryptoMB(lib)
    _known_answers(bound)
    return bound


#: RFC 7748 section 5.2, the first X25519 test vector: scalar, u-coordinate, result
_RFC7748_SCALAR = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
_RFC7748_U = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
_RFC7748_OUT = bytes.fromhex("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552")


def _known_answers(bound: CryptoMB) -> None:
    """Refuse a library that computes wrong answers: RFC 7748's X25519 vector in every lane,
    a small-order point named, and an exponentiation against Python's `pow`."""
    out, low = bound.x25519(_RFC7748_SCALAR, _RFC7748_U * 7 + bytes(32))
    if out[:7 * 32] != _RFC7748_OUT * 7 or low != [7]:
        raise Unavailable("crypto_mb failed its X25519 known-answer check")
    modulus = (1 << 2047) + 0x1DB  # odd, 2048 bits
    bases = [3 + i for i in range(9)]
    exps = [(1 << 79) + 12345 * i for i in range(9)]
    if bound.powmod(bases, exps, modulus, 80) != [pow(b, e, modulus) for b, e in zip(bases, exps)]:
        raise Unavailable("crypto_mb failed its exponentiation known-answer check")

