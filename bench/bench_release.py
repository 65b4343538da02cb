"""Benchmark: what the release controls cost an honest audit (design §8).

An ERO audit of a `ppre synth` population (default 100,000 members, every one with a
model output; BISG + Self-ID + clipping prepared once and reused, so that every run sees
the same probabilities), through both services over gRPC on loopback: once without
release controls (the noiseless estimates, B bootstrap replicates) and `--runs` times
with the default controls (noise, random-groups intervals). Prints per group the
noiseless estimate, each noisy one, the largest |difference| and both intervals' widths.

    .venv/bin/python bench/bench_release.py [--members 100000] [--runs 3] [--bootstrap 1000]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args()

    from client_service.datasets import DatasetRegistry
    from common.stats.results import AuditReport
    from ppre.commands.demo import DEMO_THRESHOLD, write_inputs
    from ppre.local import local_services
    from ppre.synth import SynthConfig, synthesize
    from proto import ppre_pb2 as pb
    from tester_service.demographics.preparation import PreparationConfig
    from tester_service.release import PrivacyAccountant, ReleasePolicy
    from tester_service.server import prepare_from_files, run_audit

    data = synthesize(SynthConfig(members=args.members, seed=args.seed, disparity={"black": 0.08}))
    with tempfile.TemporaryDirectory(prefix="ppre-bench-release-") as tmp:
        members, self_id, outputs = write_inputs(data, Path(tmp) / "tester", Path(tmp) / "client")
        t0 = time.perf_counter()
        probabilities = prepare_from_files(members, self_id, PreparationConfig(threshold=DEMO_THRESHOLD))
        print(f"prepared {len(probabilities)} members in {time.perf_counter() - t0:.1f} s", flush=True)
        request = pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=args.bootstrap, confidence=0.95,
                                  has_seed=True, seed=1)

        def audit(release):
            with local_services(lambda: probabilities, DatasetRegistry(named={"ero": outputs}), release=release,
                                accountant=PrivacyAccountant(math.inf)) as svc:
                start = time.perf_counter()
                event = run_audit(svc.tester_address, request, tls=svc.operator_tls)
                wall = time.perf_counter() - start
            if event.WhichOneof("event") != "result":
                raise SystemExit(f"audit failed: {event.error.code}: {event.error.message}")
            return AuditReport.from_proto(event.result), wall

        exact, wall = audit(ReleasePolicy.off())
        print(f"noiseless audit (no release controls, B={args.bootstrap}): {wall:.1f} s", flush=True)
        noisy = []
        for r in range(args.runs):
            report, wall = audit(ReleasePolicy())
            noisy.append(report)
            print(f"audit with the default release controls, run {r + 1}: {wall:.1f} s", flush=True)

    release = noisy[0].release
    print(f"\n{args.members} members, {exact.n_matched} joined; defaults: rho {release['rho']:g} per audit "
          f"(epsilon {release['epsilon']:.2f} at delta {release['delta']:g}), estimate noise sd "
          f"{release['sigma_estimate']:.3f} members, interval from {noisy[0].bootstrap} random groups")
    head = "| group | noiseless | " + " | ".join(f"run {i + 1}" for i in range(len(noisy))) + \
        " | max abs diff | CI width noiseless | CI width noisy (mean) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    worst = 0.0
    for g in exact.groups:
        ests = [r.group(g.group).estimate for r in noisy]
        diff = max(abs(e - g.estimate) for e in ests)
        if g.group != "overall":
            worst = max(worst, diff)
        widths = [r.group(g.group).ci_high - r.group(g.group).ci_low for r in noisy]
        print(f"| {g.group} | {g.estimate:.4f} | " + " | ".join(f"{e:.4f}" for e in ests) +
              f" | {diff:.4f} | {g.ci_high - g.ci_low:.4f} | {sum(widths) / len(widths):.4f} |")
    print(f"\nlargest |noisy - noiseless| over groups and runs: {worst:.4f} (bar: 0.005)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
