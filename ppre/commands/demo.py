"""`ppre demo`: a whole audit on synthetic data, with the true-race values beside it.

With no arguments: generates members and model outputs with a known injected
disparity, starts both services as real gRPC servers on loopback, runs an ERO audit
(B = 1000, 95% CIs, 2048-bit Paillier) and prints the per-group table.
`--write-data DIR` instead writes the inputs that docker-compose.yml mounts
(DIR/tester/probabilities.csv, DIR/client/ero.csv) and exits.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from client_service.datasets import DatasetRegistry
from common import bootstrap as boot
from common.report import AuditReport
from ppre.demo_data import make_demo_data
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.inputs import read_probability_table
from tester_service.server import run_audit


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("demo", help="run a demo audit on synthetic data")
    s.add_argument("--members", type=int, default=4000)
    s.add_argument("--bootstrap", type=int, default=boot.DEFAULT_REPLICATES)
    s.add_argument("--disparity", type=float, default=0.10, help="extra FPR injected for black members")
    s.add_argument("--seed", type=int, default=4)
    s.add_argument("--write-data", metavar="DIR", help="write the compose example data and exit")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data = make_demo_data(args.members, disparity=args.disparity, seed=args.seed)
    if args.write_data:
        root = Path(args.write_data)
        (root / "tester").mkdir(parents=True, exist_ok=True)
        (root / "client").mkdir(parents=True, exist_ok=True)
        data.probabilities.to_csv(root / "tester" / "probabilities.csv", index=False)
        data.outputs.to_csv(root / "client" / "ero.csv", index=False)
        print(f"wrote {root / 'tester' / 'probabilities.csv'} and {root / 'client' / 'ero.csv'}")
        return 0
    print(f"PPRE demo: {args.members} members at the Tester, {len(data.outputs)} model outputs at the "
          f"Test-Client; injected disparity: FPR +{args.disparity:.2f} for black members.", flush=True)
    with tempfile.TemporaryDirectory(prefix="ppre-demo-") as tmp:
        tp, cp = Path(tmp) / "probabilities.csv", Path(tmp) / "ero.csv"
        data.probabilities.to_csv(tp, index=False)
        data.outputs.to_csv(cp, index=False)
        request = pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=args.bootstrap, confidence=0.95,
                                  has_seed=True, seed=args.seed)
        with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp})) as svc:
            event = run_audit(svc.tester_address, request, on_progress=lambda p: print(
                f"  [{p.elapsed_s:6.1f}s] {p.phase}: {p.message}", flush=True))
    if event.WhichOneof("event") != "result":
        print(f"demo audit failed ({event.error.code}): {event.error.message}", file=sys.stderr)
        return 1
    report = AuditReport.from_proto(event.result)
    truth = data.true_fpr()
    print()
    print(report.to_table())
    print("\nbeside the privacy-preserving estimates, the FPR computed with the hidden true races:")
    print(f"{'group':<12}{'PPRE':>10}{'true race':>11}{'in CI':>7}")
    for g in report.groups:
        t = truth[g.group]
        inside = g.estimate is not None and not math.isnan(t) and g.ci_low <= t <= g.ci_high
        est = f"{g.estimate:.4f}" if g.estimate is not None else "n/a"
        print(f"{g.group:<12}{est:>10}{t:>11.4f}{'yes' if inside else 'no':>7}")
    print(f"\ntotal {report.phase_seconds.get('total', 0):.1f} s")
    return 0
