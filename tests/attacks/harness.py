"""Attack harness: a curious Test-Client against the real services (design §8.1).

The attacker (design §8.1; Hamman, Chen and Dutta 2023) is a
Test-Client and its operator. It knows its own users' member ids, surnames and ZIPs,
so it can compute public BISG itself (`ppre bisg`); it chooses its dataset's outputs
adversarially, runs as many audits as the Tester answers and reads the released report
(`ppre audit --json`: per-group estimates). It never sees the Tester's probabilities.

Every audit here is the real command, `ppre audit --local --json` run in-process
(`ppre.cli.main`): both services on loopback, talking gRPC, with the Tester preparing
BISG, privatised Self-ID (randomized response, ε = 4.5) and clipping inside each audit
from the `ppre synth` files. The only test-sized setting is the Paillier modulus (1024
bits, as every other test uses; `PPRE_ATTACK_KEY_BITS=2048` for production keys).

Ground truth: the synth's Self-ID survey (each Self-ID member's self-reported race).
*Targets* are Self-ID members whose public BISG argmax is a different group: public
information points the wrong way, so a correct guess is information the audits gave
away. A target is *recovered* when the attacker's guess equals its self-reported
group. Even a perfect attack stays near 95% (the Tester flips a Self-ID answer with
probability 5/(e^4.5+5) = 5.3%).

*Chance*: every attack guesses the argmax of what it recovered over the k − 1 = 5
groups other than public BISG's argmax, ties and "nothing released" broken uniformly
at random. With no information in the releases that guess is uniform over 5 groups:
chance is 1/(k − 1) = 0.2 per target. Where small-cell suppression hides some groups,
the same guess without information picks uniformly among the groups it can see, which
can beat 1/5 for targets in the large groups; chance is then that rate
(`uninformed_hit`), whichever is larger. `Outcome.chance_margin` is the count a chance
guesser reaches with probability below `CHANCE_ALPHA` (binomial).
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binom

from common.crypto import paillier
from common.races import RACES
from ppre.cli import main as ppre_main

K = len(RACES)
#: a uniform guess over the groups other than public BISG's argmax
CHANCE = 1.0 / (K - 1)
#: a uniform guesser exceeds `chance_margin` recoveries with probability below this
CHANCE_ALPHA = 0.001
#: the Tester's refusals (tester_service/release.py; the minimum is checked on a noised count, §8.2)
REFUSALS = ("release_refused", "privacy_budget_exhausted", "refusal_limit_reached")
#: test-sized Paillier keys, as tests/helpers.py TEST_BITS (production refuses < 2048)
KEY_BITS = int(os.environ.get("PPRE_ATTACK_KEY_BITS", "1024"))
#: the population every attack draws from (`ppre synth`); 15% in Self-ID for enough targets
POPULATION = dict(members=2000, seed=11, self_id_share=0.15)
#: replicates per audit: the attacks read point estimates only
BOOTSTRAP = 10


# ----------------------------------------------------------------------------------
# The population: synth files, the attacker's public BISG, the hidden truth
# ----------------------------------------------------------------------------------
def _quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return ppre_main(argv)


@dataclass
class Population:
    directory: Path
    members: Path  # member_id, surname, zip: the Tester's file; the attacker knows its users' rows
    self_id_file: Path
    ero: pd.DataFrame  # the synth's ERO dataset (the product team's real outputs)
    bisg: pd.DataFrame  # public BISG, indexed by member_id, one column per race (the attacker's)
    self_id: pd.Series  # member_id -> self-reported race index (hidden: scoring only)
    targets: list[str]  # Self-ID members whose public BISG argmax is another group

    @property
    def ids(self) -> np.ndarray:
        return self.bisg.index.to_numpy()

    def public(self, ids: Sequence[str]) -> np.ndarray:
        """Public BISG rows of `ids`, (len(ids), K)."""
        return self.bisg.loc[list(ids), list(RACES)].to_numpy(dtype=np.float64)

    def public_argmax(self, member: str) -> int:
        return int(np.argmax(self.public([member])[0]))

    def reported(self, member: str) -> int:
        return int(self.self_id[member])

    def others(self, n: int, rng: np.random.Generator, exclude: Sequence[str] = ()) -> list[str]:
        """`n` random members other than `exclude` (decoys, padding: the attacker's other
        users, Self-ID or not; it cannot tell)."""
        pool = np.setdiff1d(self.ids, np.asarray(list(exclude), dtype=object))
        return sorted(rng.choice(pool, size=n, replace=False).tolist())

    def runner_up_baseline(self, targets: Sequence[str]) -> int:
        """How many of `targets` an attacker gets right with no audit at all, by guessing
        public BISG's second choice (context for the tables; not the chance line)."""
        p = self.public(targets)
        second = np.argsort(-p, axis=1)[:, 1]
        return int(sum(int(s) == self.reported(t) for s, t in zip(second, targets)))


