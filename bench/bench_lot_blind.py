"""Benchmark: what LOT's blind path costs (design §5.3, "The Tester blind to the pairs").

Under the release controls LOT's rows never reach the Tester; this runs the same audit
(the paper's LOT validation data, `bench/bench_lot.py`; option `raw`; both services as
real gRPC servers on loopback; the default release controls) on the blind path and on
the rows the plaintext path would send (`Lot.blind_pairs = False`, in this process
only: the leak the blind path closes), and prints per size the wall time and the
largest difference between the two paths' pooled estimates (noise included: each audit
draws its own), then the CPU time of the whole run (this process and its workers).

    .venv/bin/python bench/bench_lot_blind.py [--queries 1000,4000] [--bits 2048] [--workers N] [--ops]
        [--alternatives MEMBERS]

`--ops` first prints what the path's operations cost one at a time (CPU time, one
process, this process's backend): encryption under a peer's key and the owner's,
decryption modulo p, a row's term (an exponentiation by a 33-bit gap, in the lanes), a
share of the masks' totals (per base and column, masks at the plan's width) and of the
Tester's weighted totals (32-bit weights), then what they add up to per member.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(queries: int, bits: int, executor, blind: bool):
    """One audit under the default controls; (report, wall seconds)."""
    from bench.bench_lot import make_data
    from client_service.datasets import DatasetRegistry
    from common.metrics.lot import Lot
    from common.stats.results import AuditReport
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.release import ReleasePolicy
    from tester_service.server import run_audit

    Lot.blind_pairs = blind
    try:
        with tempfile.TemporaryDirectory() as tmp:
            probabilities, path = make_data(Path(tmp), queries)
            request = pb.AuditRequest(metric="lot", client_dataset="lot", bootstrap=1000, confidence=0.95,
                                      has_seed=True, seed=1, metric_option="raw",
                                      metric_params={"relevance_range": "0.5:3.5", "out_of_range": "refuse"})
            with local_services(lambda: probabilities, DatasetRegistry(named={"lot": path}), modulus_bits=bits,
                                allow_insecure=bits < 2048, executor=executor, release=ReleasePolicy()) as svc:
                t0 = time.perf_counter()
                event = run_audit(svc.tester_address, request)
                wall = time.perf_counter() - t0
    finally:
        Lot.blind_pairs = True
    if event.WhichOneof("event") != "result":
        raise RuntimeError(f"audit failed: {event.error.code}: {event.error.message}")
    return AuditReport.from_proto(event.result), wall


def operation_costs(bits: int, count: int = 400) -> None:
    """The per-operation costs the blind path is made of (module docstring, `--ops`), on
    this process's backend, and what they add up to per member of the member table
    (9 rank pairs, two groups: the paper's and `ppre synth`'s shape)."""
    import secrets

    from common.crypto import batch, paillier
    from common.metrics.lot import RANGE_MEMBERS, METRIC
    key = paillier.generate_keypair(bits, allow_insecure=bits < 2048)
    pub = key.public
    values = [secrets.randbits(bits // 2 - 8) for _ in range(count)]  # below p/3: decodable mod p
    encrypt, decrypt = key.encrypt_task(), key.decrypt_task(signed=True)
    paillier.encrypt_chunk(pub.n, pub.h, values[:2])
    encrypt(values[:2])  # the fixed-base tables, built once per key
    cts = paillier.encrypt_chunk(pub.n, pub.h, values)
    plan = METRIC.blind_plan(("hsm", "non_hsm"), 9, "idcg", {"second_moments": True}, n_members=10_000,
                             tester_modulus_bits=bits)
    bases = (cts * (-(-RANGE_MEMBERS // count)))[:RANGE_MEMBERS]

    def per(fn, n=count) -> float:
        t = time.process_time()
        fn()
        return (time.process_time() - t) / n * 1e3
    costs = {
        "encryption, a peer's key": per(lambda: paillier.encrypt_chunk(pub.n, pub.h, values)),
        "encryption, the owner's (CRT)": per(lambda: encrypt(values)),
        "decryption mod p": per(lambda: decrypt(cts)),
        "a row's term: exponentiation by a 33-bit gap": per(
            lambda: batch.powmod_many(cts, [(1 << 33) - 7] * count, pub.n2, 33)),
        f"masks' totals: per base and column, {plan.mask_bits}-bit": per(
            lambda: batch.multi_exp_wide(bases, [[secrets.randbits(plan.mask_bits) for _ in bases]
                                                 for _ in range(8)], pub.n2), RANGE_MEMBERS * 8),
        "weighted totals: per base and column, 32-bit": per(
            lambda: batch.multi_exp_many(bases, [[secrets.randbits(32) for _ in bases] for _ in range(8)], pub.n2),
            RANGE_MEMBERS * 8)}
    print(f"  backend {batch.backend()}; multi-exponentiations over {RANGE_MEMBERS} bases (a range)")
    for name, ms in costs.items():
        print(f"  {name:<55} {ms:.4f} ms")
    c = list(costs.values())
    cells = plan.strata * plan.vector_cts
    model = {"Tester: its vectors (owner encryptions)": plan.member_cts * c[1],
             "Test-Client: masked sums (encryptions, a peer's key)": cells * c[0],
             "Test-Client: masks' totals (columns per member)": plan.strata * plan.sum_slots * plan.weight_cts * c[4],
             "Tester: weighted totals (columns per member)": cells * plan.weights * c[5],
             "Test-Client: rows' terms (about 1.8 rows per member)": 1.8 * plan.vector_cts * c[3]}
    print(f"  per member of the member table ({plan.strata} rank pairs, {plan.sum_slots} sum slots, "
          f"{plan.weights} head weights), CPU:")
    for name, ms in model.items():
        print(f"    {name:<55} {ms:.3f} ms")
    print(f"    {'total':<55} {sum(model.values()):.3f} ms")


def masks_totals_alternatives(bits: int, members: int) -> None:
    """The masks' totals Σ_a w_a·r_asj two ways on the same members (CPU, one process):
    as built (the Test-Client's multi-exponentiation of the Tester's encrypted head weights
    by its masks, `plan.mask_bits` wide) and as the alternative that moves it to the Tester
    (the Test-Client encrypts its masks under its own key, one ciphertext per member and
    rank pair, and the Tester raises them to its 32-bit weights; the items would then need
    a further round to move the slots into the items' layout, not counted here)."""
    import secrets

    from client_service import blind_pairs as client_side
    from common.crypto import batch, encoding, paillier
    from common.metrics.lot import METRIC
    tester, own = (paillier.generate_keypair(bits, allow_insecure=bits < 2048) for _ in range(2))
    plan = METRIC.blind_plan(("hsm", "non_hsm"), 9, "idcg", {"second_moments": True}, n_members=members,
                             tester_modulus_bits=bits)
    weights = [[secrets.randbits(32) for _ in range(plan.weights)] for _ in range(members)]
    layout = encoding.SlotLayout(plan.total_bits, plan.total_slots)
    encrypt_t = tester.encrypt_task()
    heads = [int.from_bytes(c, "big") for c in _split(encrypt_t([layout.pack(b) for w in weights for b in plan.weight_blocks(w)]),
                                                     tester.public.ciphertext_bytes)]
    masks = client_side.draw(plan.mask_bits, members * plan.strata, plan.sum_slots)
    t = time.process_time()
    columns = [[masks[a * plan.strata + s][j] for a in range(members)]
               for s in range(plan.strata) for j in range(plan.sum_slots)]
    batch.multi_exp_wide(heads, columns, tester.public.n2)
    built = time.process_time() - t
    sums_layout = encoding.SlotLayout(plan.slot_bits, plan.slots)
    encrypt_c = own.encrypt_task()
    encrypt_c([1])
    t = time.process_time()
    cts = [int.from_bytes(c, "big") for c in _split(encrypt_c([sums_layout.pack(b) for r in masks for b in plan.sums_blocks(r)]),
                                                   own.public.ciphertext_bytes)]
    encrypted = time.process_time() - t
    t = time.process_time()
    for s in range(plan.strata):
        batch.multi_exp_many([cts[a * plan.strata + s] for a in range(members)],
                             [[w[c] for w in weights] for c in range(plan.weights)], own.public.n2)
    weighted = time.process_time() - t
    print(f"masks' totals at {members} members, {bits}-bit keys, {batch.backend()} backend (CPU s):")
    print(f"  built: the Test-Client's {len(columns)} columns of {plan.mask_bits}-bit masks   {built:.2f}")
    print(f"  alternative: its {len(masks)} encryptions {encrypted:.2f} + the Tester's {plan.strata} x "
          f"{plan.weights} columns of 32-bit weights {weighted:.2f} = {encrypted + weighted:.2f}")


def _split(packed: bytes, width: int) -> list[bytes]:
    return [packed[i:i + width] for i in range(0, len(packed), width)]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", default="1000,4000", help="comma-separated list counts (10 members each)")
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--ops", action="store_true", help="first the per-operation costs")
    ap.add_argument("--alternatives", type=int, default=0, metavar="MEMBERS",
                    help="first the masks' totals as built and moved to the Tester, at this many members")
    args = ap.parse_args()
    if args.ops:
        print(f"per operation, {args.bits}-bit keys:")
        operation_costs(args.bits)
    if args.alternatives:
        masks_totals_alternatives(args.bits, args.alternatives)
    from common.execution import parallel

    executor = parallel.ProcessExecutor(args.workers).start()
    print(f"LOT under the default release controls, {executor.workers} workers, {args.bits}-bit keys")
    print(f"{'members':>8} {'rows':>7} {'path':>6} {'wall s':>8} {'max |Δ pooled|':>15}")
    try:
        for queries in (int(x) for x in args.queries.split(",")):
            reports = {}
            for blind in (True, False):
                report, wall = run(queries, args.bits, executor, blind)
                reports[blind] = report
                pooled = {(c.higher, c.lower): c.estimate for c in report.cells if c.rank_pair is None}
                other = {(c.higher, c.lower): c.estimate for c in reports[True].cells if c.rank_pair is None}
                diff = max((abs(pooled[k] - other[k]) for k in pooled if pooled[k] is not None
                            and other.get(k) is not None), default=float("nan"))
                print(f"{queries * 10:>8} {queries * 9:>7} {'blind' if blind else 'rows':>6} {wall:>8.1f} "
                      f"{diff:>15.4f}")
    finally:
        executor.shutdown()  # reap the workers, so that their CPU time is counted
    print(f"CPU time of the run: {_cpu():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
