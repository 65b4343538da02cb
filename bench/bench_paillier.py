"""Benchmark: our Paillier encryption paths against `phe`'s `PaillierPublicKey.encrypt`, side by
side in one run, on the same plaintexts under the same 2048-bit key.

    .venv/bin/python bench/bench_paillier.py [--count 2000] [--bits 2048] [--seed 7] [--repeat 3]
                                             [--workers N] [--json FILE]

One key: `paillier.generate_keypair(bits)` (phe makes its primes); phe's own key objects
are built from the same n, p and q (`PaillierPublicKey(n)`, `PaillierPrivateKey(pub, p, q)`;
phe also uses g = n + 1), so every path encrypts under the same modulus and phe's private
key can decrypt every path's ciphertexts. Plaintexts: `count` random 64-bit values.

Paths (each timed over all `count` plaintexts, `repeat` times, the median reported):

* ours, key owner: `key.encrypt_task()(plaintexts)` (`OwnerEncryption`: h^alpha mod p^2 and
  mod q^2 from fixed-base tables, joined by the CRT; packed bytes out), what the
  Test-Client runs on its own rows;
* ours, public key: `paillier.encrypt_chunk(n, h, plaintexts)` (h^alpha mod n^2 from a
  fixed-base table), what anyone holding only the public key runs;
* phe: `[pub.encrypt(v) for v in plaintexts]` (encode, then the ciphertext times r^n mod
  n^2 with r uniform below n, `gmpy2.powmod`).

Randomness: ours is Damgard-Jurik-Nielsen's short-exponent randomizer, h^alpha with h =
x^(2n) mod n^2 a fixed public n-th residue and alpha fresh of `paillier.RANDOMIZER_BITS`
bits: a product of table entries (one per window of alpha), no exponentiation at run
time. phe's is the textbook r^n mod n^2 for a fresh uniform r: a 2048-bit exponent mod a
4096-bit modulus per value. That difference, not the arithmetic library (both use gmpy2),
is why ours is faster; the tables cost a one-off setup per key (per worker), reported on
its own (`setup_s`: the first call on one value, which builds them).

On one core (this process) every path; on all cores (`ProcessExecutor`, one process per
CPU, started and warmed, tables built, before the clock) our two paths and phe's, the
plaintexts cut into `executor.chunk_count()` chunks. Correctness: a sample of every
path's ciphertexts (`--check`, default 100) is decrypted with phe's private key and with
ours (`decrypt_mod_p`) and must give the plaintexts back; every ciphertext is checked to
be a unit below n^2 and all of a path's ciphertexts distinct.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def phe_encrypt_chunk(n: int, plaintexts: list[int]) -> list[int]:
    """phe's encryption of a chunk, as an executor task (ciphertexts as integers)."""
    from phe import paillier as phe_paillier

    pub = phe_paillier.PaillierPublicKey(n)
    return [pub.encrypt(v).ciphertext(be_secure=False) for v in plaintexts]


def ours_public_chunk(n: int, h: int, plaintexts: list[int]) -> list[int]:
    from common.crypto import paillier

    return paillier.encrypt_chunk(n, h, plaintexts)


def _timed(fn, repeat: int) -> tuple[list[float], object]:
    walls, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return walls, out