def make_population(directory: Path, *, members: int = POPULATION["members"], seed: int = POPULATION["seed"],
                    self_id_share: float = POPULATION["self_id_share"]) -> Population:
    """`ppre synth` into `directory`, then `ppre bisg` of the members (the public part)."""
    directory = Path(directory)
    assert _quiet(["synth", "--members", str(members), "--seed", str(seed), "--out", str(directory),
                   "--self-id-share", str(self_id_share)]) == 0
    bisg_file = directory / "public_bisg.csv"
    assert _quiet(["bisg", "--input", str(directory / "members.csv"), "--output", str(bisg_file)]) == 0
    bisg = pd.read_csv(bisg_file, dtype={"member_id": str}).set_index("member_id")
    survey = pd.read_csv(directory / "self_id.csv", dtype={"member_id": str, "race": str})
    self_id = pd.Series([RACES.index(r) for r in survey["race"]], index=survey["member_id"])
    public_argmax = bisg.loc[self_id.index, list(RACES)].to_numpy().argmax(axis=1)
    targets = sorted(self_id.index[public_argmax != self_id.to_numpy()].tolist())
    ero = pd.read_csv(directory / "client" / "ero.csv", dtype={"member_id": str})
    return Population(directory, directory / "members.csv", directory / "self_id.csv", ero, bisg, self_id,
                      targets)


# ----------------------------------------------------------------------------------
# Defences: the Tester's release controls, as `ppre audit --local` flags
# ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
@dataclass(frozen=True)
class Defences:
    """A setting of the Tester's release controls (tester_service/release.py)."""

    name: str
    extra: tuple[str, ...] = ()
    controls_off: bool = False

    def flags(self, ledger: Path) -> list[str]:
        if self.controls_off:
            return ["--no-release-controls"]
        # one Test-Client identity for all of the attacker's audits, as a Tester charges a
        # Test-Client's certificate identity whatever dataset it submits
        return ["--privacy-ledger", str(ledger), "--privacy-identity", "attacker", *self.extra]


OFF = Defences("off", controls_off=True)
#: the defaults (tester_service.release): min intersection 100, min effective size 30 (on
#: noisy sizes), noise rho 0.2 per audit, budget rho 0.4
DEFAULTS = Defences("defaults")
#: ablation (report only): the default noise and minimum sizes, but no budget
NOISE_ONLY = Defences("noise, no budget", extra=("--privacy-budget", "inf", "--population-budget", "inf"))


# ----------------------------------------------------------------------------------
# The attacker's audits
# ----------------------------------------------------------------------------------
@dataclass
class Release:
    """What one audit gave the attacker: per-group estimates (None: suppressed or no
    data), or the error that came back instead."""

    estimates: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    message: str = ""

    @property
    def answered(self) -> bool:
        return self.error is None

    @property
    def refused(self) -> bool:
        return self.error in REFUSALS

    def vector(self) -> np.ndarray:
        """The six estimates in RACES order, NaN where nothing was released."""
        return np.array([np.nan if self.estimates.get(r) is None else float(self.estimates[r]) for r in RACES])


