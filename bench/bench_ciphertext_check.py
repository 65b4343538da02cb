"""Benchmark: checking a peer's ciphertext table (`paillier.ciphertexts_from_bytes`, design
§4.7: every ciphertext a unit of Z_{n²}) against the per-ciphertext gcd it replaced, side by
side in one process on the same table.

    .venv/bin/python bench/bench_ciphertext_check.py [--count 20000] [--bits 2048] [--repeat 5]

Paths, each over the same `count` ciphertexts (fresh encryptions under one key), CPU time
per ciphertext, the median of `repeat` interleaved runs:

* table: today's check, the range test per ciphertext and one gcd of their product mod n;
* per ciphertext: the range test and gcd(c, n) for each (the check before).

Both parse the same bytes; both must accept the table and refuse it with a factor of n
inside it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gmpy2
from gmpy2 import mpz

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.crypto import paillier  # noqa: E402
from common.errors import ProtocolError  # noqa: E402


def per_ciphertext(packed: bytes, pub: paillier.PublicKey) -> list[int]:
    """The check before: one gcd per ciphertext."""
    width, n2, n = pub.ciphertext_bytes, pub.n2, mpz(pub.n)
    out = []
    for i in range(0, len(packed), width):
        c = int.from_bytes(packed[i:i + width], "big")
        if not 0 < c < n2 or gmpy2.gcd(c, n) != 1:
            raise ProtocolError(f"ciphertext {i // width} is out of range")
        out.append(c)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    key = paillier.generate_keypair(args.bits)
    pub = key.public
    cts = paillier.encrypt_chunk(pub.n, pub.h, list(range(args.count)))
    packed = paillier.ciphertexts_to_bytes(cts, pub.ciphertext_bytes)
    bad = paillier.ciphertexts_to_bytes(cts[:-1] + [key.p], pub.ciphertext_bytes)
    paths = {"table (one gcd)": paillier.ciphertexts_from_bytes, "per ciphertext (a gcd each)": per_ciphertext}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeat):
        for name, check in paths.items():
            start = time.process_time()
            assert check(packed, pub) == cts
            times[name].append((time.process_time() - start) / args.count * 1e6)
    for name, check in paths.items():
        try:
            check(bad, pub)
        except ProtocolError as exc:
            assert f"ciphertext {args.count - 1}" in str(exc)
        else:
            raise AssertionError(f"{name} accepted a factor of n")
    print(f"{args.count} ciphertexts, {args.bits}-bit n, CPU time per ciphertext (median of {args.repeat}):")
    for name, ts in times.items():
        print(f"  {name:28s} {statistics.median(ts):7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
