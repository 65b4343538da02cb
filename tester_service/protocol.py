"""The Tester's (P1's) side of one audit session, free of I/O (SPEC.md section 3).

`TesterSession` is a small state machine over `PeerMessage`s, in the style of h11:
`start()` yields the first messages, `receive(msg)` consumes one peer message and
returns the messages to send back, `result` holds the report once done. No sockets,
no threads, no files: the gRPC layer (`tester_service.server`) only moves messages.

Steps (SPEC 3): 1 keys and salt share; 2 send (Com.Enc_sk1(RO(id)), Sym.Enc(race_p))
and drop the plaintext table; 3 receive the shuffled, doubly encrypted rows; 4 receive
P2's (Com.Enc_sk2(RO(id)), HE.Enc(values)); 5 doubly encrypt, join, delete every id,
then open the probability vectors; 6 aggregate per bucket and group, build the
bootstrap replicates, mask, rerandomise and send; 7 receive P2's result (P2 learns it)
or the decrypted masked values (only P1 learns it) and unmask.
"""
from __future__ import annotations

import dataclasses
import enum
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from common import aggregation, commutative, encoding, paillier, parallel
from common import bootstrap as boot
from common.session import PhaseClock, chunk_ticks, expect_phase
from common.errors import EncodingOverflowError, InputError, PeerAborted, ProtocolError
from common.estimators import get_metric
from common.masking import AdditiveMask, RatioMask
from common.report import DEFAULT_TAU, AuditReport, GroupResult
from common.symmetric import RowSealer, sealed_width
from common.wire import TableReader, table_messages
from proto import ppre_pb2 as pb

PROTOCOL_VERSION = 1
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

    def validated(self) -> "AuditSpec":
        metric = get_metric(self.metric)
        option = self.metric_option or metric.options[0]
        if option not in metric.options:
            raise InputError(f"'{option}' is not an option of {metric.name} ({', '.join(metric.options)})",
                             parameter="metric option")
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
        return dataclasses.replace(self, metric_option=option)


