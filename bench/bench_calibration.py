"""Is ERO's verdict calibrated where races do not differ? Real audits of null populations.

    flock /tmp/ppre-bench.lock .venv/bin/python bench/bench_calibration.py [--members 10000] [--populations 100] \
        [--mode generative|calibrated] [--seed 1000] [--draws 20] [--json FILE] [--workdir DIR] [--deadline HH:MM]
    .venv/bin/python bench/bench_calibration.py --summarize FILE   # the summary of an earlier --json FILE

For each population i (seed ``--seed`` + i) this runs the real tools, as a user would:

1. ``ppre synth --members N --seed S --disparity none --mode MODE --out DIR``: every member's
   false-positive rate is ``base_fpr`` = 0.10 whatever their race (issue 43, the null);
2. ``ppre audit --local --metric ero --tester-members DIR/members.csv --tester-self-id
   DIR/self_id.csv --client-data DIR/client/ero.csv --privacy-ledger DIR/ledger.json
   --history none --json``: the default ERO audit (option ``fpr``, the default release
   controls: Gaussian noise, ρ = 0.2, 10 random groups; a fresh ledger per population, no
   run history kept), its JSON parsed;
3. the population's directory is deleted afterwards (member data; only numbers are kept).

Against what the audit reports, per group j:

* **true-race rate**: Σ f / Σ d over the members whose hidden race (``DIR/truth.csv``) is j,
  f = 1(ŷ=1, y=0), d = 1(y=0) (`common.metrics.ero`, option ``fpr``);
* **weighted estimand** ``Σ_i p_ij f_i / Σ_i p_ij d_i`` with the Tester's prepared
  probabilities (`tester_service.demographics.preparation.prepare`: BISG on surname + ZCTA,
  the 6% Self-ID rows replaced by their randomized response at ε = 4.5, clipping at the
  90%-rule T). The audit's own probabilities cannot be reproduced outside it: ``--local``
  starts a new Tester process per audit, so the randomized response comes from a new
  secret epoch (`preparation.process_epoch`) and clipping from an unseeded generator.
  What is computed instead is the estimand **averaged over ``--draws`` seeded preparation
  draws** (the same code path with seeds 0..K-1: `prepare`'s steps 3-4 on one BISG
  result; draw 0 is checked against `prepare(..., PreparationConfig(seed=0))` on the first
  population), with the draws' standard deviation (the part of an audit's error that the
  per-audit redraw of randomized response and clipping adds). Also, labelled as an
  approximation, the **plain BISG** weighted rate (no Self-ID, no clipping);
* **base** 0.10: the superpopulation value every group's true-race rate *and* weighted rate
  has under this null (ŷ is independent of race and of surname and ZIP given y, so
  E[p_j f] / E[p_j d] = base_fpr for every j, in both synth modes): no proxy bias exists
  in expectation here, so any gap in the finite weighted estimand is sampling noise.

Per population it records: the verdict (significant = severity low, moderate or high;
``flagged`` as the audit defines it = moderate or high), the compared pair, its estimate,
interval and simultaneous band; per group the audit's estimate and interval, whether the
interval covers the true-race rate, the weighted estimand (prepared mean and plain BISG)
and base; the largest pairwise gap of the weighted estimand (all six groups, and the
groups the verdict used), of the true-race rates and of the audit's estimates.

Summary: the flag rate with its Clopper-Pearson 95% interval, severities and pairs, coverage
per group, the weighted estimand's largest gap (mean, sd, range), and a per-group error
decomposition: the spread of (estimate − base) across populations against the spread the
intervals imply (half-width / z), split into member sampling (prepared-mean estimand − base)
and the audit's own draws (estimate − prepared-mean estimand: randomized response,
clipping and release noise); and the spread of the true-race rate itself (true − base), which
the weighted intervals do not track for the groups BISG attenuates most.

Note: at one seed the two modes share members, proxies and (under this null, the outcomes
not depending on race) the Test-Client's rows; they differ in the true races and so in the
Self-ID answers. Their flags are therefore not independent of each other's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from common.races import RACES  # noqa: E402
from tester_service.demographics import bisg as bisg_mod  # noqa: E402
from tester_service.demographics import clipping, randomized_response  # noqa: E402
from tester_service.demographics.preparation import (PreparationConfig, prepare, read_members,  # noqa: E402
                                                     read_self_id, self_id_categories)

PPRE = str(Path(sys.executable).with_name("ppre"))
BASE_FPR = 0.10
K = len(RACES)
SIGNIFICANT = ("low", "moderate", "high")
#: the largest gaps summarised: (row key, label)
GAPS = (("weighted_all", "weighted estimand, all six groups:"),
        ("weighted_verdict_groups", "weighted estimand, the verdict's groups:"),
        ("bisg_all", "plain-BISG weighted (approx.), all six:"),
        ("true_all", "true-race rates, all six:"),
        ("true_verdict_groups", "true-race rates, the verdict's groups:"),
        ("audit_estimates", "the audit's estimates, verdict's groups:"))


# ----------------------------------------------------------------------------------- estimands
def rates(weights: np.ndarray, f: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Σ w_ij f_i / Σ w_ij d_i per column j (NaN where the denominator is 0)."""
    num, den = weights.T @ f, weights.T @ d
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def largest_gap(values, keep=None) -> tuple[float, str]:
    """The largest pairwise difference among the finite values (of the groups in `keep`), as higher - lower."""
    idx = [j for j, v in enumerate(values) if np.isfinite(v) and (keep is None or RACES[j] in keep)]
    if len(idx) < 2:
        return float("nan"), ""
    hi = max(idx, key=lambda j: values[j])
    lo = min(idx, key=lambda j: values[j])
    return float(values[hi] - values[lo]), f"{RACES[hi]} - {RACES[lo]}"


