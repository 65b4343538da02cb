"""Is the verdict's severity honest about attenuation where a gap is real? Real audits.

Each population is a real ``ppre synth --members N --seed S`` with the default injected
disparity (black's FPR 0.10 + 0.08, every other race 0.10) and a real ``ppre audit --local
--metric ero ... --json`` under the default release controls (no correction asked for), a
fresh ledger each. Per audit: the severity, whether a "low" verdict says that the weighted
gap understates the true-race one (`verdict.attenuation.understates`, the message's words)
or that it may be τ or more (`verdict.may_reach_tau`), the compared pair's weighted gap, its
attenuation factor and allowance (`up_to`), its corrected gap where identifiable, and the
true-race gap of the same pair (``truth.csv``: Σ ŷ / count over the pair's true members
with y = 0). The summary counts the audits whose true gap reaches τ and were called "low"
without such a statement (the issue's bar: none), and how often weighted, `up_to` and the
corrected gap lie nearer the true gap.

    .venv/bin/python bench/bench_severity.py --members 10000 --populations 20 --seed 500 --json /tmp/sev.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

PPRE = str(Path(sys.executable).with_name("ppre"))
UNDERSTATES = "understates the true-race gap"


def true_gap(directory: Path, pair: str) -> float | None:
    """The compared pair's gap between the races themselves (FPR over true members, y = 0)."""
    a, _, b = pair.partition(" - ")
    truth = pd.read_csv(directory / "truth.csv").merge(pd.read_csv(directory / "client" / "ero.csv"))
    negatives = truth[truth.y_true == 0]
    rates = negatives.groupby("race").y_pred.mean()
    if a == "overall":
        return float(negatives.y_pred.mean() - rates.get(b, np.nan))
    if a not in rates or b not in rates:
        return None
    return float(rates[a] - rates[b])


def one_population(seed: int, members: int, workdir: Path) -> dict:
    directory = Path(tempfile.mkdtemp(prefix=f"sev{seed}-", dir=workdir))
    try:
        subprocess.run([PPRE, "synth", "--members", str(members), "--seed", str(seed), "--out", str(directory)],
                       check=True, capture_output=True, timeout=1800)
        t0 = time.time()
        out = subprocess.run([PPRE, "audit", "--local", "--metric", "ero",
                              "--tester-members", str(directory / "members.csv"),
                              "--tester-self-id", str(directory / "self_id.csv"),
                              "--client-data", str(directory / "client" / "ero.csv"),
                              "--privacy-ledger", str(directory / "ledger.json"), "--history", "none", "--json"],
                             capture_output=True, text=True, timeout=3600)
        seconds = time.time() - t0
        if out.returncode != 0:
            raise RuntimeError(f"audit failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-1000:]}")
        v = json.loads(out.stdout)["verdict"]
        compared = v.get("compared") or {}
        pair = str(compared.get("label") or "")
        truth = true_gap(directory, pair) if " - " in pair else None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    a = v.get("attenuation") or {}
    return {"seed": seed, "severity": v["severity"], "pair": pair, "weighted": compared.get("estimate"),
            "band_high": compared.get("band_high"), "true": truth, "factor": a.get("factor"),
            "up_to": a.get("up_to"), "corrected": a.get("corrected"), "understates": a.get("understates"),
            "says_understated": UNDERSTATES in v["message"], "may_reach_tau": v.get("may_reach_tau"),
            "message": v["message"], "seconds": round(seconds, 1)}


def factor_text(factor: float | None) -> str:
    return "-" if factor is None else f"{factor:.2f}"


def summarize(rows: list[dict], tau: float = 0.05) -> str:
    lines = [f"{len(rows)} audits; severities: "
             + ", ".join(f"{s} {sum(r['severity'] == s for r in rows)}" for s in
                         ("none", "inconclusive", "low", "moderate", "high") if any(r["severity"] == s for r in rows))]
    low = [r for r in rows if r["severity"] == "low"]
    real = [r for r in low if r["true"] is not None and abs(r["true"]) >= tau]
    silent = [r for r in real if not (r["says_understated"] or r["may_reach_tau"])]
    lines.append(f"'low' verdicts: {len(low)}; of them with a true-race gap of at least tau: {len(real)}; "
                 f"of those without a statement that the weighted gap understates it or may reach tau: {len(silent)}")
    lines.append(f"'low' verdicts that say 'may be ... or more' (may_reach_tau): {sum(bool(r['may_reach_tau']) for r in low)}")
    sig = [r for r in rows if r["severity"] in ("low", "moderate", "high") and r["true"] is not None]
    if sig:
        def err(key):
            vals = [abs(r[key] - r["true"]) for r in sig if r[key] is not None]
            return (f"{np.mean(vals):.4f} over {len(vals)}" if vals else "n/a")
        lines.append(f"significant audits {len(sig)}: mean |x - true gap| for weighted {err('weighted')}, "
                     f"corrected {err('corrected')}, up_to {err('up_to')}")
        lines.append("| seed | severity | pair | weighted | band high | corrected | factor | up to | true-race gap | "
                     "says understated | may reach tau |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        fmt = (lambda x: "-" if x is None else f"{x:+.4f}")
        for r in sig:
            lines.append(f"| {r['seed']} | {r['severity']} | {r['pair']} | {fmt(r['weighted'])} | {fmt(r['band_high'])} | "
                         f"{fmt(r['corrected'])} | {factor_text(r['factor'])} | "
                         f"{fmt(r['up_to'])} | {fmt(r['true'])} | {r['says_understated']} | {r['may_reach_tau']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=10000)
    ap.add_argument("--populations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=500, help="population i uses seed SEED + i")
    ap.add_argument("--json", type=Path, help="write every audit's row here")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--summarize", type=Path, help="print the summary of an earlier --json file (runs nothing)")
    args = ap.parse_args()
    if args.summarize:
        print(summarize(json.loads(args.summarize.read_text())["rows"]))
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"command: {' '.join(sys.argv)}", flush=True)
    for i in range(args.populations):
        r = one_population(args.seed + i, args.members, args.workdir)
        rows.append(r)
        print(f"[{i + 1}/{args.populations} seed {r['seed']}] {r['severity']:<12} {r['pair']:<20} weighted "
              f"{r['weighted']} true {r['true']} up_to {r['up_to']} corrected {r['corrected']}", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
