"""Benchmark: what the bootstrap costs. The same audit at B = 100 and at B = 1000, for ERO,
LOT and MQOS-AUC, through both services as real gRPC servers on loopback.

    .venv/bin/python bench/bench_bootstrap.py [--metrics ero,lot,mqos-auc] [--low 100] [--high 1000]
                                              [--ero-members 100000] [--overlap 0.5]
                                              [--lot-queries 10000] [--auc-members 100000]
                                              [--bits 2048] [--seed 1] [--workers N] [--json FILE]

The requirement: B = 1000 costs less than twice B = 100 on the same data, i.e.
wall(B = 1000) / wall(B = 100) < 2 for every metric.

Per metric one dataset (fixed data seed 7), then the same audit (audit seed `--seed`) at
B = `--low` and at B = `--high`, both services in this process (`ppre.local`, mutual
TLS, one `common.execution.parallel.ProcessExecutor` shared by both services and started before
the first audit, so worker start-up is not billed to an audit), 2048-bit Paillier, each
metric's default option:

* ERO (fpr): `--ero-members` members on each side, `--overlap` of them shared
  (`bench_audit.make_files`: Dirichlet(0.5) race probabilities, y_pred ~ 0.8 / 0.15).
* LOT (idcg): `--lot-queries` queries x 10 ranks, every position its own member
  (`tests.metric_data.lot_validation_data`, relevance made non-negative); the Tester's
  table `hsm, non_hsm`, hsm ~ U(0, 1).
* MQOS-AUC (exact): `--auc-members` members on each side, `--overlap` shared, y_true ~
  Bernoulli(0.3), score = y + N(0, 1); Dirichlet race probabilities.

Release controls are OFF (`tester_service.release.ReleasePolicy.off()`): with them on
(the default), the Tester releases noised disjoint random groups instead of bootstrap
replicates and B is not used at all, so there would be nothing to measure. MQOS-AUC
(both options) always takes its interval from G = 10 random groups: B does not enter
its audit either way; it is measured anyway, as a control (its ratio should be ~1).

Prints per audit the wall time, the CPU seconds of this process and its workers (less
sensitive to other work on the machine), the 1-minute load average before and after,
and every phase timing both parties report, per metric
the ratio wall(B = high) / wall(B = low) and the growth of each phase, and whether the
point estimates agree at both B (they must: the estimate is the replicate with every
count 1; only the Test-Client's masked ratio, drawn afresh per audit, moves them, by
less than 1e-9). Exit status 1 when a ratio is >= 2 or an estimate differs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

DATA_SEED = 7
METRICS = ("ero", "lot", "mqos-auc")
#: largest |estimate(B = low) - estimate(B = high)| accepted as "the same estimate"
ESTIMATE_TOLERANCE = 1e-9


def _race_probabilities(ids, rng) -> pd.DataFrame:
    from common.races import RACES
    probs = rng.dirichlet(np.full(len(RACES), 0.5), len(ids))
    frame = pd.DataFrame({"member_id": ids})
    for j, race in enumerate(RACES):
        frame[race] = probs[:, j]
    return frame


def _two_sides(members: int, overlap: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """(Tester ids, Test-Client ids): `members` each, `overlap` of them shared, shuffled."""
    n_common = int(members * overlap)
    tester = np.char.add("T", np.char.zfill(np.arange(members).astype(str), 9))
    client = np.concatenate([tester[:n_common],
                             np.char.add("C", np.char.zfill(np.arange(members - n_common).astype(str), 9))])
    rng.shuffle(client)
    return tester.astype(object), client.astype(object)


def make_dataset(metric: str, directory: Path, args) -> tuple[pd.DataFrame, Path, str]:
    """(the Tester's probability table, the Test-Client's file, a one-line description)."""
    rng = np.random.default_rng(DATA_SEED)
    if metric == "ero":
        from bench_audit import make_files
        from tester_service.inputs import read_probability_table
        tp, cp = make_files(directory, args.ero_members, args.overlap, seed=DATA_SEED)
        return (read_probability_table(tp), cp,
                f"{args.ero_members} members each side, {args.overlap:.0%} shared")
    if metric == "lot":
        from tests.metric_data import lot_validation_data
        from bench_lot import GAPS
        lists = lot_validation_data(args.lot_queries, GAPS, rng, noise=1e-2)
        # idcg mode needs non-negative relevances: shift every list by the same constant
        lists["relevance"] = lists["relevance"] - min(0.0, float(lists["relevance"].min()))
        hsm = rng.uniform(0.0, 1.0, len(lists))
        probabilities = pd.DataFrame({"member_id": lists["member_id"].to_numpy(), "hsm": hsm, "non_hsm": 1.0 - hsm})
        path = directory / "lot.csv"
        lists.to_csv(path, index=False, float_format="%.17g")
        return probabilities, path, f"{args.lot_queries} queries x 10 ranks, every position its own member"
    if metric == "mqos-auc":
        tester, client = _two_sides(args.auc_members, args.overlap, rng)
        probabilities = _race_probabilities(tester, rng)
        y = (rng.random(len(client)) < 0.3).astype(np.int64)
        score = y + rng.normal(0.0, 1.0, len(client))
        path = directory / "auc.csv"
        pd.DataFrame({"member_id": client, "y_true": y, "score": score}).to_csv(path, index=False,
                                                                               float_format="%.17g")
        return probabilities, path, f"{args.auc_members} members each side, {args.overlap:.0%} shared"
    raise SystemExit(f"unknown metric {metric}")


def _tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process (both services' threads) and of its live
    child processes (the executor's workers): less sensitive than the wall time to other
    work on the machine."""
    from bench_psi import tree_cpu_seconds
    return tree_cpu_seconds()


