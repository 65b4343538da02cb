"""Benchmark: a 10,000 x 10,000-member ERO audit (50% overlap, B = 1000, 2048-bit Paillier),
both services as real gRPC servers on loopback (the bar: under 60 s on 2 cores).

    .venv/bin/python bench/bench_ero.py [--members 10000] [--bootstrap 1000] [--workers N]

Prints the wall time and the phase timings reported by both parties.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def make_files(directory: Path, members: int, overlap: float, seed: int = 7) -> tuple[Path, Path]:
    from common.races import RACES

    rng = np.random.default_rng(seed)
    n_common = int(members * overlap)
    tester_ids = [f"T{i:08d}" for i in range(members)]
    client_ids = tester_ids[:n_common] + [f"C{i:08d}" for i in range(members - n_common)]
    rng.shuffle(client_ids)
    probs = rng.dirichlet(np.full(len(RACES), 0.5), members)
    tester = pd.DataFrame(probs, columns=list(RACES))
    tester.insert(0, "member_id", tester_ids)
    y = rng.integers(0, 2, members)
    client = pd.DataFrame({"member_id": client_ids, "y_true": y,
                           "y_pred": (rng.random(members) < np.where(y == 1, 0.8, 0.15)).astype(int)})
    tp, cp = directory / "probabilities.csv", directory / "ero.csv"
    tester.to_csv(tp, index=False)
    client.to_csv(cp, index=False)
    return tp, cp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--result-recipient", default="client")
    args = ap.parse_args()

    from client_service.datasets import DatasetRegistry
    from common.execution import parallel
    from common.stats.results import AuditReport
    from ppre.report.text import render_text
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.inputs import read_probability_table
    from tester_service.server import run_audit

    with tempfile.TemporaryDirectory() as tmp:
        tp, cp = make_files(Path(tmp), args.members, args.overlap)
        # one pool for both services, started now so that process start-up is not billed to the audit
        executor = parallel.ProcessExecutor(args.workers).start()
        request = pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=args.bootstrap, confidence=0.95,
                                  has_seed=True, seed=1, result_recipient=args.result_recipient)
        try:
            with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                                executor=executor) as svc:
                t0 = time.perf_counter()
                event = run_audit(svc.tester_address, request)
                wall = time.perf_counter() - t0
        finally:
            executor.shutdown()
    if event.WhichOneof("event") != "result":
        print("audit failed:", event.error.code, event.error.message)
        return 1
    report = AuditReport.from_proto(event.result)
    print(render_text(report))
    print(f"\nwall time: {wall:.2f} s  ({args.members} x {args.members} members, "
          f"{args.overlap:.0%} overlap, B={args.bootstrap}, workers={executor.workers}, cpus={os.cpu_count()})")
    print(json.dumps({k: round(v, 2) for k, v in report.phase_seconds.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
