"""(B2) A Tester that turns its own controls off reads members' model outputs.

The attacker is the Tester and its operator. It turns the release controls off
(`--no-release-controls`: no noise, no minimum sizes) and chooses its probability
table: target k (k = 1..K) gets weight 2^-k in one group ("black") and the rest of its
mass in another, every other row 0 in that group. ERO's unconditional rate of that
group is then

    R = Σ_k 2^-k·f_k / Σ_k 2^-k,

so R·Σ_k 2^-k, written in binary, is the targets' false-positive bits f_k = 1(ŷ=1, y=0),
one each: the member id with the Test-Client's values, which the design promises no
party holds. With result recipient `client` the attacker needs the Test-Client's
result: it reads what its operator gets and every message the Test-Client sends it
(a tap on `TesterSession.receive`).

Two defences, both the Test-Client's: it refuses an AggregatesHeader without release
noise unless its own operator opted in (`ppre client serve --accept-noiseless`,
`ClientConfig.accept_noiseless`), so the audit ends in a protocol error before the
Test-Client decrypts or returns anything; and it keeps the result (design §3.7): the
Tester gets its timings only and ends with a receipt. With noise (the Tester's
defaults) the rate carries noise sized for one member's whole weight, which swamps the
bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from common.races import RACES
from common.stats.results import AuditReport
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.protocol import TesterSession
from tester_service.release import ReleasePolicy
from tester_service.server import forget_local_results, run_audit
from tests.helpers import TEST_BITS, wait_until

#: targets read per audit, and the members around them (fresh seed: no other attack uses it)
N_TARGETS, N_OTHERS, SEED = 12, 40, 1804
GROUP, REST = "black", "white"


@dataclass
class Outcome:
    targets: int
    recovered: int
    blind: int
    error: str = ""
    message: str = ""
    kinds_at_tester: list[str] = field(default_factory=list)  # what the Test-Client sent the Tester
    #: every result a ClientResult carried to the Tester (read by the tap, refused or not)
    results_at_tester: list[str] = field(default_factory=list)
    #: what the Tester's operator got: a receipt or a result (None: an error)
    report: AuditReport | None = None
    #: the Tester's session's own `result` at the end
    session_result: AuditReport | None = None

    @property
    def tester_got_result(self) -> bool:
        """Whether any estimate reached the Tester's side: in a message or in its result."""
        return bool(self.results_at_tester) or any(r is not None and r.groups
                                                   for r in (self.report, self.session_result))

    def __str__(self) -> str:
        return (f"noiseless Tester: {self.recovered}/{self.targets} false-positive bits read (blind {self.blind}); "
                f"error {self.error or '-'}; Tester received {sorted(set(self.kinds_at_tester))}")


def crafted_inputs(seed: int = SEED) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """(the Tester's chosen probability table, the Test-Client's real outputs, the targets'
    false-positive bits: the truth)."""
    rng = np.random.default_rng(seed)
    ids = [f"m{i:05d}" for i in range(N_TARGETS + N_OTHERS)]
    probs = np.zeros((len(ids), len(RACES)))
    weights = 2.0 ** -np.arange(1, N_TARGETS + 1)
    probs[:N_TARGETS, RACES.index(GROUP)] = weights
    probs[:N_TARGETS, RACES.index(REST)] = 1.0 - weights
    probs[N_TARGETS:, RACES.index(REST)] = 1.0
    tester = pd.DataFrame(probs, columns=list(RACES))
    tester.insert(0, "member_id", ids)
    y_true, y_pred = rng.integers(0, 2, len(ids)), rng.integers(0, 2, len(ids))
    client = pd.DataFrame({"member_id": ids, "y_true": y_true, "y_pred": y_pred})
    return tester, client, (y_pred * (1 - y_true))[:N_TARGETS]


def read_bits(rate: float) -> np.ndarray:
    """The targets' false-positive bits from the group's rate (module docstring)."""
    total = float(np.sum(2.0 ** -np.arange(1, N_TARGETS + 1)))
    scaled = int(round(rate * total * 2 ** N_TARGETS))
    return np.array([(scaled >> (N_TARGETS - k)) & 1 for k in range(1, N_TARGETS + 1)])


def send_result_back(monkeypatch) -> None:
    """The second defence removed: the Test-Client sends its finished result to the
    Tester in its ClientResult (as it did before design §3.7 kept it)."""
    keep = ClientSession._keep

    def leaky(self, report):
        out = keep(self, report)
        out[0].client_result.report_json = self.result.to_json()
        return out
    monkeypatch.setattr(ClientSession, "_keep", leaky)


def run(monkeypatch, tmp_path, *, accept_noiseless: bool, release: ReleasePolicy | None = None) -> Outcome:
    """One audit by the attacking Tester (controls off unless `release`), result recipient
    `client`, against a Test-Client that accepts noiseless aggregates or not. The
    attacker's view is the Tester's: what its operator gets (not local mode's merge with
    the Test-Client's kept result) and every message the Test-Client sends it."""
    tester, client, truth = crafted_inputs()
    client.to_csv(tmp_path / "ero.csv", index=False)
    kinds: list[str] = []
    carried: list[str] = []
    sessions: list[TesterSession] = []
    original = TesterSession.receive

    def receive(self, msg):  # a tap on the real session: what the Test-Client sent
        kinds.append(msg.WhichOneof("body"))
        if msg.HasField("client_result") and msg.client_result.report_json:
            carried.append(msg.client_result.report_json)
        if self not in sessions:
            sessions.append(self)
        return original(self, msg)

    monkeypatch.setattr(TesterSession, "receive", receive)
    with local_services(lambda: tester.copy(), DatasetRegistry(data_dir=tmp_path), modulus_bits=TEST_BITS,
                        allow_insecure=True, release=release or ReleasePolicy.off(),
                        accept_noiseless=accept_noiseless, tls=False) as svc:
        forget_local_results(svc.tester_address)  # the Tester's operator only, not both sides
        event = run_audit(svc.tester_address, pb.AuditRequest(
            metric="ero", metric_option="unconditional", client_dataset="ero", bootstrap=5,
            result_recipient="client"))
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
    rng = np.random.default_rng(SEED + 1)
    blind = int(max(truth.sum(), len(truth) - truth.sum()))
    # nothing came back, or no rate (undefined under noise): a blind guess, one value for all
    guess = np.full(len(truth), int(rng.integers(0, 2)))
    report = AuditReport.from_json(event.result.report_json) if event.WhichOneof("event") == "result" else None
    # the rate from anything that reached the Tester's side: its result, or a ClientResult's
    seen = ([report] if report is not None else []) + [AuditReport.from_json(text) for text in carried]
    rates = [r.group(GROUP).estimate for r in seen if any(g.group == GROUP for g in r.groups)]
    if rates and rates[0] is not None:
        guess = read_bits(rates[0])
    error = event.error if event.WhichOneof("event") == "error" else pb.AuditError()
    return Outcome(len(truth), int((guess == truth).sum()), blind, error.code, error.message, kinds,
                   results_at_tester=carried, report=report,
                   session_result=sessions[0].result if sessions else None)
