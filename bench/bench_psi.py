"""Benchmark: our PSI (`common.crypto.commutative`, X25519) against openmined-psi's (P-256), side by
side in one run on the same id sets, each on one core and on all cores.

    .venv/bin/python bench/bench_psi.py [--size 100000] [--overlap 0.5] [--seed 7] [--repeat 1]
                                        [--modes one,all] [--workers N] [--json FILE]

The two sets (``size`` ids each, ``overlap`` of them shared, random 16-hex-digit ids,
shuffled) are generated once and written to one temporary JSON file; both implementations
read them from there. Every run checks that the intersection it finds is exactly the true
one (the same ids, not only the same count).

Ours, in this process (the project's venv): the protocol of design §3.1-§3.5 between two
parties A and B, both in this process, each with its own `CommutativeKey` and the session
salt from two random shares; A hashes and encrypts its ids (`commutative.encrypt_ids`), B
validates and doubly encrypts them (`ScalarMultiplication`) and shuffles the result, B
hashes and encrypts its own ids, A validates and doubly encrypts B's points, A intersects
the two doubly encrypted sets (a hash set) and learns which of B's rows match. Every step
runs through an executor as chunks (`executor.run_chunks`): `InlineExecutor` for one
core, `ProcessExecutor` (one worker process per CPU, started before the clock) for all.

openmined-psi 2.0.6, in a subprocess of its own venv (`bench/.venv-openmined`, created on
first use from `bench/requirements-openmined.txt`: it pins protobuf 6, which the project
cannot have), with reveal_intersection and the RAW data structure (the exact sorted set;
`fpr` is ignored by it): A is the server, B the client; the client learns which of its
rows are in the intersection. One core: one server and one client instance in one process,
CreateSetupMessage -> CreateRequest -> ProcessRequest -> GetIntersection. All cores: a pool
of one process per CPU (spawn, started before the clock) and every step sharded over it,
one shard per process: the server key and the client key are made once and shared with
the workers (`GetPrivateKeyBytes` / `CreateFromKey`); phase 1, each worker encrypts a shard
of the server's set (`CreateSetupMessage`, RAW), and the parent merges the shards' encrypted
elements into one sorted RAW setup (what one `CreateSetupMessage` over the whole set gives);
phase 2, each worker takes a shard of the client's set through CreateRequest ->
ProcessRequest -> GetIntersection against that one merged setup, and the parent offsets the
indices. The same four elliptic-curve passes as ours (encrypt A, encrypt B, re-encrypt B,
and the client's decryption of B, where ours re-encrypts A), all of them on every core.

With ``--repeat R`` the runs are interleaved (ours, then openmined-psi, per mode, R times),
so that a change in the machine's other load falls on both alike; the medians are
reported, and each paired run's ratio too.

Reported per run: wall time (keys and salt included, reading the sets and starting the
pool not), elements per second = (|A| + |B|) / wall, the intersection size and whether it
is the true one, and the CPU seconds of the process and its workers over the same interval
(/proc), divided by the wall time: how many cores it kept busy.
"""
from __future__ import annotations

# Only the standard library at module level: the openmined side runs this file in a venv
# without the project's packages (and its pool's spawned workers import it again there).
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPENMINED_VENV = HERE / ".venv-openmined"
OPENMINED_REQUIREMENTS = HERE / "requirements-openmined.txt"
#: RAW ignores it (it holds the exact set); CreateSetupMessage still takes one
OPENMINED_FPR = 1e-9
#: every step of ours is cut into at least this many chunks (load balance across workers)
MIN_CHUNKS = 8


# ---------------------------------------------------------------------------------------------
# shared helpers (both venvs)

def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of a process (all its threads) and of its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0.0, [root or os.getpid()], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def shards(seq: list, parts: int) -> list[tuple[int, list]]:
    """(offset, slice): at most `parts` contiguous, near-equal, non-empty slices."""
    parts = max(1, min(parts, len(seq)))
    size, extra = divmod(len(seq), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, seq[start:end]))
        start = end
    return out


def make_sets(size: int, overlap: float, seed: int) -> tuple[list[str], list[str], set[str]]:
    """Two shuffled sets of `size` distinct random ids sharing round(size * overlap)."""
    rng = random.Random(seed)
    shared = round(size * overlap)
    ids: set[str] = set()
    while len(ids) < 2 * size - shared:
        ids.add(f"{rng.getrandbits(64):016x}")
    pool = sorted(ids)
    rng.shuffle(pool)
    common, rest = pool[:shared], pool[shared:]
    a = common + rest[:size - shared]
    b = common + rest[size - shared:]
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b, set(common)


