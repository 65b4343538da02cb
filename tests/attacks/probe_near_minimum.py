"""(D2) The membership probe at the minimum: members known to be in the Tester's table,
one short of the minimum intersection, plus one probe.

The refusal's text says nothing (`membership`), but whether an audit is answered at
all is still an answer: a Test-Client that knows `KNOWN` = 99 of the Tester's members
(its own customers it has seen in an earlier answered audit, say) submits them with one
probe, and the audit is answered exactly when the intersection reaches the minimum of
100, that is when the probe is a member: one bit per audit, read by every audit it
runs, answered or refused. The defence (design §8.2, `ReleasePolicy.intersection_answered`)
checks the minimum on a count with Gaussian noise of σ_i = 5 members at the defaults, so
that one member moves the decision with probability at most 2·Φ(1/(2σ_i)) − 1 = 0.080,
and counts every refusal against the identity and the population, local audits too
(`PrivacyAccountant.max_population_refusals`), which bounds how many decisions the
attacker can collect on one population.

`run` asks each probe once through both sessions in one process (`tests.helpers.local_audit`,
budgets lifted so that every probe is asked: the per-audit advantage alone);
`run_local` asks them as `ppre audit --local` does, one client file (one identity) per
probe, all against the same Tester files and one ledger, under the default bounds.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from client_service.datasets import DatasetRegistry
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.audit_spec import AuditSpec
from tester_service.inputs import read_probability_table
from tester_service.release import (DEFAULT_MAX_POPULATION_REFUSALS, DEFAULT_MIN_INTERSECTION, IntersectionRefused,
                                    ReleasePolicy, local_accountant)
from tester_service.server import run_audit
from tests.helpers import TEST_BITS, local_audit, make_inputs, wait_until

#: the members the attacker knows are in the Tester's table: one short of the minimum
KNOWN = DEFAULT_MIN_INTERSECTION - 1
#: the Tester's table (`make_inputs` ids m000000...): the known members, then the
#: members the probes ask about; a seed no other attack uses
N_TESTER, SEED = 260, 1807
SPEC = AuditSpec(metric="ero", client_dataset="d", bootstrap=10, seed=1)


@dataclass
class Population:
    """The Tester's probability table, the members the attacker knows, and the probes
    with the hidden truth (probe -> in the Tester's table)."""

    tester: pd.DataFrame
    known: list[str]
    probes: list[str]
    member: dict[str, bool]

    def dataset(self, probe: str, known: int = KNOWN) -> pd.DataFrame:
        """The attacker's ERO dataset: the first `known` known members and the probe."""
        ids = [*self.known[:known], probe]
        rng = np.random.default_rng(zlib.crc32(probe.encode()))
        return pd.DataFrame({"member_id": ids, "y_true": rng.integers(0, 2, len(ids)),
                             "y_pred": rng.integers(0, 2, len(ids))})


def make_population(n_probes: int, *, seed: int = SEED) -> Population:
    """Half the probes members of the Tester's table (beyond the known ones), half not, in
    a random order."""
    tester, _ = make_inputs(N_TESTER, 1, 0, seed=seed)
    ids = tester["member_id"].tolist()
    known = ids[:KNOWN]
    inside = ids[KNOWN:KNOWN + n_probes // 2]
    assert len(inside) == n_probes // 2, "the table is too small for that many probes"
    outside = [f"x{i:06d}" for i in range(n_probes - len(inside))]
    probes = list(np.random.default_rng(seed).permutation(inside + outside))
    return Population(tester, known, probes, {p: p in set(inside) for p in probes})


@dataclass
class Outcome:
    probes: int
    #: audits whose intersection was decided (answered or refused for it), and of them
    #: those whose probe was guessed right and those answered
    decided: int
    recovered: int
    answered: int
    #: per audit, in order: the operator's code ("result" for an answered audit)
    codes: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Right guesses per decided audit."""
        return self.recovered / self.decided if self.decided else 0.0

    def __str__(self) -> str:
        return (f"probe at the minimum: {self.recovered}/{self.decided} decided audits right ({self.accuracy:.3f}) "
                f"of {self.probes} asked, {self.answered} answered; codes {sorted(set(self.codes))}")


def run(population: Population, release: ReleasePolicy | None = None) -> Outcome:
    """Each probe asked once (both sessions in one process, `local_audit`): the guess is
    "member" when the audit is answered. `release`: default the defaults with the budgets
    and the refusal limit lifted, so that every probe is asked."""
    release = release or dataclasses.replace(ReleasePolicy(), budget=math.inf, max_refusals=None)
    recovered = answered = 0
    codes = []
    for probe in population.probes:
        try:
            local_audit(population.tester, population.dataset(probe), spec=SPEC, release=release, n_buckets=16)
            said_member = True
        except IntersectionRefused:
            said_member = False
        answered += said_member
        recovered += said_member == population.member[probe]
        codes.append("result" if said_member else "release_refused")
    return Outcome(len(population.probes), len(population.probes), recovered, answered, codes)


def decision_accuracy(release: ReleasePolicy, trials: int) -> float:
    """The attacker's accuracy per audit on the decision alone, member and non-member
    equally likely: `trials` draws of `ReleasePolicy.intersection_answered` at KNOWN + 1
    and at KNOWN distinct members (the operating system's CSPRNG, as in an audit)."""
    right = sum(release.intersection_answered(KNOWN + 1) for _ in range(trials))
    right += sum(not release.intersection_answered(KNOWN) for _ in range(trials))
    return right / (2 * trials)


def repeated_accuracy(release: ReleasePolicy, audits: int, attackers: int) -> float:
    """The accuracy of an attacker who asks one probe `audits` times and guesses "member"
    when more audits were answered than midway between the answers expected of a member,
    P(Z ≥ 0) = 1/2, and of a non-member, P(Z ≥ 1) (the likelihood-ratio test between the
    two counts), over `attackers` attackers, half of them with a member; decisions drawn
    as in `decision_accuracy`."""
    outsider = 0.5 * math.erfc(1.0 / (release.intersection_sigma() * math.sqrt(2.0))) if release.noisy else 0.0
    cut = audits * (0.5 + outsider) / 2
    right = 0
    for n in range(attackers):
        member = n % 2 == 0
        answered = sum(release.intersection_answered(KNOWN + member) for _ in range(audits))
        right += (answered > cut) == member
    return right / attackers


def run_local(population: Population, workdir: Path, *, known: int = KNOWN,
              max_population_refusals: int | None = DEFAULT_MAX_POPULATION_REFUSALS) -> Outcome:
    """The probes asked as `ppre audit --local` asks them: one client file per probe (with
    the first `known` known members), so that each audit is charged to an identity of its
    own (`local_accountant`: a digest of the inputs), all against the same Tester file
    (one population) and one ledger, under the default release controls;
    `max_population_refusals` None removes the population's refusal bound."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    table = workdir / "probabilities.csv"
    population.tester.to_csv(table, index=False)
    ledger = workdir / "privacy-ledger.json"
    release = ReleasePolicy()
    files = []
    for i, probe in enumerate(population.probes):
        files.append(workdir / f"d{i}.csv")
        population.dataset(probe, known).to_csv(files[-1], index=False)
    decided = recovered = answered = 0
    codes, messages = [], []
    with local_services(lambda: read_probability_table(table), DatasetRegistry(data_dir=workdir),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=release, n_buckets=16) as svc:
        for i, probe in enumerate(population.probes):
            svc.tester_config.accountant = local_accountant(release.budget, (table, None), files[i], ledger,
                                                            max_population_refusals=max_population_refusals)
            event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset=f"d{i}",
                                                                   bootstrap=10))
            kind = event.WhichOneof("event")
            code, message = ("result", "") if kind == "result" else (event.error.code, event.error.message)
            codes.append(code)
            messages.append(message)
            if code in ("result", "release_refused"):  # the intersection was decided
                said_member = code == "result"
                decided += 1
                answered += said_member
                recovered += said_member == population.member[probe]
            assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    return Outcome(len(population.probes), decided, recovered, answered, codes, messages)


def with_exact_minimum(monkeypatch) -> None:
    """The defence removed: the minimum checked on the exact count, as it was."""
    def exact(self, distinct: int, draw=None) -> bool:
        return distinct > 0 and distinct >= self.min_intersection
    monkeypatch.setattr(ReleasePolicy, "intersection_answered", exact)