def estimates(report) -> dict[str, float | None]:
    out = {f"group {g.group}": g.estimate for g in report.groups}
    out.update({f"cell {c.higher}>{c.lower} {c.rank_pair}": c.estimate for c in report.cells})
    return out


def run_metric(metric: str, args, executor) -> dict:
    from client_service.datasets import DatasetRegistry
    from common.stats.results import AuditReport
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.release import ReleasePolicy
    from tester_service.server import run_audit

    with tempfile.TemporaryDirectory(prefix="ppre-bench-bootstrap-") as tmp:
        t0 = time.perf_counter()
        probabilities, path, description = make_dataset(metric, Path(tmp), args)
        print(f"\n== {metric}: {description} (data in {time.perf_counter() - t0:.1f} s)", flush=True)
        runs = {}
        with local_services(lambda: probabilities, DatasetRegistry(named={metric: path}),
                            modulus_bits=args.bits, allow_insecure=args.bits < 2048,
                            release=ReleasePolicy.off(), executor=executor) as svc:
            for b in (args.low, args.high):
                request = pb.AuditRequest(metric=metric, client_dataset=metric, bootstrap=b, confidence=0.95,
                                          has_seed=True, seed=args.seed)
                load0 = os.getloadavg()[0]
                cpu0, t0 = _tree_cpu_seconds(), time.perf_counter()
                event = run_audit(svc.tester_address, request, tls=svc.operator_tls)
                wall = time.perf_counter() - t0
                cpu = _tree_cpu_seconds() - cpu0
                if event.WhichOneof("event") != "result":
                    raise SystemExit(f"{metric} B={b}: audit failed: {event.error.code}: {event.error.message}")
                report = AuditReport.from_proto(event.result)
                phases = {k: round(v, 2) for k, v in report.phase_seconds.items()}
                runs[b] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                           "load_avg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)], "n_matched": report.n_matched, "interval": report.interval,
                           "option": report.metric_option, "phase_seconds": phases,
                           "estimates": estimates(report)}
                print(f"  B={b:5d}: wall {wall:7.2f} s  CPU {cpu:7.2f} s  load {load0:.2f} -> "
                      f"{os.getloadavg()[0]:.2f}  n_matched {report.n_matched}  interval {report.interval}",
                      flush=True)
                print("    " + " | ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
    low, high = runs[args.low], runs[args.high]
    ratio = high["wall_s"] / low["wall_s"]
    cpu_ratio = high["cpu_s"] / low["cpu_s"]
    growth = {k: round(high["phase_seconds"].get(k, 0.0) - v, 2) for k, v in low["phase_seconds"].items()}
    # the Test-Client's masked ratios (rX + e) / (rY + e') with fresh r, e < r differ from
    # X / Y by far less than 1e-9: equal estimates up to that, never bit-for-bit
    keys = set(low["estimates"]) | set(high["estimates"])
    diffs = [abs(low["estimates"][k] - high["estimates"][k]) for k in keys
             if low["estimates"].get(k) is not None and high["estimates"].get(k) is not None]
    missing = [k for k in keys if (low["estimates"].get(k) is None) != (high["estimates"].get(k) is None)]
    max_diff = max(diffs, default=0.0)
    same = not missing and max_diff <= ESTIMATE_TOLERANCE
    uses_b = low["interval"] == "percentile"
    print(f"  ratio wall(B={args.high}) / wall(B={args.low}) = {ratio:.2f} (CPU {cpu_ratio:.2f})"
          f"{'' if uses_b else '  (interval ' + low['interval'] + ': B is not used)'}; "
          f"point estimates equal: {same} (max |diff| {max_diff:.1e})", flush=True)
    grown = sorted(((v, k) for k, v in growth.items() if k != "total" and abs(v) >= 0.1), reverse=True)
    print("    phase growth (s): " + (" | ".join(f"{k} {v:+.2f}" for v, k in grown) or "none >= 0.1 s"), flush=True)
    return {"metric": metric, "option": low["option"], "data": description, "interval": low["interval"],
            "uses_bootstrap": uses_b, "ratio": round(ratio, 3), "cpu_ratio": round(cpu_ratio, 3), "estimates_equal": same,
            "estimates_max_abs_diff": max_diff,
            "phase_growth_s": growth, "runs": {str(b): {k: v for k, v in r.items() if k != "estimates"}
                                              for b, r in runs.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metrics", default=",".join(METRICS), help="comma-separated, of: " + ", ".join(METRICS))
    ap.add_argument("--low", type=int, default=100, help="the smaller B")
    ap.add_argument("--high", type=int, default=1000, help="the larger B")
    ap.add_argument("--ero-members", type=int, default=100_000)
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--lot-queries", type=int, default=10_000)
    ap.add_argument("--auc-members", type=int, default=100_000)
    ap.add_argument("--bits", type=int, default=2048, help="Paillier modulus bits")
    ap.add_argument("--seed", type=int, default=1, help="the audit seed (buckets and resampling)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default PPRE_WORKERS or CPUs)")
    ap.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    args = ap.parse_args()
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    for m in metrics:
        if m not in METRICS:
            ap.error(f"unknown metric {m!r}")

    from common.execution import parallel

    executor = parallel.ProcessExecutor(args.workers).start()
    print(f"release controls OFF (ReleasePolicy.off()): with them on, intervals come from noised random groups "
          f"and B is not used. Executor {executor.name}, {os.cpu_count()} CPUs, {args.bits}-bit Paillier, "
          f"audit seed {args.seed}.", flush=True)
    try:
        results = [run_metric(m, args, executor) for m in metrics]
    finally:
        executor.shutdown()
    print(f"\n| metric | interval | B={args.low} wall | B={args.high} wall | ratio | CPU ratio |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['metric']} ({r['option'] or 'default'}) | {r['interval']} | "
              f"{r['runs'][str(args.low)]['wall_s']:.1f} s | {r['runs'][str(args.high)]['wall_s']:.1f} s | "
              f"{r['ratio']:.2f} | {r['cpu_ratio']:.2f} |")
    out = {"command": " ".join([Path(sys.executable).name] + sys.argv), "cpus": os.cpu_count(),
           "executor": executor.name, "bits": args.bits, "seed": args.seed, "release_controls": False,
           "date": time.strftime("%Y-%m-%d"), "low": args.low, "high": args.high, "metrics": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    ok = all(r["ratio"] < 2 and r["estimates_equal"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
