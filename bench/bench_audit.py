"""Benchmark: one ERO audit of a given size over the real services, each its own process.

    .venv/bin/python bench/bench_audit.py --members 1000000 [--overlap 0.5] [--bootstrap 1000]
                                          [--workers N] [--executor SPEC] [--data DIR] [--json FILE]

Generates (or reuses, under --data) a fractional probability table for the Tester and
an ERO dataset for the Test-Client (N members each, `overlap` of them shared, shuffled),
starts `ppre client serve` and `ppre tester serve` as two processes on loopback, runs
the audit through the operator RPC and prints: wall time, rows per second, every phase
timing both parties report, and the peak resident memory and the CPU seconds of each
service during the audit (the service process and its worker processes together, sampled
every 0.2 s from /proc; CPU of a worker that exits between two samples is partly missed).
It also splits each service's CPU by phase (the Tester's progress events mark the
phases) into the service process itself (its session, gRPC and join threads: what no
executor spreads) and its workers (what more workers share): the serial part of a
scale-out (`phase_cpu` in the JSON; bench/RESULTS.md, "Where the serial part is").
A phase starts at its first progress event, and the Tester's first "aggregation" event
comes when the aggregation's first chunk is done: the `join` row holds that chunk's CPU
(with 16 chunks on 2 workers, about an eighth of the aggregation), so compare paths by
join + aggregation (bench/RESULTS.md, "ERO's default path against B = 1000").

`--aggregation-rows R` measures instead, in this process, the Tester's aggregation of one
task of R joined rows (2048-bit key, the data's own probabilities) for ERO's weight columns
under the default controls (the groups, the pair weights, those formed from others left
out) and without them (the groups; as 1,000,000 members' 128 buckets, R / 3,906 of them):
the CPU seconds of `aggregation.bucket_sums_packed` against `bucket_sums_chunk` on the same
inputs (the kernel's calls through `batch.multi_exp_many`, before `lane_plan`), and whether
they give the same integers.

`--executor SPEC` is passed to both services (`common.execution.executors.executor_from_spec`:
`processes`, `processes:N`, `inline`, `dask://HOST:PORT`); with a Dask cluster the per-row
work runs in the cluster's workers, whose CPU is not part of the services' (see
bench/bench_scaling.py, which starts the cluster and measures it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def make_files(directory: Path, members: int, overlap: float, seed: int = 7) -> tuple[Path, Path]:
    from common.races import RACES

    tp, cp = directory / f"probabilities-{members}.parquet", directory / f"ero-{members}.parquet"
    if tp.exists() and cp.exists():
        return tp, cp
    rng = np.random.default_rng(seed)
    n_common = int(members * overlap)
    tester_ids = np.char.add("T", np.char.zfill(np.arange(members).astype(str), 9))
    client_ids = np.concatenate([tester_ids[:n_common],
                                 np.char.add("C", np.char.zfill(np.arange(members - n_common).astype(str), 9))])
    rng.shuffle(client_ids)
    probs = rng.dirichlet(np.full(len(RACES), 0.5), members)
    columns = {"member_id": pa.array(tester_ids.tolist())}
    columns.update({race: pa.array(probs[:, j]) for j, race in enumerate(RACES)})
    pq.write_table(pa.table(columns), tp)
    y = rng.integers(0, 2, members)
    y_pred = (rng.random(members) < np.where(y == 1, 0.8, 0.15)).astype(np.int64)
    pq.write_table(pa.table({"member_id": pa.array(client_ids.tolist()), "y_true": pa.array(y),
                             "y_pred": pa.array(y_pred)}), cp)
    return tp, cp


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process (not its children), from /proc/PID/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def tree_stats(pid: int) -> tuple[int, dict[int, float]]:
    """(resident memory in bytes, {pid: CPU seconds}) of a process and all its descendants
    (worker pools)."""
    total, cpu, todo = 0, {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            seconds = cpu_seconds(p)
            if seconds is not None:
                cpu[p] = seconds
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total, cpu


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (worker pools)."""
    return tree_stats(pid)[0]


