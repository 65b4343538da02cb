"""The attenuation correction's remaining error, in plaintext (`common.stats.correction`).

Per group, over several synthetic populations (`ppre.synth`, a fresh one per seed, with
an injected disparity on the ERO false-positive rate: black +0.08 unless ``--disparity``
says otherwise): the members' true-race FPR (Σ f / Σ d over the members of race r, from the hidden truth), the mean
weighted estimate ``Σ p_j f / Σ p_j d`` (the paper's) and the mean corrected estimate
``M⁻¹·Num``, the bias and RMSE of each against the true-race FPR, and how often the group
was identifiable (identifying size ≥ `correction.MIN_IDENTIFYING_SIZE`, as the Tester
measures it on its own probabilities; a withheld group is held at its weighted value in
the others' rows, `CorrectionPlan.values`).

Scenarios (``--scenarios``):

* ``generative/tester``: ``ppre synth``'s default mode (true race from national shares,
  BISG's posterior only approximately the model's: assumption A1 holds approximately)
  and the probabilities the Tester computes by default: `tester_service.demographics.preparation.prepare`
  (what `prepare_from_files` runs on the files ``ppre synth`` writes), i.e. BISG, the 6%
  Self-ID rows privatised by randomized response (ε = 4.5) and clipping at the 90%-rule T;
* ``calibrated/tester``: ``--mode calibrated`` (true race drawn from each member's BISG
  posterior: A1 holds exactly for raw BISG), same Tester preparation;
* ``calibrated/bisg``: calibrated mode and raw BISG (no Self-ID, no clipping): both
  assumptions hold exactly, the reference for the other two;
* ``generative/bisg``: default mode, raw BISG: A1 approximately, without the preparation.

The estimates are point estimates (no bootstrap; `tests/test_correction_coverage.py` has
the intervals). The weighted estimate is averaged over every seed (it is always reported);
the corrected one over the seeds where the group was identifiable.

    flock /tmp/ppre-bench.lock .venv/bin/python bench/bench_correction.py [--members 100000] [--seeds 10] \
        [--disparity black=0.08] [--scenarios ...]
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.stats import correction  # noqa: E402
from tester_service.demographics import bisg  # noqa: E402
from common.races import RACES  # noqa: E402
from ppre.synth import DEFAULT_DISPARITY, SynthConfig, parse_race_values, synthesize  # noqa: E402
from tester_service.demographics.preparation import PreparationConfig, prepare  # noqa: E402

K = len(RACES)
SCENARIOS = ("generative/tester", "calibrated/tester", "calibrated/bisg", "generative/bisg")

_PAIRS = correction.pairs(K)
_FAMILY = correction.Family(cells=tuple(range(K)), pair_items=tuple(range(K, K + len(_PAIRS))),
                            num_slot=0, den_slot=1, scale_shift=0)
_PLAN = correction.CorrectionPlan(groups=tuple(RACES), families=(_FAMILY,), first_item=K)
_CELLS = [SimpleNamespace(item=j) for j in range(K)]


def estimates(p: np.ndarray, f: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(weighted, corrected, identifiable, condition number of M): the parties' finish
    (`CorrectionPlan.values`) on the full sample's sums."""
    num, den, m = p.T @ f, p.T @ d, correction.plain_matrix(p, d)
    identifiable = correction.identifying_sizes(correction.plain_matrix(p)) >= correction.MIN_IDENTIFYING_SIZE
    hidden = [g for g, ok in zip(RACES, identifiable) if not ok]
    slots = np.zeros((K + len(_PAIRS), 2))
    slots[:K, 0], slots[:K, 1] = num, den
    slots[K:, 1] = [m[j, r] for j, r in _PAIRS]
    corrected, cond = _PLAN.values(slots, _CELLS, len(slots), hidden=hidden)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den, corrected[0], identifiable, cond or float("nan")


