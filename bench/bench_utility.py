"""Benchmark: what a user reads under the default release controls, metric by metric.

Every metric of the catalog is run as a new user runs it (`ppre audit --local --json`, a
process per audit, on `ppre synth` data), once without release controls (the noiseless
estimate) and `--runs` times with the defaults (ρ 0.2 per audit; each run in a fresh
data directory, so that the local privacy ledger never refuses a run of the benchmark).
For every reported quantity (a group's estimate, LOT's cells, POT's curve points) it
prints

* |default − noiseless| (the mean and the largest over the runs),
* the interval's width with the defaults and without,
* the verdict's minimum detectable difference, where the verdict states one,
* whether every reported value lies inside the metric's range, and the verdicts.

The bar (docs/metrics): at 100,000 members every group with an effective size of at
least 2,000 (and every LOT cell) is within 0.01 of its noiseless estimate (the output
metric: 1% of its declared outcome range).

    .venv/bin/python bench/bench_utility.py [--sizes 10000,100000] [--metrics ero,lot,...]
        [--runs 3] [--seed 1] [--bootstrap 200] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PPRE = [sys.executable, "-m", "ppre.cli"]

#: per metric: the dataset `ppre synth` writes, the extra audit arguments, and the range
#: of its reported values (None: the output metric's declared outcome range, read from
#: the result's parameters)
METRICS = {
    "ero": ("ero.csv", ["--metric-option", "fpr"], (0.0, 1.0)),
    "lot": ("lot.csv", ["--metric-option", "idcg",
                        "--group-mapping", "hsm=black+hispanic+aian,non_hsm=white+api+multiple"], (-1.0, 1.0)),
    "mqos-ndcg": ("mqos_ndcg.csv", [], (0.0, 1.0)),
    "pot": ("pot.csv", [], (0.0, 1.0)),
    "mqos-auc": ("mqos_auc.csv", [], (0.0, 1.0)),
    "output": ("output.csv", ["--outcome-range=-1:3"], None),
    "prob-count": ("prob_count.csv", [], (0.0, 1.0)),
}
#: the bar's tolerance and the effective size from which it applies
TOLERANCE = 0.01
MIN_SIZE_FOR_BAR = 2000.0


@dataclass
class Quantity:
    """One reported value across the runs."""

    label: str
    noiseless: float | None
    noiseless_width: float | None
    effective_size: float | None = None
    defaults: list[float | None] = field(default_factory=list)
    widths: list[float | None] = field(default_factory=list)


def quantities(report: dict) -> dict[str, tuple[float | None, float | None]]:
    """label -> (estimate, interval width) of every reported value of a result."""
    out: dict[str, tuple[float | None, float | None]] = {}

    def width(entry):
        lo, hi = entry.get("ci_low"), entry.get("ci_high")
        return None if lo is None or hi is None else hi - lo

    for g in report.get("groups", []):
        out[g["group"]] = (g.get("estimate"), width(g))
    for c in report.get("cells", []):
        label = f"{c['higher']}>{c['lower']}" + (f"@{c['rank_pair']}" if c.get("rank_pair") else "")
        out[label] = (c.get("estimate"), width(c))
    for c in report.get("curves", []):
        out[f"{c['group']}@{c['score']:.3g}"] = (c.get("estimate"), width(c))
    return out


def value_range(metric: str, report: dict) -> tuple[float, float]:
    bounds = METRICS[metric][2]
    if bounds is not None:
        return bounds
    declared = report.get("params", {}).get("outcome_range")
    if isinstance(declared, (list, tuple)) and len(declared) == 2:
        return float(declared[0]), float(declared[1])
    return -math.inf, math.inf


def out_of_range(metric: str, report: dict) -> list[str]:
    lo, hi = value_range(metric, report)
    bad = []
    for label, (est, _) in quantities(report).items():
        # a pair cell (POT's DTI, LOT's cells) is a difference of two values in [lo, hi]
        low, high = (lo - hi, hi - lo) if ">" in label and metric != "lot" else (lo, hi)
        if est is not None and not low - 1e-9 <= est <= high + 1e-9:
            bad.append(f"{label}={est:.4g}")
    for g in report.get("groups", []):
        for key in ("ci_low", "ci_high", "corrected_estimate", "corrected_ci_low", "corrected_ci_high"):
            v = g.get(key)
            if v is not None and not lo - 1e-9 <= v <= hi + 1e-9:
                bad.append(f"{g['group']}.{key}={v:.4g}")
    for size in (report.get("release", {}).get("effective_sizes") or {}).values():
        if size is not None and size < 0:
            bad.append(f"negative effective size {size}")
    return bad


def effective_size(label: str, sizes: dict, metric: str) -> float | None:
    """A quantity's effective size as the result states it: a group's own; a curve point
    ("group@score") its group's; a pair cell ("a>b", POT's DTI) the smaller of its two
    groups'. LOT's cells are held to the bar whatever their groups' sizes (None)."""
    if label in sizes:
        return sizes[label]
    if metric == "lot":
        return None
    if "@" in label:
        return sizes.get(label.split("@", 1)[0])
    if ">" in label:
        a, b = label.split(">", 1)
        if a in sizes and b in sizes:
            return min(sizes[a], sizes[b])
    return None


