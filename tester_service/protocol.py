"""The Tester's (P1's) side of one audit session, free of I/O (design §3).

`TesterSession` is a small state machine over `PeerMessage`s, in the style of h11:
`start()` yields the first messages, `receive(msg)` consumes one peer message and
returns the messages to send back, `result` holds the report once done. No sockets,
no threads, no files: the gRPC layer (`tester_service.server`) only moves messages.

Steps (design §3): 1 keys and salt share; 2 send (Com.Enc_sk1(RO(id)), Sym.Enc(race_p))
and drop the plaintext table; 3 receive the shuffled, doubly encrypted rows; 4 receive
P2's rows: each row's member ids Com.Enc_sk2(RO(id)) (two for pair metrics), its
HE.Enc(values) and, where the metric has them, a resampling bucket and a plaintext
stratum; 5 doubly encrypt, join (a row is kept when all its members are found), delete
every id, then open the probability vectors; 6 weight, aggregate per bucket (and
stratum), build the bootstrap replicates (or random groups), mask, rerandomise and
send; 7 receive P2's "done" (P2 learns and keeps the result; `result` is then a
receipt, design §3.7) or the decrypted masked values (only P1 learns it) and unmask.
The metric (`common.metrics`) decides the rows, weights, cells
and verdict; a metric without HE (probabilistic count) ends after step 5, at P1.
MQOS-AUC exact adds a round trip between 6 and 7: P2 squares additively masked sums.
LOT under the release controls never shows P1 a row (design §5.3, "The Tester blind to
the pairs"): after step 3, P2 sends each of its members once; P1 joins them, opens the
vectors it holds and answers each member with HE_T.Enc of its vector under a key of its
own (`_member_vectors`); P2 returns per member and rank pair masked sums, then per rank
pair the masks' totals; P1 weights the sums under its key, decrypts only totals and
forms the items the rows would have given (`_aggregate_blind`), then step 6 goes on.
Release controls (design §8, `tester_service.release`) act at the end of step 5 (the
intersection's size, members repeated across rows) and in step 6 (cells below the
effective size withheld, Gaussian noise added under encryption, the budget charged
just before anything leaves).
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import math
import secrets
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import gmpy2
import numpy as np
import pandas as pd

from common.stats import bootstrap as boot
from common.protocol import validation, wire
from common.execution import parallel
from common.stats import correction, moments
from common.crypto import commutative, encoding, paillier
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.logs import new_audit_id
from common.crypto.masking import AdditiveMask, RatioMask
from common.metrics import correcting_metrics, get_metric
from common.metrics.base import RELEASE_NOISE, SECOND_MOMENTS, Layout, composite_items, sensitivity_rows
from common.stats.correction import finish_corrected
from common.stats.results import DEFAULT_TAU, MIN_EFFECTIVE_SIZE, AuditReport, finish, receipt, small_for_verdict
from common.protocol.session import PartySession, PhaseClock, chunk_ticks
from common.crypto.symmetric import RowSealer, sealed_width
from proto import ppre_pb2 as pb
from tester_service import aggregation, blind_pairs
from tester_service.join import check_shuffled_chunk, double_client_chunk
from tester_service.release import (RELEASE_GROUPS, REPORT_DELTA, IntersectionRefused, ReleasePolicy, gaussian,
                                    gaussian_slots, rho_to_epsilon)

PROTOCOL_VERSION = 2
MAX_REPLICATES = 100_000
RECIPIENTS = ("client", "tester")


@dataclass(frozen=True)
class AuditSpec:
    """What the operator asked for (validated before any work)."""

    metric: str
    client_dataset: str
    bootstrap: int = boot.DEFAULT_REPLICATES
    confidence: float = boot.DEFAULT_CONFIDENCE
    seed: int | None = None
    result_recipient: str = "client"
    metric_option: str = ""
    tau: float = DEFAULT_TAU
    #: the metric's parameters as the operator gave them (text)
    params: dict[str, str] = field(default_factory=dict)
    #: "none" or "calibration": attenuation-corrected estimates beside the weighted ones
    correction: str = "none"

    def validated(self) -> "AuditSpec":
        metric = get_metric(self.metric)
        option = metric.check_option(self.metric_option)
        metric.parse_params(self.params)
        if not self.client_dataset:
            raise InputError("no client dataset named", parameter="client dataset")
        # what the Test-Client accepts in a Hello (common.protocol.validation): refused here as the operator's input
        if len(self.client_dataset) > validation.MAX_NAME_CHARS:
            raise InputError(f"at most {validation.MAX_NAME_CHARS} characters", parameter="client dataset")
        if sum(len(k) + len(v) for k, v in self.params.items()) > validation.MAX_PARAM_CHARS:
            raise InputError(f"at most {validation.MAX_PARAM_CHARS} characters in all", parameter="metric parameter")
        if not 1 <= self.bootstrap <= MAX_REPLICATES:
            raise InputError(f"must be between 1 and {MAX_REPLICATES}", parameter="bootstrap")
        if not 0.0 < self.confidence < 1.0:
            raise InputError("must be strictly between 0 and 1", parameter="confidence")
        if self.result_recipient not in RECIPIENTS:
            raise InputError(f"must be one of {', '.join(RECIPIENTS)}", parameter="result recipient")
        if not self.tau > 0:
            raise InputError("must be positive", parameter="tau")
        correction_method = correction.check_method(self.correction)
        if correction_method != "none" and not metric.corrects:
            raise InputError(f"{self.metric} has no attenuation correction (metrics with one: "
                             f"{', '.join(correcting_metrics())})", parameter="correction")
        return dataclasses.replace(self, metric_option=option, params=dict(self.params), correction=correction_method)


#: chunks of the Test-Client's rows in flight on the executor at most (per worker: 2)
JOIN_WINDOW = 4


class Phase(enum.Enum):
    START = "start"
    WAIT_HELLO_ACK = "wait_hello_ack"
    WAIT_SHUFFLED = "wait_shuffled"
    WAIT_MEMBERS = "wait_members"
    WAIT_CLIENT_ROWS = "wait_client_rows"
    WAIT_TOTALS = "wait_totals"
    WAIT_SQUARES = "wait_squares"
    WAIT_RESULT = "wait_result"
    DONE = "done"
    CLOSED = "closed"


#: progress(phase, message, done=0, total=0): a phase ended (no counts), or `done` of
#: `total` rows of a long phase are through
ProgressFn = Callable[..., None]
#: rows hashed, encrypted and sealed per step of step 2 (a checkpoint and a progress
#: report each; about a second of work)
UPLOAD_STEP_ROWS = 32_768


class TesterSession(PartySession):
    __test__ = False  # not a pytest class

    def __init__(self, spec: AuditSpec, probabilities: pd.DataFrame, *,
                 min_modulus_bits: int = paillier.MIN_MODULUS_BITS,
                 n_buckets: int = boot.DEFAULT_BUCKETS,
                 progress: ProgressFn | None = None,
                 checkpoint: Callable[[], None] | None = None,
                 preparation: dict[str, float] | None = None,
                 release: ReleasePolicy | None = None,
                 charge: Callable[[float], float] | None = None,
                 max_received_bytes: int = validation.DEFAULT_MAX_RECEIVED_BYTES,
                 executor: parallel.Executor | None = None, audit_id: str | None = None,
                 group_mapping: str = "") -> None:
        """`progress(phase, message, done, total)` reports each finished phase and the
        rows done within long ones; `checkpoint()` runs between chunks of the long steps,
        and whatever either raises ends the session (the servicer uses this to stop an
        audit whose operator went away, or when it shuts down). `preparation`: the
        counts of the Tester's demographic preparation (no member-level data), passed
        through to the result. `release`: the release controls (design §8; default: the
        secure defaults of `tester_service.release`); `charge(rho)` spends this audit's
        privacy budget just before anything is released (it raises to refuse, and returns
        the budget left). `max_received_bytes`: the most the Test-Client may send in this
        session (`common.protocol.validation`). `executor`: where the per-row work runs (the
        service's; default inline, `common.execution.parallel`). `audit_id`: the audit's correlation
        id, sent in the Hello for the Test-Client's log lines (default: a fresh one,
        `common.logs`)."""
        self.spec = spec.validated()
        self.audit_id = audit_id if audit_id is not None else new_audit_id()
        self._executor = executor or parallel.InlineExecutor()
        self.metric = get_metric(self.spec.metric).for_option(self.spec.metric_option)
        self.params = self.metric.parse_params(self.spec.params)
        self.groups: tuple[str, ...] = tuple(c for c in probabilities.columns if c != "member_id")
        if not self.groups:
            raise InputError("the probability table has no group columns")
        self._ids: list[str] | None = probabilities["member_id"].astype(str).tolist()
        self._probabilities: np.ndarray | None = probabilities[list(self.groups)].to_numpy(np.float64)
        self._min_bits = min_modulus_bits
        self._n_buckets = n_buckets
        self._progress = progress or (lambda *args, **kw: None)
        self._checkpoint = checkpoint
        self._preparation = dict(preparation or {})
        #: how the groups were coarsened from the six races ("" for none), for the result
        self._group_mapping = group_mapping
        self.release = release if release is not None else ReleasePolicy()
        if self._moments_form():  # rows carry f² (`moment_squares`), the Test-Client states its facts
            self.params[SECOND_MOMENTS] = True
        if self.release.noisy and self.metric.he_under_noise:  # aggregated under encryption (design §5.8)
            self.params[RELEASE_NOISE] = True
        self.metric = self.metric.for_release(self.params)
        self._charge = charge
        self._release_info: dict[str, Any] = {}
        self._multiplicity = 1
        #: the row count the slots' noise is sized by (`_rows_l2`; else the multiplicity)
        self._sensitivity_rows: float = 1
        self._suppressed: list[int] = []
        self._noise_sd: list[float] = []  # per item slot: the estimate's, then the groups'
        self.phase = Phase.START
        #: every message from the Test-Client is checked here first (common.protocol.validation)
        self._inbound = validation.TesterInbound(max_received_bytes=max_received_bytes)
        self._clock = PhaseClock()
        self.phase_seconds = self._clock.seconds
        self.result: AuditReport | None = None
        self.n_matched = 0
        # per-session secrets: memory only, dropped by close()
        self._com_key: commutative.CommutativeKey | None = commutative.CommutativeKey.generate()
        self._sealer: RowSealer | None = RowSealer.generate()
        self._salt_share = secrets.token_bytes(32)
        self._pub: paillier.PublicKey | None = None
        self._layout: Layout | None = None
        self._strata_labels: tuple[str, ...] = ()
        self._info: dict[str, Any] = {}
        self._client_rows = 0
        #: the shuffled table (step 3) as it arrives, then `_index` sorted by point
        self._shuffled: list[tuple[bytes, bytes]] | None = None
        #: the executor's checks of its chunks' points (`commutative.check_points`)
        self._shuffled_checks: list = []
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        #: per matched row: where each of its members is in `_index` (one position per
        #: distinct member), and its ciphertexts (packed)
        self._matched_at: list[np.ndarray] = []
        self._matched_cts: list[bytes] = []
        self._matched_units: list[np.ndarray] = []
        self._matched_strata: list[np.ndarray] = []
        #: every row of the Test-Client's table, matched or not: its members' doubly encrypted
        #: points and its strata, from which the noise is sized (`_rows_per_member`)
        self._row_points: list[np.ndarray] = []
        self._row_strata: list[np.ndarray] = []
        self._reader: wire.TableReader | None = None
        #: chunks of the Test-Client's rows being doubly encrypted on the executor, in order
        self._pending: collections.deque = collections.deque()
        self._plan = None
        #: the weight columns the metric says are formed from others (`Metric.weight_derivations`)
        self._derivations: dict = {}
        self._pads: list[AdditiveMask] | None = None
        self._masked_values: list[int] = []
        self._squares_state: Any = None
        self._squares: list[int] = []
        self._small_groups: list[str] = []
        self._unidentifiable: list[str] = []
        self._correction: correction.CorrectionPlan | None = None
        self._n_sent = 0
        #: the blind path (`common.metrics.lot`, "The Tester blind to the pairs"): our own
        #: Paillier key for this audit, its slot plan, and per member of the Test-Client's
        #: member table its quantised vector (zeros where we hold no such member)
        self._blind = self.metric.tester_blind(self.params)
        self._tester_key: paillier.PrivateKey | None = paillier.generate_keypair(
            max(min_modulus_bits, 1024), allow_insecure=min_modulus_bits < paillier.MIN_MODULUS_BITS) \
            if self._blind else None
        self._blind_plan = None
        self._member_q: np.ndarray | None = None
        self._blind_members = 0
        self._blind_cts: list[bytes] = []
        self._blind_totals: list[tuple[bytes, bytes]] = []

    # ------------------------------------------------------------------ helpers
    def _report_rows(self, phase: str, done: int, total: int, message: str) -> None:
        self._progress(phase, message, done, total)

    def _drop_secrets(self) -> None:
        """Every key and every member-level table (`close`, however the session ends)."""
        self._com_key = None
        self._sealer = None
        self._ids = None
        self._probabilities = None
        self._shuffled = None
        for check in self._shuffled_checks:
            check.cancel()
        self._shuffled_checks = []
        self._index = None
        self._matched_at = []
        self._row_points, self._row_strata = [], []
        for future, *_ in self._pending:
            future.cancel()
        self._pending = collections.deque()
        self._matched_cts = []
        self._matched_units = []
        self._matched_strata = []
        self._pads = None
        self._masked_values = []
        self._squares_state = None
        self._squares = []
        self._tester_key = None
        self._member_q = None
        self._blind_cts = []
        self._blind_totals = []

    # ------------------------------------------------------------------ protocol
    def start(self) -> list[pb.PeerMessage]:
        self._expect(Phase.START)
        self.phase = Phase.WAIT_HELLO_ACK
        self._progress("handshake", "session keys generated; contacting the Test-Client")
        return [pb.PeerMessage(hello=pb.Hello(
            protocol_version=PROTOCOL_VERSION, metric=self.spec.metric, client_dataset=self.spec.client_dataset,
            metric_option=self.spec.metric_option, salt_share=self._salt_share,
            probability_bits=encoding.PROBABILITY_BITS, result_recipient=self.spec.result_recipient,
            sealed_width=sealed_width(len(self.groups)), metric_params=self.spec.params,
            buckets=self._n_buckets, correction=self.spec.correction, audit_id=self.audit_id,
            value_bounds=self.metric.value_bounds(self.spec.metric_option, self.params),
            second_moments=bool(self.params.get(SECOND_MOMENTS)), release_noise=self.release.noisy,
            **self._tester_key_fields()))]

    def _tester_key_fields(self) -> dict[str, bytes]:
        """The blind path's key in the Hello (`common.metrics.lot`); nothing otherwise."""
        if self._tester_key is None:
            return {}
        n, h = self._tester_key.public.to_bytes()
        return {"tester_paillier_n": n, "tester_paillier_h": h}

    def _on_hello_ack(self, ack: pb.HelloAck, facts: validation.AckFacts) -> Iterator[pb.PeerMessage]:
        self._client_rows = facts.rows
        self._strata_labels = facts.strata_labels
        self._info = facts.info
        self._pub = facts.public_key
        self._layout = facts.layout
        salt = commutative.session_salt(self._salt_share, ack.salt_share)
        self._lap("handshake")

        self.phase = Phase.WAIT_SHUFFLED
        width = sealed_width(len(self.groups))
        self._reader = wire.TableReader(wire.shuffled_rows(width))
        self._shuffled = []
        return self._upload(salt, width)

    def _upload(self, salt: commutative.SessionSalt, width: int) -> Iterator[pb.PeerMessage]:
        """Step 2, streamed: each step's ids are hashed and encrypted on the executor while
        the previous step's rows are sealed and sent; the plaintext table is dropped as
        soon as its last row is encrypted."""
        ids, probs = self._ids, self._probabilities
        n = len(ids)
        layout = wire.tester_rows(width)
        starts = range(0, n, UPLOAD_STEP_ROWS)
        tasks = ((salt.hash_task(), self._com_key.multiply_task(), ids[a:a + UPLOAD_STEP_ROWS]) for a in starts)
        for a, points in zip(starts, self._executor.stream(commutative.encrypt_ids, tasks)):
            b = min(n, a + UPLOAD_STEP_ROWS)
            sealed = self._sealer.seal_rows(probs[a:b])
            if b == n:  # step 2 done: the plaintext table is dropped
                self._ids = self._probabilities = None
                ids = probs = None
            yield from wire.chunk_messages(layout, b - a, points=points, sealed=sealed)
            self._tick("psi_upload", b, n, f"{b} of {n} rows encrypted and sent")
        self._ids = self._probabilities = None
        self._n_sent = n
        self._lap("psi_tester_encrypt")
        yield wire.table_end(layout, n)

    def _client_layout(self) -> wire.TableLayout:
        metric = self.metric
        if self._blind:
            plan = self._blind_plan
            return wire.blind_client_rows(plan.strata * plan.vector_cts, self._tester_key.public.ciphertext_bytes,
                                          0, self._pub.ciphertext_bytes)
        return wire.client_rows(metric.n_ids, self._layout.n_ciphertexts if self._layout else 0,
                                self._pub.ciphertext_bytes if self._pub else 0,
                                units=metric.resampling in ("unit", "client_groups"),
                                strata=metric.row_strata(self.params))

    def _on_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        if self.phase is Phase.WAIT_SQUARES:
            self._squares += rows.ciphertexts
            return []
        if self.phase is Phase.WAIT_SHUFFLED:  # its points checked on the executor (`_index_shuffled`)
            self._shuffled.append((chunk.points, chunk.sealed))
            self._shuffled_checks.append(self._executor.submit(check_shuffled_chunk, chunk.points,
                                                               self._reader.rows - chunk.rows))
            self._progress("psi_shuffled", "", self._reader.rows, self._n_sent)
            return []
        if self.phase is Phase.WAIT_MEMBERS:  # doubly encrypted (and checked) on the executor
            first = self._reader.rows - chunk.rows
            self._pending.append((self._executor.submit(double_client_chunk, self._com_key.multiply_task(),
                                                        chunk.points, first, b"", None),))
            return []
        if self.phase is Phase.WAIT_TOTALS:  # checked by the gate (`validation.TesterInbound`)
            self._blind_totals.append((chunk.tester_ciphertexts, chunk.ciphertexts))
            return []
        if self._blind:  # the masked sums: checked by the gate
            self._blind_cts.append(chunk.tester_ciphertexts)
            self._progress("join", "", self._reader.rows, self._blind_members)
            return []
        # step 5, one chunk: doubly encrypted (and checked, its ciphertexts too) on the
        # executor while the next chunks arrive; the chunks are joined in order as their
        # points come back
        first = self._reader.rows - chunk.rows
        future = self._executor.submit(double_client_chunk, self._com_key.multiply_task(), chunk.points, first,
                                       chunk.ciphertexts, self._pub)
        self._pending.append((future, chunk.rows, chunk.ciphertexts, rows.units, rows.strata))
        while self._pending and (len(self._pending) > self._executor.chunk_count(JOIN_WINDOW)
                                 or self._pending[0][0].done()):
            self._join(*self._pending.popleft())  # bounded: never more chunks held than the window
        self._progress("join", "", self._reader.rows, self._client_rows)
        return []

    def _index_shuffled(self) -> None:
        """The shuffled table, sorted by point for the join (arrays, not a dict of a
        million objects), once every chunk's points have passed their check
        (`commutative.check_points`, on the executor: canonical, on the curve, not of
        small order; the first failure is the session's error); a point that appears
        twice is refused."""
        checks, self._shuffled_checks = self._shuffled_checks, []
        for check in checks:
            check.result()
        width = self._reader.layout.sealed
        points = np.frombuffer(b"".join(p for p, _ in self._shuffled), dtype=f"S{commutative.POINT_BYTES}")
        sealed = np.frombuffer(b"".join(s for _, s in self._shuffled), dtype=f"V{width}")
        self._shuffled = None
        order = np.argsort(points, kind="stable")
        points, sealed = points[order], sealed[order]
        if len(points) > 1 and bool((points[1:] == points[:-1]).any()):
            raise ProtocolError("duplicate row in the shuffled table")
        self._index = (points, sealed)

    def _join(self, future, n_rows: int, ciphertexts: bytes, units, strata) -> None:
        """Step 5 for one chunk: a row is kept when every one of its members is among ours."""
        n_ids = self.metric.n_ids
        doubled = np.frombuffer(future.result(), dtype=f"S{commutative.POINT_BYTES}")
        at, found = self._lookup(doubled)
        kept = np.flatnonzero(found.reshape(n_rows, n_ids).all(axis=1))
        self._row_points.append(doubled)
        if strata is not None:
            self._row_strata.append(strata)
        if not len(kept):
            return
        self._matched_at.append(at.reshape(n_rows, n_ids)[kept])
        if self._layout is not None and self._layout.n_ciphertexts:
            row = self._layout.n_ciphertexts * self._pub.ciphertext_bytes
            self._matched_cts.append(np.frombuffer(ciphertexts, dtype=f"V{row}")[kept].tobytes())
        if units is not None:
            self._matched_units.append(units[kept])
        if strata is not None:
            self._matched_strata.append(strata[kept])

    def _lookup(self, doubled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each doubly encrypted point's place in the shuffled table (`_index`) and whether
        it is there."""
        keys = self._index[0]
        if not len(keys):
            return np.zeros(len(doubled), int), np.zeros(len(doubled), bool)
        at = np.minimum(np.searchsorted(keys, doubled), len(keys) - 1)
        return at, keys[at] == doubled

    def _on_table_end(self, end: pb.TableEnd, _: None) -> Iterable[pb.PeerMessage]:
        if self.phase is Phase.WAIT_SHUFFLED:
            self._index_shuffled()
            self._lap("psi_client_double_encrypt")
            if self._blind:
                self.phase = Phase.WAIT_MEMBERS
                self._reader = wire.TableReader(wire.member_points())
                return []
            self.phase = Phase.WAIT_CLIENT_ROWS
            self._reader = wire.TableReader(self._client_layout())
            return []
        if self.phase is Phase.WAIT_MEMBERS:
            return self._member_vectors()
        if self.phase is Phase.WAIT_SQUARES:
            return self._after_squares()
        if self.phase is Phase.WAIT_TOTALS:
            return self._aggregate_blind()
        if self._blind:  # the masked sums are in; their totals' masks come next
            self.phase = Phase.WAIT_TOTALS
            plan = self._blind_plan
            self._reader = wire.TableReader(wire.blind_totals(
                plan.sum_slots * plan.weight_cts, self._tester_key.public.ciphertext_bytes,
                len(self.metric.blind_items(self.groups, self.params)), self._pub.ciphertext_bytes))
            return []
        while self._pending:
            self._join(*self._pending.popleft())
        # step 5: the join is complete; every id (and the unmatched rows) is deleted, and
        # the commutative key is no longer needed (design §7: keys deleted as soon as possible)
        self._com_key = None
        self.n_matched = sum(len(a) for a in self._matched_at)
        self._lap("client_encrypt_and_join")
        self._progress("join", f"{self.n_matched} rows matched")
        self._check_intersection()  # an empty intersection too: one refusal for both (design §8.2)
        if not self.metric.encrypted(self.params):
            return self._local_result()
        return self._aggregate()

    def _check_intersection(self) -> None:
        """Release controls on the intersection (design §8): each member in no more rows than
        the metric allows (checked on all the Test-Client's rows: its own data), and enough
        distinct members; the counts are then dropped. An intersection empty or too small
        gets `IntersectionRefused`, whose text is the same whatever the size: the
        Test-Client learns "refused", never a count (design §8.2)."""
        self._multiplicity, self._sensitivity_rows = self._rows_per_member()
        if self.metric.unique_ids and self.metric.n_ids == 1 and self._multiplicity > 1:
            raise ProtocolError("a member appears in more than one row of a dataset whose member ids must be unique")
        if self._distinct_members() < self.release.min_intersection:
            raise IntersectionRefused()

    def _distinct_members(self) -> int:
        """The distinct members among the joined rows: their positions in `_index`, whose
        points are distinct (`_index_shuffled`)."""
        return len(np.unique(np.concatenate(self._matched_at))) if self._matched_at else 0

    def _rows_per_member(self) -> tuple[int, float]:
        """The most rows one member is in (m) and the row count the slots' noise is sized by
        (`common.metrics.base.sensitivity_rows` for a metric whose cells are kept apart per
        stratum; else m), counted over every row of the Test-Client's table, matched or not
        (design §8.3): a function of the Test-Client's own data, so the noise scales it
        receives say nothing of which of its members the Tester holds. Counted on the joined
        rows alone, m would move when the member with the most rows joins or not."""
        points = np.concatenate(self._row_points) if self._row_points else np.empty(0, dtype="S1")
        strata = np.concatenate(self._row_strata) if self._row_strata else None
        self._row_points, self._row_strata = [], []
        if not len(points):
            return 1, 1.0
        member, counts = aggregation.distinct_points(points)
        multiplicity = int(counts.max())
        if not self.metric.strata_cells or strata is None:
            return multiplicity, float(multiplicity)
        return multiplicity, sensitivity_rows(member.reshape(-1, self.metric.n_ids), strata)

    # ------------------------------------------------------------------ step 5: open
    def _open(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None]:
        """The matched rows' probability vectors (one array per id slot), units and strata."""
        k = len(self.groups)
        at = np.concatenate(self._matched_at)
        sealed = self._index[1]
        self._matched_at, self._index = [], None  # every id is gone: only the vectors' places
        probs = [self._sealer.open_rows(sealed[at[:, s]].tobytes(), k) for s in range(self.metric.n_ids)]
        del at, sealed
        self._sealer = None
        units = np.concatenate(self._matched_units) if self._matched_units else None
        strata = np.concatenate(self._matched_strata) if self._matched_strata else None
        self._matched_units, self._matched_strata = [], []
        return probs, units, strata

    def _local_result(self) -> list[pb.PeerMessage]:
        """A metric computed here from the joined rows (the probabilistic count without
        release noise, design §5.8: with noise it is aggregated under encryption)."""
        probs, _, strata = self._open()
        suppressed: list[str] = []
        report = self.metric.local_result(probs, strata, self._strata_labels, self.groups, self.spec.metric_option,
                                          self.params, self._info, confidence=self.spec.confidence,
                                          tau=self.spec.tau, min_size=self.release.min_effective_size,
                                          suppressed=suppressed)
        self._note_noise(1, 0.0, 0.0, [])
        if suppressed:
            self._release_info["suppressed"] = suppressed
        self._spend_budget()  # a no-op without noise, the one way here; charged before any release regardless
        self._lap("local_statistic")
        return self._finish(report, {})

    # ------------------------------------------------------------------ the blind path
    def _member_vectors(self) -> Iterator[pb.PeerMessage]:
        """The blind path's step 5 (`common.metrics.lot`, "The Tester blind to the pairs"):
        join the Test-Client's members, apply the intersection's controls, open the vectors
        of the members we hold, drop every id, and answer each member, in its table's
        order, with HE_T.Enc of its vector (zeros where we hold none)."""
        doubled = np.frombuffer(b"".join(f.result() for f, in self._pending), dtype=f"S{commutative.POINT_BYTES}")
        self._pending = collections.deque()
        self._com_key = None
        if len(np.unique(doubled)) != len(doubled):
            raise ProtocolError("a member appears twice in the member table")
        at, found = self._lookup(doubled)
        sealed = self._index[1]
        self._index = None
        self._blind_members = len(doubled)
        self.n_matched = int(found.sum())
        self._lap("client_encrypt_and_join")
        self._progress("join", f"{self.n_matched} members matched")
        self._multiplicity, self._sensitivity_rows = self.metric.stated_member_rows(self._info)
        if self.n_matched < self.release.min_intersection:  # an empty one too: one refusal for both
            raise IntersectionRefused()
        q = np.zeros((len(doubled), len(self.groups)), dtype=np.int64)
        q[found] = encoding.quantize_probabilities(self._open_members(sealed[at[found]]), encoding.PROBABILITY_BITS)
        del sealed, at, found, doubled
        self._member_q = q
        plan = self._blind_plan = self.metric.blind_plan(
            self.groups, len(self._strata_labels), self.spec.metric_option, self.params, n_rows=self._client_rows,
            n_members=len(q), tester_modulus_bits=self._tester_key.public.n.bit_length())
        plaintexts = blind_pairs.vector_plaintexts(plan, q)
        encrypt = self._tester_key.encrypt_task()
        parts = parallel.split(plaintexts, self._executor.chunk_count())
        packed = b"".join(self._executor.run_chunks(encrypt, [(part,) for part in parts]))
        del plaintexts, encrypt
        self._lap("member_vectors")
        self.phase = Phase.WAIT_CLIENT_ROWS
        self._reader = wire.TableReader(self._client_layout())
        layout = wire.member_vectors(plan.member_cts, self._tester_key.public.ciphertext_bytes)
        yield from wire.table_messages(layout, len(q), ciphertexts=packed)

    def _open_members(self, sealed: np.ndarray) -> np.ndarray:
        """The blind path's opening: the vectors of the joined members (their sealed blobs,
        in the member table's order); the row key is dropped."""
        probs = self._sealer.open_rows(sealed.tobytes(), len(self.groups))
        self._sealer = None
        return probs

    def _aggregate_blind(self) -> Iterator[pb.PeerMessage]:
        """The blind path's step 6 (`tester_service.blind_pairs`): the totals of the masked
        sums of the members we hold, weighted by their head weights, decrypted with the
        Test-Client's masked totals; from them the items the plaintext path would have
        formed, released as it releases them (`_release`). Nothing is withheld here: we know
        no cell's size; the finishing party withholds a cell whose noised size is below
        the minimum (`Lot.withheld_by_size`)."""
        plan, metric, pub, key = self._blind_plan, self.metric, self._pub, self._tester_key
        held = np.flatnonzero(self._member_q.any(axis=1))
        weights = blind_pairs.head_weights(plan, self._member_q[held])
        self._member_q = None
        width, per = key.public.ciphertext_bytes, plan.vector_cts
        packed = np.frombuffer(b"".join(self._blind_cts), dtype=f"V{plan.strata * per * width}")[held].tobytes()
        self._blind_cts = []
        sums = paillier.ciphertexts_from_bytes(packed, key.public)
        del packed
        rows = plan.strata * per
        tasks = [([sums[a * rows + s * per:a * rows + (s + 1) * per] for a in range(len(held))], weights,
                  key.public.n2) for s in range(plan.strata)]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "aggregation"))
        totals = self._executor.run_chunks(paillier.multi_exp_columns, tasks, checkpoint=ticks)
        del tasks, sums, weights
        self._plan = metric.plan(self.groups, self._strata_labels, self._layout, self.spec.metric_option,
                                 self.params, self._info)
        self._plan, self._correction = metric.moment_plan(self._plan, self.groups, self.spec.metric_option,
                                                          self.params, self._info, self._layout)
        items = metric.blind_items(self.groups, self.params)
        _, num_slot = self._layout.position(0)
        ct, den_slot = self._layout.position(1)
        bits = self._layout.slot_bits
        w = plan.weight_cts
        masked_totals = paillier.ciphertexts_from_bytes(b"".join(t for t, _ in self._blind_totals), key.public)
        item_masks = paillier.ciphertexts_from_bytes(b"".join(o for _, o in self._blind_totals), pub)
        per_row = plan.sum_slots * w
        agg = {}
        try:
            for s, per_weight in enumerate(totals):
                row = masked_totals[s * per_row:(s + 1) * per_row]
                masked = [blind_pairs.decoded(plan, key, row[j * w:(j + 1) * w], "weights") for j in range(plan.sum_slots)]
                sums_of = [blind_pairs.decoded(plan, key, cts, "sums") for cts in per_weight]
                column = blind_pairs.cell_items(items, plan.groups, sums_of, masked,
                                                item_masks[s * len(items):(s + 1) * len(items)], pub,
                                                num_slot * bits, den_slot * bits)
                agg[s] = [[item if t == ct else 1 for t in range(self._layout.n_ciphertexts)] for item in column]
        except EncodingOverflowError:
            raise ProtocolError("a masked total of the Test-Client's does not decode: overflow") from None
        self._blind_totals, self._tester_key = [], None
        self._lap("aggregation")
        self._progress("aggregation", f"aggregated {len(held)} members' masked sums into {len(agg)} rank pairs")
        no_rows = [None] * len(items)  # no row's weight is known here
        yield from self._release(agg, no_rows, 1, np.random.default_rng(self.spec.seed), False)

    # ------------------------------------------------------------------ step 6: aggregate
    def _aggregate(self) -> Iterator[pb.PeerMessage]:
        """Step 6 (design §3.6, release controls §8): the named steps below, in order."""
        q, units, strata, canonical = self._ordered_rows()
        rng = np.random.default_rng(self.spec.seed)
        groups_instead = self._groups_instead()
        units, n_units = self._resampling_units(units, self.n_matched, rng, groups_instead)
        facts, weights = self._weights_and_plan(q, strata, units)
        del q
        self._suppress_small(weights, strata)
        self._lap("open_probabilities")
        agg = self._bucket_sums(weights, units, strata, canonical)
        if self.metric.needs_squares:
            del weights
            yield from self._request_squares(agg, n_units, facts)
            return
        yield from self._release(agg, weights, n_units, rng, groups_instead)

    def _release(self, agg: dict, weights: list, n_units: int, rng: np.random.Generator,
                 groups_instead: bool) -> Iterator[pb.PeerMessage]:
        """Design §3.6, §8: from the bucket sums to what is sent: the replicates' counts,
        the direct items, their noise, the estimate and the replicates, and the masked table."""
        count_rows = self._count_rows(n_units, rng, groups_instead)
        parts_of, direct, columns = self._direct_items(agg, weights, n_units)
        sigma0, sigma_b, item_sigma, scales, beta = self._item_noise(direct, weights)
        del weights
        point, columns = self._noised_point_and_groups(columns, direct, scales, item_sigma, sigma_b)
        computed = point + self._replicate_rows(columns, count_rows)
        n_items = len(self._plan.items)
        self._note_noise(round(beta, 3), sigma0, sigma_b,
                         aggregation.composite_scales(scales, direct, parts_of, n_items),
                         item_sigma if self._moments_form() else None)
        items = aggregation.compose_items(computed, len(count_rows), direct, parts_of, n_items, self._pub.n2)
        yield from self._send_items(items, self._replicates())

    def _ordered_rows(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None, np.ndarray]:
        """Design §3.6: open the joined rows (`_open`), quantize their probabilities, and
        put rows, units and strata in our canonical order; also that order (`canonical`:
        the rows' places as they arrived)."""
        probs, units, strata = self._open()
        q = [encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS) for p in probs]
        del probs
        # The Test-Client sends its rows in a random order; put them in an order of our
        # own (by probability vectors) so that --seed fixes the buckets and the resampling
        # (rows with identical vectors keep their random order among themselves).
        canonical = aggregation.canonical_order(q)
        q = [qs[canonical] for qs in q]
        units = units[canonical] if units is not None else None
        strata = strata[canonical] if strata is not None else None
        return q, units, strata, canonical

    def _groups_instead(self) -> bool:
        """Design §8.4: with release noise, a bootstrap metric's interval comes from disjoint
        random groups instead (`_interval`)."""
        # With release noise, a bootstrap metric's interval comes from disjoint random
        # groups instead (`_interval`): the Test-Client's units go to the groups at random.
        return self._interval() == "random_groups" and self.metric.interval == "percentile"

    def _resampling_units(self, units: np.ndarray | None, n: int, rng: np.random.Generator,
                          groups_instead: bool) -> tuple[np.ndarray | None, int]:
        """Design §4.8 and §8.4: every row's resampling unit and their number
        (`aggregation.resampling_units`)."""
        return aggregation.resampling_units(self.metric.resampling, units, n, rng,
                                            estimate_only=self._estimate_only(), groups_instead=groups_instead,
                                            random_groups=self.metric.random_groups, n_buckets=self._n_buckets)

    def _weights_and_plan(self, q: list[np.ndarray], strata: np.ndarray | None, units: np.ndarray | None) -> tuple:
        """Design §3.6, §8.4: the groups left out of the verdict, the metric's facts and
        weight columns, and its plan (with, for the correction or a release of second
        moments, M's items and their weights: `Metric.moment_plan`); returns (facts,
        weights)."""
        metric = self.metric
        # groups left out of the verdict (common.stats.results, "Left out"): without release noise
        # by their exact Kish size among the joined rows (first member of a row); with it
        # by the noised sizes only (`_suppress_small`), never by exact ones
        self._small_groups = [] if self.release.noisy else small_for_verdict(
            q[0], self.groups, metric.name, float(1 << encoding.PROBABILITY_BITS))
        facts = metric.tester_facts(q, strata, units, row_bound=self._client_rows)
        weights = metric.weights(q, strata, units, self.groups, self.spec.metric_option, self.params)
        self._derivations = metric.weight_derivations(len(self.groups))
        self._plan = metric.plan(self.groups, self._strata_labels, self._layout, self.spec.metric_option,
                                 self.params, self._info)
        if self.spec.correction != "none" or self._moments_form():
            # M's items, which are also the second moments of the interval (`common.stats.moments`)
            self._plan, self._correction = metric.moment_plan(self._plan, self.groups, self.spec.metric_option,
                                                              self.params, self._info, self._layout)
            self._derivations.update(metric.moment_derivations(len(self.groups), len(weights)))
            weights = list(weights) + metric.moment_weights(q, self.groups, self.spec.metric_option, self.params)
            assert max(item.weight for item in self._plan.items) < len(weights)
            if self.spec.correction != "none" and not self.release.noisy:
                self._check_identifiable(q[0])  # with noise: on the released M (`correction.finish_corrected`)
        return facts, weights

    def _n_strata(self) -> int:
        """Design §3.6: the strata kept apart in the buckets: all of them for a metric
        with `strata_cells`, else one."""
        return len(self._strata_labels) if self.metric.strata_cells else 1

    def _bucket_sums(self, weights: list, units: np.ndarray, strata: np.ndarray | None,
                     canonical: np.ndarray) -> dict[int, list[list[int]]]:
        """Design §3.6: agg[key][w][t], Enc(Σ w·v) per (unit, stratum) bucket, weight
        column and row ciphertext, summed by the executor (`aggregation.bucket_sums_packed`)."""
        metric = self.metric
        n = self.n_matched
        # aggregate: per (unit, stratum) and weight column and row ciphertext
        n_cts = self._layout.n_ciphertexts
        groups_idx, keys = aggregation.bucket_rows(units, strata, self._n_strata(), metric.strata_cells)
        n_parts = self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS)
        # a bucket larger than a part's share of the rows is summed in pieces on every worker
        pieces, owner = aggregation.split_buckets(groups_idx, -(-n // n_parts))
        # columns formed from others' sums (`Metric.weight_derivations`), where the values bear it out
        derived = aggregation.verified_derivations(weights, self._derivations)
        explicit, _ = aggregation.weight_kinds(weights, derived)
        need_ones = aggregation.needs_ones(weights, derived)
        only = metric.column_ciphertexts(len(self.groups), len(weights), self._layout)
        per_ct = aggregation.columns_per_ciphertext(explicit, only, n_cts)
        pub = self._pub
        width = pub.ciphertext_bytes
        # the joined rows' ciphertexts as they arrived (packed); a bucket's rows are picked
        # by their place in that order (`canonical`), so the table is never copied whole
        packed, self._matched_cts = b"".join(self._matched_cts), []
        cts = np.frombuffer(packed, dtype=f"V{width}").reshape(n, n_cts)
        columns_of = [np.asarray(weights[w]) for w in explicit]

        def task(part) -> tuple:
            jobs = []
            for idx in part:
                columns = [col[idx] for col in columns_of]  # arrays: made lists by the worker
                ones = [np.ones(len(idx), dtype=np.int64)] if need_ones else []
                rows = canonical[idx]
                jobs += [(cts[rows, t].tobytes(), [columns[e] for e in per_ct[t]] + ones) for t in range(n_cts)]
            return pub.n, width, jobs

        parts = parallel.split(pieces, n_parts)
        ticks = chunk_ticks(len(parts), partial(self._tick, "aggregation"))
        # built as the workers take them: a few tasks' copies of the rows at a time
        sums = [s for part in self._executor.stream(aggregation.bucket_sums_packed, (task(p) for p in parts),
                                                    checkpoint=ticks) for s in part]
        del cts, packed, columns_of
        sums = aggregation.merge_piece_sums(sums, owner, len(groups_idx), n_cts, pub.n2)
        agg = aggregation.combine_bucket_sums(sums, keys, weights, pub.n, pub.n2, n_cts, derived, per_ct)
        self._lap("aggregation")
        self._progress("aggregation", f"aggregated {n} rows into {len(keys)} buckets x {len(weights)} weights")
        return agg

    def _request_squares(self, agg: dict, n_units: int, facts) -> Iterator[pb.PeerMessage]:
        """Design §5.6, MQOS-AUC exact: send the square requests (`Metric.square_requests`) and wait for
        the squares (`_after_squares`)."""
        pub = self._pub
        self._squares_state, requests = self.metric.square_requests(agg, n_units, pub, facts, self._layout)
        self.phase = Phase.WAIT_SQUARES
        self._reader = wire.TableReader(wire.ciphertext_table(pb.SQUARES, pub.ciphertext_bytes))
        yield from wire.table_messages(wire.ciphertext_table(pb.SQUARE_REQUEST, pub.ciphertext_bytes),
                                       len(requests),
                                       ciphertexts=paillier.ciphertexts_to_bytes(requests, pub.ciphertext_bytes))

    def _count_rows(self, n_units: int, rng: np.random.Generator, groups_instead: bool) -> list[list[int]]:
        """Design §4.8, §8.4: each released row's count of every unit (`aggregation.count_rows`)."""
        groups = self.metric.resampling == "client_groups" or groups_instead
        return aggregation.count_rows(n_units, self._replicates() if groups else 0, self.spec.bootstrap, rng,
                                      estimate_only=self._estimate_only(), groups=groups)

    def _direct_items(self, agg: dict, weights: list, n_units: int) -> tuple[dict, list[int], list[list[int]]]:
        """Design §3.6: the items formed from others (item -> its parts), the direct items,
        and each direct item's ciphertext per unit (`aggregation.direct_columns`)."""
        metric = self.metric
        n_strata = self._n_strata()
        # An item whose weight is a sum of other columns (e.g. "overall") is, in every
        # replicate, the product of those columns' items: no multi-exponentiation of its own.
        plan_items = list(self._plan.items)
        parts_of = composite_items(plan_items, weights, strata=n_strata if metric.strata_cells else 0)
        direct = [i for i in range(len(plan_items)) if i not in parts_of]
        columns = aggregation.direct_columns(plan_items, direct, agg, n_units, n_strata, metric.strata_cells,
                                             self._pub.n2)
        return parts_of, direct, columns

    def _item_noise(self, direct: list[int], weights: list) -> tuple:
        """Design §8.3, §8.4: σ₀ and σ_b (or σ_m for the second moments), σ per item, and each
        direct item's slot scales; returns (sigma0, sigma_b, item_sigma, scales, beta)."""
        metric = self.metric
        plan_items = list(self._plan.items)
        # Release noise (design §8): the estimate is the sum of the noiseless units plus its own
        # noise (σ₀); every replicate is formed from units that each carry noise (σ_b): with
        # noise, the units are disjoint random groups and each replicate is one of them.
        comps = metric.components(self.spec.metric_option, self.params, self._info)
        beta = metric.sensitivity_components(self.spec.metric_option, self.params, self._info)
        squares = metric.moment_components(self.spec.metric_option, self.params)
        if self._moments_form():  # σ₀ on the group items, σ_m on the pair items (`ReleasePolicy.moment_sigmas`)
            sigma0, sigma_m = self.release.moment_sigmas(beta, squares=squares)
            sigma_b = 0.0
            item_sigma = [sigma_m if i >= self._correction.first_item else sigma0 for i in range(len(plan_items))]
        elif self._interval() == "exact":  # the estimate alone: no groups to share ρ with
            sigma0, sigma_b = self.release.single_sigma(beta), 0.0
            item_sigma = [sigma0] * len(plan_items)
        else:
            sigma0, sigma_b = self.release.sigmas(beta * (correction.SENSITIVITY_FACTOR if self._correction else 1))
            item_sigma = [sigma0] * len(plan_items)
        scales = [self._slot_scales(plan_items[i], weights, comps) for i in direct]
        if squares:  # a group item's squares belong to the second moments: σ_m, not σ₀
            scales = [self._square_scales(plan_items[i], scale, len(comps) - squares, sigma_m / sigma0)
                      if i < self._correction.first_item else scale for i, scale in zip(direct, scales)]
        return sigma0, sigma_b, item_sigma, scales, beta

    def _noised_point_and_groups(self, columns: list[list[int]], direct: list[int], scales: list,
                                 item_sigma: list[float], sigma_b: float) -> tuple[list[int], list[list[int]]]:
        """Design §8.3, §8.4: the estimate's row (each direct item's product over the units, noised
        with its σ), then every unit noised with σ_b where the replicates are random groups."""
        n2 = self._pub.n2
        point = []
        for d, col in enumerate(columns):
            c = gmpy2.mpz(1)
            for x in col:
                c = c * x % n2
            point.append(self._add_noise(int(c), scales[d], item_sigma[direct[d]]))
        if sigma_b > 0:
            columns = [[self._add_noise(x, scales[d], sigma_b) for x in col] for d, col in enumerate(columns)]
        return point, columns

    def _replicate_rows(self, columns: list[list[int]], count_rows: list[list[int]]) -> list[int]:
        """Design §3.6: every replicate's (or random group's) direct items, Π_u C[u]^count,
        by the executor (`aggregation.replicate_chunk`); row 0 (the estimate) is not among them."""
        pub = self._pub
        tasks = [(pub.n, columns, part) for part in
                 parallel.split(count_rows[1:], self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS))]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "bootstrap"))
        return [c for part in self._executor.run_chunks(aggregation.replicate_chunk, tasks, checkpoint=ticks)
                for c in part]

    def _after_squares(self) -> Iterator[pb.PeerMessage]:
        """MQOS-AUC exact: the squares are back; form the released (V, D) of every cell in
        the full sample and each random group, each noised before packing: the estimate
        with σ₀, each random group with σ_b (the groups are disjoint, so a member is in one
        of them). The noise scales come from the metric's declared form and the row count
        (`ExactAuc.squares_sensitivity`), never from a group's size."""
        scales = self.metric.squares_sensitivity(self._squares_state, self._multiplicity)
        slots = self._plan.item_slots
        if self._moments_form():  # the estimate at σ₀, the pair items (S1, S0) at σ_m: β 2 and 1
            sigma0, sigma_m = self.release.moment_sigmas(2, pair_components=1)
            pair = self.metric.pair_sensitivity(self._multiplicity)
            levels = [(scales[0], sigma0), (scales[1], sigma0), (pair, sigma_m), (pair, sigma_m)]
            sigma_b = 0.0
        else:
            sigma0, sigma_b = self.release.sigmas(2)
            levels = None

        def noise(ciphertext: int, component: int, replicate: int) -> int:
            one = [0] * slots
            if levels is not None:
                one[0], sigma = levels[component]
            else:
                one[0], sigma = scales[component], (sigma0 if replicate == 0 else sigma_b)
            return self._add_noise(ciphertext, one, sigma)
        items = self.metric.combine(self._squares_state, self._squares, self._pub, self._layout, noise)
        cells = len(self._squares_state["facts"]["S"])
        self._squares_state, self._squares = None, []
        if levels is not None:
            n_pairs = len(items) - cells
            self._note_noise(2, sigma0, 0.0, [self.metric.slot_noise(scales)] * cells + [[float(pair)] * 2] * n_pairs,
                             [sigma0] * cells + [sigma_m] * n_pairs)
        else:
            self._note_noise(2, sigma0, sigma_b, [self.metric.slot_noise(scales)] * cells)
        self._lap("squares")
        yield from self._send_items(items, self._replicates())

    def _check_identifiable(self, q: np.ndarray) -> None:
        """Without release noise: the groups whose identifying size (`common.stats.correction`),
        measured on our own probabilities over the joined rows, is below the minimum:
        their corrected values are withheld. With noise nothing of the sort is released:
        both parties decide it on the released, noised M (`correction.finish_corrected`),
        since an identifying size's sensitivity to one member has no useful bound (an
        ill-conditioned M amplifies one row)."""
        p = q / float(1 << encoding.PROBABILITY_BITS)
        sizes = correction.identifying_sizes(correction.plain_matrix(p))
        self._unidentifiable = [g for g, size in zip(self.groups, sizes) if not size >= correction.MIN_IDENTIFYING_SIZE]

    # ------------------------------------------------------------------ release controls
    def _suppress_small(self, weights: list, strata: np.ndarray | None) -> None:
        """The items (and so cells) whose effective size, Σ of the size weight over the
        rows that enter them, is below the policy's minimum: with release noise, the size
        plus Gaussian noise (an exact comparison would be an oracle); without, the exact
        size, and a size of 0 whatever the policy (the mask cannot show a zero)."""
        metric, plan = self.metric, self._plan
        scale = float(1 << (encoding.PROBABILITY_BITS * metric.n_ids))
        n = self.n_matched
        sizes: dict[tuple[int, int | None], float] = {}

        def size(w: int, stratum: int | None) -> float:
            if (w, stratum) not in sizes:
                col = weights[w]
                if isinstance(col, tuple):
                    sizes[(w, stratum)] = sum(size(x, stratum) for x in col)
                else:
                    rows = (strata == stratum) if (stratum is not None and strata is not None
                                                   and metric.strata_cells) else slice(None)
                    if isinstance(col, int):
                        count = int(np.count_nonzero(rows)) if not isinstance(rows, slice) else n
                        sizes[(w, stratum)] = col * count / scale
                    else:
                        sizes[(w, stratum)] = float(aggregation.exact_sum(np.asarray(col)[rows])) / scale
            return sizes[(w, stratum)]

        minimum = self.release.min_effective_size
        # M's items (the correction) are not cells: a small entry of M is no cell to
        # withhold, and the noise below covers them
        base = self._correction.first_item if self._correction else len(plan.items)
        keys = [(metric.size_weight(item), item.stratum) for item in plan.items[:base]]
        if self.release.noisy:  # decided on noisy sizes (one draw per weight and stratum)
            sigma = self.release.threshold_sigma() * self._multiplicity
            measured = {key: size(*key) + gaussian(sigma) for key in set(keys)}
            self._suppressed = [i for i, key in enumerate(keys) if not measured[key] >= minimum]
        else:
            measured = {key: size(*key) for key in set(keys)}
            self._suppressed = [i for i, key in enumerate(keys) if not (measured[key] >= minimum and measured[key] > 0)]
        # the groups' effective sizes as decided on (noised under the controls: releasing
        # the same draws costs nothing more), for the report; cut, not rounded, to 0.1, so
        # that a size shown as 30.0 was never one decided as below 30
        self._release_info["effective_sizes"] = {
            cell.group: math.floor(float(measured[keys[cell.item]]) * 10.0) / 10.0 for cell in plan.cells
            if cell.kind in ("group", "curve") and cell.group in self.groups
            and plan.items[cell.item].stratum is None}
        if self.release.noisy:  # left out of the verdict on the same noised sizes (common.stats.results)
            sizes = self._release_info["effective_sizes"]
            self._small_groups = sorted({g for g, v in sizes.items() if not v >= MIN_EFFECTIVE_SIZE})
        if self._suppressed:
            hidden = set(self._suppressed)
            self._release_info["suppressed"] = plan.labels_of(self._suppressed)
            groups = {c.group for c in plan.cells if c.item in hidden and c.kind == "group" and c.group in self.groups}
            self._small_groups = sorted(set(self._small_groups) | groups)

    def _slot_scales(self, item, weights: list, components) -> list[int]:
        """Per slot of `item`: its sensitivity to one member (0 for weights that do not
        depend on the members' race: constants, and "overall" as the sum of all groups)."""
        if isinstance(weights[item.weight], (int, tuple)):
            return [0] * self._layout.slots
        return self.metric.slot_sensitivity(item, self._layout, components, self._sensitivity_rows)

    def _square_scales(self, item, scales: list, first_square: int, factor: float) -> list:
        """`scales` of a group item with the slots of the squared components (those from
        `first_square` on, `Metric.moment_squares`) times `factor` = σ_m/σ₀: they are
        released at the second moments' noise (`ReleasePolicy.moment_sigmas`)."""
        out = list(scales)
        for c in range(first_square, self._layout.n_components):
            ct, slot = self._layout.position(c)
            if ct == item.ciphertext:
                out[slot] = out[slot] * factor
        return out

    def _add_noise(self, ciphertext: int, scales: list[int], sigma: float) -> int:
        if sigma <= 0 or not any(scales):
            return ciphertext
        return paillier.add_plain(self._pub.n, ciphertext,
                                  gaussian_slots([sigma * x for x in scales], self._layout.release_slot_bits))

    def _note_noise(self, n_components: int, sigma0: float, sigma_b: float, scales: list[list[int]],
                    item_sigmas: list[float] | None = None) -> None:
        """What the report says about the noise (σ₀ in members, per unit of sensitivity),
        and, for the header, the noise's sd per item slot: the estimate's, then the
        groups' (`scales`: each item's slot sensitivities). `item_sigmas`: the release of
        second moments (`common.stats.moments`), one multiplier per item and no groups (zeros)."""
        if self.release.noisy and item_sigmas is not None:
            self._noise_sd = [sig * float(x) for sig, row in zip(item_sigmas, scales) for x in row]
            self._noise_sd += [0.0] * len(self._noise_sd)
            self._release_info.update({"interval_from": "second moments (parametric bootstrap)",
                                       "sigma_moments": max(item_sigmas) * self._multiplicity})
        elif self.release.noisy:
            self._noise_sd = [sig * float(x) for sig in (sigma0, sigma_b) for row in scales for x in row]
        info = self._release_info
        info["controls"] = self.release != ReleasePolicy.off()
        info.update({"min_intersection": self.release.min_intersection,
                     "min_effective_size": self.release.min_effective_size,
                     "rho": self.release.rho, "epsilon": rho_to_epsilon(self.release.rho), "delta": REPORT_DELTA,
                     "sigma_estimate": sigma0 * self._multiplicity, "components": n_components,
                     "member_rows_max": self._multiplicity})

    def _spend_budget(self) -> None:
        """Charge this audit's ρ to the Test-Client's budget: the last step before release."""
        if self.release.noisy and self._charge is not None:
            self._release_info["budget_left"] = round(self._charge(self.release.rho), 12)

    def _send_items(self, items: list[int], replicates: int) -> Iterator[pb.PeerMessage]:
        """Withhold suppressed items, mask every item of every replicate, rerandomise, and
        send (step 6's end).

        With release noise, every row is released as its noised aggregates: they are what
        the release controls protect, and their denominators tell the Test-Client which
        cells the noise swamps (`Plan.cell_values`). Without noise, every row is a masked
        ratio, and the estimate's items get a zero test each, Enc(ρ·X) with ρ uniform in
        Z_n: 0 when the item is empty (a denominator of 0: the cell is undefined), else a
        uniform value (nothing else about X)."""
        pub, layout, plan = self._pub, self._layout, self._plan
        self._spend_budget()
        n_items = len(plan.items)
        if self._suppressed:
            for r in range(len(items) // n_items):
                for i in self._suppressed:
                    items[r * n_items + i] = 1  # Enc(0), rerandomised below: nothing of the cell leaves
        noisy = self.release.noisy
        plain_rows = self._released_rows() if noisy else 0
        zero_tests = 0
        if not noisy and self.spec.result_recipient == "client":
            items = items + [paillier.scalar_pow(pub.n, items[i], 1 + secrets.randbelow(pub.n - 1))
                             for i in range(n_items)]
            zero_tests = n_items
        shift = layout.release_slot_bits
        slots = plan.item_slots
        if self.spec.result_recipient == "client":
            ratio = []
            # the correction solves systems that mix a replicate's cells: one factor per
            # replicate (each slot keeps its own noise); otherwise one per item
            common_factor = {}
            for idx, _ in enumerate(items):
                if idx < plain_rows * n_items or idx >= (replicates + 1) * n_items:
                    ratio.append((1, 0))  # released as it is (rerandomised)
                    continue
                if self._correction is None:
                    r = RatioMask.draw().r
                else:
                    r = common_factor.setdefault(idx // n_items, RatioMask.draw().r)
                noise = sum(RatioMask.noise(r) << (s * shift) for s in range(slots))
                ratio.append((r, noise))
            pads = None
        else:
            pad_bits = layout.release_slot_bits - AdditiveMask.max_bits(0) - 1
            draws = [AdditiveMask.draw(slots, pad_bits) for _ in items]
            self._pads = draws
            pads = [sum(p << (s * shift) for s, p in enumerate(d.pads)) for d in draws]
            ratio = None
        h = paillier.randomizer_base(pub.n)  # our own base, never the Test-Client's h
        parts = parallel.split(list(range(len(items))), self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS))
        tasks = [(pub.n, h, [items[i] for i in part], [ratio[i] for i in part] if ratio else None,
                  [pads[i] for i in part] if pads else None) for part in parts]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "bootstrap"))
        out = [c for part in self._executor.run_chunks(aggregation.mask_chunk, tasks, checkpoint=ticks) for c in part]
        self._lap("bootstrap_and_mask")
        self._progress("bootstrap", (f"{replicates} replicates masked" if replicates else "the estimate noised")
                       + "; sending to the Test-Client")
        self.phase = Phase.WAIT_RESULT
        width = pub.ciphertext_bytes
        yield pb.PeerMessage(aggregates_header=pb.AggregatesHeader(
            groups=list(self.groups), replicates=replicates, confidence=self.spec.confidence,
            slot_bits=shift, mask="ratio" if ratio else "additive", items=len(plan.items), item_slots=slots,
            tau=self.spec.tau, small_groups=self._small_groups, suppressed_items=self._suppressed,
            interval=self._release_form(), plain_rows=plain_rows if ratio else 0, noise_sd=self._noise_sd,
            zero_tests=zero_tests, unidentifiable=self._unidentifiable,
            min_effective_size=self.release.min_effective_size))
        yield from wire.table_messages(wire.ciphertext_table(pb.AGGREGATES, width), len(out),
                                       ciphertexts=paillier.ciphertexts_to_bytes(out, width))

    # ------------------------------------------------------------------ step 7
    def _interval(self) -> str:
        """The report's interval method. With release noise a bootstrap's replicates would
        reuse every member, so noise that keeps each of them private would swamp their
        spread (`tester_service.release`): a metric with second moments
        (`Metric.moment_interval`) gets percentile intervals of parametric draws from its
        released aggregates and second moments (`common.stats.moments`), any other bootstrap
        metric random groups."""
        if self._moments_form():
            return "percentile"
        if self.metric.interval == "percentile" and self.release.noisy:
            return "random_groups"
        return self.metric.interval

    def _moments_form(self) -> bool:
        """Whether this audit releases its estimate and second moments (`common.stats.moments`)."""
        return self.release.noisy and self.metric.moment_interval

    def _release_form(self) -> str:
        """The header's interval: `common.stats.moments.FORM` for a release of second moments
        (one row of aggregates; the finishing party draws the replicates), else the
        report's method."""
        return moments.FORM if self._moments_form() else self._interval()

    def _estimate_only(self) -> bool:
        """Whether the estimate is released alone: second moments, or an exact interval."""
        return self._moments_form() or self._interval() == "exact"

    def _released_rows(self) -> int:
        """Rows of items in the AGGREGATES table: the estimate alone (`_estimate_only`),
        else the estimate and every replicate."""
        return 1 if self._estimate_only() else self._replicates() + 1

    def _replicates(self) -> int:
        """B (bootstrap replicates, or parametric draws), or the number of random groups
        where the interval comes from random groups."""
        if self._interval() == "exact":  # the estimate alone (the probabilistic count)
            return 0
        if self._interval() != "random_groups":
            return self.spec.bootstrap
        return self.metric.random_groups or RELEASE_GROUPS

    def _finish(self, report: AuditReport, client_seconds: dict[str, float]) -> list[pb.PeerMessage]:
        self._lap("wait_for_client_result")
        seconds = dict(self.phase_seconds)
        seconds.update({f"client_{k}": v for k, v in client_seconds.items()})
        seconds["total"] = self._clock.total()
        self.result = dataclasses.replace(
            report, metric=self.spec.metric, metric_option=self.spec.metric_option, n_matched=self.n_matched,
            result_recipient=self.spec.result_recipient, tau=self.spec.tau, phase_seconds=seconds,
            preparation=self._preparation, release=dict(self._release_info), group_mapping=self._group_mapping)
        self.phase = Phase.DONE
        self._progress("done", "result received")
        self.close()
        return []

    def _on_client_result(self, res: pb.ClientResult, _: None) -> list[pb.PeerMessage]:
        """Result recipient `client`: the Test-Client kept the result (design §3.7), and
        sent its timings only (`common.protocol.validation` refuses one with a result). The
        session ends with a receipt: the audit's settings and our own facts."""
        kept = receipt(metric=self.spec.metric, option=self.spec.metric_option, bootstrap=self._replicates(),
                       confidence=self.spec.confidence, interval=self._interval(), tau=self.spec.tau,
                       params=self.params, audit_id=self.audit_id)
        return self._finish(kept, dict(res.phase_seconds))

    def _on_masked_plaintexts(self, mp: pb.MaskedPlaintexts, values: list[int]) -> list[pb.PeerMessage]:
        self._masked_values += values
        if not mp.last:
            return []
        plan = self._plan
        replicates = self._replicates()
        layout = encoding.SlotLayout(self._layout.release_slot_bits, plan.item_slots)
        slots = []
        for idx, value in enumerate(self._masked_values):
            try:
                slots.append(self._pads[idx].remove(layout.unpack(value)))
            except EncodingOverflowError:
                raise ProtocolError("a masked plaintext does not decode") from None
        noisy = self.release.noisy
        if self._moments_form():
            by_size = self.metric.withheld_by_size(plan, slots[:len(plan.items)], self.release.min_effective_size,
                                                   self.params)
            withheld = self._suppressed + by_size
            if by_size:
                self._release_info["suppressed"] = list(self._release_info.get("suppressed", ())) + \
                    plan.labels_of(by_size)
            values, corrected = moments.finish_release(
                plan, self._correction, slots, self._noise_sd, replicates, withheld=withheld,
                correct=self.spec.correction != "none",
                bounds=moments.estimate_bounds(self.metric, self.spec.metric_option, self.params))
            report = finish(self.metric, plan, values, option=self.spec.metric_option,
                            confidence=self.spec.confidence, interval=self._interval(), tau=self.spec.tau,
                            params=self.params, info=self._info, replicates=replicates, result_recipient="tester",
                            small_groups=self._small_groups, corrected=corrected, noisy=noisy,
                            min_size=self.release.min_effective_size)
            return self._finish(report, dict(mp.phase_seconds))
        pseudo = noisy and self.metric.interval == "percentile"
        values = plan.suppress(plan.cell_values(slots, lambda num, den: float(num) / float(den) if den != 0 else None,
                                                plain_rows=replicates + 1 if noisy else 0, noise_sd=self._noise_sd,
                                                pseudo_values=pseudo),
                               self._suppressed)
        corrected = None if self._correction is None else finish_corrected(
            self._correction, slots, plan, self._suppressed, self._unidentifiable, self._noise_sd if noisy else (),
            pseudo_values=pseudo, bounds=moments.estimate_bounds(self.metric, self.spec.metric_option, self.params))
        report = finish(self.metric, plan, values, option=self.spec.metric_option, confidence=self.spec.confidence,
                        interval=self._interval(),
                        tau=self.spec.tau, params=self.params, info=self._info, replicates=replicates,
                        result_recipient="tester", small_groups=self._small_groups, corrected=corrected,
                        noisy=noisy, min_size=self.release.min_effective_size)
        return self._finish(report, dict(mp.phase_seconds))