def _row(path: str, mode: str, walls: list[float], count: int, setup_s: float | None, correct: bool) -> dict:
    wall = statistics.median(walls)
    return {"path": path, "mode": mode, "wall_s": round(wall, 4), "walls_s": [round(w, 4) for w in walls],
            "us_per_encryption": round(wall / count * 1e6, 1), "setup_s": None if setup_s is None else round(setup_s, 4),
            "us_per_encryption_with_setup": round((wall + (setup_s or 0.0)) / count * 1e6, 1),
            "correct": correct}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="plaintexts (random 64-bit values)")
    ap.add_argument("--bits", type=int, default=2048, help="Paillier modulus bits")
    ap.add_argument("--seed", type=int, default=7, help="seed of the plaintexts")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per path (the median is reported)")
    ap.add_argument("--check", type=int, default=100, help="ciphertexts per path decrypted to check")
    ap.add_argument("--workers", type=int, default=None, help="processes for 'all cores' (default: the CPU count)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    import gmpy2
    import phe
    from phe import paillier as phe_paillier
    from phe import util as phe_util

    from common.execution import parallel
    from common.crypto import paillier

    load_before = os.getloadavg()
    rng = random.Random(args.seed)
    plaintexts = [rng.getrandbits(64) for _ in range(args.count)]
    t0 = time.perf_counter()
    key = paillier.generate_keypair(args.bits, allow_insecure=args.bits < paillier.MIN_MODULUS_BITS)
    keygen_s = time.perf_counter() - t0
    n, h = key.public.n, key.public.h
    n2 = n * n
    phe_pub = phe_paillier.PaillierPublicKey(n)
    phe_priv = phe_paillier.PaillierPrivateKey(phe_pub, key.p, key.q)
    width = key.public.ciphertext_bytes
    check = list(range(0, args.count, max(1, args.count // max(1, args.check))))[:args.check]

    def verify(ciphertexts: list[int]) -> bool:
        if len(ciphertexts) != args.count or len(set(ciphertexts)) != args.count:
            return False
        if not all(0 < c < n2 and gmpy2.gcd(c, n) == 1 for c in ciphertexts):
            return False
        sample = [ciphertexts[i] for i in check]
        ours_plain = key.decrypt_mod_p(sample)
        return all(phe_priv.raw_decrypt(c) == plaintexts[i] == m for c, i, m in zip(sample, check, ours_plain))

    def unpack(packed: bytes) -> list[int]:
        return [int.from_bytes(packed[i:i + width], "big") for i in range(0, len(packed), width)]

    rows = []
    one = "1 core (this process)"
    # ours, key owner (CRT): the first call builds this key's tables
    task = key.encrypt_task()
    t0 = time.perf_counter()
    task(plaintexts[:1])
    setup = time.perf_counter() - t0
    walls, packed = _timed(lambda: task(plaintexts), args.repeat)
    rows.append(_row("ours, key owner: key.encrypt_task()", one, walls, args.count, setup, verify(unpack(packed))))
    # ours, public key
    t0 = time.perf_counter()
    paillier.encrypt_chunk(n, h, plaintexts[:1])
    setup = time.perf_counter() - t0
    walls, out = _timed(lambda: paillier.encrypt_chunk(n, h, plaintexts), args.repeat)
    rows.append(_row("ours, public key: paillier.encrypt_chunk", one, walls, args.count, setup, verify(out)))
    # phe
    walls, out = _timed(lambda: [phe_pub.encrypt(v) for v in plaintexts], args.repeat)
    rows.append(_row("phe: PaillierPublicKey.encrypt", one, walls, args.count, None,
                     verify([c.ciphertext(be_secure=False) for c in out])))

    executor = parallel.ProcessExecutor(args.workers).start()
    every = f"all cores: ProcessExecutor({executor.workers})"
    try:
        chunks = [(part,) for part in parallel.split(plaintexts, executor.chunk_count())]

        def owner_all() -> bytes:
            return b"".join(executor.run_chunks(task, chunks))

        def public_all() -> list[int]:
            return [c for part in executor.run_chunks(ours_public_chunk, [(n, h) + c for c in chunks]) for c in part]

        def phe_all() -> list[int]:
            return [c for part in executor.run_chunks(phe_encrypt_chunk, [(n,) + c for c in chunks]) for c in part]

        for label, fn, conv in (("ours, key owner: key.encrypt_task()", owner_all, unpack),
                                ("ours, public key: paillier.encrypt_chunk", public_all, list),
                                ("phe: PaillierPublicKey.encrypt", phe_all, list)):
            # warm-up before the clock: every worker imports the modules and builds its tables
            warm = [(part,) for part in parallel.split(plaintexts[:4 * executor.workers], 2 * executor.workers)]
            t0 = time.perf_counter()
            if fn is owner_all:
                executor.run_chunks(task, warm)
            elif fn is public_all:
                executor.run_chunks(ours_public_chunk, [(n, h) + c for c in warm])
            else:
                executor.run_chunks(phe_encrypt_chunk, [(n,) + c for c in warm])
            setup = time.perf_counter() - t0
            walls, out = _timed(fn, args.repeat)
            rows.append(_row(label, every, walls, args.count, setup if fn is not phe_all else None, verify(conv(out))))
    finally:
        executor.shutdown()
    load_after = os.getloadavg()

    by = {(r["path"].split(":")[0], r["mode"] == one): r for r in rows}
    phe_one = by[("phe", True)]["us_per_encryption"]
    phe_all_us = by[("phe", False)]["us_per_encryption"]
    ratios = {
        "owner_one_core_vs_phe_one_core": round(phe_one / by[("ours, key owner", True)]["us_per_encryption"], 1),
        "public_one_core_vs_phe_one_core": round(phe_one / by[("ours, public key", True)]["us_per_encryption"], 1),
        "owner_all_cores_vs_phe_all_cores": round(phe_all_us / by[("ours, key owner", False)]["us_per_encryption"], 1),
        "public_all_cores_vs_phe_all_cores": round(phe_all_us / by[("ours, public key", False)]["us_per_encryption"], 1),
        "owner_all_cores_vs_phe_one_core": round(phe_one / by[("ours, key owner", False)]["us_per_encryption"], 1),
    }

    print(f"Paillier encryption, {args.count:,} random 64-bit plaintexts, {n.bit_length()}-bit n (key made in "
          f"{keygen_s:.1f} s), median of {args.repeat} run(s); {os.cpu_count()} CPUs; phe {phe.__version__} "
          f"(gmpy2: {phe_util.HAVE_GMP}); ours: RANDOMIZER_BITS = {paillier.RANDOMIZER_BITS}, "
          f"OWNER_WINDOW = {paillier.OWNER_WINDOW}\n")
    print(f"| path | cores | µs / encryption | wall (s) | speed-up vs phe (same cores) | one-off setup (s) | "
          f"µs / encryption, setup spread over {args.count:,} | correct |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        phe_us = phe_one if r["mode"] == one else phe_all_us
        setup_text = "" if r["setup_s"] is None else f"{r['setup_s']:.3f}"
        print(f"| {r['path']} | {r['mode']} | {r['us_per_encryption']:,.1f} | {r['wall_s']:.3f} | "
              f"{phe_us / r['us_per_encryption']:.1f}x | {setup_text} | {r['us_per_encryption_with_setup']:,.1f} | "
              f"{'yes' if r['correct'] else 'NO'} |")
    print()
    bar = ratios["owner_one_core_vs_phe_one_core"]
    print(f"one core, key owner vs phe: {bar:.1f}x; public key vs phe: {ratios['public_one_core_vs_phe_one_core']:.1f}x "
          f"(bar: 10x, {'met' if min(bar, ratios['public_one_core_vs_phe_one_core']) >= 10 else 'see the rows'})")
    print(f"1-minute load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    ok = all(r["correct"] for r in rows)
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "count": args.count, "bits": n.bit_length(), "keygen_s": round(keygen_s, 2), "phe": phe.__version__,
            "randomizer_bits": paillier.RANDOMIZER_BITS, "rows": rows, "speedup_vs_phe": ratios,
            "loadavg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)]}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