def key_environment(bits: int) -> dict[str, str | None]:
    """`ppre audit --local` with `bits`-bit Paillier keys (the services still run whole):
    the one test-key setting every process reads (`PPRE_TEST_KEY_BITS`); unset for 2048."""
    return {paillier.TEST_KEY_ENV: str(bits) if bits < paillier.MIN_MODULUS_BITS else None}


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    """The process environment with `values` set (None: unset) for the block."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ReleaseTally:
    """An attacker's audits so far (`releases`): how many were answered, and the refusals
    by error code (what `score` reads)."""

    releases: list[Release]

    @property
    def answered(self) -> int:
        return sum(r.answered for r in self.releases)

    @property
    def refusals(self) -> Counter:
        return Counter(r.error for r in self.releases if r.refused)


class Attacker(ReleaseTally):
    """One curious Test-Client: its datasets, its audits, and what came back.

    All of its audits share one privacy ledger (`workdir/ledger.json`, and a private
    XDG_DATA_HOME), as one Test-Client identity would at a real Tester."""

    def __init__(self, population: Population, defences: Defences, workdir: Path, *,
                 bootstrap: int = BOOTSTRAP, key_bits: int = KEY_BITS) -> None:
        self.population = population
        self.defences = defences
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ledger = self.workdir / "ledger.json"
        self.bootstrap = bootstrap
        self.key_bits = key_bits
        self.releases: list[Release] = []
        self.seconds = 0.0

    def audit(self, frame: pd.DataFrame, *, metric: str = "ero", option: str = "fpr") -> Release:
        """One audit of the dataset `frame` (written as a fresh dataset file)."""
        path = self.workdir / f"dataset_{len(self.releases):04d}.csv"
        frame.to_csv(path, index=False)
        argv = ["audit", "--local", "--json", "--metric", metric, "--metric-option", option,
                "--tester-members", str(self.population.members),
                "--tester-self-id", str(self.population.self_id_file),
                "--client-data", str(path), "--bootstrap", str(self.bootstrap),
                *self.defences.flags(self.ledger)]
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with _environment(XDG_DATA_HOME=str(self.workdir / "xdg"), **key_environment(self.key_bits)), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = ppre_main(argv)
        self.seconds += time.perf_counter() - t0
        release = _parse(code, out.getvalue(), err.getvalue())
        if not release.answered and not release.refused:
            raise AssertionError(f"audit failed ({release.error}): {release.message}")
        self.releases.append(release)
        return release


def _parse(code: int, stdout: str, stderr: str) -> Release:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:  # an error raised before any service started prints one line to stderr
        text = stderr.strip()
        kind = ("privacy_budget_exhausted" if "budget" in text else
                "release_refused" if "refus" in text else "cli_error")
        return Release(error=kind, message=text)
    obj = json.loads(lines[-1])
    if "error" in obj:
        return Release(error=obj["error"]["code"], message=obj["error"]["message"])
    return Release(estimates={g["group"]: g["estimate"] for g in obj["groups"]})


# ----------------------------------------------------------------------------------
# Guessing and scoring
# ----------------------------------------------------------------------------------
def guess(signal: np.ndarray, public_argmax: int, rng: np.random.Generator) -> int:
    """The attacker's guess: the group with the largest `signal` among the groups other
    than public BISG's argmax; NaN (nothing released) never wins; ties and an all-NaN
    signal are broken uniformly at random (so no information means chance)."""
    candidates = np.array([j for j in range(K) if j != public_argmax])
    values = np.asarray(signal, dtype=np.float64)[candidates]
    known = ~np.isnan(values)
    if not known.any():
        return int(rng.choice(candidates))
    top = np.max(values[known])
    slack = 0.0 if np.isinf(top) else 1e-9 * max(1.0, abs(top))
    best = candidates[known & (values >= top - slack)]
    return int(rng.choice(best))


def uninformed_hit(signal: np.ndarray, public_argmax: int, reported: int) -> float:
    """The probability that `guess` is right for this target if the released values
    carried no information about it: a uniform pick among the candidates it could see
    (groups other than public BISG's argmax with something released), or among all
    k − 1 when nothing was. It exceeds 1/(k − 1) when suppression hides groups the
    target does not belong to (suppression depends on the other rows, not the target)."""
    candidates = [j for j in range(K) if j != public_argmax and not np.isnan(signal[j])]
    if not candidates:
        return CHANCE
    return (reported in candidates) / len(candidates)


@dataclass
class Outcome:
    """One attack under one setting of the defences."""

    attack: str
    defences: str
    targets: int
    recovered: int
    audits: int
    answered: int
    refusals: Counter
    seconds: float
    uninformed: float = 0.0  # expected recoveries of the same guess with no signal (Σ_t uninformed_hit)
    informed: int = 0  # targets whose audits were answered (the others' guesses are blind)
    recovered_informed: int = 0  # recoveries among those
    runner_up: int = 0  # public BISG's second choice, no audit (context)
    details: list = field(default_factory=list)  # (target, reported, public argmax, guess)

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())

    @property
    def chance_rate(self) -> float:
        """Chance per target: 1/(k − 1), or the same guess's no-signal rate where
        suppression narrowed its candidates (whichever is larger)."""
        return max(CHANCE, self.uninformed / self.targets if self.targets else 0.0)

    @property
    def chance_expected(self) -> float:
        return self.targets * self.chance_rate

    @property
    def chance_margin(self) -> int:
        """Recoveries a chance guesser reaches with probability < CHANCE_ALPHA (binomial)."""
        return int(binom.ppf(1.0 - CHANCE_ALPHA, self.targets, self.chance_rate))

    @property
    def above_chance(self) -> bool:
        return self.recovered > self.chance_margin

    def row(self) -> dict:
        return {"attack": self.attack, "defences": self.defences, "targets": self.targets,
                "recovered": self.recovered, "informed": self.informed,
                "recovered_informed": self.recovered_informed, "chance": round(self.chance_expected, 1),
                "chance_margin": self.chance_margin, "bisg_runner_up": self.runner_up,
                "audits": self.audits, "answered": self.answered, "refused": self.refused,
                "refusal_codes": dict(self.refusals), "seconds": round(self.seconds, 1)}

    def __str__(self) -> str:
        return (f"{self.attack} [{self.defences}]: {self.recovered}/{self.targets} recovered "
                f"(chance {self.chance_expected:.1f}, margin {self.chance_margin}; {self.recovered_informed} of "
                f"{self.informed} with answered audits); {self.audits} audits, "
                f"{self.answered} answered, {self.refused} refused {dict(self.refusals)}; {self.seconds:.1f} s")


def score(attack: str, attacker: Attacker, targets: Sequence[str], signals: Sequence[np.ndarray],
          informed: Sequence[bool] | None = None, *, seed: int = 0) -> Outcome:
    """Guess every target from its signal (`guess`) and count the recoveries; `informed`:
    per target, whether the audits its guess needs were answered (default: all). Each
    target's tie-break draws come from its own generator (`seed`, its position), so a
    blind guess does not depend on what the other targets' audits released."""
    pop = attacker.population
    guesses, uninformed, details = [], 0.0, []
    for k, (target, signal) in enumerate(zip(targets, signals)):
        public, reported = pop.public_argmax(target), pop.reported(target)
        g = guess(signal, public, np.random.default_rng([seed, k]))
        guesses.append(g)
        uninformed += uninformed_hit(np.asarray(signal, dtype=np.float64), public, reported)
        details.append((target, RACES[reported], RACES[public], RACES[g]))
    hits = [pop.reported(t) == g for t, g in zip(targets, guesses)]
    informed = [True] * len(targets) if informed is None else list(informed)
    return Outcome(attack, attacker.defences.name, len(targets), int(sum(hits)), len(attacker.releases),
                   attacker.answered, attacker.refusals, attacker.seconds, uninformed=uninformed,
                   informed=int(sum(informed)), recovered_informed=int(sum(h for h, i in zip(hits, informed) if i)),
                   runner_up=pop.runner_up_baseline(targets), details=details)


def record_finished_releases(mp) -> list:
    """Each release the finishing party decodes, recorded through `mp` (a pytest
    MonkeyPatch) as (plan, its decoded rows) beside `common.stats.moments.finish_release`,
    which still runs: what a modified Test-Client reads off the noised aggregates."""
    from common.stats import moments
    seen: list = []
    release = moments.finish_release

    def finish_release(plan, corr, row, *args, **kw):
        seen.append((plan, [list(r) for r in row]))
        return release(plan, corr, row, *args, **kw)
    mp.setattr(moments, "finish_release", finish_release)
    return seen


def ero_frame(ids: Sequence[str], y_true: Sequence[int], y_pred: Sequence[int]) -> pd.DataFrame:
    return pd.DataFrame({"member_id": list(ids), "y_true": np.asarray(y_true, dtype=int),
                         "y_pred": np.asarray(y_pred, dtype=int)})