class Phase(enum.Enum):
    START = "start"
    WAIT_HELLO_ACK = "wait_hello_ack"
    WAIT_SHUFFLED = "wait_shuffled"
    WAIT_CLIENT_ROWS = "wait_client_rows"
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
        #: |f|, |d| <= value_bound, from the metric the Tester asked for (never from the peer)
        self._value_bound = get_metric(self.spec.metric).value_bound
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
        self._slot: encoding.SlotLayout | None = None
        self._shuffled: dict[bytes, bytes] | None = None
        self._matched_sealed: list[bytes] = []
        self._matched_cts: list[int] = []
        self._reader: TableReader | None = None
        self._pads: list[list[int]] | None = None
        self._masked_values: list[int] = []
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
        self._pads = None
        self._masked_values = []
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
            sealed_width=sealed_width(len(self.groups))))]

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

    def _on_hello_ack(self, ack: pb.HelloAck) -> Iterator[pb.PeerMessage]:
        self._expect(Phase.WAIT_HELLO_ACK)
        self._pub = paillier.PublicKey.from_bytes(ack.paillier_n, ack.paillier_h, min_bits=self._min_bits)
        p_bits = self._pub.n.bit_length() // 2
        if not 64 <= ack.slot_bits or 2 * ack.slot_bits + 4 > p_bits:
            raise ProtocolError("slot width does not fit the plaintext space")
        if ack.value_bound != self._value_bound:
            raise ProtocolError(f"the Test-Client announced value bound {ack.value_bound}; "
                                f"{self.spec.metric} values are bounded by {self._value_bound}")
        self._slot = encoding.SlotLayout(ack.slot_bits, 2)
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
        self._reader = TableReader(pb.SHUFFLED_ROWS, point_width=commutative.POINT_BYTES,
                                   sealed_width=sealed_width(len(self.groups)))
        self._shuffled = {}
        return table_messages(pb.TESTER_ROWS, n, points=points, point_width=commutative.POINT_BYTES,
                              sealed=sealed, sealed_width=sealed_width(len(self.groups)))

    def _on_chunk(self, chunk: pb.TableChunk) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_SHUFFLED, Phase.WAIT_CLIENT_ROWS)
        self._reader.check_chunk(chunk)
        points = commutative.validate_points(chunk.points)
        if self.phase is Phase.WAIT_SHUFFLED:
            width = self._reader.sealed_width
            for i, pt in enumerate(points):
                if pt in self._shuffled:
                    raise ProtocolError("duplicate row in the shuffled table")
                self._shuffled[pt] = chunk.sealed[i * width:(i + 1) * width]
            self._progress("psi_shuffled", "", self._reader.rows, self._n_sent)
        else:
            cts = paillier.ciphertexts_from_bytes(chunk.ciphertexts, self._pub)
            doubled = commutative.split_points(self._com_key.encrypt_points(points))
            for pt, ct in zip(doubled, cts):
                sealed = self._shuffled.pop(pt, None)
                if sealed is not None:
                    self._matched_sealed.append(sealed)
                    self._matched_cts.append(ct)
            self._progress("join", "", self._reader.rows, 0)
        return []

    def _on_table_end(self, end: pb.TableEnd) -> Iterable[pb.PeerMessage]:
        self._expect(Phase.WAIT_SHUFFLED, Phase.WAIT_CLIENT_ROWS)
        self._reader.check_end(end)
        if self.phase is Phase.WAIT_SHUFFLED:
            if self._reader.rows != self._n_sent:
                raise ProtocolError(f"shuffled table has {self._reader.rows} rows, {self._n_sent} were sent")
            self._lap("psi_client_double_encrypt")
            self.phase = Phase.WAIT_CLIENT_ROWS
            self._reader = TableReader(pb.CLIENT_ROWS, point_width=commutative.POINT_BYTES,
                                       ciphertext_width=self._pub.ciphertext_bytes)
            return []
        # step 5: the join is complete; every id (and the unmatched rows) is deleted, and
        # the commutative key is no longer needed (SPEC 7: keys deleted as soon as possible)
        self._shuffled = None
        self._com_key = None
        self.n_matched = len(self._matched_cts)
        self._lap("client_encrypt_and_join")
        self._progress("join", f"{self.n_matched} members matched")
        if self.n_matched == 0:
            raise InputError("empty intersection: no member of the client dataset is among the Tester's members",
                             parameter="client dataset")
        return self._aggregate()

    def _aggregate(self) -> Iterator[pb.PeerMessage]:
        k = len(self.groups)
        probs = self._sealer.open_rows(b"".join(self._matched_sealed), k)
        self._matched_sealed = []
        self._sealer = None
        q = encoding.quantize_probabilities(probs, encoding.PROBABILITY_BITS)
        del probs
        rng = np.random.default_rng(self.spec.seed)
        buckets = boot.assign_buckets(self.n_matched, self._n_buckets, rng)
        m = len(buckets)
        counts = boot.resample_counts(m, self.spec.bootstrap, rng)
        count_rows = np.vstack([np.ones((1, m), dtype=np.int64), counts])

        # slot plan: the largest |Num| or |Den| any replicate can reach, then its mask
        sizes = np.array([len(b) for b in buckets], dtype=object)
        worst = max(int(np.dot(row.astype(object), sizes)) for row in count_rows)
        bound = worst * self._value_bound * (1 << encoding.PROBABILITY_BITS)
        if self.spec.result_recipient == "client":
            masked_bits = RatioMask.max_bits(bound.bit_length())
        else:
            masked_bits = AdditiveMask.max_bits(bound.bit_length())
        self._slot.check_bound(1 << masked_bits, "a masked aggregate")
        self._lap("open_probabilities")

        # rerandomise with a base of our own, never the Test-Client's h (see paillier.randomizer_base)
        n, h = self._pub.n, paillier.randomizer_base(self._pub.n)
        cts = self._matched_cts
        tasks = [(n, [([cts[i] for i in idx], [q[idx, j].tolist() for j in range(k)]) for idx in part])
                 for part in parallel.split(buckets, parallel.chunk_count(parallel.CHECKPOINT_CHUNKS))]
        self._matched_cts = []
        ticks = chunk_ticks(len(tasks), partial(self._tick, "aggregation"))
        bucket_sums = [s for part in parallel.run_chunks(aggregation.bucket_sums_chunk, tasks, checkpoint=ticks)
                       for s in part]
        self._lap("aggregation")
        self._progress("aggregation", f"aggregated {self.n_matched} rows into {m} buckets x {k} groups")

        shift = self._slot.slot_bits
        rows = count_rows.tolist()
        if self.spec.result_recipient == "client":
            masks = [[RatioMask.draw() for _ in range(k)] for _ in rows]
            ratio = [[(mk.r, mk.e_num + (mk.e_den << shift)) for mk in row] for row in masks]
            pads = None
        else:
            pad_bits = bound.bit_length()
            draws = [[AdditiveMask.draw(2, pad_bits) for _ in range(k)] for _ in rows]
            self._pads = [[list(d.pads) for d in row] for row in draws]
            pads = [[d.pads[0] + (d.pads[1] << shift) for d in row] for row in draws]
            ratio = None
        tasks = []
        for part in parallel.split(list(range(len(rows))), parallel.chunk_count(parallel.CHECKPOINT_CHUNKS)):
            tasks.append((n, h, bucket_sums, [rows[b] for b in part],
                          [ratio[b] for b in part] if ratio else None,
                          [pads[b] for b in part] if pads else None))
        ticks = chunk_ticks(len(tasks), partial(self._tick, "bootstrap"))
        out = [c for part in parallel.run_chunks(aggregation.replicate_chunk, tasks, checkpoint=ticks) for c in part]
        self._lap("bootstrap_and_mask")
        self._progress("bootstrap", f"{self.spec.bootstrap} replicates masked; sending to the Test-Client")
        self.phase = Phase.WAIT_RESULT
        width = self._pub.ciphertext_bytes
        header = pb.PeerMessage(aggregates_header=pb.AggregatesHeader(
            groups=list(self.groups), replicates=self.spec.bootstrap, confidence=self.spec.confidence,
            slot_bits=shift, mask="ratio" if ratio else "additive"))
        yield header
        yield from table_messages(pb.AGGREGATES, len(out), ciphertexts=paillier.ciphertexts_to_bytes(out, width),
                                  ciphertext_width=width)

    def _finish(self, groups: list[GroupResult], client_seconds: dict[str, float]) -> list[pb.PeerMessage]:
        self._lap("wait_for_client_result")
        seconds = dict(self.phase_seconds)
        seconds.update({f"client_{k}": v for k, v in client_seconds.items()})
        seconds["total"] = self._clock.total()
        self.result = AuditReport(metric=self.spec.metric, n_matched=self.n_matched,
                                  bootstrap=self.spec.bootstrap, confidence=self.spec.confidence, groups=groups,
                                  result_recipient=self.spec.result_recipient,
                                  metric_option=self.spec.metric_option, tau=self.spec.tau,
                                  phase_seconds=seconds, preparation=self._preparation)
        self.phase = Phase.DONE
        self._progress("done", "result received")
        self.close()
        return []

    def _on_client_result(self, res: pb.ClientResult) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_RESULT)
        if self.spec.result_recipient != "client":
            raise ProtocolError("a result was sent although only the Tester may learn it")
        if [g.group for g in res.groups] != list(self.groups):
            raise ProtocolError("the result's groups do not match the audit's groups")
        groups = [GroupResult.from_proto(g) for g in res.groups]
        return self._finish(groups, dict(res.phase_seconds))

    def _on_masked_plaintexts(self, mp: pb.MaskedPlaintexts) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_RESULT)
        if self.spec.result_recipient != "tester":
            raise ProtocolError("masked plaintexts were sent although the Test-Client learns the result")
        width = mp.width
        if not 1 <= width <= 1024 or len(mp.values) % width:
            raise ProtocolError("masked plaintext table is malformed")
        self._masked_values += [int.from_bytes(mp.values[i:i + width], "big", signed=True)
                                for i in range(0, len(mp.values), width)]
        k = len(self.groups)
        expected = (self.spec.bootstrap + 1) * k
        if len(self._masked_values) > expected:
            raise ProtocolError("too many masked plaintexts")
        if not mp.last:
            return []
        if len(self._masked_values) != expected:
            raise ProtocolError(f"{len(self._masked_values)} masked plaintexts received, {expected} expected")
        num = np.empty((self.spec.bootstrap + 1, k))
        den = np.empty_like(num)
        for idx, value in enumerate(self._masked_values):
            b, j = divmod(idx, k)
            try:
                num_b, den_b = AdditiveMask(tuple(self._pads[b][j])).remove(self._slot.unpack(value))
            except EncodingOverflowError:
                raise ProtocolError("a masked plaintext does not decode") from None
            num[b, j], den[b, j] = float(num_b), float(den_b)
        ratios = boot.ratios(num, den)
        low, high = boot.percentile_interval(ratios[1:], self.spec.confidence)
        groups = [GroupResult.from_values(g, ratios[0, j], low[j], high[j]) for j, g in enumerate(self.groups)]
        return self._finish(groups, dict(mp.phase_seconds))

