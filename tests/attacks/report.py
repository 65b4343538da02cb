"""Print the attack harness's results as a table: `python -m tests.attacks.report`.

Runs every attack (`single_member`, `differencing`, `reconstruction`, `suppression`)
through the real services against one `ppre synth` population, under each setting of the
defences, each with its own Test-Client (own privacy ledger), and prints one row per attack and
setting: targets, recovered, chance (expected, and the margin a chance guesser stays
under with probability 99.9%), public BISG's runner-up (no audit at all), audits run,
answered and refused. Then the other attacks (`catalogue`: the small-groups list, the
membership oracle, the noiseless Tester, averaging, the Tester's row linkers, the modified
Test-Client, the pair-graph linker and operations), each as its test runs it, with the
defence removed and with the defaults: recovered against the blind guess. Options:
`--settings off,defaults,noise` (default: all three), `--attacks ...` (harness attacks and
catalogue names; default: all), `--json` (one JSON object per row), `--keep DIR` (keep the data).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from tests.attacks import catalogue, differencing, reconstruction, single_member, suppression
from tests.attacks.harness import (CHANCE, DEFAULTS, KEY_BITS, NOISE_ONLY, OFF, POPULATION, Attacker,
                                   make_population)

SETTINGS = {"off": OFF, "defaults": DEFAULTS, "noise": NOISE_ONLY}
#: (name, module, which targets) as the tests use them
ATTACKS = {
    "single-member": (single_member, lambda targets: targets[:12]),
    "differencing": (differencing, lambda targets: targets[12:22]),
    "reconstruction": (reconstruction, lambda targets: targets[-12:]),
    "suppression": (suppression, lambda targets: targets[:12]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.attacks.report", description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="off,defaults,noise")
    parser.add_argument("--attacks", default=",".join([*ATTACKS, *catalogue.RUNNERS]))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", help="write the population and the datasets here and keep them")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    for name in settings:
        if name not in SETTINGS:
            parser.error(f"unknown setting {name!r} (choose from {', '.join(SETTINGS)})")
    for name in attacks:
        if name not in ATTACKS and name not in catalogue.RUNNERS:
            parser.error(f"unknown attack {name!r} (choose from {', '.join([*ATTACKS, *catalogue.RUNNERS])})")

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ppre-attacks-"))
    t0 = time.perf_counter()
    try:
        population = make_population(root / "population") if any(a in ATTACKS for a in attacks) else None
        outcomes, lines = [], []
        for attack in [a for a in attacks if a in ATTACKS]:
            module, pick = ATTACKS[attack]
            for setting in settings:
                attacker = Attacker(population, SETTINGS[setting], root / f"{attack}-{setting}")
                outcome = module.run(attacker, pick(population.targets))
                outcomes.append(outcome)
                print(outcome, file=sys.stderr, flush=True)
        for attack in [a for a in attacks if a in catalogue.RUNNERS]:
            new = catalogue.RUNNERS[attack](root / attack)
            lines += new
            print(*(asdict(line) for line in new), sep="\n", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - t0

    if args.json:
        for outcome in outcomes:
            print(json.dumps(outcome.row()))
        for line in lines:
            print(json.dumps(asdict(line)))
        return 0
    if outcomes:
        print_harness(outcomes, population, elapsed)
    if lines:
        print_catalogue(lines)
    return 0


def print_harness(outcomes, population, elapsed: float) -> None:
    print(f"Population: `ppre synth --members {POPULATION['members']} --seed {POPULATION['seed']} "
          f"--self-id-share {POPULATION['self_id_share']}`: {len(population.self_id)} Self-ID members, "
          f"{len(population.targets)} targets (public BISG argmax is not the self-reported group). "
          f"Paillier keys: {KEY_BITS} bits. Chance: 1/(k-1) = {CHANCE:.2f} per target (more where "
          f"suppression narrows the guess); margin: 99.9% binomial quantile. Total {elapsed:.0f} s.\n")
    print("| attack | defences | targets | recovered | chance (margin) | recovered / targets with answered "
          "audits | BISG runner-up, no audit | audits | answered | refused | time |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for o in outcomes:
        refused = ", ".join(f"{n} {code}" for code, n in sorted(o.refusals.items())) or "0"
        print(f"| {o.attack} | {o.defences} | {o.targets} | {o.recovered} | {o.chance_expected:.1f} "
              f"(≤ {o.chance_margin}) | {o.recovered_informed} / {o.informed} | {o.runner_up} | {o.audits} "
              f"| {o.answered} | {refused} | {o.seconds:.0f} s |")


def print_catalogue(lines: list) -> None:
    """The other attacks: per setting, recovered (of total) against the blind guess."""
    print("\n| attack | setting | recovered | of | blind guess | note |")
    print("|---|---|---:|---:|---:|---|")
    for line in lines:
        print(f"| {line.attack} | {line.setting} | {line.recovered} | {line.total} | {line.blind} | {line.note} |")


if __name__ == "__main__":
    sys.exit(main())