def read_sets(path: Path) -> tuple[list[str], list[str]]:
    data = json.loads(Path(path).read_text())
    return data["a"], data["b"]


# ---------------------------------------------------------------------------------------------
# openmined-psi (runs in bench/.venv-openmined)

def _om_setup_shard(server_key: bytes, n_client: int, items: list[str]) -> list[bytes]:
    """Pool task, phase 1: the server's encryption of one shard of its set (RAW setup)."""
    import private_set_intersection.python as psi

    server = psi.server.CreateFromKey(server_key, True)
    setup = server.CreateSetupMessage(OPENMINED_FPR, n_client, items, psi.DataStructure.RAW)
    return list(setup.raw.encrypted_elements)


def _om_client_shard(server_key: bytes, client_key: bytes, setup_bytes: bytes, items: list[str]) -> list[int]:
    """Pool task, phase 2: one shard of the client's set, request -> response -> intersection."""
    import private_set_intersection.python as psi

    server = psi.server.CreateFromKey(server_key, True)
    client = psi.client.CreateFromKey(client_key, True)
    setup = psi.ServerSetup()
    setup.ParseFromString(setup_bytes)
    response = server.ProcessRequest(client.CreateRequest(items))
    return list(client.GetIntersection(setup, response))


def _om_warm(_: int) -> int:
    """Pool task before the clock: import the library in every worker."""
    import private_set_intersection.python  # noqa: F401

    time.sleep(0.2)  # keep this worker busy so that the next warm-up task goes to another
    return os.getpid()


def openmined_one(a: list[str], b: list[str]) -> list[int]:
    import private_set_intersection.python as psi

    server = psi.server.CreateWithNewKey(True)
    client = psi.client.CreateWithNewKey(True)
    setup = server.CreateSetupMessage(OPENMINED_FPR, len(b), a, psi.DataStructure.RAW)
    request = client.CreateRequest(b)
    response = server.ProcessRequest(request)
    return list(client.GetIntersection(setup, response))


def openmined_all(a: list[str], b: list[str], pool, processes: int) -> list[int]:
    import private_set_intersection.python as psi

    server_key = psi.server.CreateWithNewKey(True).GetPrivateKeyBytes()
    client_key = psi.client.CreateWithNewKey(True).GetPrivateKeyBytes()
    parts = pool.starmap(_om_setup_shard, [(server_key, len(b), items) for _, items in shards(a, processes)])
    setup = psi.ServerSetup()
    setup.raw.encrypted_elements.extend(sorted(e for part in parts for e in part))
    setup_bytes = setup.SerializeToString()
    b_shards = shards(b, processes)
    found = pool.starmap(_om_client_shard, [(server_key, client_key, setup_bytes, items) for _, items in b_shards])
    return [offset + i for (offset, _), idx in zip(b_shards, found) for i in idx]


def openmined_main(sets: Path, out: Path, mode: str, processes: int, repeat: int) -> int:
    """The subprocess: run openmined-psi `repeat` times in `mode`; results as JSON to `out`."""
    import multiprocessing

    import private_set_intersection.python as psi

    a, b = read_sets(sets)
    pool = None
    if mode == "all":
        pool = multiprocessing.get_context("spawn").Pool(processes)
        pool.map(_om_warm, range(processes), chunksize=1)  # started and warm before the clock
    runs = []
    try:
        for _ in range(repeat):
            c0, t0 = tree_cpu_seconds(), time.perf_counter()
            found = openmined_one(a, b) if mode == "one" else openmined_all(a, b, pool, processes)
            wall = time.perf_counter() - t0
            cpu = tree_cpu_seconds() - c0
            runs.append({"wall_s": wall, "cpu_s": cpu, "found": sorted(set(found))})
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    version = getattr(psi, "__version__", "?")
    import google.protobuf
    out.write_text(json.dumps({"version": version, "protobuf": google.protobuf.__version__, "runs": runs}))
    return 0


def openmined_python() -> Path:
    """bench/.venv-openmined's interpreter; the venv is created (and openmined-psi installed
    from bench/requirements-openmined.txt) on first use."""
    python = OPENMINED_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {OPENMINED_VENV} (openmined-psi, in a venv of its own: it pins protobuf 6) ...",
              flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(OPENMINED_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(OPENMINED_REQUIREMENTS)], check=True)
    return python


