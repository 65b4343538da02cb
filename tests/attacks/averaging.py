"""(e) Averaging repeated reads of a target's Self-ID answer (ours; design §2.3).

Randomized response hides a Self-ID answer behind one draw: the Tester reports the
answer with probability e^ε/(e^ε + k − 1), another group otherwise. If the Tester drew
it afresh in every audit, a Test-Client that can read a target's released vector (any
channel: the single-member design (a) against a Tester whose controls are off, or a
leak such as the small-groups list) reads it again and again and averages the draws
away: the sum of R independent reads points at the answer ever more surely. The
defence draws each member's response once per Tester epoch (`ResponseEpoch`, kept by
the long-lived Tester process), so every read returns the same draw.

The attacker here reads its targets through one long-lived Tester (both services in
this process, as `ppre tester serve` and `ppre client serve` would run, 1024-bit keys)
with the release controls off, so that each read is exact: the target plus decoys, all
true negatives, the target the only positive (`single_member.recovered_vector`). Each
target is read `reads` times; the guess is `harness.guess` of the sum of the reads.

*Blind baseline* of this attack: what one randomized response leaves to an attacker who
reads it exactly. Its guess is right when the draw kept the answer, and with
probability 1/(k − 1) when the draw landed on public BISG's argmax (the guess leaves
that group out and picks among the rest at random): ``one_draw_rate``. Averaging gains
only if the reads are different draws.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from scipy.stats import binom

from client_service.datasets import DatasetRegistry
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.demographics import randomized_response
from tester_service.demographics.preparation import PreparationConfig
from tester_service.release import ReleasePolicy
from tester_service.server import prepare_from_files, run_audit
from tests.attacks.harness import (CHANCE_ALPHA, K, KEY_BITS, Outcome, Population, Release, ReleaseTally, _parse,
                                   ero_frame, score)
from tests.attacks.single_member import recovered_vector

#: the Tester's randomized-response ε here: low enough that one draw often misleads, so
#: that the gain of averaging shows with few reads (the mechanism is the same at 4.5)
EPSILON = 2.0
N_DECOYS = 60
READS = 5
#: replicates per audit: the attack reads point estimates only
BOOTSTRAP = 2


def one_draw_rate(epsilon: float = EPSILON, k: int = K) -> float:
    """The blind baseline per target: one randomized response read exactly (kept, or
    moved to public BISG's argmax and then guessed right by a uniform pick)."""
    keep = randomized_response.keep_probability(epsilon, k)
    return keep + (1.0 - keep) / (k - 1) / (k - 1)


def per_audit_epochs(seed: int):
    """The defence removed: a stand-in for `tester_service.demographics.preparation.process_epoch` that
    gives every preparation (every audit) a new epoch, seeded so that a run repeats."""
    count = iter(range(10**9))
    return lambda: randomized_response.ResponseEpoch.from_seed(1_000_000 * seed + next(count))


@dataclass(frozen=True)
class Setting:
    """What the Tester does with Self-ID between audits (shown in the outcome)."""

    name: str


FIXED = Setting("one draw per member and epoch")
REDRAWN = Setting("a new draw per audit (defence removed)")


class ServiceAttacker(ReleaseTally):
    """A curious Test-Client's audits against one long-lived Tester: the interface
    `harness.score` reads (`population`, `defences`, `releases`, `answered`,
    `refusals`, `seconds`), with datasets written to the Test-Client's data folder."""

    def __init__(self, population: Population, setting: Setting, tester_address: str, data_dir: Path) -> None:
        self.population = population
        self.defences = setting
        self.tester_address = tester_address
        self.data_dir = data_dir
        self.releases: list[Release] = []
        self.seconds = 0.0

    def audit(self, frame) -> Release:
        name = f"dataset_{len(self.releases):04d}"
        frame.to_csv(self.data_dir / f"{name}.csv", index=False)
        t0 = time.perf_counter()
        request = pb.AuditRequest(metric="ero", metric_option="fpr", client_dataset=name, bootstrap=BOOTSTRAP)
        event = run_audit(self.tester_address, request, timeout=300)
        self.seconds += time.perf_counter() - t0
        if event.WhichOneof("event") != "result":
            raise AssertionError(f"audit failed ({event.error.code}): {event.error.message}")
        release = _parse(0, event.result.report_json, "")
        self.releases.append(release)
        return release


@contextlib.contextmanager
def tester(population: Population, setting: Setting, workdir: Path, *, epsilon: float = EPSILON,
           key_bits: int = KEY_BITS) -> Iterator[ServiceAttacker]:
    """Both services for the attacker's audits: the Tester prepares from the synth's
    members and Self-ID files in every audit (`prepare_from_files`), with no release
    controls; its Self-ID draws follow `setting` (the caller arranges REDRAWN)."""
    data_dir = Path(workdir) / "client-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    preparation = PreparationConfig(epsilon=epsilon)
    with local_services(lambda: prepare_from_files(population.members, population.self_id_file, preparation),
                        DatasetRegistry(data_dir), modulus_bits=key_bits, allow_insecure=key_bits < 2048,
                        release=ReleasePolicy.off()) as services:
        yield ServiceAttacker(population, setting, services.tester_address, data_dir)


@dataclass
class Averaged:
    """The averaging attack's outcome (`outcome`: the guess from the sum of the reads),
    with the same guess from the first read alone and the number of targets whose reads
    were not all the same draw."""

    outcome: Outcome
    first_read: Outcome
    reads: int
    draws_differ: int  # targets whose reads' largest groups were not all the same
    on_public: int  # targets whose reads were all public BISG's argmax (the guess is then blind)

    @property
    def baseline_rate(self) -> float:
        return one_draw_rate()

    @property
    def baseline_margin(self) -> int:
        """Recoveries that exactly-read single draws exceed with probability < CHANCE_ALPHA."""
        return int(binom.ppf(1.0 - CHANCE_ALPHA, self.outcome.targets, self.baseline_rate))

    def __str__(self) -> str:
        return (f"averaging {self.reads} reads [{self.outcome.defences}]: {self.outcome.recovered}/"
                f"{self.outcome.targets} recovered from the sum, {self.first_read.recovered} from the first read "
                f"(one draw read exactly: {self.outcome.targets * self.baseline_rate:.1f} expected, margin "
                f"{self.baseline_margin}); reads differ for {self.draws_differ} targets; "
                f"{self.outcome.audits} audits, {self.outcome.seconds:.1f} s")


def run(attacker: ServiceAttacker, targets: Sequence[str], *, reads: int = READS, n_decoys: int = N_DECOYS,
        seed: int = 0) -> Averaged:
    """Read every target `reads` times (one audit each) and guess from the sum."""
    pop = attacker.population
    decoys = pop.others(n_decoys, np.random.default_rng(seed), exclude=targets)
    decoy_mass = pop.public(decoys).sum(axis=0)
    per_target: list[list[np.ndarray]] = []
    for target in targets:
        frame = ero_frame([target, *decoys], np.zeros(len(decoys) + 1), [1] + [0] * len(decoys))
        per_target.append([recovered_vector(attacker.audit(frame).vector(), decoy_mass) for _ in range(reads)])
    summed = [np.sum(r, axis=0) for r in per_target]
    tops = [{int(np.nanargmax(v)) for v in r} for r in per_target]
    on_public = sum(t == {pop.public_argmax(target)} for t, target in zip(tops, targets))
    name = "averaging reads"
    return Averaged(score(name, attacker, targets, summed, seed=seed),
                    score(name, attacker, targets, [r[0] for r in per_target], seed=seed), reads,
                    draws_differ=sum(len(t) > 1 for t in tops), on_public=on_public)
