"""Benchmark: the batch primitives on both backends (`common.crypto.batch`), and phe, side by
side in one process, interleaved.

    .venv/bin/python bench/bench_backends.py [--count 4000] [--bits 2048] [--repeat 3] [--json FILE]

Per operation (CPU µs, one core, the median of `repeat` interleaved rounds: portable, ifma,
phe where it has the operation, then again), on one 2048-bit key:

* X25519 of a validated point (`batch.x25519_many`, what `Com.Enc` runs per point);
* the key owner's encryption (`OwnerEncryption`: h^alpha mod p^2 and q^2 from fixed-base
  tables, gmpy2's on portable, the IFMA kernel's eight at a time on ifma; phe: `encrypt`,
  r^n mod n^2), the public-key encryption and the rerandomisation (tables mod n^2);
* decryption modulo p (`PrivateKey.decrypt_mod_p`; phe: `decrypt`, full CRT);
* the ratio mask's factor, Enc(x)^r mod n^2 with r < 2^80 read at 80 bits
  (`paillier.scalar_pow_many`);
* the aggregation's multi-exponentiation: one bucket of 390 ciphertexts under 8 columns
  of 32-bit weights (`batch.multi_exp_many`: Pippenger per column on portable, eight
  columns in the IFMA kernel's lanes), per base and column.

Then the exponent-length check: on each backend the factor's time for r of 32 bits and of
80 bits (both at the 80-bit width). The IFMA kernel reads every exponent at the stated
width, so its two times agree; gmpy2's `powmod` shows the length.

Every result is checked: the two backends' bytes agree (the owner's encryption under the
same randomizer exponents), decryptions give the plaintexts back.
"""
from __future__ import annotations

import argparse
import json
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.crypto import batch, commutative, paillier  # noqa: E402


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="ascii", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="ascii", errors="replace"):
            if line.startswith("flags"):
                return " ".join(f for f in line.split()[2:] if f.startswith("avx512") or f in ("adx", "bmi2"))
    except OSError:
        pass
    return ""


def timed(fn, count: int) -> float:
    """CPU µs per operation of fn() (which does `count` operations)."""
    start = time.process_time()
    fn()
    return (time.process_time() - start) / count * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=4000, help="operations per measurement (X25519: 4x this)")
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    backends = ["portable"] + (["ifma"] if batch.select("auto") == "ifma" else [])
    if len(backends) == 1:
        print(f"ifma backend unavailable here: {batch.backend_reason()}", file=sys.stderr)
    from phe import paillier as phe

    key = paillier.generate_keypair(args.bits)
    n, h, n2 = key.public.n, key.public.h, key.public.n2
    phe_pub = phe.PaillierPublicKey(n)
    phe_priv = phe.PaillierPrivateKey(phe_pub, key.p, key.q)
    count = args.count
    salt = secrets.token_bytes(32)
    points = commutative.hash_ids(salt, [f"m{i}" for i in range(4 * count)])  # packed
    scalar = secrets.token_bytes(32)
    plain = [secrets.randbits(64) for _ in range(count)]
    alphas = [secrets.randbits(paillier.RANDOMIZER_BITS) for _ in range(count)]
    cts = paillier.encrypt_chunk(n, h, plain)
    factors = [(1 << 79) | secrets.randbits(79) for _ in range(count)]
    short = [(1 << 31) | secrets.randbits(31) for _ in range(count)]
    weights = [[secrets.randbits(32) for _ in range(390)] for _ in range(8)]
    few = max(50, count // 40)  # phe's operations are slow: a sample

    rows: dict[str, dict[str, list[float]]] = {}
    outputs: dict[str, dict[str, object]] = {}

    def record(op: str, who: str, us: float) -> None:
        rows.setdefault(op, {}).setdefault(who, []).append(us)

    for _ in range(args.repeat):
        for name in backends:
            batch.select(name)
            res = {}
            record("X25519 (per point)", name, timed(lambda: res.update(x=batch.x25519_many(scalar, points)), 4 * count))
            task = key.encrypt_task()
            task.with_randomizers(plain[:1], alphas[:1])  # tables built before the clock
            paillier.rerandomize_chunk(n, h, cts[:1])
            record("owner encryption (per value)", name, timed(lambda: res.update(e=task.with_randomizers(plain, alphas)), count))
            record("public-key encryption mod n^2 (per value)", name,
                   timed(lambda: paillier.encrypt_chunk(n, h, plain), count))
            record("rerandomisation mod n^2 (per ciphertext)", name,
                   timed(lambda: paillier.rerandomize_chunk(n, h, cts), count))
            record("decryption mod p (per ciphertext)", name, timed(lambda: res.update(d=key.decrypt_mod_p(cts)), count))
            record("mask factor Enc(x)^r, r < 2^80 (per item)", name,
                   timed(lambda: res.update(m=paillier.scalar_pow_many(n, cts, factors, 80)), count))
            # the width check: 32-bit and 80-bit factors alternated in small batches, so
            # that a change in the machine's load falls on both
            for _ in range(5):
                record("mask factor, r of 32 bits at width 80 (per item)", name,
                       timed(lambda: paillier.scalar_pow_many(n, cts[:400], short[:400], 80), 400))
                record("mask factor, r of 80 bits at width 80, alternated (per item)", name,
                       timed(lambda: paillier.scalar_pow_many(n, cts[:400], factors[:400], 80), 400))
            record("multi-exponentiation, 32-bit weights, 390 bases (per base and column)", name,
                   timed(lambda: res.update(a=batch.multi_exp_many(cts[:390], weights, n2)), 390 * 8))
            for op, k in (("X25519", "x"), ("owner encryption", "e"), ("decryption", "d"), ("mask factor", "m"), ("multi-exponentiation", "a")):
                outputs.setdefault(op, {})[name] = res[k]
        record("public-key encryption mod n^2 (per value)", "phe", timed(lambda: [phe_pub.encrypt(v) for v in plain[:few]], few))
        enc = [phe.EncryptedNumber(phe_pub, c) for c in cts[:few]]
        record("decryption mod p (per ciphertext)", "phe (full CRT)",
               timed(lambda: [phe_priv.raw_decrypt(c.ciphertext(be_secure=False)) for c in enc], few))

    for op, outs in outputs.items():
        if len(set(map(repr, outs.values()))) != 1:
            raise SystemExit(f"{op}: the backends disagree")
    if outputs["decryption"]["portable"] != plain:
        raise SystemExit("decryption did not give the plaintexts back")

    medians = {op: {who: statistics.median(v) for who, v in per.items()} for op, per in rows.items()}
    print(f"CPU: {cpu_model()}; flags: {cpu_flags()}; Python {platform.python_version()}; {args.bits}-bit key; "
          f"count {count}, {args.repeat} rounds; backends {', '.join(backends)}")
    who_all = ["portable", "ifma", "phe", "phe (full CRT)"]
    print("| operation | " + " | ".join(w for w in who_all if any(w in m for m in medians.values())) + " | portable / ifma |")
    print("|---|" + "---|" * (sum(any(w in m for m in medians.values()) for w in who_all) + 1))
    for op, per in medians.items():
        cells = [f"{per[w]:.1f}" if w in per else "" for w in who_all if any(w in m for m in medians.values())]
        ratio = f"{per['portable'] / per['ifma']:.2f}x" if "ifma" in per else ""
        print(f"| {op} | " + " | ".join(cells) + f" | {ratio} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "flags": cpu_flags(), "bits": args.bits,
                                               "count": count, "medians_us": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