def run_openmined(sets: Path, mode: str, processes: int, repeat: int) -> dict:
    python = openmined_python()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "openmined.json"
        subprocess.run([str(python), str(Path(__file__).resolve()), "--openmined-worker", str(sets), str(out),
                        "--mode", mode, "--workers", str(processes), "--repeat", str(repeat)], check=True)
        return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------
# ours (runs in the project's venv)

def ours_psi(a: list[str], b: list[str], executor) -> list[int]:
    """Design §3.1-§3.5 between A and B, every step in chunks on `executor`: the indices of
    B's rows whose ids A also holds (what A learns)."""
    import secrets

    import numpy as np

    from common.crypto import commutative

    key_a, key_b = commutative.CommutativeKey.generate(), commutative.CommutativeKey.generate()
    salt = commutative.session_salt(secrets.token_bytes(32), secrets.token_bytes(32))
    hash_task = salt.hash_task()
    mul_a, mul_b = key_a.multiply_task(), key_b.multiply_task()
    chunks = executor.chunk_count(MIN_CHUNKS)
    size = commutative.POINT_BYTES

    def encrypt_own(mul, ids: list[str]) -> bytes:
        return b"".join(executor.run_chunks(commutative.encrypt_ids,
                                            [(hash_task, mul, part) for _, part in shards(ids, chunks)]))

    def encrypt_peer(mul, packed: bytes) -> bytes:
        count = len(packed) // size
        parts = [(packed[off * size:(off + len(part)) * size], off)
                 for off, part in shards(range(count), chunks)]
        return b"".join(executor.run_chunks(mul, parts))

    enc_a = encrypt_own(mul_a, a)                              # A -> B
    double_a = encrypt_peer(mul_b, enc_a)                      # B: validate, [k_b]
    order = np.argsort(np.frombuffer(secrets.token_bytes(8 * len(a)), dtype=np.uint64), kind="stable")
    double_a = np.frombuffer(double_a, dtype=np.uint8).reshape(-1, size)[order].tobytes()  # B shuffles, -> A
    enc_b = encrypt_own(mul_b, b)                              # B -> A
    double_b = encrypt_peer(mul_a, enc_b)                      # A: validate, [k_a]
    seen = {double_a[i:i + size] for i in range(0, len(double_a), size)}
    return [j for j in range(len(b)) if double_b[j * size:(j + 1) * size] in seen]


def run_ours(sets: Path, mode: str, workers: int | None, repeat: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from common.execution import parallel

    a, b = read_sets(sets)
    executor = parallel.InlineExecutor() if mode == "one" else parallel.ProcessExecutor(workers)
    if isinstance(executor, parallel.ProcessExecutor):
        executor.start()  # workers started before the clock
    runs = []
    try:
        ours_psi(a[:256], b[:256], executor)  # before the clock: imports, in every worker too
        for _ in range(repeat):
            c0, t0 = tree_cpu_seconds(), time.perf_counter()
            found = ours_psi(a, b, executor)
            wall = time.perf_counter() - t0
            runs.append({"wall_s": wall, "cpu_s": tree_cpu_seconds() - c0, "found": found})
    finally:
        executor.shutdown()
    return {"executor": executor.name, "chunks": executor.chunk_count(MIN_CHUNKS), "runs": runs}


# ---------------------------------------------------------------------------------------------

def summarise(name: str, mode_text: str, raw_runs: list[dict], b: list[str], truth: set[str], n_elements: int) -> dict:
    walls = [r["wall_s"] for r in raw_runs]
    wall = statistics.median(walls)
    cpu = statistics.median(r["cpu_s"] for r in raw_runs)
    sizes = [len(r["found"]) for r in raw_runs]
    correct = all({b[j] for j in r["found"]} == truth and len(set(r["found"])) == len(r["found"])
                  for r in raw_runs)
    return {"implementation": name, "mode": mode_text, "wall_s": round(wall, 3),
            "walls_s": [round(w, 3) for w in walls], "elements_per_s": round(n_elements / wall, 1),
            "intersection": sizes[0] if len(set(sizes)) == 1 else sizes, "correct": correct,
            "cpu_s": round(cpu, 2), "cores_busy": round(cpu / wall, 2)}


def machine() -> dict:
    model = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version()}


