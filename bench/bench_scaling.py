"""Benchmark: how the ERO audit scales with the number of Dask workers doing its per-row work.

    .venv/bin/python bench/bench_scaling.py --members 200000 --workers 16,8,4,2,1 [--budget-s 480]
                                            [--data DIR] [--json FILE] [--no-baseline]

For each worker count W (largest first, so that the cheap runs surely complete): starts a
local Dask scheduler and W single-threaded worker processes (no nanny, spilling off:
DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False / __SPILL=False, as common/execution/dask_executor.py
requires), waits until all W have joined, runs `bench/bench_audit.py --members N
--no-release-controls --executor dask://127.0.0.1:PORT` (both services on that one
cluster, each its own process), records the audit's wall time, phase timings and the CPU
seconds of the workers, the scheduler and each service, stops the cluster and goes on with
the next W. One more run, after the first, uses `--executor processes` (each service with
its own local pool of all CPUs): the baseline without Dask.

The data are generated once (under --data, reused by every run and by later invocations).
Prints a table: W, wall, speed-up and efficiency against W=1 (or, when W=1 was not run,
against the smallest W measured, assumed to scale ideally from 1: marked with *), worker
CPU; then every phase per run. `--json FILE` gets everything, rewritten after each run.

`--budget-s S`: a run is skipped when it would likely end after S seconds from the start:
its time is estimated from the last completed run assuming ideal scaling
(wall_prev * W_prev / W, an over-estimate when going to fewer workers) plus that run's fixed
overhead (cluster start, service start). A run still going at S + 60 s is killed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_audit import cpu_seconds, make_files  # noqa: E402

SPILL_OFF = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
             "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"}
#: a run still going this long after --budget-s is killed
KILL_GRACE_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH (for the services and the
    Dask workers, which import `common`, `tester_service`, `client_service` by name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        paths.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop(procs: list[subprocess.Popen], timeout: float = 5.0) -> int:
    """SIGTERM, then SIGKILL what is still there after `timeout` s; returns how many were killed."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline, killed = time.monotonic() + timeout, 0
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
            killed += 1
    return killed