class Estimands:
    """The true-race and weighted estimands of one population's files (module docstring)."""

    def __init__(self, directory: Path, draws: int, check_draw: bool):
        members = read_members(directory / "members.csv")
        self_id = read_self_id(directory / "self_id.csv")
        ids = members["member_id"].astype(str).to_numpy()
        ero = pd.read_csv(directory / "client" / "ero.csv", dtype={"member_id": str}).set_index("member_id")
        ero = ero.loc[ids]
        self.d = (ero["y_true"].to_numpy() == 0).astype(np.float64)
        self.f = self.d * (ero["y_pred"].to_numpy() == 1)
        truth = pd.read_csv(directory / "truth.csv", dtype=str).set_index("member_id")["race"].loc[ids]
        race = np.array([RACES.index(r) for r in truth])
        onehot = np.eye(K)[race]
        self.true = rates(onehot, self.f, self.d)
        self.true_negatives = (onehot.T @ self.d).astype(int)

        # BISG once (step 2 of `prepare`), then the seeded draws of steps 3-4
        p_bisg = bisg_mod.bisg(members["surname"], zips=members["zip"]).probabilities
        self.bisg = rates(p_bisg, self.f, self.d)
        self.threshold = clipping.threshold_from_rule(p_bisg)
        position = pd.Series(np.arange(len(ids)), index=ids)
        sid_ids = self_id["member_id"].astype(str).to_numpy()
        pos = position.loc[sid_ids].to_numpy()
        cats = self_id_categories(self_id)
        draws_w = []
        for s in range(draws):
            p = self.prepared(p_bisg, pos, cats, list(sid_ids), s)
            if s == 0 and check_draw:  # the reproduction is prepare()'s own steps 3-4
                ref = prepare(members, self_id, PreparationConfig(seed=0))
                assert list(ref["member_id"]) == list(ids)
                assert np.array_equal(ref[list(RACES)].to_numpy(dtype=float), p), "draw 0 differs from prepare()"
            draws_w.append(rates(p, self.f, self.d))
        w = np.array(draws_w)
        self.weighted = w.mean(axis=0)
        self.weighted_draw_sd = w.std(axis=0, ddof=1) if draws > 1 else np.full(K, np.nan)

    def prepared(self, p_bisg, pos, cats, sid_ids, seed: int) -> np.ndarray:
        cfg = PreparationConfig(seed=seed)
        probs = p_bisg.copy()
        probs[pos] = randomized_response.privatize_per_member_one_hot(cats, sid_ids, cfg.response_epoch(),
                                                                      cfg.epsilon)
        return clipping.clip(probs, self.threshold, cfg.rng())


# ----------------------------------------------------------------------------------- one population
def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def covers(lo, hi, value) -> bool | None:
    if lo is None or hi is None or not np.isfinite(value):
        return None
    return bool(lo <= value <= hi)