class PeakMemory(threading.Thread):
    """Peak resident memory and CPU seconds (since start) of each named process tree."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {name: 0 for name in pids}
        self.base = {name: tree_stats(pid)[1] for name, pid in pids.items()}  # CPU before the audit
        self.last = {name: dict(cpu) for name, cpu in self.base.items()}
        self.stop = threading.Event()
        #: (monotonic time, {service: (own CPU s, workers' CPU s)}) since the start
        self.series: list[tuple[float, dict[str, tuple[float, float]]]] = []

    def sample(self) -> None:
        point = {}
        for name, pid in self.pids.items():
            rss, cpu = tree_stats(pid)
            self.peak[name] = max(self.peak[name], rss)
            self.last[name].update(cpu)
            base = self.base[name]
            own = self.last[name].get(pid, 0.0) - base.get(pid, 0.0)
            total = sum(v - base.get(p, 0.0) for p, v in self.last[name].items())
            point[name] = (own, total - own)
        self.series.append((time.monotonic(), point))

    def at(self, when: float) -> dict[str, tuple[float, float]]:
        """The last sample at or before `when` (the first one before any)."""
        best = self.series[0][1] if self.series else {}
        for t, point in self.series:
            if t > when:
                break
            best = point
        return best

    def cpu(self) -> dict[str, float]:
        return {name: sum(s - self.base[name].get(p, 0.0) for p, s in last.items())
                for name, last in self.last.items()}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()
        self.sample()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(address: str, proc: subprocess.Popen, timeout: float = 120.0, tls=None) -> None:
    from common.net.channels import check_health
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}")
        if check_health(address, timeout=1.0, tls=tls):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{address} not healthy after {timeout} s")


def cpu_by_phase(memory: PeakMemory, starts: list[tuple[str, float]], ended: float) -> list[dict]:
    """Per phase (the Tester's progress events, in order; a phase seen again later is
    another span): its wall seconds and each service's CPU seconds in its own process
    and in its workers, from the 0.2 s samples (so to about ±0.2 s per span)."""
    spans = []
    for i, (phase, start) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else ended
        a, b = memory.at(start), memory.at(end)
        row = {"phase": phase, "wall_s": round(end - start, 2)}
        for name in memory.pids:
            (own0, work0), (own1, work1) = a.get(name, (0.0, 0.0)), b.get(name, (0.0, 0.0))
            row[f"{name}_own_s"] = round(own1 - own0, 2)
            row[f"{name}_workers_s"] = round(work1 - work0, 2)
        spans.append(row)
    return spans


def phase_table(rows: list[dict]) -> str:
    """`cpu_by_phase` as a Markdown table, with a total row."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k != "phase"]
    lines = ["| phase | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += ["| " + r["phase"] + " | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |" for r in rows]
    lines.append("| total | " + " | ".join(f"{sum(r[k] for r in rows):.1f}" for k in keys) + " |")
    return "\n".join(lines)


def aggregation_only(rows: int, data: Path, members: int, overlap: float) -> int:
    """`--aggregation-rows`: the bucket sums of one task, as now and through `bucket_sums_chunk`."""
    from common.crypto import encoding, paillier
    from common.metrics.ero import METRIC
    from common.races import RACES
    from tester_service import aggregation

    tp, _ = make_files(data, members, overlap)
    probs = pq.read_table(tp).to_pandas()[list(RACES)].to_numpy()[:rows]
    rows = len(probs)
    q = encoding.quantize_probabilities(probs, encoding.PROBABILITY_BITS)
    pub = paillier.generate_keypair(2048).public
    width = pub.ciphertext_bytes
    rng = np.random.default_rng(1)
    packed = b"".join((int.from_bytes(rng.bytes(width), "big") % pub.n2).to_bytes(width, "big") for _ in range(rows))
    groups = tuple(RACES)
    columns = METRIC.weights([q], None, None, groups, "fpr", {})
    derivations = METRIC.weight_derivations(len(groups))
    paths = {"no controls, B = 1000": (list(columns), dict(derivations), max(1, rows // 3906))}
    derivations.update(METRIC.moment_derivations(len(groups), len(columns)))
    paths["default controls"] = (list(columns) + METRIC.moment_weights([q], groups, "fpr", {}), derivations, 1)
    out = {}
    for name, (weights, candidates, buckets) in paths.items():
        explicit, _ = aggregation.weight_kinds(weights, aggregation.verified_derivations(weights, candidates))
        cut = np.array_split(np.arange(rows), buckets)
        jobs = [(packed[idx[0] * width:(idx[-1] + 1) * width],
                 [np.asarray(weights[e])[idx] for e in explicit] + [np.ones(len(idx), dtype=np.int64)]) for idx in cut]
        t = time.process_time()
        now = aggregation.bucket_sums_packed(pub.n, width, jobs)
        t_now = time.process_time() - t
        t = time.process_time()
        before = aggregation.bucket_sums_chunk(pub.n, [([int.from_bytes(p[i:i + width], "big")
                                                         for i in range(0, len(p), width)], [c.tolist() for c in cs])
                                                        for p, cs in jobs])
        t_before = time.process_time() - t
        out[name] = {"rows": rows, "buckets": buckets, "columns": len(explicit) + 1,
                     "cpu_s_lane_plan": round(t_now, 3), "cpu_s_multi_exp_many": round(t_before, 3),
                     "same_integers": now == before}
    print(json.dumps(out, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=10_000, help="members on each side")
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None, help="PPRE_WORKERS of each service")
    ap.add_argument("--executor", default=None, metavar="SPEC",
                    help="--executor of both services: processes (default), processes:N, inline or "
                         "dask://HOST:PORT (see common/execution/parallel.py, common/execution/dask_executor.py)")
    ap.add_argument("--data", type=Path, default=None, help="keep the generated files here (reused)")
    ap.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    ap.add_argument("--no-release-controls", action="store_true",
                    help="the Tester without release controls (B bootstrap replicates instead of the noised "
                         "random groups; see docs/threat-model.md)")
    ap.add_argument("--aggregation-rows", type=int, default=0, metavar="R",
                    help="measure only the Tester's aggregation of one task of R rows, in this process")
    args = ap.parse_args()
    if args.aggregation_rows:
        with tempfile.TemporaryDirectory() as tmp:
            return aggregation_only(args.aggregation_rows, args.data or Path(tmp), args.members, args.overlap)

    from proto import ppre_pb2 as pb
    from tester_service.server import run_audit

    tmp = tempfile.TemporaryDirectory()
    data = args.data or Path(tmp.name)
    data.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tp, cp = make_files(data, args.members, args.overlap)
    print(f"data ready in {time.perf_counter() - t0:.1f} s: {tp.name}, {cp.name}", flush=True)

    env = dict(os.environ)
    if args.workers:
        env["PPRE_WORKERS"] = str(args.workers)
    ppre = [sys.executable, "-m", "ppre.cli"]
    # mutual TLS as deployed: a development CA for this run (`ppre certs init`)
    from common.net.tls import DevCA, TlsIdentity
    certs = Path(tmp.name) / "certs"
    DevCA.generate().write(certs)
    operator = TlsIdentity.from_dir(certs, "operator")
    tls = ["--tls-dir", str(certs)]
    executor = ["--executor", args.executor] if args.executor else []
    client_port, tester_port = free_port(), free_port()
    procs = {}
    try:
        procs["client"] = subprocess.Popen(ppre + ["client", "serve", "--host", "127.0.0.1", "--port",
                                                   str(client_port), "--dataset", f"ero={cp}", *tls, *executor,
                                                   *(["--accept-noiseless"] if args.no_release_controls else [])],
                                           env=env, cwd=ROOT)
        procs["tester"] = subprocess.Popen(ppre + ["tester", "serve", "--host", "127.0.0.1", "--port",
                                                   str(tester_port), "--client", f"127.0.0.1:{client_port}",
                                                   "--probabilities", str(tp), *tls, *executor,
                                                   *(["--no-release-controls"] if args.no_release_controls else
                                                     ["--privacy-budget", "inf"])], env=env, cwd=ROOT)
        wait_healthy(f"127.0.0.1:{client_port}", procs["client"], tls=operator)
        wait_healthy(f"127.0.0.1:{tester_port}", procs["tester"], tls=operator)
        memory = PeakMemory({name: p.pid for name, p in procs.items()})
        memory.start()
        # recipient tester: the estimates come back to this operator (with "client" only
        # the Test-Client's side holds them)
        request = pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=args.bootstrap, confidence=0.95,
                                  has_seed=True, seed=1, result_recipient="tester")
        last = {"phase": None}
        phase_starts: list[tuple[str, float]] = []  # (phase, monotonic time of its first event)

        def show(p):
            if p.phase != last["phase"]:
                phase_starts.append((p.phase, time.monotonic()))
            if p.phase != last["phase"] or (p.total and p.done == p.total):
                print(f"[{p.elapsed_s:8.1f}s] {p.phase}: {p.message}", flush=True)
                last["phase"] = p.phase

        t0 = time.perf_counter()
        event = run_audit(f"127.0.0.1:{tester_port}", request, on_progress=show, tls=operator)
        wall = time.perf_counter() - t0
        ended = time.monotonic()
        memory.stop.set()
        memory.join()
        phase_cpu = cpu_by_phase(memory, phase_starts, ended)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()
    if event.WhichOneof("event") != "result":
        print("audit failed:", event.error.code, event.error.message)
        return 1
    from common.stats.results import AuditReport
    r = AuditReport.from_proto(event.result)
    out = {
        "members_each_side": args.members, "overlap": args.overlap, "bootstrap": args.bootstrap,
        "workers": args.workers or os.cpu_count(), "cpus": os.cpu_count(), "n_matched": r.n_matched,
        "executor": args.executor or os.environ.get("PPRE_EXECUTOR") or "processes",
        "wall_s": round(wall, 1), "rows_per_s": round(2 * args.members / wall),
        "peak_rss_mib": {k: round(v / 2**20) for k, v in memory.peak.items()},
        "cpu_s": {k: round(v, 1) for k, v in memory.cpu().items()},
        "phase_seconds": {k: round(v, 1) for k, v in r.phase_seconds.items()},
        "phase_cpu": phase_cpu,
        "estimates": {g.group: round(g.estimate, 5) for g in r.groups},
    }
    print(json.dumps(out, indent=1))
    print(phase_table(phase_cpu))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