#: the project's target: our PSI at least this many times openmined-psi's throughput
BAR = 5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100_000, help="ids in each set (default 100,000)")
    ap.add_argument("--overlap", type=float, default=0.5, help="share of each set in the intersection")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=1, help="runs per row (the median is reported)")
    ap.add_argument("--modes", default="one,all", help="one (one core), all (all cores), or both")
    ap.add_argument("--workers", type=int, default=None, help="processes for 'all' (default: the CPU count)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--openmined-worker", nargs=2, metavar=("SETS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("one", "all"), default="one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    workers = args.workers or os.cpu_count() or 1
    if args.openmined_worker:
        return openmined_main(Path(args.openmined_worker[0]), Path(args.openmined_worker[1]), args.mode,
                              workers, args.repeat)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("one", "all") for m in modes):
        ap.error("--modes: one, all or one,all")

    load_before = os.getloadavg()
    a, b, truth = make_sets(args.size, args.overlap, args.seed)
    n_elements = len(a) + len(b)
    raw: dict[tuple[str, str], list[dict]] = {(impl, mode): [] for mode in modes for impl in ("ours", "openmined")}
    extra: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sets = Path(tmp) / "sets.json"
        sets.write_text(json.dumps({"a": a, "b": b}))
        # interleaved (ours, then openmined-psi, per mode, per repetition), so that a change in
        # the machine's other load falls on both alike
        for rep in range(args.repeat):
            for mode in modes:
                ours = run_ours(sets, mode, workers, 1)
                extra["chunks"] = ours["chunks"]
                raw[("ours", mode)] += ours["runs"]
                om = run_openmined(sets, mode, workers, 1)
                extra["version"] = om["version"]
                raw[("openmined", mode)] += om["runs"]
                print(f"[run {rep + 1}/{args.repeat}, {mode}] ours {ours['runs'][0]['wall_s']:.2f} s, "
                      f"openmined-psi {om['runs'][0]['wall_s']:.2f} s", flush=True)
    load_after = os.getloadavg()
    om_version = extra["version"]

    rows, ratios, paired = [], {}, {}
    for mode in modes:
        label = "1 core" if mode == "one" else f"all cores ({workers} processes)"
        ours_text = (f"{label}: InlineExecutor, this process" if mode == "one" else
                     f"{label}: ProcessExecutor({workers}), {extra['chunks']} chunks per step")
        om_text = (f"{label}: one server + one client instance, one process" if mode == "one" else
                   f"{label}: pool of {workers}, shared keys, setup sharded + merged, client set in "
                   f"{workers} shards")
        rows.append(summarise("ours (X25519)", ours_text, raw[("ours", mode)], b, truth, n_elements))
        rows.append(summarise(f"openmined-psi {om_version} (P-256, RAW)", om_text, raw[("openmined", mode)], b,
                              truth, n_elements))
        ratios[mode] = round(rows[-2]["elements_per_s"] / rows[-1]["elements_per_s"], 2)
        paired[mode] = [round(o["wall_s"] / u["wall_s"], 2)
                        for u, o in zip(raw[("ours", mode)], raw[("openmined", mode)])]
    print(f"\nPSI, {args.size:,} x {args.size:,} ids, {args.overlap:.0%} overlap (true intersection "
          f"{len(truth):,}), seed {args.seed}, median of {args.repeat} run(s); {os.cpu_count()} CPUs; "
          f"elements/s = (|A| + |B|) / wall\n")
    print("| implementation | cores | wall (s) | elements/s | intersection | correct | CPU s / wall |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['implementation']} | {r['mode']} | {r['wall_s']:.2f} | {r['elements_per_s']:,.0f} | "
              f"{r['intersection']:,} | {'yes' if r['correct'] else 'NO'} | {r['cores_busy']:.2f} |")
    print()
    for mode, ratio in ratios.items():
        print(f"throughput ours / openmined-psi, {'one core' if mode == 'one' else 'all cores'}: {ratio:.2f}x "
              f"(medians; per paired run {', '.join(f'{x:.2f}' for x in paired[mode])}) "
              f"(bar: {BAR}x, {'met' if ratio >= BAR else 'MISSED'})")
    print(f"1-minute load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    ok = all(r["correct"] for r in rows) and all(v >= BAR for v in ratios.values())
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine(), "size": args.size, "overlap": args.overlap, "seed": args.seed,
            "repeat": args.repeat, "true_intersection": len(truth), "openmined_psi": om_version,
            "rows": rows, "throughput_ratio_ours_over_openmined": ratios,
            "paired_run_ratios": paired, "walls_in_run_order": "interleaved: ours, openmined-psi per mode per run",
            "loadavg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)]}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