def one_population(i: int, args, workdir: Path) -> dict:
    seed = args.seed + i
    directory = Path(tempfile.mkdtemp(prefix=f"pop{seed}-", dir=workdir))
    try:
        t0 = time.time()
        synth = [PPRE, "synth", "--members", str(args.members), "--seed", str(seed), "--disparity", "none",
                 "--mode", args.mode, "--out", str(directory)]
        out = run(synth, 1800)
        if out.returncode != 0:
            raise RuntimeError(f"synth failed: {out.stderr[-2000:]}")
        t_synth = time.time() - t0
        t0 = time.time()
        audit = [PPRE, "audit", "--local", "--metric", "ero", "--tester-members", str(directory / "members.csv"),
                 "--tester-self-id", str(directory / "self_id.csv"),
                 "--client-data", str(directory / "client" / "ero.csv"),
                 "--privacy-ledger", str(directory / "ledger.json"), "--history", "none", "--json"]
        out = run(audit, 3600)
        t_audit = time.time() - t0
        if out.returncode != 0:
            raise RuntimeError(f"audit failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
        report = json.loads(out.stdout)
        t0 = time.time()
        est = Estimands(directory, args.draws, check_draw=(i == 0))
        t_est = time.time() - t0
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    v = report["verdict"]
    compared = v.get("compared") or {}
    excluded = set(v.get("excluded_groups") or [])
    groups = {g["group"]: g for g in report["groups"]}
    verdict_groups = [g for g in RACES if g not in excluded and groups[g]["estimate"] is not None]
    rows = {}
    for j, g in enumerate(RACES):
        e = groups[g]
        lo, hi = e["ci_low"], e["ci_high"]
        rows[g] = {
            "estimate": e["estimate"], "ci_low": lo, "ci_high": hi, "informative": e.get("informative"),
            "in_verdict": g in verdict_groups,
            "effective_size": report.get("release", {}).get("effective_sizes", {}).get(g),
            "true": float(est.true[j]), "true_negatives": int(est.true_negatives[j]),
            "weighted": float(est.weighted[j]), "weighted_draw_sd": float(est.weighted_draw_sd[j]),
            "bisg": float(est.bisg[j]),
            "covers_true": covers(lo, hi, est.true[j]), "covers_weighted": covers(lo, hi, est.weighted[j]),
            "covers_bisg": covers(lo, hi, est.bisg[j]), "covers_base": covers(lo, hi, BASE_FPR),
        }
    overall = groups["overall"]
    audit_est = [np.nan if groups[g]["estimate"] is None else groups[g]["estimate"] for g in RACES]
    pair = compared.get("label", "")
    pair_w = pair_t = None
    if pair and " - " in pair:
        a, b = pair.split(" - ")
        if a in RACES and b in RACES:
            pair_w = float(est.weighted[RACES.index(a)] - est.weighted[RACES.index(b)])
            pair_t = float(est.true[RACES.index(a)] - est.true[RACES.index(b)])
    gap = {name: dict(zip(("value", "pair"), largest_gap(values, keep)))
           for name, values, keep in (("weighted_all", est.weighted, None),
                                      ("weighted_verdict_groups", est.weighted, verdict_groups),
                                      ("bisg_all", est.bisg, None),
                                      ("true_all", est.true, None),
                                      ("true_verdict_groups", est.true, verdict_groups),
                                      ("audit_estimates", audit_est, verdict_groups))}
    band = (compared.get("band_low"), compared.get("band_high"))
    return {
        "population": i, "seed": seed, "members": args.members, "mode": args.mode,
        "n_matched": report["n_matched"], "seconds": {"synth": round(t_synth, 2), "audit": round(t_audit, 2),
                                                      "estimands": round(t_est, 2)},
        "severity": v["severity"], "significant": bool(v["significant"]), "flagged": bool(v["flagged"]),
        "compared": pair, "compared_estimate": compared.get("estimate"),
        "compared_ci": [compared.get("ci_low"), compared.get("ci_high")], "compared_band": list(band),
        "compared_weighted_difference": pair_w, "compared_true_difference": pair_t,
        "band_covers_weighted_difference": covers(*band, pair_w) if pair_w is not None else None,
        "band_covers_zero": covers(*band, 0.0) if band[0] is not None else None,
        "significant_comparisons": list(v.get("significant_comparisons") or []),
        "excluded_groups": sorted(excluded), "uninformative": list(v.get("uninformative") or []),
        "mdd": v.get("mdd"), "threshold_audit": report["preparation"]["threshold"],
        "threshold_reproduced": est.threshold, "self_id_used": report["preparation"]["self_id_used"],
        "clipped_rows": report["preparation"]["clipped_rows"],
        "sigma_estimate": report.get("release", {}).get("sigma_estimate"),
        "interval_from": report.get("release", {}).get("interval_from"), "interval": report.get("interval"),
        "overall": {"estimate": overall["estimate"], "ci_low": overall["ci_low"], "ci_high": overall["ci_high"],
                    "true": float(est.f.sum() / est.d.sum())},
        "groups": rows, "largest_gap": gap,
    }


# ----------------------------------------------------------------------------------- summary
def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def share(flags) -> str:
    vals = [x for x in flags if x is not None]
    return f"{sum(vals)}/{len(vals)}" + (f" ({sum(vals) / len(vals):.0%})" if vals else "")


def fmt_stats(x) -> str:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    if not len(x):
        return "n/a"
    return f"{x.mean():.4f} (sd {x.std(ddof=1) if len(x) > 1 else 0:.4f}, {x.min():.4f} to {x.max():.4f})"


def summary(rows: list[dict], confidence: float = 0.95) -> str:
    n = len(rows)
    k = sum(r["significant"] for r in rows)
    lo, hi = clopper_pearson(k, n)
    z = stats.norm.ppf(0.5 + confidence / 2)
    sev = {}
    for r in rows:
        sev[r["severity"]] = sev.get(r["severity"], 0) + 1
    lines = [f"populations: {n} ({rows[0]['members']:,} members, mode {rows[0]['mode']}, seeds "
             f"{rows[0]['seed']}..{rows[-1]['seed']})",
             f"significant verdicts (low/moderate/high): {k}/{n} = {k / n:.1%}, Clopper-Pearson 95% "
             f"[{lo:.1%}, {hi:.1%}]; flagged (moderate/high): {sum(r['flagged'] for r in rows)}/{n}",
             "severities: " + ", ".join(f"{s} {c}" for s, c in sorted(sev.items()))
             + "; verdict.significant = (severity is low/moderate/high) in "
             + share([r["significant"] == (r["severity"] in SIGNIFICANT) for r in rows]),
             "significant pairs: " + (", ".join(
                 f"{r['compared']} {r['compared_estimate']:+.4f} band [{r['compared_band'][0]:+.4f}, "
                 f"{r['compared_band'][1]:+.4f}] ({r['severity']}; "
                 f"weighted estimand {r['compared_weighted_difference']:+.4f}, "
                 f"true {r['compared_true_difference']:+.4f})" for r in rows if r["significant"]) or "none"),
             "compared pair's band covers its weighted-estimand difference: "
             + share([r["band_covers_weighted_difference"] for r in rows])
             + "; covers 0: " + share([r["band_covers_zero"] for r in rows]),
             "",
             "| group | in verdict | covers true-race rate | covers weighted estimand | covers plain-BISG weighted "
             "(approx.) | covers base 0.10 | mean half-width | sd(estimate - base) | sd implied by intervals "
             "| sd(weighted - base) | mean draw sd | sd(estimate - weighted) | sd(true - base) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in list(RACES) + ["overall"]:
        if g == "overall":
            gs = [r["overall"] for r in rows]
            lines.append(f"| overall | - | {share([covers(x['ci_low'], x['ci_high'], x['true']) for x in gs])} "
                         f"| = true | = true | {share([covers(x['ci_low'], x['ci_high'], BASE_FPR) for x in gs])} "
                         f"| {np.mean([(x['ci_high'] - x['ci_low']) / 2 for x in gs]):.4f} "
                         f"| {np.std([x['estimate'] - BASE_FPR for x in gs], ddof=1) if n > 1 else 0:.4f} "
                         f"| {np.mean([(x['ci_high'] - x['ci_low']) / 2 / z for x in gs]):.4f} | | | "
                         f"| {np.std([x['true'] - BASE_FPR for x in gs], ddof=1) if n > 1 else 0:.4f} |")
            continue
        gs = [r["groups"][g] for r in rows]
        with_ci = [x for x in gs if x["ci_low"] is not None and x["estimate"] is not None]
        hw = [(x["ci_high"] - x["ci_low"]) / 2 for x in with_ci]

        def sd(vals):
            return f"{np.std(vals, ddof=1):.4f}" if len(vals) > 1 else "n/a"
        lines.append(
            f"| {g} | {sum(x['in_verdict'] for x in gs)}/{n} | {share([x['covers_true'] for x in gs])} "
            f"| {share([x['covers_weighted'] for x in gs])} | {share([x['covers_bisg'] for x in gs])} "
            f"| {share([x['covers_base'] for x in gs])} | {np.mean(hw) if hw else float('nan'):.4f} "
            f"| {sd([x['estimate'] - BASE_FPR for x in with_ci])} "
            f"| {np.mean(hw) / z if hw else float('nan'):.4f} "
            f"| {sd([x['weighted'] - BASE_FPR for x in gs])} | {np.mean([x['weighted_draw_sd'] for x in gs]):.4f} "
            f"| {sd([x['estimate'] - x['weighted'] for x in with_ci])} "
            f"| {sd([x['true'] - BASE_FPR for x in gs if np.isfinite(x['true'])])} |")
    lines += ["",
              "largest pairwise gap (higher - lower), mean (sd, min to max) over populations:",
              *(f"  {label:<40} " + fmt_stats([r["largest_gap"][key]["value"] for r in rows]) for key, label in GAPS),
              "threshold T reproduced = the audit's in "
              + share([abs(r["threshold_audit"] - r["threshold_reproduced"]) < 1e-12 for r in rows]) + " populations",
              "seconds per population (synth / audit / estimands): "
              + " / ".join(f"{np.mean([r['seconds'][s] for r in rows]):.1f}" for s in ("synth", "audit", "estimands"))]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--populations", type=int, default=100)
    ap.add_argument("--mode", choices=("generative", "calibrated"), default="generative")
    ap.add_argument("--seed", type=int, default=1000, help="population i uses seed SEED + i")
    ap.add_argument("--draws", type=int, default=20, help="seeded preparation draws averaged for the weighted estimand")
    ap.add_argument("--json", type=Path, default=None, help="write every population's row (and the summary) here")
    ap.add_argument("--workdir", type=Path, default=None, help="where populations are written (and deleted)")
    ap.add_argument("--deadline", default=None, metavar="HH:MM",
                    help="start no population after this UTC time (the rows so far are summarised)")
    ap.add_argument("--summarize", type=Path, default=None, metavar="FILE",
                    help="print the summary of the rows of an earlier --json FILE (runs nothing)")
    args = ap.parse_args(argv)
    if args.summarize:
        print(summary(json.loads(args.summarize.read_text())["rows"]))
        return 0
    workdir = args.workdir or Path(tempfile.gettempdir())
    workdir.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in
                       [".venv/bin/python", "bench/bench_calibration.py", *(argv or sys.argv[1:])])
    print("command: " + command, flush=True)
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load: {os.getloadavg()}", flush=True)
    rows = []
    t0 = time.time()
    for i in range(args.populations):
        if args.deadline and time.strftime("%H:%M", time.gmtime()) >= args.deadline:
            print(f"deadline {args.deadline} UTC reached: {i} of {args.populations} populations run", flush=True)
            break
        r = one_population(i, args, workdir)
        rows.append(r)
        wg = r["largest_gap"]["weighted_all"]
        print(f"[{i + 1}/{args.populations} seed {r['seed']}] {r['severity']:<12} {r['compared']:<20} "
              f"{r['compared_estimate'] if r['compared_estimate'] is not None else float('nan'):+.4f} band "
              f"[{r['compared_band'][0] if r['compared_band'][0] is not None else float('nan'):+.4f}, "
              f"{r['compared_band'][1] if r['compared_band'][1] is not None else float('nan'):+.4f}]; "
              f"weighted gap {wg['value']:.4f} ({wg['pair']}); "
              f"{r['seconds']['synth']:.0f}+{r['seconds']['audit']:.0f}+{r['seconds']['estimands']:.0f} s",
              flush=True)
        if args.json:  # rewritten after every population, so an interrupted run keeps its rows
            args.json.write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    if not rows:
        return 1
    text = summary(rows)
    print(f"\n{len(rows)} populations in {time.time() - t0:.0f} s; load {os.getloadavg()}")
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"command": command, "rows": rows, "summary": text}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