def one_population(members: int, seed: int, mode: str, preparations: list[str],
                   disparity: dict[str, float]) -> dict[str, dict]:
    data = synthesize(SynthConfig(members=members, seed=seed, mode=mode, disparity=dict(disparity)))
    ero = data.ero.set_index("member_id")
    truth = data.truth.set_index("member_id")["race"]
    out = {}
    for how in preparations:
        if how == "tester":  # the Tester's default preparation (`prepare_from_files`), in memory
            prepared = prepare(data.members, data.self_id, PreparationConfig(seed=seed))
            ids = prepared["member_id"].to_numpy(dtype=object)
            p = prepared[list(RACES)].to_numpy(dtype=float)
            stats = prepared.attrs["preparation"]
            info = {"threshold": stats.threshold, "clipped": stats.clipped_rows / len(p),
                    "self_id": stats.self_id_used}
        else:  # raw BISG on surname and ZIP
            ids = data.members["member_id"].to_numpy(dtype=object)
            p = bisg.bisg(data.members["surname"], zips=data.members["zip"]).probabilities
            info = {}
        rows = ero.loc[ids]
        d = (rows["y_true"].to_numpy() == 0).astype(float)
        f = d * rows["y_pred"].to_numpy()
        race = np.array([RACES.index(r) for r in truth.loc[ids]])
        with np.errstate(divide="ignore", invalid="ignore"):
            true = np.bincount(race, weights=f, minlength=K) / np.bincount(race, weights=d, minlength=K)
        weighted, corrected, identifiable, cond = estimates(p, f, d)
        out[how] = {"true": true, "weighted": weighted, "corrected": corrected, "identifiable": identifiable,
                    "cond": cond, **info}
    return out


def table(runs: list[dict]) -> str:
    true = np.array([r["true"] for r in runs])
    w = np.array([r["weighted"] for r in runs])
    c = np.array([r["corrected"] for r in runs])
    ok = np.array([r["identifiable"] for r in runs])
    lines = ["| group | true FPR | mean weighted | mean corrected | bias weighted | bias corrected "
             "| RMSE weighted | RMSE corrected | identifiable |",
             "|---|---|---|---|---|---|---|---|---|"]
    for j, g in enumerate(RACES):
        ew = w[:, j] - true[:, j]
        cells = [g, f"{true[:, j].mean():.4f}", f"{w[:, j].mean():.4f}"]
        if ok[:, j].any():
            ec = c[ok[:, j], j] - true[ok[:, j], j]
            cells += [f"{c[ok[:, j], j].mean():.4f}", f"{ew.mean():+.4f}", f"{ec.mean():+.4f}",
                      f"{np.sqrt((ew ** 2).mean()):.4f}", f"{np.sqrt((ec ** 2).mean()):.4f}"]
        else:
            cells += ["withheld", f"{ew.mean():+.4f}", "", f"{np.sqrt((ew ** 2).mean()):.4f}", ""]
        cells.append(f"{ok[:, j].sum()}/{len(runs)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=10, help="populations per mode (seeds 1..N)")
    ap.add_argument("--disparity", default=None,
                    help="injected FPR disparity, e.g. black=0.08,aian=0.05 (default: ppre synth's, black=0.08)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ", ".join(SCENARIOS))
    args = ap.parse_args(argv)
    disparity = DEFAULT_DISPARITY if args.disparity is None else parse_race_values(args.disparity, "disparity")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario '{s}'")
    print("command: " + " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/bench_correction.py",
                                                             *(sys.argv[1:] if argv is None else argv)]))
    start = time.perf_counter()
    modes = list(dict.fromkeys(s.split("/")[0] for s in scenarios))
    results: dict[str, list[dict]] = {s: [] for s in scenarios}
    for mode in modes:
        preps = [s.split("/")[1] for s in scenarios if s.split("/")[0] == mode]
        for seed in range(1, args.seeds + 1):
            for how, res in one_population(args.members, seed, mode, preps, disparity).items():
                results[f"{mode}/{how}"].append(res)
    elapsed = time.perf_counter() - start
    for s in scenarios:
        runs = results[s]
        extra = ""
        if "threshold" in runs[0]:
            extra = (f"; T = {np.mean([r['threshold'] for r in runs]):.3f}, "
                     f"{np.mean([r['clipped'] for r in runs]):.1%} of rows clipped, "
                     f"{np.mean([r['self_id'] for r in runs]):.0f} Self-ID rows")
        print(f"\n### {s}: {args.members} members x {args.seeds} seeds, disparity "
              f"{','.join(f'{g}={v:+g}' for g, v in disparity.items()) or 'none'} (median condition number of M "
              f"{np.median([r['cond'] for r in runs]):.0f}{extra})\n")
        print(table(runs))
    print(f"\n{elapsed:.0f} s")


if __name__ == "__main__":
    main()