class Cluster:
    """A Dask scheduler and `workers` single-threaded worker processes on loopback."""

    def __init__(self, workers: int, logdir: Path) -> None:
        self.workers = workers
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"dask-{workers}-", dir=logdir))
        self.scheduler: subprocess.Popen | None = None
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []

    def _start(self, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        fh = open(self.dir / log, "wb")
        self._logs.append(fh)
        p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self, timeout: float = 120.0) -> float:
        """Start everything and wait until all workers have joined; returns the seconds it took."""
        import distributed

        t0 = time.perf_counter()
        env = child_env()
        py = sys.executable
        self.scheduler = self._start([py, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--no-dashboard"], env, "scheduler.log")
        worker_env = {**env, **SPILL_OFF}
        for i in range(self.workers):
            self._start([py, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
                         "--no-dashboard", "--name", f"w{i}", "--local-directory", str(self.dir / f"w{i}")],
                        worker_env, f"worker-{i}.log")
        deadline = time.monotonic() + timeout
        client = None
        try:
            while client is None:
                self._check_alive()
                try:
                    client = distributed.Client(self.address, timeout=5, set_as_default=False)
                except (OSError, TimeoutError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            while len(client.scheduler_info(n_workers=-1)["workers"]) < self.workers:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(client.scheduler_info(n_workers=-1)['workers'])} of "
                                       f"{self.workers} workers joined in {timeout:g} s")
                time.sleep(0.2)
        finally:
            if client is not None:
                client.close()
        return time.perf_counter() - t0

    def _check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                name = "scheduler" if i == 0 else f"worker-{i - 1}"
                log = (self.dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Dask {name} exited with {p.returncode}:\n{log}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the scheduler and of all workers together."""
        values = [cpu_seconds(p.pid) or 0.0 for p in self.procs]
        return {"scheduler": values[0] if values else 0.0, "workers": sum(values[1:])}

    def close(self) -> int:
        """Stop the workers, then the scheduler (nothing of theirs is on disk but logs: spilling
        is off), remove their directory; returns how many processes had to be killed."""
        killed = stop(self.procs[1:]) + stop(self.procs[:1])
        for fh in self._logs:
            fh.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return killed


def run_audit(args, executor: str, data: Path, logdir: Path, timeout: float) -> dict:
    """bench_audit.py with `executor`; its measurements (or {"error": ...})."""
    out = logdir / f"audit-{executor.replace('/', '_').replace(':', '_')}.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(ROOT / "bench" / "bench_audit.py"), "--members", str(args.members),
            "--overlap", str(args.overlap), "--bootstrap", str(args.bootstrap), "--data", str(data),
            "--executor", executor, "--json", str(out)]
    if not args.release_controls:
        argv.append("--no-release-controls")
    sys.stdout.flush()
    p = subprocess.Popen(argv, env=child_env(), cwd=ROOT, start_new_session=True)
    try:
        rc = p.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)  # bench_audit and the two services it started
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
        return {"error": f"killed after {timeout:.0f} s (budget)"}
    if rc != 0 or not out.exists():
        return {"error": f"bench_audit.py exited with {rc}"}
    return json.loads(out.read_text())


def fmt_table(runs: list[dict]) -> str:
    done = [r for r in runs if "wall_s" in r and r["workers"] is not None]
    ref = min(done, key=lambda r: r["workers"], default=None)
    lines = [f"{'run':<12} {'W':>3} {'wall s':>8} {'speed-up':>9} {'effic.':>7} {'CPU s':>7} {'CPU/wall':>8} "
             f"{'workers':>8} {'sched':>6} {'tester':>7} {'client':>7}   (CPU s)"]
    for r in sorted(runs, key=lambda r: (r["executor"] == "processes", -(r["workers"] or 0))):
        if "wall_s" not in r:
            lines.append(f"{r['label']:<12} {r['workers'] or '':>3}  {r.get('skipped') or r.get('error')}")
            continue
        w = r["workers"] or r["cpus"]
        star = "" if ref is None or ref["workers"] == 1 else "*"
        speed = ref["wall_s"] * ref["workers"] / r["wall_s"] if ref else float("nan")
        cpu, cluster = r.get("cpu_s", {}), r.get("cluster_cpu_s", {})
        total = total_cpu(r)
        lines.append(f"{r['label']:<12} {w:>3} {r['wall_s']:>8.1f} {speed:>8.2f}{star:1} {speed / w:>7.2f} "
                     f"{total:>7.1f} {total / r['wall_s']:>8.2f} "
                     f"{cluster.get('workers', float('nan')):>8.1f} {cluster.get('scheduler', float('nan')):>6.1f} "
                     f"{cpu.get('tester', float('nan')):>7.1f} {cpu.get('client', float('nan')):>7.1f}")
    if ref is not None and ref["workers"] != 1:
        lines.append(f"* against W={ref['workers']}, assumed to scale ideally from W=1 (no W=1 run)")
    lines.append("CPU s: the services (with their local pools), the Dask workers and the scheduler during the "
                 "audit; CPU/wall: cores busy on average. With W=1 the executor runs `run_chunks` steps inline "
                 "in the services (common/execution/parallel.py: workers <= 1), so W=1 may use more than one core.")
    return "\n".join(lines)


def total_cpu(r: dict) -> float:
    return sum(r.get("cpu_s", {}).values()) + sum(r.get("cluster_cpu_s", {}).values())


def fmt_phases(runs: list[dict]) -> str:
    done = [r for r in sorted(runs, key=lambda r: (r["executor"] == "processes", -(r["workers"] or 0)))
            if "phase_seconds" in r]
    if not done:
        return ""
    phases: list[str] = []
    for r in done:
        phases += [k for k in r["phase_seconds"] if k not in phases]
    lines = [f"{'phase (s)':<34}" + "".join(f"{r['label']:>12}" for r in done)]
    for k in phases:
        lines.append(f"{k:<34}" + "".join(f"{r['phase_seconds'].get(k, float('nan')):>12.1f}" for r in done))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=20_000, help="members on each side")
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--workers", default="16,8,4,2,1", help="comma-separated worker counts (run largest first)")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="skip the run with --executor processes (local pools of all CPUs)")
    ap.add_argument("--release-controls", action="store_true",
                    help="audit with release controls (default: --no-release-controls, B bootstrap replicates)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip runs that would likely end after this many seconds (from the start)")
    ap.add_argument("--data", type=Path, default=None, help="keep the generated files here (reused)")
    ap.add_argument("--json", type=Path, default=None, help="write every measurement here (after each run)")
    args = ap.parse_args()

    t_start = time.monotonic()
    counts = sorted({int(w) for w in args.workers.split(",") if w.strip()}, reverse=True)
    if not counts or min(counts) < 1:
        ap.error("--workers: positive whole numbers, e.g. 16,8,4,2,1")
    plan: list[tuple[str, int | None]] = [("dask", w) for w in counts]
    if args.baseline:
        plan.insert(1, ("processes", None))

    tmp = tempfile.TemporaryDirectory(prefix="ppre-scaling-")
    logdir = Path(tmp.name)
    data = args.data or logdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tp, cp = make_files(data, args.members, args.overlap)
    data_s = time.perf_counter() - t0

    import dask
    import distributed
    import grpc
    import google.protobuf
    info = {"members_each_side": args.members, "overlap": args.overlap, "bootstrap": args.bootstrap,
            "release_controls": args.release_controls, "cpus": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "machine": platform.machine(), "processor": _cpu_model(),
            "versions": {"dask": dask.__version__, "distributed": distributed.__version__, "grpcio": grpc.__version__,
                         "protobuf": google.protobuf.__version__},
            "data_s": round(data_s, 1), "budget_s": args.budget_s}
    print(f"scaling: {args.members} members each side, runs {[(e, w) for e, w in plan]}, "
          f"{info['cpus']} CPUs ({info['processor']}), data ready in {data_s:.1f} s ({tp.name}, {cp.name})",
          flush=True)

    runs: list[dict] = []
    last: dict | None = None  # the last completed run: its W, wall and overhead

    def save() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**info, "elapsed_s": round(time.monotonic() - t_start, 1),
                                             "runs": runs}, indent=1) + "\n")

    for kind, w in plan:
        label = f"dask W={w}" if kind == "dask" else "processes"
        effective_w = w if w is not None else os.cpu_count() or 1
        elapsed = time.monotonic() - t_start
        record: dict = {"label": label, "executor": "processes" if kind == "processes" else "dask", "workers": w}
        if args.budget_s is not None and last is not None:
            estimate = last["overhead_s"] + last["wall_s"] * last["w"] / effective_w
            record["estimate_s"] = round(estimate, 1)
            if elapsed + estimate > args.budget_s:
                record["skipped"] = (f"skipped: ~{estimate:.0f} s estimated, {args.budget_s - elapsed:.0f} s "
                                     f"of the budget left")
                print(f"\n=== {label}: {record['skipped']}", flush=True)
                runs.append(record)
                save()
                continue
        timeout = (args.budget_s + KILL_GRACE_S - elapsed) if args.budget_s is not None else 24 * 3600
        print(f"\n=== {label} (at {elapsed:.0f} s)", flush=True)
        t_run = time.perf_counter()
        cluster = None
        try:
            if kind == "dask":
                cluster = Cluster(w, logdir)
                record["cluster_start_s"] = round(cluster.start(), 1)
                print(f"cluster {cluster.address}: {w} workers in {record['cluster_start_s']} s", flush=True)
                before = cluster.cpu()
                t_audit = time.perf_counter()
                result = run_audit(args, f"dask://127.0.0.1:{cluster.port}", data, logdir, timeout)
                record["audit_process_s"] = round(time.perf_counter() - t_audit, 1)
                after = cluster.cpu()
                record["cluster_cpu_s"] = {k: round(after[k] - before[k], 1) for k in after}
            else:
                t_audit = time.perf_counter()
                result = run_audit(args, "processes", data, logdir, timeout)
                record["audit_process_s"] = round(time.perf_counter() - t_audit, 1)
        except Exception as exc:  # a cluster that did not start: note it, go on
            result = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        finally:
            if cluster is not None:
                t_stop = time.perf_counter()
                record["cluster_killed"] = cluster.close()
                record["cluster_stop_s"] = round(time.perf_counter() - t_stop, 1)
        total = time.perf_counter() - t_run
        record.update(result)
        record["workers"] = w
        record["run_s"] = round(total, 1)
        runs.append(record)
        if "wall_s" in record:
            last = {"w": effective_w, "wall_s": record["wall_s"], "overhead_s": max(0.0, total - record["wall_s"])}
            print(f"--- {label}: audit {record['wall_s']} s, run {total:.1f} s", flush=True)
        else:
            print(f"--- {label}: {record['error']}", flush=True)
        save()

    info["elapsed_s"] = round(time.monotonic() - t_start, 1)
    print(f"\n=== scaling of the ERO audit, {args.members} members each side, "
          f"{'with' if args.release_controls else 'no'} release controls, B={args.bootstrap}; "
          f"{info['cpus']} CPUs, Python {info['python']}; total {info['elapsed_s']} s")
    print(fmt_table(runs))
    print()
    print(fmt_phases(runs))
    estimates = {json.dumps(r.get("estimates"), sort_keys=True) for r in runs if r.get("estimates")}
    print(f"\nestimates identical across runs: {len(estimates) <= 1}")
    save()
    tmp.cleanup()
    return 0 if any("wall_s" in r for r in runs) else 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
