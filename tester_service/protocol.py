"""The Tester's (P1's) side of one audit session, free of I/O (SPEC.md section 3).

`TesterSession` is a small state machine over `PeerMessage`s, in the style of h11:
`start()` yields the first messages, `receive(msg)` consumes one peer message and
returns the messages to send back, `result` holds the report once done. No sockets,
no threads, no files: the gRPC layer (`tester_service.server`) only moves messages.

Steps (SPEC 3): 1 keys and salt share; 2 send (Com.Enc_sk1(RO(id)), Sym.Enc(race_p))
and drop the plaintext table; 3 receive the shuffled, doubly encrypted rows; 4 receive
P2's rows: each row's member ids Com.Enc_sk2(RO(id)) (two for pair metrics), its
HE.Enc(values) and, where the metric has them, a resampling bucket and a plaintext
stratum; 5 doubly encrypt, join (a row is kept when all its members are found), delete
every id, then open the probability vectors; 6 weight, aggregate per bucket (and
stratum), build the bootstrap replicates (or random groups), mask, rerandomise and
send; 7 receive P2's result (P2 learns it) or the decrypted masked values (only P1
learns it) and unmask. The metric (`common.metrics`) decides the rows, weights, cells
and verdict; a metric without HE (probabilistic count) ends after step 5, at P1.
MQOS-AUC exact adds a round trip between 6 and 7: P2 squares additively masked sums.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import secrets
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from common import bootstrap as boot
from common import commutative, encoding, paillier, parallel, wire
from common.errors import EncodingOverflowError, InputError, PeerAborted, ProtocolError
from common.masking import NOISE_BITS, AdditiveMask, RatioMask
from common.metrics import get_metric
from common.metrics.base import Layout
from common.results import DEFAULT_TAU, MIN_EFFECTIVE_SIZE, AuditReport, finish
from common.session import PhaseClock, chunk_ticks, expect_phase
from common.symmetric import RowSealer, sealed_width
from proto import ppre_pb2 as pb
from tester_service import aggregation

PROTOCOL_VERSION = 2
MAX_REPLICATES = 100_000
RECIPIENTS = ("client", "tester")
#: limits on what the Test-Client announces about its table (HelloAck)
MAX_STRATA = 100_000
MAX_INFO_BYTES = 1 << 16


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

    def validated(self) -> "AuditSpec":
        metric = get_metric(self.metric)
        option = metric.check_option(self.metric_option)
        metric.parse_params(self.params)
        if not self.client_dataset:
            raise InputError("no client dataset named", parameter="client dataset")
        if not 1 <= self.bootstrap <= MAX_REPLICATES:
            raise InputError(f"must be between 1 and {MAX_REPLICATES}", parameter="bootstrap")
        if not 0.0 < self.confidence < 1.0:
            raise InputError("must be strictly between 0 and 1", parameter="confidence")
        if self.result_recipient not in RECIPIENTS:
            raise InputError(f"must be one of {', '.join(RECIPIENTS)}", parameter="result recipient")
        if not self.tau > 0:
            raise InputError("must be positive", parameter="tau")
        return dataclasses.replace(self, metric_option=option, params=dict(self.params))


class Phase(enum.Enum):
    START = "start"
    WAIT_HELLO_ACK = "wait_hello_ack"
    WAIT_SHUFFLED = "wait_shuffled"
    WAIT_CLIENT_ROWS = "wait_client_rows"
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


class TesterSession:
    __test__ = False  # not a pytest class

    def __init__(self, spec: AuditSpec, probabilities: pd.DataFrame, *,
                 min_modulus_bits: int = paillier.MIN_MODULUS_BITS,
                 n_buckets: int = boot.DEFAULT_BUCKETS,
                 progress: ProgressFn | None = None,
                 checkpoint: Callable[[], None] | None = None,
                 preparation: dict[str, float] | None = None) -> None:
        """`progress(phase, message, done, total)` reports each finished phase and the
        rows done within long ones; `checkpoint()` runs between chunks of the long steps,
        and whatever either raises ends the session (the servicer uses this to stop an
        audit whose operator went away, or when it shuts down). `preparation`: the
        counts of the Tester's demographic preparation (no member-level data), passed
        through to the result."""
        self.spec = spec.validated()
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
        self.phase = Phase.START
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
        self._shuffled: dict[bytes, bytes] | None = None
        self._matched_sealed: list[list[bytes]] = []
        self._matched_cts: list[list[int]] = []
        self._matched_units: list[np.ndarray] = []
        self._matched_strata: list[np.ndarray] = []
        self._reader: wire.TableReader | None = None
        self._plan = None
        self._pads: list[list[int]] | None = None
        self._masked_values: list[int] = []
        self._squares_state: Any = None
        self._squares: list[int] = []
        self._small_groups: list[str] = []
        self._n_sent = 0

    # ------------------------------------------------------------------ helpers
    def _lap(self, name: str) -> None:
        self._clock.lap(name)

    def _tick(self, phase: str, done: int, total: int, message: str = "") -> None:
        """Progress within a long step, then the checkpoint."""
        self._progress(phase, message, done, total)
        if self._checkpoint is not None:
            self._checkpoint()

    def _expect(self, *phases: Phase) -> None:
        expect_phase(self.phase, *phases)

    def close(self) -> None:
        """Drop every key and every member-level table (runs however the session ends)."""
        self._com_key = None
        self._sealer = None
        self._ids = None
        self._probabilities = None
        self._shuffled = None
        self._matched_sealed = []
        self._matched_cts = []
        self._matched_units = []
        self._matched_strata = []
        self._pads = None
        self._masked_values = []
        self._squares_state = None
        self._squares = []
        if self.phase is not Phase.DONE:
            self.phase = Phase.CLOSED

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
            buckets=self._n_buckets))]

    def receive(self, msg: pb.PeerMessage) -> Iterable[pb.PeerMessage]:
        kind = msg.WhichOneof("body")
        if kind == "abort":
            raise PeerAborted(msg.abort.code or "peer_error", msg.abort.message or "the Test-Client aborted")
        handler = {
            "hello_ack": self._on_hello_ack,
            "chunk": self._on_chunk,
            "table_end": self._on_table_end,
            "client_result": self._on_client_result,
            "masked_plaintexts": self._on_masked_plaintexts,
        }.get(kind)
        if handler is None:
            raise ProtocolError(f"unexpected message '{kind}' from the Test-Client")
        return handler(getattr(msg, kind))

    def _read_ack(self, ack: pb.HelloAck) -> None:
        """Check what the Test-Client announced about its table; recompute its slot plan."""
        metric = self.metric
        if not 0 < ack.rows <= wire.MAX_TABLE_ROWS:
            raise ProtocolError("the Test-Client announced an impossible row count")
        if len(ack.strata_labels) > MAX_STRATA or any(len(s) > 200 for s in ack.strata_labels):
            raise ProtocolError("too many or too long strata labels")
        if len(ack.info_json) > MAX_INFO_BYTES:
            raise ProtocolError("dataset facts too large")
        try:
            info = json.loads(ack.info_json or "{}")
            if not isinstance(info, dict):
                raise ValueError("not an object")
            metric.check_info(info, list(ack.strata_labels))
        except (ValueError, TypeError, KeyError) as exc:
            raise ProtocolError(f"the Test-Client's dataset facts are malformed ({exc})") from None
        self._client_rows = int(ack.rows)
        self._strata_labels = tuple(ack.strata_labels)
        self._info = info
        if not metric.needs_he:
            if ack.paillier_n or ack.slot_bits:
                raise ProtocolError(f"{metric.name} needs no encryption key")
            return
        self._pub = paillier.PublicKey.from_bytes(ack.paillier_n, ack.paillier_h, min_bits=self._min_bits)
        try:
            layout = metric.layout(self.spec.metric_option, self.params, info, n_rows=self._client_rows,
                                   n_units=self._n_buckets, recipient=self.spec.result_recipient,
                                   modulus_bits=self._pub.n.bit_length())
        except EncodingOverflowError as exc:
            raise ProtocolError(f"the Test-Client's table cannot be aggregated with its key: {exc}") from None
        if (ack.slot_bits, ack.slots) != (layout.slot_bits, layout.slots):
            raise ProtocolError(f"the Test-Client's slot plan ({ack.slots} x {ack.slot_bits} bits) differs from "
                                f"the one its table needs ({layout.slots} x {layout.slot_bits})")
        self._layout = layout

    def _on_hello_ack(self, ack: pb.HelloAck) -> Iterator[pb.PeerMessage]:
        self._expect(Phase.WAIT_HELLO_ACK)
        self._read_ack(ack)
        salt = commutative.session_salt(self._salt_share, ack.salt_share)
        self._lap("handshake")

        ids, probs = self._ids, self._probabilities
        n = len(ids)
        point_parts, sealed_parts = [], []
        for start in range(0, n, UPLOAD_STEP_ROWS):
            stop = min(n, start + UPLOAD_STEP_ROWS)
            hashed = commutative.hash_ids(salt, ids[start:stop])
            point_parts.append(self._com_key.encrypt_points(commutative.split_points(hashed)))
            sealed_parts.append(self._sealer.seal_rows(probs[start:stop]))
            self._tick("psi_upload", stop, n, f"{stop} of {n} rows encrypted")
        points, sealed = b"".join(point_parts), b"".join(sealed_parts)
        del point_parts, sealed_parts
        # step 2 done: the plaintext table is dropped before anything is sent
        self._ids = self._probabilities = None
        del ids, probs
        self._n_sent = n
        self._lap("psi_tester_encrypt")
        self._progress("psi_upload", f"sending {n} encrypted member rows")
        self.phase = Phase.WAIT_SHUFFLED
        width = sealed_width(len(self.groups))
        self._reader = wire.TableReader(wire.shuffled_rows(width))
        self._shuffled = {}
        return wire.table_messages(wire.tester_rows(width), n, points=points, sealed=sealed)

    def _client_layout(self) -> wire.TableLayout:
        metric = self.metric
        return wire.client_rows(metric.n_ids, self._layout.n_ciphertexts if self._layout else 0,
                                self._pub.ciphertext_bytes if self._pub else 0,
                                units=metric.resampling in ("unit", "client_groups"),
                                strata=bool(metric.uses_strata))

    def _on_chunk(self, chunk: pb.TableChunk) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_SHUFFLED, Phase.WAIT_CLIENT_ROWS, Phase.WAIT_SQUARES)
        self._reader.check_chunk(chunk)
        if self.phase is Phase.WAIT_SQUARES:
            self._squares += paillier.ciphertexts_from_bytes(chunk.ciphertexts, self._pub)
            return []
        points = commutative.validate_points(chunk.points)
        if self.phase is Phase.WAIT_SHUFFLED:
            width = self._reader.layout.sealed
            for i, pt in enumerate(points):
                if pt in self._shuffled:
                    raise ProtocolError("duplicate row in the shuffled table")
                self._shuffled[pt] = chunk.sealed[i * width:(i + 1) * width]
            self._progress("psi_shuffled", "", self._reader.rows, self._n_sent)
            return []
        self._join(chunk, points)
        self._progress("join", "", self._reader.rows, self._client_rows)
        return []

    def _join(self, chunk: pb.TableChunk, points: list[bytes]) -> None:
        """Step 5 for one chunk: a row is kept when every one of its members is among ours."""
        n_ids = self.metric.n_ids
        doubled = commutative.split_points(self._com_key.encrypt_points(points))
        per_row = self._layout.n_ciphertexts if self._layout else 0
        cts = paillier.ciphertexts_from_bytes(chunk.ciphertexts, self._pub) if per_row else []
        units = wire.unpack_indices(chunk.units) if chunk.units else None
        strata = wire.unpack_indices(chunk.strata) if chunk.strata else None
        limit = self.metric.random_groups + 1 if self.metric.resampling == "client_groups" else self._n_buckets
        if units is not None and units.size and units.max() >= limit:
            raise ProtocolError("a row's resampling bucket is out of range")
        if strata is not None and self._strata_labels and strata.size and strata.max() >= len(self._strata_labels):
            raise ProtocolError("a row's stratum is out of range")
        kept = []
        for r in range(chunk.rows):
            found = [self._shuffled.get(pt) for pt in doubled[r * n_ids:(r + 1) * n_ids]]
            if all(s is not None for s in found):
                kept.append(r)
                self._matched_sealed.append(found)
                if per_row:
                    self._matched_cts.append(cts[r * per_row:(r + 1) * per_row])
        if units is not None:
            self._matched_units.append(units[kept])
        if strata is not None:
            self._matched_strata.append(strata[kept])

    def _on_table_end(self, end: pb.TableEnd) -> Iterable[pb.PeerMessage]:
        self._expect(Phase.WAIT_SHUFFLED, Phase.WAIT_CLIENT_ROWS, Phase.WAIT_SQUARES)
        self._reader.check_end(end)
        if self.phase is Phase.WAIT_SHUFFLED:
            if self._reader.rows != self._n_sent:
                raise ProtocolError(f"shuffled table has {self._reader.rows} rows, {self._n_sent} were sent")
            self._lap("psi_client_double_encrypt")
            self.phase = Phase.WAIT_CLIENT_ROWS
            self._reader = wire.TableReader(self._client_layout())
            return []
        if self.phase is Phase.WAIT_SQUARES:
            return self._after_squares()
        if self._reader.rows != self._client_rows:
            raise ProtocolError(f"the Test-Client sent {self._reader.rows} rows, {self._client_rows} announced")
        # step 5: the join is complete; every id (and the unmatched rows) is deleted, and
        # the commutative key is no longer needed (SPEC 7: keys deleted as soon as possible)
        self._shuffled = None
        self._com_key = None
        self.n_matched = len(self._matched_sealed)
        self._lap("client_encrypt_and_join")
        self._progress("join", f"{self.n_matched} rows matched")
        if self.n_matched == 0:
            raise InputError("empty intersection: no member of the client dataset is among the Tester's members",
                             parameter="client dataset")
        if not self.metric.needs_he:
            return self._local_result()
        return self._aggregate()

    # ------------------------------------------------------------------ step 5: open
    def _open(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None]:
        """The matched rows' probability vectors (one array per id slot), units and strata."""
        k = len(self.groups)
        probs = [self._sealer.open_rows(b"".join(row[s] for row in self._matched_sealed), k)
                 for s in range(self.metric.n_ids)]
        self._matched_sealed = []
        self._sealer = None
        units = np.concatenate(self._matched_units) if self._matched_units else None
        strata = np.concatenate(self._matched_strata) if self._matched_strata else None
        self._matched_units, self._matched_strata = [], []
        return probs, units, strata

    def _local_result(self) -> list[pb.PeerMessage]:
        """A metric without HE (probabilistic count): computed here from the joined rows."""
        probs, _, strata = self._open()
        report = self.metric.local_result(probs, strata, self._strata_labels, self.groups, self.spec.metric_option,
                                          self.params, self._info, confidence=self.spec.confidence,
                                          tau=self.spec.tau)
        self._lap("local_statistic")
        return self._finish(report, {})

    # ------------------------------------------------------------------ step 6: aggregate
    def _aggregate(self) -> Iterator[pb.PeerMessage]:
        metric = self.metric
        probs, units, strata = self._open()
        q = [encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS) for p in probs]
        del probs
        n = self.n_matched
        # The Test-Client sends its rows in a random order; put them in an order of our
        # own (by probability vectors) so that --seed fixes the buckets and the resampling
        # (rows with identical vectors keep their random order among themselves).
        canonical = np.lexsort([col for qs in reversed(q) for col in reversed(qs.T)])
        q = [qs[canonical] for qs in q]
        units = units[canonical] if units is not None else None
        strata = strata[canonical] if strata is not None else None
        self._matched_cts = [self._matched_cts[i] for i in canonical]
        rng = np.random.default_rng(self.spec.seed)
        if metric.resampling == "unit":
            used = np.unique(units)
            units = np.searchsorted(used, units)
            n_units = len(used)
        elif metric.resampling == "client_groups":
            n_units = metric.random_groups + 1
        else:
            count = metric.random_groups if metric.resampling == "random_groups" else self._n_buckets
            buckets = boot.assign_buckets(n, count, rng)
            units = np.empty(n, dtype=np.int64)
            for m, idx in enumerate(buckets):
                units[idx] = m
            n_units = len(buckets)
        # effective size of each group among the joined rows (first member of a row)
        effective = q[0].sum(axis=0) / float(1 << encoding.PROBABILITY_BITS)
        self._small_groups = [g for g, size in zip(self.groups, effective) if size < MIN_EFFECTIVE_SIZE]
        facts = metric.tester_facts(q, strata, units)
        weights = metric.weights(q, strata, units, self.groups, self.spec.metric_option, self.params)
        del q
        self._lap("open_probabilities")

        # aggregate: per (unit, stratum) and weight column and row ciphertext
        n_cts = self._layout.n_ciphertexts
        n_strata = len(self._strata_labels) if metric.strata_cells else 1
        key = units * n_strata + (strata if metric.strata_cells else 0)
        order = np.argsort(key, kind="stable")
        bounds = np.flatnonzero(np.diff(key[order])) + 1
        groups_idx = np.split(order, bounds)
        keys = [int(key[idx[0]]) for idx in groups_idx]
        explicit = [w for w, col in enumerate(weights) if not isinstance(col, (int, tuple))]
        const = [w for w, col in enumerate(weights) if isinstance(col, int)]
        need_ones = bool(const)
        cts = self._matched_cts
        self._matched_cts = []
        jobs = []
        for idx in groups_idx:
            lst = idx.tolist()
            columns = [np.asarray(weights[w])[idx].tolist() for w in explicit]
            if need_ones:
                columns.append([1] * len(lst))
            for t in range(n_cts):
                jobs.append(([cts[i][t] for i in lst], columns))
        del cts
        pub = self._pub
        tasks = [(pub.n, part) for part in parallel.split(jobs, parallel.chunk_count(parallel.CHECKPOINT_CHUNKS))]
        del jobs
        ticks = chunk_ticks(len(tasks), partial(self._tick, "aggregation"))
        sums = [s for part in parallel.run_chunks(aggregation.bucket_sums_chunk, tasks, checkpoint=ticks)
                for s in part]
        # agg[key][w][t]: every weight column, explicit, constant or a sum of others
        agg: dict[int, list[list[int]]] = {}
        n2 = pub.n2
        for g, kk in enumerate(keys):
            per_w: list[list[int] | None] = [None] * len(weights)
            for t in range(n_cts):
                row = sums[g * n_cts + t]
                for pos, w in enumerate(explicit):
                    per_w[w] = (per_w[w] or []) + [row[pos]]
                for w in const:
                    per_w[w] = (per_w[w] or []) + [paillier.scalar_pow(pub.n, row[-1], weights[w])]
            for w, col in enumerate(weights):
                if isinstance(col, tuple):
                    prod = [1] * n_cts
                    for other in col:
                        prod = [a * b % n2 for a, b in zip(prod, per_w[other])]
                    per_w[w] = prod
            agg[kk] = per_w
        self._lap("aggregation")
        self._progress("aggregation", f"aggregated {n} rows into {len(keys)} buckets x {len(weights)} weights")

        if metric.needs_squares:
            self._squares_state, requests = metric.square_requests(agg, n_units, pub, facts)
            self.phase = Phase.WAIT_SQUARES
            self._reader = wire.TableReader(wire.ciphertext_table(pb.SQUARES, pub.ciphertext_bytes))
            yield from wire.table_messages(wire.ciphertext_table(pb.SQUARE_REQUEST, pub.ciphertext_bytes),
                                           len(requests),
                                           ciphertexts=paillier.ciphertexts_to_bytes(requests, pub.ciphertext_bytes))
            return

        self._plan = metric.plan(self.groups, self._strata_labels, self._layout, self.spec.metric_option,
                                 self.params, self._info)
        if metric.resampling == "client_groups":
            # row 0 every unit (the estimate), then each of the G groups alone
            count_rows = np.vstack([np.ones((1, n_units), dtype=np.int64),
                                    np.eye(metric.random_groups, n_units, dtype=np.int64)]).tolist()
        else:
            # bootstrap: replicate r draws the units with multinomial counts (row 0: all ones)
            counts = boot.resample_counts(n_units, self.spec.bootstrap, rng)
            count_rows = np.vstack([np.ones((1, n_units), dtype=np.int64), counts]).tolist()
        # An item whose weight is a sum of other columns (e.g. "overall") is, in every
        # replicate, the product of those columns' items: no multi-exponentiation of its own.
        plan_items = list(self._plan.items)
        position = {(it.weight, it.ciphertext, it.stratum): i for i, it in enumerate(plan_items)}
        parts_of = {}
        for i, it in enumerate(plan_items):
            col = weights[it.weight]
            if isinstance(col, tuple):
                parts = [position.get((w, it.ciphertext, it.stratum)) for w in col]
                if all(p is not None and not isinstance(weights[plan_items[p].weight], tuple) for p in parts):
                    parts_of[i] = parts
        direct = [i for i in range(len(plan_items)) if i not in parts_of]
        columns = []
        for i in direct:
            item = plan_items[i]
            col = []
            for u in range(n_units):
                c = 1
                strata_range = range(n_strata) if (metric.strata_cells and item.stratum is None) else \
                    [item.stratum if metric.strata_cells else 0]
                for s in strata_range:
                    part = agg.get(u * n_strata + s)
                    if part is not None:
                        c = c * part[item.weight][item.ciphertext] % n2
                col.append(c)
            columns.append(col)
        tasks = [(pub.n, columns, part) for part in
                 parallel.split(count_rows, parallel.chunk_count(parallel.CHECKPOINT_CHUNKS))]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "bootstrap"))
        computed = [c for part in parallel.run_chunks(aggregation.replicate_chunk, tasks, checkpoint=ticks)
                    for c in part]
        slot = {i: d for d, i in enumerate(direct)}
        items = []
        for r in range(len(count_rows)):
            row = computed[r * len(direct):(r + 1) * len(direct)]
            for i in range(len(plan_items)):
                if i in parts_of:
                    c = 1
                    for p in parts_of[i]:
                        c = c * row[slot[p]] % n2
                    items.append(c)
                else:
                    items.append(row[slot[i]])
        yield from self._send_items(items, self._replicates())

    def _after_squares(self) -> Iterator[pb.PeerMessage]:
        """MQOS-AUC exact: the squares are back; form the cells of every random group."""
        items = self.metric.combine(self._squares_state, self._squares, self._pub, self._layout)
        self._squares_state, self._squares = None, []
        self._plan = self.metric.plan(self.groups, self._strata_labels, self._layout, self.spec.metric_option,
                                      self.params, self._info)
        self._lap("squares")
        yield from self._send_items(items, self._replicates())

    def _send_items(self, items: list[int], replicates: int) -> Iterator[pb.PeerMessage]:
        """Mask every item of every replicate, rerandomise, and send (step 6's end)."""
        pub, layout, plan = self._pub, self._layout, self._plan
        shift = layout.slot_bits
        slots = plan.item_slots
        if self.spec.result_recipient == "client":
            ratio = []
            for _ in items:
                mk = RatioMask.draw()
                noise = sum(secrets.randbits(NOISE_BITS) << (s * shift) for s in range(slots))
                ratio.append((mk.r, noise))
            pads = None
        else:
            pad_bits = layout.slot_bits - AdditiveMask.max_bits(0) - 1
            draws = [AdditiveMask.draw(slots, pad_bits) for _ in items]
            self._pads = [list(d.pads) for d in draws]
            pads = [sum(p << (s * shift) for s, p in enumerate(d.pads)) for d in draws]
            ratio = None
        h = paillier.randomizer_base(pub.n)  # our own base, never the Test-Client's h
        parts = parallel.split(list(range(len(items))), parallel.chunk_count(parallel.CHECKPOINT_CHUNKS))
        tasks = [(pub.n, h, [items[i] for i in part], [ratio[i] for i in part] if ratio else None,
                  [pads[i] for i in part] if pads else None) for part in parts]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "bootstrap"))
        out = [c for part in parallel.run_chunks(aggregation.mask_chunk, tasks, checkpoint=ticks) for c in part]
        self._lap("bootstrap_and_mask")
        self._progress("bootstrap", f"{replicates} replicates masked; sending to the Test-Client")
        self.phase = Phase.WAIT_RESULT
        width = pub.ciphertext_bytes
        yield pb.PeerMessage(aggregates_header=pb.AggregatesHeader(
            groups=list(self.groups), replicates=replicates, confidence=self.spec.confidence,
            slot_bits=shift, mask="ratio" if ratio else "additive", items=len(plan.items), item_slots=slots,
            tau=self.spec.tau, small_groups=self._small_groups))
        yield from wire.table_messages(wire.ciphertext_table(pb.AGGREGATES, width), len(out),
                                       ciphertexts=paillier.ciphertexts_to_bytes(out, width))

    # ------------------------------------------------------------------ step 7
    def _replicates(self) -> int:
        """B, or the number of random groups where the interval comes from random groups."""
        return self.metric.random_groups if self.metric.interval == "random_groups" else self.spec.bootstrap

    def _finish(self, report: AuditReport, client_seconds: dict[str, float]) -> list[pb.PeerMessage]:
        self._lap("wait_for_client_result")
        seconds = dict(self.phase_seconds)
        seconds.update({f"client_{k}": v for k, v in client_seconds.items()})
        seconds["total"] = self._clock.total()
        self.result = dataclasses.replace(
            report, metric=self.spec.metric, metric_option=self.spec.metric_option, n_matched=self.n_matched,
            result_recipient=self.spec.result_recipient, tau=self.spec.tau, phase_seconds=seconds,
            preparation=self._preparation)
        self.phase = Phase.DONE
        self._progress("done", "result received")
        self.close()
        return []

    def _on_client_result(self, res: pb.ClientResult) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_RESULT)
        if self.spec.result_recipient != "client":
            raise ProtocolError("a result was sent although only the Tester may learn it")
        report = AuditReport.from_json(res.report_json)
        if report.metric != self.spec.metric or report.bootstrap != self._replicates():
            raise ProtocolError("the result does not describe this audit")
        expected = [c.group for c in self._plan.cells if c.kind == "group"]
        if [g.group for g in report.groups] != expected:
            raise ProtocolError("the result's groups do not match the audit's groups")
        return self._finish(report, dict(res.phase_seconds))

    def _on_masked_plaintexts(self, mp: pb.MaskedPlaintexts) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_RESULT)
        if self.spec.result_recipient != "tester":
            raise ProtocolError("masked plaintexts were sent although the Test-Client learns the result")
        width = mp.width
        if not 1 <= width <= 1024 or len(mp.values) % width:
            raise ProtocolError("masked plaintext table is malformed")
        self._masked_values += [int.from_bytes(mp.values[i:i + width], "big", signed=True)
                                for i in range(0, len(mp.values), width)]
        plan = self._plan
        n_items = len(plan.items)
        replicates = self._replicates()
        expected = (replicates + 1) * n_items
        if len(self._masked_values) > expected:
            raise ProtocolError("too many masked plaintexts")
        if not mp.last:
            return []
        if len(self._masked_values) != expected:
            raise ProtocolError(f"{len(self._masked_values)} masked plaintexts received, {expected} expected")
        layout = encoding.SlotLayout(self._layout.slot_bits, plan.item_slots)
        slots = []
        for idx, value in enumerate(self._masked_values):
            try:
                slots.append(AdditiveMask(tuple(self._pads[idx])).remove(layout.unpack(value)))
            except EncodingOverflowError:
                raise ProtocolError("a masked plaintext does not decode") from None
        values = plan.cell_values(slots, lambda num, den: float(num) / float(den) if den != 0 else None)
        report = finish(self.metric, plan, values, option=self.spec.metric_option, confidence=self.spec.confidence,
                        tau=self.spec.tau, params=self.params, info=self._info, replicates=replicates,
                        result_recipient="tester", small_groups=self._small_groups)
        return self._finish(report, dict(mp.phase_seconds))
