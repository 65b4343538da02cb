"""Benchmark and validation: the paper's LOT validation via synthetic data (section 8.2.1,
Table 5), run through both services as real gRPC servers on loopback.

    .venv/bin/python bench/bench_lot.py [--queries 40000] [--bootstrap 1000] [--bits 2048]
                                        [--same-group-pairs] [--workers N] [--seed 1] [--json [FILE]]

Data: ``queries`` ranked lists of 10 positions, every position a different member
(400,000 members at full size); relevance at rank 1 uniform, at each next rank the
previous one minus the predefined gap (Table 5) plus N(0, 1e-2) noise
(`tests.metric_data.lot_validation_data`). The Tester's probability table
(member_id, hsm, non_hsm) is drawn independently of the outcomes (hsm ~ U(0, 1),
non_hsm = 1 − hsm), so every group-pair cell of rank pair r-(r+1) estimates the gap.
The audit is `metric=lot`, `metric_option=raw`, production 2048-bit Paillier.

Prints per rank pair: the gap, the estimate of every directed cell, its error, the
bootstrap sd implied by the 95% percentile interval ((ci_high − ci_low) / 3.92), the
wall time and the phase timings both parties report. ``--json`` writes the same as one
JSON object (to FILE, or to stdout without one). Exit status 1 when a cell misses the
paper's 3e-4 bar.
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

#: Table 5's ground-truth gaps, rank pairs 1-2 .. 9-10
GAPS = (0.12, 0.34, -0.27, 0.78, -0.43, -0.24, -0.29, 0.76, -0.41)
TOLERANCE = 3e-4
Z95 = 3.92  # width of a 95% normal interval in standard deviations (2 x 1.96)


def make_data(directory: Path, queries: int, seed: int = 7) -> tuple[pd.DataFrame, Path]:
    """(the Tester's probability table, the Test-Client's LOT dataset as a CSV file)."""
    from tests.metric_data import lot_validation_data

    rng = np.random.default_rng(seed)
    lists = lot_validation_data(queries, GAPS, rng, noise=1e-2)
    hsm = rng.uniform(0.0, 1.0, len(lists))
    probabilities = pd.DataFrame({"member_id": lists["member_id"].to_numpy(), "hsm": hsm, "non_hsm": 1.0 - hsm})
    path = directory / "lot.csv"
    lists.to_csv(path, index=False, float_format="%.17g")
    return probabilities, path


def rank_pair_label(r: int) -> str:
    return f"{r}-{r + 1}"


def validation_rows(report, gaps=GAPS) -> list[dict]:
    """One row per (rank pair, directed cell): gap, estimate, error, implied bootstrap sd."""
    rows = []
    by_label = {}
    for cell in report.cells:
        if cell.rank_pair is not None:
            by_label.setdefault(cell.rank_pair, []).append(cell)
    labels = sorted(by_label, key=lambda s: int(str(s).split("-")[0]))
    if len(labels) != len(gaps):
        raise AssertionError(f"expected {len(gaps)} rank pairs, the report has {labels}")
    for label, gap in zip(labels, gaps):
        for cell in by_label[label]:
            sd = None if cell.ci_low is None or cell.ci_high is None else (cell.ci_high - cell.ci_low) / Z95
            rows.append({"rank_pair": label, "higher": cell.higher, "lower": cell.lower, "gap": gap,
                         "estimate": cell.estimate, "ci_low": cell.ci_low, "ci_high": cell.ci_high,
                         "error": None if cell.estimate is None else cell.estimate - gap, "sd": sd})
    return rows


def run(queries: int, bootstrap: int, *, bits: int = 2048, seed: int = 1, same_group_pairs: bool = False,
        data_seed: int = 7, executor=None):
    """Generate the data, run the audit on `executor` (both services' per-row work; default
    inline, `common.execution.parallel`; the caller starts and shuts it down); returns (AuditReport,
    wall seconds, setup seconds)."""
    from client_service.datasets import DatasetRegistry
    from common.stats.results import AuditReport
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.server import run_audit

    t_setup = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        probabilities, path = make_data(Path(tmp), queries, data_seed)
        setup = time.perf_counter() - t_setup
        # the relevances' declared range (rank 1 in [2, 3], then Table 5's gaps): the release
        # noise is sized from it, and a value outside is refused
        params = {"relevance_range": "0.5:3.5", "out_of_range": "refuse",
                  **({"same_group_pairs": "true"} if same_group_pairs else {})}
        request = pb.AuditRequest(metric="lot", client_dataset="lot", bootstrap=bootstrap, confidence=0.95,
                                  has_seed=True, seed=seed, metric_option="raw", metric_params=params)
        with local_services(lambda: probabilities, DatasetRegistry(named={"lot": path}),
                            modulus_bits=bits, allow_insecure=bits < 2048, executor=executor) as svc:
            t0 = time.perf_counter()
            event = run_audit(svc.tester_address, request)
            wall = time.perf_counter() - t0
    if event.WhichOneof("event") != "result":
        raise RuntimeError(f"audit failed: {event.error.code}: {event.error.message}")
    return AuditReport.from_proto(event.result), wall, setup


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=40_000)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--bits", type=int, default=2048, help="Paillier modulus bits (below 2048: insecure, tests only)")
    ap.add_argument("--seed", type=int, default=1, help="the audit's seed (buckets and resampling)")
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--same-group-pairs", action="store_true", help="also report the (a, a) cells")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE")
    args = ap.parse_args()
    from common.execution import parallel

    load_before = os.getloadavg()
    # one pool for both services, started before the audit so that process start-up is not billed to it
    executor = parallel.ProcessExecutor(args.workers).start()
    try:
        report, wall, setup = run(args.queries, args.bootstrap, bits=args.bits, seed=args.seed,
                                  same_group_pairs=args.same_group_pairs, data_seed=args.data_seed,
                                  executor=executor)
    finally:
        executor.shutdown()  # reap the workers, so that their CPU time is counted below
    load_after = os.getloadavg()
    workers = executor.workers
    t = os.times()
    cpu = t.user + t.system + t.children_user + t.children_system
    rows = validation_rows(report)
    worst = max(abs(r["error"]) if r["error"] is not None else float("inf") for r in rows)
    sds = [r["sd"] for r in rows if r["sd"] is not None]
    ok = worst <= TOLERANCE
    summary = {
        "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "queries": args.queries, "members": args.queries * (len(GAPS) + 1), "bootstrap": args.bootstrap,
        "modulus_bits": args.bits, "same_group_pairs": args.same_group_pairs, "workers": workers,
        "cpus": os.cpu_count(), "wall_s": round(wall, 2), "data_setup_s": round(setup, 2),
        # CPU of this process and its workers over the whole command (data generation included);
        # the load averages show whether other work shared the machine
        "cpu_s": round(cpu, 1), "loadavg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "max_abs_error": worst, "sd_min": min(sds) if sds else None, "sd_max": max(sds) if sds else None,
        "within_tolerance": ok, "tolerance": TOLERANCE,
        "verdict": {"significant": report.verdict.significant, "severity": report.verdict.severity,
                    "message": report.verdict.message},
        "n_matched": report.n_matched, "info": report.info,
        "phase_seconds": {k: round(v, 3) for k, v in report.phase_seconds.items()},
        "rank_pairs": rows,
    }
    if args.json is not None:
        text = json.dumps(summary, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if args.json != "-":
        print(f"{'rank pair':>9} {'cell':>16} {'gap':>7} {'estimate':>11} {'error':>10} {'boot sd':>9}")
        for r in rows:
            print(f"{r['rank_pair']:>9} {r['higher'] + '>' + r['lower']:>16} {r['gap']:>7.2f} "
                  f"{_fmt(r['estimate'], '>11.6f')} {_fmt(r['error'], '>+10.2e')} {_fmt(r['sd'], '>9.2e')}")
        pooled = [c for c in report.cells if c.rank_pair is None]
        for c in pooled:
            print(f"{'pooled':>9} {c.higher + '>' + c.lower:>16} {'':>7} {_fmt(c.estimate, '>11.6f')}")
        print(f"\nmax |error| {worst:.2e} (bar {TOLERANCE:g}: {'met' if ok else 'MISSED'}); bootstrap sd "
              f"{summary['sd_min']:.2e} .. {summary['sd_max']:.2e}")
        print(f"verdict: significant={report.verdict.significant} severity={report.verdict.severity}")
        print(f"wall time: {wall:.2f} s  ({args.queries} queries x {len(GAPS) + 1} ranks, "
              f"{summary['members']} members, B={args.bootstrap}, {args.bits}-bit Paillier, "
              f"workers={workers}, cpus={os.cpu_count()}; data generation {setup:.2f} s not included)")
        print(f"CPU time (this process and its workers, whole command): {cpu:.1f} s; 1-minute load average "
              f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
        print(json.dumps(summary["phase_seconds"], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
