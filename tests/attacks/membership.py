"""(D) Membership oracle: a one-member dataset asks whether that member is in the Tester's table.

The Tester's table is its members file less the members who opted out (the `opt_out`
column, design §2). A Test-Client that knows its users' ids submits, per target, a
dataset holding the target alone, and reads what comes back before any budget is
charged: the Abort its own service receives from the Tester, and what its operator
is told. It first submits an id that no Tester holds, to learn the "not a member"
answer, then guesses "member" for every target whose answer differs from it.

Before the defence, a refusal stated the intersection's size ("holds 1 distinct
members") and an empty join had an error of its own: every target's status came out.
With it, an empty and a small intersection get the same bytes (`INTERSECTION_REFUSAL`),
and a Test-Client identity's refused audits are limited (`ReleasePolicy.max_refusals`),
which bounds what the refusal itself (answered or not) can still say once the
attacker pads its dataset with members it knows are in (design §8.2).

Unlike the other attacks this one runs the services in-process (`ppre.local`), with a
Tester that counts per Test-Client identity as `ppre tester serve` does (`ppre audit
--local` counts no refusals: its user holds both datasets).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.audit_log import AuditLog
from tester_service.demographics.preparation import PreparationConfig
from tester_service.release import PrivacyAccountant, ReleasePolicy
from tester_service.server import prepare_from_files, run_audit
from tests.attacks.harness import _quiet
from tests.helpers import TEST_BITS, wait_until

#: this attack's population (`ppre synth`): a seed no other attack uses
MEMBERS, SEED = 300, 1803
#: an id the Tester holds under no circumstances: the attacker's "not a member" answer
NOBODY = "zz-not-a-member"


@dataclass
class Table:
    """The Tester's members file with opt-outs, and the hidden truth about the targets."""

    members: Path
    targets: list[str]
    member: dict[str, bool]  # target -> in the Tester's table (did not opt out)

    @property
    def blind(self) -> int:
        """Right guesses with no information: the larger class, guessed for everyone."""
        inside = sum(self.member.values())
        return max(inside, len(self.targets) - inside)


def make_table(directory: Path, n_targets: int, *, seed: int = SEED) -> Table:
    """`ppre synth` members; half of `n_targets` random members opt out."""
    directory = Path(directory)
    assert _quiet(["synth", "--members", str(MEMBERS), "--seed", str(seed), "--out", str(directory)]) == 0
    frame = pd.read_csv(directory / "members.csv", dtype=str)
    rng = np.random.default_rng(seed)
    targets = sorted(rng.choice(frame["member_id"].to_numpy(), size=n_targets, replace=False).tolist())
    out = set(rng.choice(targets, size=n_targets // 2, replace=False).tolist())
    frame["opt_out"] = ["1" if m in out else "0" for m in frame["member_id"]]
    path = directory / "members_opt_out.csv"
    frame.to_csv(path, index=False)
    return Table(path, targets, {t: t not in out for t in targets})


@dataclass
class Answer:
    """What one audit gave the attacker: its operator's (code, message) and the bytes of
    the Abort its service received from the Tester (b"" for none)."""

    code: str
    message: str
    abort: bytes

    @property
    def key(self) -> tuple:
        return self.code, self.message, self.abort


@dataclass
class Outcome:
    targets: int
    recovered: int
    blind: int
    answers: dict[str, Answer] = field(default_factory=dict)
    reference: Answer | None = None

    def codes(self) -> list[str]:
        return [a.code for a in self.answers.values()]

    def __str__(self) -> str:
        return (f"membership oracle: {self.recovered}/{self.targets} recovered (blind {self.blind}); "
                f"codes {sorted(set(self.codes()))}")


@contextlib.contextmanager
def aborts_received(monkeypatch) -> Iterator[list[bytes]]:
    """Every Abort a Test-Client session receives, as serialized bytes (a tap on the real
    `ClientSession.receive`, which still handles the message)."""
    seen: list[bytes] = []
    original = ClientSession.receive

    def receive(self, msg):
        if msg.WhichOneof("body") == "abort":
            seen.append(msg.abort.SerializeToString())
        return original(self, msg)

    monkeypatch.setattr(ClientSession, "receive", receive)
    yield seen


def run(table: Table, workdir: Path, monkeypatch, *, release: ReleasePolicy | None = None,
        accountant: PrivacyAccountant | None = None, audit_log: AuditLog | None = None) -> Outcome:
    """The attack against a Tester with `release` (default: the defaults), all audits
    from one Test-Client identity (its certificate's, over mutual TLS: the same for a
    restarted pair of services)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ids = [NOBODY, *table.targets]
    for i, member in enumerate(ids):
        pd.DataFrame({"member_id": [member], "y_true": [0], "y_pred": [1]}).to_csv(workdir / f"d{i}.csv",
                                                                                 index=False)
    load = lambda: prepare_from_files(table.members, None, PreparationConfig())  # noqa: E731
    answers: list[Answer] = []
    with aborts_received(monkeypatch) as seen, \
            local_services(load, DatasetRegistry(data_dir=workdir), modulus_bits=TEST_BITS, allow_insecure=True,
                           release=release or ReleasePolicy(), accountant=accountant) as svc:
        if audit_log is not None:
            svc.tester_config.audit_log = audit_log
        for i in range(len(ids)):
            before = len(seen)
            event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset=f"d{i}",
                                                                   bootstrap=10))
            kind = event.WhichOneof("event")
            code, message = ("result", "") if kind == "result" else (event.error.code, event.error.message)
            # the Tester's Abort reaches the Test-Client's session a moment after the operator's error
            if kind == "error" and code != "refusal_limit_reached":
                assert wait_until(lambda: len(seen) > before), f"no Abort reached the Test-Client ({code})"
            abort = seen[before] if len(seen) > before else b""
            answers.append(Answer(code, message, abort))
            assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    reference, rest = answers[0], dict(zip(table.targets, answers[1:]))
    recovered = sum((answer.key != reference.key) == table.member[t] for t, answer in rest.items())
    return Outcome(len(table.targets), recovered, table.blind, rest, reference)


def with_count_in_refusal(monkeypatch) -> None:
    """The defence removed: the refusal states the intersection's size, as it did
    ("the intersection holds N distinct members"), and an empty join has its own words."""
    from tester_service import protocol
    from tester_service.release import IntersectionRefused

    original = protocol.TesterSession._check_intersection

    def leaky(self) -> None:
        distinct = self._distinct_members()
        try:
            original(self)
        except IntersectionRefused:
            if distinct == 0:
                raise IntersectionRefused("empty intersection: no member of the client dataset is among the "
                                          "Tester's members") from None
            raise IntersectionRefused(f"the intersection holds {distinct} distinct members") from None

    monkeypatch.setattr(protocol.TesterSession, "_check_intersection", leaky)


def without_refusal_limit() -> ReleasePolicy:
    """The defaults, but no limit on refused audits."""
    return dataclasses.replace(ReleasePolicy(), max_refusals=None)