def synth(members: int, seed: int, folder: Path) -> None:
    subprocess.run(PPRE + ["synth", "--members", str(members), "--seed", str(seed), "--out", str(folder)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def audit(metric: str, folder: Path, *, controls: bool, bootstrap: int, seed: int) -> tuple[dict, float]:
    dataset, extra, _ = METRICS[metric]
    argv = PPRE + ["audit", "--local", "--metric", metric, *extra,
                   "--tester-members", str(folder / "members.csv"), "--tester-self-id", str(folder / "self_id.csv"),
                   "--client-data", str(folder / "client" / dataset), "--bootstrap", str(bootstrap),
                   "--seed", str(seed), "--json"]
    if not controls:
        argv.append("--no-release-controls")
    with tempfile.TemporaryDirectory(prefix="ppre-utility-home-") as home:
        env = dict(os.environ, XDG_DATA_HOME=home, HOME=home)
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if proc.returncode != 0 or not proc.stdout.strip():
        said = proc.stdout.strip()[-800:] if proc.stdout.strip().startswith('{"error"') else proc.stderr.strip()[-800:]
        raise RuntimeError(f"{metric} audit failed (exit {proc.returncode}): {said}")
    return json.loads(proc.stdout), wall


def run_metric(metric: str, folder: Path, *, runs: int, bootstrap: int, seed: int) -> dict:
    exact, wall0 = audit(metric, folder, controls=False, bootstrap=bootstrap, seed=seed)
    table = {label: Quantity(label, est, w) for label, (est, w) in quantities(exact).items()}
    verdicts, mdds, problems, walls = [], [], out_of_range(metric, exact), [wall0]
    for r in range(runs):
        report, wall = audit(metric, folder, controls=True, bootstrap=bootstrap, seed=seed + 1 + r)
        walls.append(wall)
        sizes = report.get("release", {}).get("effective_sizes") or {}
        for label, (est, w) in quantities(report).items():
            q = table.setdefault(label, Quantity(label, None, None))
            q.defaults.append(est)
            q.widths.append(w)
            size = effective_size(label, sizes, metric)
            if size is not None:
                q.effective_size = size
        v = report.get("verdict", {})
        verdicts.append(v.get("severity"))
        mdds.append(v.get("mdd"))
        problems += out_of_range(metric, report)
    return {"metric": metric, "quantities": list(table.values()), "noiseless_verdict": exact["verdict"]["severity"],
            "verdicts": verdicts, "mdds": mdds, "problems": problems, "walls": walls,
            "n_matched": exact.get("n_matched"), "scale": scale(metric, exact)}


def scale(metric: str, report: dict) -> float:
    """The bar's unit: 1 for bounded metrics, the declared outcome range's width for output."""
    lo, hi = value_range(metric, report)
    return hi - lo if metric == "output" and math.isfinite(hi - lo) else 1.0


def fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def render(size: int, result: dict) -> list[str]:
    lines = [f"\n#### {result['metric']}, {size:,} members ({result['n_matched']} joined rows); verdicts: "
             f"noiseless {result['noiseless_verdict']}, defaults {', '.join(map(str, result['verdicts']))}; "
             f"MDD {', '.join(fmt(m) for m in result['mdds'])}; seconds {', '.join(f'{w:.0f}' for w in result['walls'])}",
             "",
             "| quantity | eff. size | noiseless | mean abs diff | max abs diff | width noiseless | width defaults (mean) | bar |",
             "|---|---|---|---|---|---|---|---|"]
    for q in result["quantities"]:
        diffs = [abs(d - q.noiseless) for d in q.defaults if d is not None and q.noiseless is not None]
        undefined = sum(d is None for d in q.defaults)
        widths = [w for w in q.widths if w is not None]
        worst = max(diffs) if diffs else None
        applies = q.effective_size is None or q.effective_size >= MIN_SIZE_FOR_BAR
        if not applies:
            bar = "n/a (small)"
        elif q.noiseless is None:
            bar = "n/a (undefined)"
        else:
            bar = "ok" if worst is not None and not undefined and worst <= TOLERANCE * result["scale"] else "MISS"
        lines.append(f"| {q.label} | {fmt(q.effective_size, 0)} | {fmt(q.noiseless)} | "
                     f"{fmt(sum(diffs) / len(diffs) if diffs else None)} | {fmt(worst)}"
                     f"{f' ({undefined} undefined)' if undefined else ''} | {fmt(q.noiseless_width)} | "
                     f"{fmt(sum(widths) / len(widths) if widths else None)} | {bar} |")
    if result["problems"]:
        lines.append(f"\nOutside the metric's range: {', '.join(result['problems'][:10])}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--metrics", default=",".join(METRICS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--markdown", help="append the tables to this file")
    args = ap.parse_args()
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        ap.error(f"unknown metric(s): {', '.join(unknown)} (known: {', '.join(METRICS)})")
    out: list[str] = [f"\n### Utility under the default controls (`python bench/bench_utility.py --sizes {args.sizes} "
                      f"--metrics {','.join(metrics)} --runs {args.runs} --seed {args.seed} "
                      f"--bootstrap {args.bootstrap}`)"]
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="ppre-utility-") as tmp:
            folder = Path(tmp)
            synth(size, args.seed, folder)
            for metric in metrics:
                try:
                    result = run_metric(metric, folder, runs=args.runs, bootstrap=args.bootstrap, seed=args.seed)
                except RuntimeError as exc:
                    out.append(f"\n#### {metric}, {size:,} members: FAILED: {exc}")
                    print(out[-1], flush=True)
                    continue
                lines = render(size, result)
                print("\n".join(lines), flush=True)
                out += lines
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as fh:
            fh.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
