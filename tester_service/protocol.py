"""The Tester's (P1's) side of one audit session, free of I/O (design §3).

`TesterSession` is a small state machine over `PeerMessage`s, in the style of h11:
`start()` yields the first messages, `receive(msg)` consumes one peer message and
returns the messages to send back, `result` holds the report once done. No sockets,
no threads, no files: the gRPC layer (`tester_service.server`) only moves messages.
Which message each phase accepts, the handler it goes to and the phases that follow
are one table (`common.protocol.transitions.TESTER`); the handlers below never set a
phase. Step 6 is `tester_service.release_items`, values the session keeps.

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
import secrets
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from common.stats import bootstrap as boot
from common.protocol import validation, wire
from common.execution import parallel
from common.stats import moments
from common.crypto import commutative, encoding, paillier
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.logs import new_audit_id
from common.crypto.masking import AdditiveMask
from common.metrics import get_metric
from common.metrics.base import RELEASE_NOISE, SECOND_MOMENTS, Layout, sensitivity_rows
from common.stats.correction import finish_corrected
from common.stats.results import AuditReport, finish, receipt
from common.protocol.session import PartySession, PhaseClock, chunk_ticks
from common.protocol.transitions import TESTER, Step, TesterPhase
from common.crypto.symmetric import RowSealer, sealed_width
from proto import ppre_pb2 as pb
from tester_service import aggregation, blind_pairs, release_items
from tester_service import release as release_controls
from tester_service.audit_spec import AuditSpec
from tester_service.join import check_shuffled_chunk, double_client_chunk
from tester_service.release import IntersectionRefused, ReleasePolicy, gaussian, gaussian_slots

PROTOCOL_VERSION = 2

#: chunks of the Test-Client's rows in flight on the executor at most (per worker: 2)
JOIN_WINDOW = 4


#: the Tester's phases, moved only by its table of transitions (`common.protocol.transitions`)
Phase = TesterPhase


#: progress(phase, message, done=0, total=0): a phase ended (no counts), or `done` of
#: `total` rows of a long phase are through
ProgressFn = Callable[..., None]
#: rows hashed, encrypted and sealed per step of step 2 (a checkpoint and a progress
#: report each; about a second of work)
UPLOAD_STEP_ROWS = 32_768


def decided_intersection(release: ReleasePolicy, distinct: int) -> tuple[bool, int]:
    """Whether an intersection of `distinct` distinct joined members is answered
    (`ReleasePolicy.intersection_answered`, design §8.2), and the count that answer
    rested on: under noise `distinct` plus the decision's own Gaussian draw of σ_i (one
    draw, recorded as the decision makes it: never a second), rounded to a whole member
    and floored at 0; without noise the exact count. Releasing it is the Gaussian
    mechanism whose ρ_i the decision already spends, the rounding and the floor being
    post-processing (docs/threat-model.md, "What one identity can still learn of
    membership"). The draw comes from `tester_service.release.gaussian`, the operating
    system's CSPRNG."""
    drawn: list[float] = []

    def draw(sigma: float) -> float:
        drawn.append(release_controls.gaussian(sigma))
        return drawn[-1]

    answered = release.intersection_answered(distinct, draw=draw)
    if len(drawn) > 1:
        raise RuntimeError("the intersection's decision drew its noise more than once")
    return answered, max(0, int(round(distinct + sum(drawn))))


class TesterSession(PartySession):
    __test__ = False  # not a pytest class
    transitions = TESTER

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
        if self.release.noisy and self.metric.moment_interval:  # a release of second moments: rows carry
            self.params[SECOND_MOMENTS] = True  # f² (`moment_squares`), the Test-Client states its facts
        if self.release.noisy and self.metric.he_under_noise:  # aggregated under encryption (design §5.8)
            self.params[RELEASE_NOISE] = True
        self.metric = self.metric.for_release(self.params)
        #: the interval's method and the rows released (design §8.4)
        self._form = release_items.release_form(self.metric, self.release, self.spec.bootstrap)
        self._charge = charge
        #: the report's release information (`release_items.Released.info`, then step 7's)
        self._release_info: dict[str, Any] = {}
        #: the rows one member may be in, which the noise is sized from: the metric's cap
        #: (`Metric.member_rows_cap`), or without one our count (`_rows_per_member`)
        self._multiplicity = 1
        #: the row count the slots' noise is sized by (the cap; without one, our L2 count
        #: for cells kept apart per stratum, else the multiplicity)
        self._sensitivity_rows: float = 1
        self.phase = TESTER.initial
        #: every message from the Test-Client is checked here first (common.protocol.validation)
        self._inbound = validation.TesterInbound(max_received_bytes=max_received_bytes)
        self._clock = PhaseClock()
        self.phase_seconds = self._clock.seconds
        self.result: AuditReport | None = None
        self.n_matched = 0
        #: whether the intersection was answered or refused (`_decide_intersection`)
        self.intersection_decided = False
        #: the count of distinct joined members the answer rested on (`decided_intersection`),
        #: sent to a Test-Client that keeps the result (`_send`); None until answered
        self._joined_members: int | None = None
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
        #: step 6's values (`tester_service.release_items`): the plan, built once; the
        #: square requests of MQOS-AUC exact; what was released, and its additive masks
        self._plans: release_items.AuditPlan | None = None
        self._asked: release_items.SquareRequests | None = None
        self._released: release_items.Released | None = None
        self._pads: list[AdditiveMask] | None = None
        self._masked_values: list[int] = []
        self._squares: list[int] = []
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
        self._asked = None
        self._squares = []
        self._tester_key = None
        self._member_q = None
        self._blind_cts = []
        self._blind_totals = []

    # ------------------------------------------------------------------ protocol
    def start(self) -> list[pb.PeerMessage]:
        """Step 1: the Hello (the table's "start")."""
        return self.transitions.run(self, "start")

    def _hello(self) -> list[pb.PeerMessage]:
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

    def _on_squares_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        self._squares += rows.ciphertexts
        return []

    def _on_shuffled_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        """Step 3: its points checked on the executor (`_on_shuffled_end`)."""
        self._shuffled.append((chunk.points, chunk.sealed))
        self._shuffled_checks.append(self._executor.submit(check_shuffled_chunk, chunk.points,
                                                           self._reader.rows - chunk.rows))
        self._progress("psi_shuffled", "", self._reader.rows, self._n_sent)
        return []

    def _on_member_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        """The blind path's member table: doubly encrypted (and checked) on the executor."""
        first = self._reader.rows - chunk.rows
        self._pending.append((self._executor.submit(double_client_chunk, self._com_key.multiply_task(),
                                                    chunk.points, first, b"", None),))
        return []

    def _on_totals_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        """The blind path's masked totals: checked by the gate (`validation.TesterInbound`)."""
        self._blind_totals.append((chunk.tester_ciphertexts, chunk.ciphertexts))
        return []

    def _on_rows_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
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

    def _on_shuffled_end(self, end: pb.TableEnd, _: None) -> Step:
        """Step 3 done: the shuffled table indexed; the Test-Client's rows come next (on the
        blind path its members first)."""
        self._index_shuffled()
        self._lap("psi_client_double_encrypt")
        if self._blind:
            self._reader = wire.TableReader(wire.member_points())
            return Step(Phase.WAIT_MEMBERS, [])
        self._reader = wire.TableReader(self._client_layout())
        return Step(Phase.WAIT_CLIENT_ROWS, [])

    def _on_rows_end(self, end: pb.TableEnd, _: None) -> Step:
        """Step 5 (the join), then step 6; on the blind path the masked sums are in and
        their totals' masks come next."""
        if self._blind:
            plan = self._blind_plan
            self._reader = wire.TableReader(wire.blind_totals(
                plan.sum_slots * plan.weight_cts, self._tester_key.public.ciphertext_bytes,
                len(self.metric.blind_items(self.groups, self.params)), self._pub.ciphertext_bytes))
            return Step(Phase.WAIT_TOTALS, [])
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
            return Step(Phase.DONE, self._local_result())
        return Step(Phase.WAIT_SQUARES if self.metric.needs_squares else Phase.WAIT_RESULT, self._aggregate())

    def _check_intersection(self) -> None:
        """Release controls on the intersection (design §8): each member in no more rows than
        the metric allows (checked on all the Test-Client's rows: its own data), and enough
        distinct members; the counts are then dropped. An intersection empty or too small
        gets `IntersectionRefused`, whose text is the same whatever the size: the
        Test-Client learns "refused", never a count (design §8.2)."""
        multiplicity, l2 = self._rows_per_member()
        if self.metric.unique_ids and self.metric.n_ids == 1 and multiplicity > 1:
            raise ProtocolError("a member appears in more than one row of a dataset whose member ids must be unique")
        self._multiplicity, self._sensitivity_rows = self._sized_rows(multiplicity, l2)
        self._decide_intersection(self._distinct_members())

    def _decide_intersection(self, distinct: int) -> None:
        """Answer or refuse on the intersection's size (design §8.2): under noise on a
        noised count (`ReleasePolicy.intersection_answered`), so that one member changes
        the decision only with bounded probability; a refusal is `IntersectionRefused`,
        whose fixed text carries neither the count nor the draw. From here on the
        decision is out: an audit that ends without charging its ρ is counted as a
        refusal by the servicer (`intersection_decided`). An answered intersection keeps
        the count it was answered on (`decided_intersection`) for the AggregatesHeader."""
        self.intersection_decided = True
        answered, count = decided_intersection(self.release, distinct)
        if not answered:
            raise IntersectionRefused()
        self._joined_members = count

    def _sized_rows(self, multiplicity: int | None, l2: float | None) -> tuple[int, float]:
        """The (m, L2 count) the noise is sized from (design §8.3): the metric's cap on
        rows per member (`Metric.member_rows_cap`, the audit's parameter) for both, never
        what the Test-Client states nor its data; our count `multiplicity` (None where we
        see no row: LOT's blind path) above it is a Test-Client that broke the protocol.
        Without a cap, our counts."""
        cap = self.metric.member_rows_cap(self.params)
        if cap is None:
            if multiplicity is None:
                raise NotImplementedError(f"{self.metric.name} declares no cap on rows per member, which a path "
                                          f"blind to its rows sizes its noise from")
            return int(multiplicity), float(l2)
        if multiplicity is not None and multiplicity > cap:
            raise ProtocolError(f"a member is in {multiplicity} rows of the Test-Client's table, above the cap of "
                                f"{cap} rows per member ({self.metric.member_rows_cap_name}) that this audit's "
                                f"noise is sized from")
        return cap, float(cap)

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
        _, self._release_info = release_items.noise_note(self._audit(), 1, 0.0, 0.0, [])
        if suppressed:
            self._release_info["suppressed"] = suppressed
        # a no-op without noise, the one way here; charged before any release regardless
        self._release_info.update(release_items.spend_budget(self.release, self._charge))
        self._lap("local_statistic")
        return self._finish(report, {})

    # ------------------------------------------------------------------ the blind path
    def _member_vectors(self, end: pb.TableEnd, _: None) -> Iterator[pb.PeerMessage]:
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
        self._multiplicity, self._sensitivity_rows = self._sized_rows(None, None)  # no row seen: the cap
        self._decide_intersection(self.n_matched)  # an empty one too: one refusal for both
        q = np.zeros((len(doubled), len(self.groups)), dtype=np.int64)
        q[found] = encoding.quantize_probabilities(self._open_members(sealed[at[found]]), encoding.PROBABILITY_BITS)
        del sealed, at, found, doubled
        self._member_q = q
        plan = self._blind_plan = self.metric.blind_plan(
            self.groups, len(self._strata_labels), self.spec.metric_option, self.params, n_members=len(q),
            tester_modulus_bits=self._tester_key.public.n.bit_length())
        plaintexts = blind_pairs.vector_plaintexts(plan, q)
        encrypt = self._tester_key.encrypt_task()
        parts = parallel.split(plaintexts, self._executor.chunk_count())
        packed = b"".join(self._executor.run_chunks(encrypt, [(part,) for part in parts]))
        del plaintexts, encrypt
        self._lap("member_vectors")
        self._reader = wire.TableReader(self._client_layout())
        layout = wire.member_vectors(plan.member_cts, self._tester_key.public.ciphertext_bytes)
        yield from wire.table_messages(layout, len(q), ciphertexts=packed)

    def _open_members(self, sealed: np.ndarray) -> np.ndarray:
        """The blind path's opening: the vectors of the joined members (their sealed blobs,
        in the member table's order); the row key is dropped."""
        probs = self._sealer.open_rows(sealed.tobytes(), len(self.groups))
        self._sealer = None
        return probs

    def _aggregate_blind(self, end: pb.TableEnd, _: None) -> Iterator[pb.PeerMessage]:
        """The blind path's step 6 (`tester_service.blind_pairs`): the totals of the masked
        sums of the members we hold, weighted by their head weights, decrypted with the
        Test-Client's masked totals; from them the items the plaintext path would have
        formed (`blind_pairs.rank_pair_items`), released as the plaintext path releases
        them (`release_items.release`). Nothing is withheld here: we know no cell's size;
        the finishing party withholds a cell whose noised size is below the minimum
        (`Lot.withheld_by_size`)."""
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
        tasks = [(plan, sums[part.start * rows:part.stop * rows], weights[part.start:part.stop], key.public.n2)
                 for part in parallel.split(range(len(held)), plan.range_count(
                     len(held), self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS)))]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "aggregation"))
        shares = self._executor.run_chunks(blind_pairs.weighted_share, tasks, checkpoint=ticks)
        del tasks, sums, weights
        flat = paillier.add_encrypted(shares, key.public.n2) if shares else [1] * (rows * plan.weights)
        totals = [[flat[(s * plan.weights + w) * per:(s * plan.weights + w + 1) * per] for w in range(plan.weights)]
                  for s in range(plan.strata)]
        del shares, flat
        audit = self._audit()
        plans = self._plan_once(audit)
        items = metric.blind_items(self.groups, self.params)
        masked_totals = paillier.ciphertexts_from_bytes(b"".join(t for t, _ in self._blind_totals), key.public)
        item_masks = paillier.ciphertexts_from_bytes(b"".join(o for _, o in self._blind_totals), pub)
        try:
            agg = blind_pairs.rank_pair_items(plan, key, pub, self._layout, items, totals, masked_totals, item_masks)
        except EncodingOverflowError:
            raise ProtocolError("a masked total of the Test-Client's does not decode: overflow") from None
        self._blind_totals, self._tester_key = [], None
        self._lap("aggregation")
        self._progress("aggregation", f"aggregated {len(held)} members' masked sums into {len(agg)} rank pairs")
        no_rows = [None] * len(items)  # no row's weight is known here
        yield from self._send(release_items.release(audit, self._work(), plans, agg, no_rows, 1,
                                                    np.random.default_rng(self.spec.seed), release_items.Suppression(),
                                                    [], self._charge))

    # ------------------------------------------------------------------ step 6
    def _audit(self) -> release_items.Audit:
        """What step 6 reads of this session (`tester_service.release_items`)."""
        return release_items.Audit(
            spec=self.spec, metric=self.metric, params=self.params, groups=self.groups,
            strata_labels=self._strata_labels, info=self._info, layout=self._layout, pub=self._pub,
            release=self.release, form=self._form, multiplicity=self._multiplicity,
            sensitivity_rows=self._sensitivity_rows, client_rows=self._client_rows, n_buckets=self._n_buckets,
            draws=release_items.Draws(gaussian, gaussian_slots))

    def _work(self) -> release_items.Work:
        return release_items.Work(self._executor, self._clock, self._progress, self._checkpoint)

    def _plan_once(self, audit: release_items.Audit) -> release_items.AuditPlan:
        """The audit's plan (`release_items.audit_plan`), built once and kept for step 7."""
        self._plans = release_items.audit_plan(audit)
        return self._plans

    def _aggregate(self) -> Iterator[pb.PeerMessage]:
        """Step 6 (design §3.6, release controls §8): the opened rows, then the values of
        `tester_service.release_items` in order; the session keeps what they return."""
        audit, work = self._audit(), self._work()
        plans = self._plan_once(audit)
        rng = np.random.default_rng(self.spec.seed)
        packed, self._matched_cts = b"".join(self._matched_cts), []
        rows = release_items.order_rows(*self._open(), packed)
        del packed
        sums = release_items.sum_buckets(audit, work, plans, rows, rng)
        del rows
        if self.metric.needs_squares:
            yield from self._request_squares(release_items.square_requests(audit, sums))
            return
        yield from self._send(release_items.release(audit, work, plans, sums.agg, sums.weights.columns, sums.n_units,
                                                    rng, sums.suppression, sums.weights.unidentifiable, self._charge))

    def _request_squares(self, asked: release_items.SquareRequests) -> Iterator[pb.PeerMessage]:
        """Design §5.6, MQOS-AUC exact: send the square requests (`Metric.square_requests`) and wait for
        the squares (`_after_squares`)."""
        pub = self._pub
        self._asked = asked
        self._reader = wire.TableReader(wire.ciphertext_table(pb.SQUARES, pub.ciphertext_bytes))
        yield from wire.table_messages(wire.ciphertext_table(pb.SQUARE_REQUEST, pub.ciphertext_bytes),
                                       len(asked.requests),
                                       ciphertexts=paillier.ciphertexts_to_bytes(asked.requests, pub.ciphertext_bytes))

    def _after_squares(self, end: pb.TableEnd, _: None) -> Iterator[pb.PeerMessage]:
        """MQOS-AUC exact: the squares are back (`release_items.release_squares`)."""
        asked, squares = self._asked, self._squares
        self._asked, self._squares = None, []
        yield from self._send(release_items.release_squares(self._audit(), self._work(), self._plans, asked, squares,
                                                            self._charge))

    def _send(self, out: release_items.ReleasedItems) -> Iterator[pb.PeerMessage]:
        """Step 6's end: keep what step 7 reads (the release, the additive masks), then
        send the header and the masked table."""
        self._released, self._pads = out.release, out.pads
        self._release_info = dict(out.release.info)
        width = self._pub.ciphertext_bytes
        header = release_items.header(self._audit(), out.release)
        if self.spec.result_recipient == "client" and self._joined_members is not None:
            # the count the intersection was decided on, for the result the Test-Client keeps
            # (design §8.2, §9.2): under noise a release whose ρ_i the answered audit's ρ covers
            header.joined_members = self._joined_members
            header.joined_members_sd = self.release.intersection_sigma()
        yield pb.PeerMessage(aggregates_header=header)
        yield from wire.table_messages(wire.ciphertext_table(pb.AGGREGATES, width), len(out.ciphertexts),
                                       ciphertexts=paillier.ciphertexts_to_bytes(out.ciphertexts, width))

    # ------------------------------------------------------------------ step 7
    def _finish(self, report: AuditReport, client_seconds: dict[str, float]) -> list[pb.PeerMessage]:
        self._lap("wait_for_client_result")
        seconds = dict(self.phase_seconds)
        seconds.update({f"client_{k}": v for k, v in client_seconds.items()})
        seconds["total"] = self._clock.total()
        self.result = dataclasses.replace(
            report, metric=self.spec.metric, metric_option=self.spec.metric_option, n_matched=self.n_matched,
            result_recipient=self.spec.result_recipient, tau=self.spec.tau, phase_seconds=seconds,
            preparation=self._preparation, release=dict(self._release_info), group_mapping=self._group_mapping)
        self._progress("done", "result received")
        return []  # done: the table closes the session

    def _on_client_result(self, res: pb.ClientResult, _: None) -> list[pb.PeerMessage]:
        """Result recipient `client`: the Test-Client kept the result (design §3.7), and
        sent its timings only (`common.protocol.validation` refuses one with a result). The
        session ends with a receipt: the audit's settings and our own facts."""
        kept = receipt(metric=self.spec.metric, option=self.spec.metric_option, bootstrap=self._form.replicates,
                       confidence=self.spec.confidence, interval=self._form.interval, tau=self.spec.tau,
                       params=self.params, audit_id=self.audit_id)
        return self._finish(kept, dict(res.phase_seconds))

    def _on_masked_plaintexts(self, mp: pb.MaskedPlaintexts, values: list[int]) -> Step:
        self._masked_values += values
        if not mp.last:
            return Step(Phase.WAIT_RESULT, [])
        return Step(Phase.DONE, self._finish(self._unmasked_report(), dict(mp.phase_seconds)))

    def _unmasked_report(self) -> AuditReport:
        """Step 7, result recipient `tester`: remove our additive masks from the decrypted
        values and finish the statistic from the released cells (design §3.7)."""
        plans, released, spec, noisy = self._plans, self._released, self.spec, self.release.noisy
        plan = plans.plan
        replicates = self._form.replicates
        layout = encoding.SlotLayout(self._layout.release_slot_bits, plan.item_slots)
        slots = []
        for idx, value in enumerate(self._masked_values):
            try:
                slots.append(self._pads[idx].remove(layout.unpack(value)))
            except EncodingOverflowError:
                raise ProtocolError("a masked plaintext does not decode") from None
        bounds = moments.estimate_bounds(self.metric, spec.metric_option, self.params)
        if self._form.moments:
            by_size = self.metric.withheld_by_size(plan, slots[:len(plan.items)], self.release.min_effective_size,
                                                   self.params)
            if by_size:
                self._release_info["suppressed"] = list(self._release_info.get("suppressed", ())) + \
                    plan.labels_of(by_size)
            values, corrected = moments.finish_release(
                plan, plans.correction, slots, released.noise_sd, replicates, withheld=released.suppressed + by_size,
                correct=spec.correction != "none", bounds=bounds)
        else:
            pseudo = noisy and self.metric.interval == "percentile"
            values = plan.suppress(plan.cell_values(slots, lambda num, den: float(num) / float(den) if den != 0 else None,
                                                    plain_rows=replicates + 1 if noisy else 0,
                                                    noise_sd=released.noise_sd, pseudo_values=pseudo),
                                   released.suppressed)
            corrected = None if plans.correction is None else finish_corrected(
                plans.correction, slots, plan, released.suppressed, released.unidentifiable,
                released.noise_sd if noisy else (), pseudo_values=pseudo, bounds=bounds)
        return finish(self.metric, plan, values, option=spec.metric_option, confidence=spec.confidence,
                      interval=self._form.interval, tau=spec.tau, params=self.params, info=self._info,
                      replicates=replicates, result_recipient="tester", small_groups=released.small_groups,
                      corrected=corrected, noisy=noisy, min_size=self.release.min_effective_size)
