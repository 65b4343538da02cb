"""The one place where a party checks what its peer sent (design §3).

Every PeerMessage a session receives goes through its gate (`TesterInbound` at the
Tester, `ClientInbound` at the Test-Client) before any handler sees it, in the style of
h11: one table per party says which message kinds each phase accepts and where each
leads (`common.protocol.transitions`), one validator per kind checks the content, and
an error state sticks. In order:

1. the kind is one the peer may send at all (else `ProtocolError`: "unexpected
   message");
2. the session has not failed: once anything went wrong (a refused message, an error in
   a handler, the peer's Abort), every later message is refused with a `PhaseError`;
3. the bytes received in the session stay under its cap (`max_received_bytes`, an
   option of both sessions; `DEFAULT_MAX_RECEIVED_BYTES` = 8 GiB, far above what the
   announced row counts of any real audit need: the per-table totals below are the
   tight bound, this is the backstop);
4. the session's phase accepts the kind (`TESTER_ACCEPTS` / `CLIENT_ACCEPTS`, from the
   tables of transitions; else
   `PhaseError`). An Abort is accepted in every phase and raised as `PeerAborted` (its
   code sanitised, its text cut); a heartbeat is accepted in every phase and does
   nothing (the servicers' `Inbox` normally consumes them, with the same check);
5. the kind's validator checks the content against what was announced and returns it
   parsed: table chunks and ends against their layout and their announced totals
   (`wire.TableReader`: the Tester's own row count for the shuffled table, the
   HelloAck's for the Test-Client's rows, the requests sent for the squares, the
   AggregatesHeader's (B + 1) x items + zero tests for the aggregates; on LOT's blind
   path the member vectors against the member table sent, its masked sums against the
   member table received, their totals one per rank pair), field sizes, the
   release fields of the AggregatesHeader (suppressed items, plain rows, zero tests,
   noise standard deviations: `tester_service.release`; the joined members' count and
   its sd, `check_joined_members`), points (32-byte
   canonical u-coordinates on Curve25519, not of small order: on the executor, below),
   ciphertexts (0 < c < n^2,
   gcd(c, n) = 1), key sizes (`min_modulus_bits` .. `MAX_MODULUS_BITS`), resampling
   buckets and strata in range, the Test-Client's timings (never a result: design §3.7) and
   masked plaintexts against the audit.

The three tables of a million points are the one exception to "checked here": the two
whose points the receiver multiplies (the Tester's rows at the Test-Client, the
Test-Client's rows at the Tester) and the shuffled table (the Tester's rows come back,
compared only). Their points are checked by the same functions
(`commutative.validate_points`, `commutative.check_points`) inside the executor's task
for each chunk, where the per-row work runs on all cores and off the session's thread
(a scale-out's serial part: bench/RESULTS.md, "Where the serial part is"); the shuffled
table's checks are waited for when it ends, before it is indexed. The Test-Client's
ciphertexts are checked (`check_ciphertexts`) in the join's task for their chunk, every
row's whether it joins or not: a check of the joined rows alone would answer, by failing
or not, whether a row's member is one of ours. The layout, the
counts and the buckets and strata are still checked here as each chunk arrives, and a
bad point or ciphertext fails the session the same way.

The handler (named by the party's table of transitions, `common.protocol.transitions`,
for the kind in the session's phase) then gets the message and what the validator
returned, and does not check again; the table also moves the session to its next phase. Malformed content is a `ProtocolError` (the
Test-Client's servicer ends the call with INVALID_ARGUMENT), a message at the wrong
moment a `PhaseError` (FAILED_PRECONDITION). Sans-I/O: no gRPC here.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from common.protocol import wire
from common.stats import correction
from common.crypto import paillier
from common.errors import EncodingOverflowError, InputError, PeerAborted, ProtocolError
from common.logs import valid_audit_id
from common.metrics import get_metric
from common.metrics.base import RELEASE_NOISE, SECOND_MOMENTS
from common.protocol.session import PhaseError
from common.protocol.transitions import CLIENT, TESTER, Transitions
from common.crypto.symmetric import sealed_width
from proto import ppre_pb2 as pb

#: bytes a session accepts from its peer in all (the backstop: per-table totals are tighter)
DEFAULT_MAX_RECEIVED_BYTES = 8 << 30
#: largest Paillier modulus a Tester accepts (a huge key would make every step crawl)
MAX_MODULUS_BITS = 8192
PROTOCOL_VERSION = 2
MAX_GROUPS = 64
MAX_REPLICATES = 100_000
MAX_BUCKETS = 1 << 20
#: most cells per replicate, and most values the Tester may ask to have squared
MAX_ITEMS = 1 << 16
MAX_SQUARES = 1 << 20
#: most random groups an interval may come from (the t interval needs few)
MAX_RANDOM_GROUPS = 1000
INTERVALS = ("", "percentile", "random_groups", "parametric", "exact")
#: what the Test-Client may announce about its table (HelloAck)
MAX_STRATA = 100_000
MAX_LABEL_CHARS = 200
MAX_INFO_BYTES = 1 << 16
#: the Hello's free-text fields
MAX_NAME_CHARS = 4096
MAX_PARAMS = 64
MAX_PARAM_CHARS = 1 << 20
#: widest masked plaintext (bytes; a value below n of MAX_MODULUS_BITS, with its sign)
MAX_PLAINTEXT_WIDTH = 1024
#: the joined members' count in an AggregatesHeader (design §8.2, §9.2): its noise sd at
#: most this (σ_i of a ρ far below any useful one), and the count at most the members the
#: Test-Client sent plus the noise's cut, `JOINED_NOISE_TAIL_SD`·sd + 1 (the Tester's
#: draws are cut there: `tester_service.release.NOISE_TAIL_SD`)
MAX_JOINED_MEMBERS_SD = 1e6
JOINED_NOISE_TAIL_SD = 8.0
#: the peer's own timings (ClientResult, MaskedPlaintexts)
MAX_SECONDS_ENTRIES = 64
_SECONDS_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: an Abort's code becomes the operator's error code: plain names only
_ABORT_CODE = re.compile(r"[a-z_]{1,40}")
MAX_ABORT_CHARS = 2000
MAX_HEARTBEAT_PHASE_CHARS = 64

#: Which message each party accepts from its peer in each phase (by the phase's value):
#: the events of its table of transitions (`common.protocol.transitions`); "abort" and
#: "heartbeat" are accepted in every phase until the session fails. Anything else is a
#: PhaseError there. Phases without a peer's event (start, done, closed) accept none.
TESTER_ACCEPTS: Mapping[str, frozenset[str]] = TESTER.accepts
CLIENT_ACCEPTS: Mapping[str, frozenset[str]] = CLIENT.accepts
ANY_PHASE = frozenset({"abort", "heartbeat"})


# ------------------------------------------------------------------ what validators return
@dataclass(frozen=True)
class Rows:
    """One table chunk, checked and parsed (a column the table does not have is None; the
    points are checked where they are read, and the handlers keep their packed bytes)."""

    ciphertexts: list[int] | None = None
    units: np.ndarray | None = None
    strata: np.ndarray | None = None
    #: the blind path's masked sums, under the Tester's own key (`wire.blind_client_rows`)
    tester_ciphertexts: list[int] | None = None


@dataclass(frozen=True)
class AckFacts:
    """What the Test-Client announced in its HelloAck, checked (the Tester's step 1)."""

    rows: int
    strata_labels: tuple[str, ...]
    info: dict[str, Any]
    public_key: paillier.PublicKey | None
    layout: Any  # common.metrics.base.Layout, or None for a metric without HE


@dataclass(frozen=True)
class HelloChoice:
    """The metric, option and parameters a checked Hello asks for (the Test-Client's step 1)."""

    metric: Any  # common.metrics.base.Metric, for the option
    option: str
    params: dict[str, Any]
    #: the Tester's own key, on the blind path (`Metric.tester_blind`); else None
    tester_key: paillier.PublicKey | None = None


# ------------------------------------------------------------------ field checks
def check_ciphertexts(packed: bytes, public_key: paillier.PublicKey) -> list[int]:
    """A peer's packed ciphertexts under `public_key`: each a unit of Z_{n^2}."""
    return paillier.ciphertexts_from_bytes(packed, public_key)


def check_public_key(n_bytes: bytes, h_bytes: bytes, *, min_bits: int) -> paillier.PublicKey:
    """The Test-Client's Paillier key: min_bits <= |n| <= MAX_MODULUS_BITS, n odd, not a
    square, not prime; h a unit of Z_{n^2}."""
    if len(n_bytes) > MAX_MODULUS_BITS // 8 + 1 or len(h_bytes) > 2 * len(n_bytes) + 1:
        raise ProtocolError(f"Paillier key refused: larger than {MAX_MODULUS_BITS} bits")
    key = paillier.PublicKey.from_bytes(n_bytes, h_bytes, min_bits=min_bits)
    if key.n.bit_length() > MAX_MODULUS_BITS:
        raise ProtocolError(f"Paillier modulus of {key.n.bit_length()} bits refused (maximum {MAX_MODULUS_BITS})")
    return key


def check_seconds(seconds: Mapping[str, float]) -> dict[str, float]:
    """The peer's phase timings: a few named, finite, non-negative numbers."""
    if len(seconds) > MAX_SECONDS_ENTRIES:
        raise ProtocolError("too many phase timings")
    for name, value in seconds.items():
        if not _SECONDS_KEY.fullmatch(name) or not math.isfinite(value) or value < 0:
            raise ProtocolError("malformed phase timings")
    return dict(seconds)


def check_heartbeat(beat: pb.Heartbeat) -> None:
    """A heartbeat carries a short printable phase name (relayed to the operator)."""
    if len(beat.phase) > MAX_HEARTBEAT_PHASE_CHARS or not beat.phase.isprintable():
        raise ProtocolError("malformed heartbeat")


def _labels(values: Iterable[str], what: str, most: int) -> tuple[str, ...]:
    values = tuple(values)
    if len(values) > most or any(not v or len(v) > MAX_LABEL_CHARS for v in values):
        raise ProtocolError(f"too many, empty or too long {what}")
    return values


def _check_stated_facts(metric, info: dict, second_moments: bool) -> None:
    """The facts a Test-Client states about its whole table for the interval under release
    noise (`Metric.stated_facts`): all of them when this audit's interval comes from
    second moments, none otherwise, since then nothing reads them (design §9.1)."""
    if second_moments:
        missing = [k for k in metric.stated_facts if k not in info]
        if missing:
            raise ProtocolError(f"the Test-Client's dataset facts lack {', '.join(missing)}, which the interval "
                                f"under release noise reads")
    else:
        unasked = [k for k in metric.stated_facts if k in info]
        if unasked:
            raise ProtocolError(f"the Test-Client stated {', '.join(unasked)}, which an audit whose interval is "
                                f"not from second moments does not ask for")


# ------------------------------------------------------------------ the gate
class Gate:
    """One session's gate for its peer's messages (module docstring): the phase table,
    the byte cap, the sticky error, and the dispatch to `_<kind>` (validator, here) then
    through the party's table of transitions (`common.protocol.transitions`) to the
    session's handler, `handler(body, checked)`. It also notes the row totals of the
    tables the session sends (`sent_rows`), which the peer's answers must match."""

    peer = "peer"
    transitions: Transitions | None = None
    accepts: Mapping[str, frozenset[str]] = {}

    def __init__(self, *, max_received_bytes: int = DEFAULT_MAX_RECEIVED_BYTES) -> None:
        if not max_received_bytes >= 1:
            raise InputError("must be at least 1", parameter="max received bytes")
        self.max_received_bytes = int(max_received_bytes)
        self.received_bytes = 0
        self.error: BaseException | None = None
        self.sent_rows: dict[int, int] = {}
        self._kinds = frozenset().union(*self.accepts.values()) | ANY_PHASE

    @property
    def failed(self) -> bool:
        return self.error is not None

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def receive(self, session, msg: pb.PeerMessage) -> Iterable[pb.PeerMessage]:
        """Check `msg` in `session`'s phase, then hand it to the session's handler; what
        the handler returns (a list, or a generator run by the caller) is watched too:
        an error there also fails the session."""
        try:
            kind = self._admit(session.phase.value, msg)
            body = getattr(msg, kind)
            checked = getattr(self, f"_{kind}")(session, body)
            out = [] if kind == "heartbeat" else self.transitions.run(session, kind, body, checked)
        except Exception as exc:
            self.fail(exc)
            raise
        if isinstance(out, list):
            self._note(out)
            return out
        return self._watch(out)

    def _admit(self, phase: str, msg: pb.PeerMessage) -> str:
        kind = msg.WhichOneof("body")
        if kind not in self._kinds:
            raise ProtocolError(f"unexpected message '{kind}' from the {self.peer}")
        if self.error is not None:
            raise PhaseError(f"the session has already failed ({type(self.error).__name__}): no further message "
                             f"from the {self.peer} is accepted")
        self.received_bytes += msg.ByteSize()
        if self.received_bytes > self.max_received_bytes:
            raise ProtocolError(f"the {self.peer} sent more than {self.max_received_bytes} bytes in one session")
        if kind == "abort":
            code = msg.abort.code if _ABORT_CODE.fullmatch(msg.abort.code) else "peer_error"
            raise PeerAborted(code, self._aborted(msg.abort.message[:MAX_ABORT_CHARS]))
        if kind not in ANY_PHASE and kind not in self.accepts.get(phase, ()):
            raise PhaseError(f"message '{kind}' not allowed in phase {phase}")
        return kind

    def _aborted(self, text: str) -> str:
        return text or f"the {self.peer} aborted"

    def _heartbeat(self, session, beat: pb.Heartbeat) -> None:
        check_heartbeat(beat)

    def _note(self, messages: Iterable[pb.PeerMessage]) -> None:
        for m in messages:
            if m.WhichOneof("body") == "table_end":
                self.sent_rows[m.table_end.table] = m.table_end.rows

    def _watch(self, messages: Iterable[pb.PeerMessage]) -> Iterator[pb.PeerMessage]:
        try:
            for m in messages:
                if m.WhichOneof("body") == "table_end":
                    self.sent_rows[m.table_end.table] = m.table_end.rows
                yield m
        except Exception as exc:
            self.fail(exc)
            raise


# ------------------------------------------------------------------ the Tester's gate
class TesterInbound(Gate):
    """What the Tester (P1) accepts from the Test-Client. Reads the TesterSession's
    announced state: `metric`, `spec`, `params`, `_min_bits`, `_n_buckets`, `_reader`,
    `_pub`, `_layout`, `_client_rows`, `_strata_labels`, `_shuffled`, `_plans`,
    `_masked_values`, `_form`; on LOT's blind path `_blind`, `_tester_key`,
    `_blind_plan`, `_blind_members`."""

    peer = "Test-Client"
    transitions = TESTER
    accepts = TESTER_ACCEPTS

    def _hello_ack(self, s, ack: pb.HelloAck) -> AckFacts:
        metric = s.metric
        if len(ack.salt_share) != 32:
            raise ProtocolError("the Test-Client's salt share must be 32 bytes")
        if not 0 < ack.rows <= wire.MAX_TABLE_ROWS:
            raise ProtocolError("the Test-Client announced an impossible row count")
        labels = _labels(ack.strata_labels, "strata labels", MAX_STRATA)
        if labels and not metric.uses_strata:
            raise ProtocolError(f"{metric.name} has no strata, but the Test-Client announced some")
        if len(ack.info_json) > MAX_INFO_BYTES:
            raise ProtocolError("dataset facts too large")
        try:
            info = json.loads(ack.info_json or "{}")
            if not isinstance(info, dict):
                raise ValueError("not an object")
            metric.check_info(info, list(labels))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise ProtocolError(f"the Test-Client's dataset facts are malformed ({exc})") from None
        _check_stated_facts(metric, info, bool(s.params.get(SECOND_MOMENTS)))
        bounds = metric.value_bounds(s.spec.metric_option, s.params)
        if dict(ack.value_bounds) != bounds:  # the noise is sized from ours: its rows must respect them
            raise ProtocolError(f"the Test-Client's declared value bounds {dict(ack.value_bounds)} differ from "
                                f"the ones this audit's noise is sized from {bounds}")
        rows = int(ack.rows)
        if not metric.encrypted(s.params):
            if ack.paillier_n or ack.paillier_h or ack.slot_bits or ack.slots:
                raise ProtocolError(f"{metric.name} needs no encryption key")
            return AckFacts(rows, labels, info, None, None)
        pub = check_public_key(ack.paillier_n, ack.paillier_h, min_bits=s._min_bits)
        try:
            layout = metric.layout(s.spec.metric_option, s.params, info, n_rows=rows, n_units=s._n_buckets,
                                   recipient=s.spec.result_recipient, modulus_bits=pub.n.bit_length())
        except EncodingOverflowError as exc:
            raise ProtocolError(f"the Test-Client's table cannot be aggregated with its key: {exc}") from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise ProtocolError(f"the Test-Client's dataset facts are malformed ({exc})") from None
        if (ack.slot_bits, ack.slots) != (layout.slot_bits, layout.slots):
            raise ProtocolError(f"the Test-Client's slot plan ({ack.slots} x {ack.slot_bits} bits) differs from "
                                f"the one its table needs ({layout.slots} x {layout.slot_bits})")
        return AckFacts(rows, labels, info, pub, layout)

    def _expected_rows(self, s, table: int) -> int:
        """Each table the Test-Client sends has a total announced before it starts."""
        if table == pb.SHUFFLED_ROWS:  # every row we sent, doubly encrypted
            return self.sent_rows.get(pb.TESTER_ROWS, 0)
        if table == pb.CLIENT_ROWS:  # its HelloAck's row count; on the blind path one per member
            return s._blind_members if s._blind else s._client_rows
        if table == pb.MEMBER_POINTS:  # capped below (each member once: at most two per row)
            return None
        if table == pb.BLIND_TOTALS:  # one per rank pair
            return s._blind_plan.strata
        return s.metric.square_answer_count(self.sent_rows.get(pb.SQUARE_REQUEST, 0), s._layout)

    def _chunk(self, s, chunk: pb.TableChunk) -> Rows:
        reader = s._reader
        members = reader.table == pb.MEMBER_POINTS  # each member once: at most n_ids per row
        reader.check_chunk(chunk, expected=self._expected_rows(s, reader.table),
                           **({"at_most": max(1, s.metric.n_ids * s._client_rows)} if members else {}))
        layout = reader.layout
        if reader.table == pb.SQUARES:
            return Rows(ciphertexts=check_ciphertexts(chunk.ciphertexts, s._pub))
        if members:  # checked where they are multiplied, as the rows' are
            return Rows()
        if s._blind:  # the masked sums (and totals), each a unit under its key
            return Rows(ciphertexts=check_ciphertexts(chunk.ciphertexts, s._pub) if chunk.ciphertexts else None,
                        tester_ciphertexts=check_ciphertexts(chunk.tester_ciphertexts, s._tester_key.public))
        if reader.table == pb.SHUFFLED_ROWS:
            # the chunk's size is checked above; its points on the executor as the table
            # arrives (`commutative.check_points`, waited for at the table's end, before
            # the index is built), and a point sent twice when the table is indexed
            return Rows()
        # the Test-Client's rows: their points and ciphertexts are checked on the executor,
        # by the join's task for the chunk (`tester_service.join.double_client_chunk`:
        # `validate_points` and `check_ciphertexts`, every row's, joined or not), as the
        # points are doubly encrypted
        units = wire.unpack_indices(chunk.units) if layout.units else None
        strata = wire.unpack_indices(chunk.strata) if layout.strata else None
        metric = s.metric
        limit = metric.random_groups + 1 if metric.resampling == "client_groups" else s._n_buckets
        if units is not None and units.size and units.max() >= limit:
            raise ProtocolError("a row's resampling bucket is out of range")
        if strata is not None and s._strata_labels and strata.size and strata.max() >= len(s._strata_labels):
            raise ProtocolError("a row's stratum is out of range")
        return Rows(units=units, strata=strata)

    def _table_end(self, s, end: pb.TableEnd) -> None:
        s._reader.check_end(end, expected=self._expected_rows(s, s._reader.table))

    def _client_result(self, s, res: pb.ClientResult) -> None:
        """The Test-Client's "done": its timings only. Under result recipient `client` the
        result is the Test-Client's alone (design §3.7, §9.1): one sent along is refused,
        unread, so that no Tester code path parses, keeps or relays it."""
        if s.spec.result_recipient != "client":
            raise ProtocolError("a result was sent although only the Tester may learn it")
        if res.report_json:
            raise ProtocolError("the Test-Client sent its result; under result recipient client it keeps the "
                                "result and sends only its timings")
        check_seconds(res.phase_seconds)
        return None

    def _masked_plaintexts(self, s, mp: pb.MaskedPlaintexts) -> list[int]:
        if s.spec.result_recipient != "tester":
            raise ProtocolError("masked plaintexts were sent although the Test-Client learns the result")
        width = mp.width
        if not 1 <= width <= MAX_PLAINTEXT_WIDTH or len(mp.values) % width:
            raise ProtocolError("masked plaintext table is malformed")
        count = len(mp.values) // width
        if count == 0 and not mp.last:
            raise ProtocolError("empty chunk of masked plaintexts")
        check_seconds(mp.phase_seconds)
        expected = s._form.released_rows * len(s._plans.plan.items)
        have = len(s._masked_values) + count
        if have > expected:
            raise ProtocolError("too many masked plaintexts")
        if mp.last and have != expected:
            raise ProtocolError(f"{have} masked plaintexts received, {expected} expected")
        return [int.from_bytes(mp.values[i:i + width], "big", signed=True) for i in range(0, len(mp.values), width)]


# ------------------------------------------------------------------ the Test-Client's gate
def check_joined_members(header: pb.AggregatesHeader, members_sent: int) -> None:
    """The AggregatesHeader's `joined_members` (design §8.2, §9.2): sent only to a
    Test-Client that keeps the result (mask "ratio"), with `joined_members_sd` a finite
    sd in [0, MAX_JOINED_MEMBERS_SD]; the count (a uint64, never negative) at most the
    `members_sent` plus the noise's cut. Anything else is a ProtocolError naming the
    field."""
    sd = header.joined_members_sd
    if not header.HasField("joined_members"):
        if sd != 0:
            raise ProtocolError("aggregates header: joined_members_sd without joined_members")
        return
    if header.mask != "ratio":
        raise ProtocolError("aggregates header: joined_members sent to a Test-Client that keeps no result")
    if not (math.isfinite(sd) and 0 <= sd <= MAX_JOINED_MEMBERS_SD):
        raise ProtocolError(f"aggregates header: joined_members_sd must be a finite sd in [0, "
                            f"{MAX_JOINED_MEMBERS_SD:g}] members")
    most = members_sent + math.ceil(JOINED_NOISE_TAIL_SD * sd) + (1 if sd else 0)
    if header.joined_members > most:
        raise ProtocolError(f"aggregates header: joined_members {header.joined_members} is above the {most} "
                            f"members this Test-Client's rows hold (with the noise's cut)")


class ClientInbound(Gate):
    """What the Test-Client (P2) accepts from the Tester. Reads the ClientSession's
    announced state: `_reader`, `_paillier`, `_header`, `_hello`, `_metric`, `_layout`,
    `_option`, `_params`, `_info`, `_strata_labels`, `_modulus_bits`, `_allow_insecure`;
    on LOT's blind path `_tester_key`, `_blind_plan`."""

    peer = "Tester"
    transitions = CLIENT
    accepts = CLIENT_ACCEPTS

    def _aborted(self, text: str) -> str:
        return f"the Tester aborted: {text}"

    def _hello(self, s, hello: pb.Hello) -> HelloChoice:
        if hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {hello.protocol_version} is not supported")
        if len(hello.salt_share) != 32:
            raise ProtocolError("salt share must be 32 bytes")
        if not 8 <= hello.probability_bits <= 48:
            raise ProtocolError("probability scale out of range")
        if hello.result_recipient not in ("client", "tester"):
            raise ProtocolError("unknown result recipient")
        if not sealed_width(1) <= hello.sealed_width <= sealed_width(MAX_GROUPS) \
                or (hello.sealed_width - sealed_width(0)) % 8:
            raise ProtocolError("sealed row width out of range")
        if not 1 <= hello.buckets <= MAX_BUCKETS:
            raise ProtocolError("bucket count out of range")
        if len(hello.client_dataset) > MAX_NAME_CHARS:
            raise ProtocolError("dataset name too long")
        if hello.audit_id and not valid_audit_id(hello.audit_id):  # it goes into log lines: plain and short
            raise ProtocolError("the audit id must be 1-64 URL-safe characters (A-Z, a-z, 0-9, '_', '-')")
        if len(hello.metric_params) > MAX_PARAMS or \
                sum(len(k) + len(v) for k, v in hello.metric_params.items()) > MAX_PARAM_CHARS:
            raise ProtocolError("too many or too long metric parameters")
        try:
            metric = get_metric(hello.metric)
        except InputError:
            raise ProtocolError("the Tester asked for a metric this Test-Client does not know") from None
        option = hello.metric_option or metric.options[0]
        if option not in metric.options:
            raise ProtocolError(f"the Tester asked for '{option}', which is not an option of {metric.name}")
        metric = metric.for_option(option)
        try:
            params = metric.parse_params(dict(hello.metric_params))
        except InputError as exc:
            raise ProtocolError(f"the Tester's metric parameters are refused: {exc}") from None
        if hello.correction not in ("", *correction.METHODS) or (
                hello.correction not in ("", "none") and not metric.corrects):
            raise ProtocolError(f"the Tester asked for a correction '{hello.correction}' that {metric.name} lacks")
        if hello.second_moments:  # the interval from second moments (`common.stats.moments`)
            if not metric.moment_interval:
                raise ProtocolError(f"the Tester asked for second moments, which {metric.name} lacks")
            params[SECOND_MOMENTS] = True
        if hello.release_noise and metric.he_under_noise:  # aggregated under encryption (design §5.8)
            params[RELEASE_NOISE] = True
        metric = metric.for_release(params)
        bounds = metric.value_bounds(option, params)
        if dict(hello.value_bounds) != bounds:  # both parties size and clip from the same bounds
            raise ProtocolError(f"the Tester's declared value bounds {dict(hello.value_bounds)} differ from the "
                                f"ones its parameters give {bounds}")
        return HelloChoice(metric, option, params, self._tester_key(s, hello, metric.tester_blind(params)))

    def _tester_key(self, s, hello: pb.Hello, blind: bool) -> paillier.PublicKey | None:
        """The blind path's key (`Metric.tester_blind`): a Paillier key as we would accept
        our own (at least `paillier.MIN_MODULUS_BITS` unless this Test-Client runs with
        insecure test keys); none on any other path."""
        if not blind:
            if hello.tester_paillier_n or hello.tester_paillier_h:
                raise ProtocolError("the Tester sent a key of its own, which only LOT under release noise uses")
            return None
        if not hello.tester_paillier_n:
            raise ProtocolError("LOT under release noise needs the Tester's own key, which the Hello lacks")
        minimum = min(s._modulus_bits, paillier.MIN_MODULUS_BITS) if s._allow_insecure else paillier.MIN_MODULUS_BITS
        return check_public_key(hello.tester_paillier_n, hello.tester_paillier_h, min_bits=minimum)

    def _expected_rows(self, s, table: int) -> int | None:
        if table == pb.AGGREGATES:  # the AggregatesHeader's (B + 1) x items, then a zero test per item
            rows = 1 if s._header.interval == "parametric" else s._header.replicates + 1  # common.stats.moments
            return rows * s._header.items + s._header.zero_tests
        if table == pb.MEMBER_VECTORS:  # one per member we sent
            return self.sent_rows.get(pb.MEMBER_POINTS, 0)
        return None  # the Tester's rows and its square requests: capped, not announced

    def _chunk(self, s, chunk: pb.TableChunk) -> Rows:
        reader = s._reader
        at_most = MAX_SQUARES if reader.table == pb.SQUARE_REQUEST else wire.MAX_TABLE_ROWS
        reader.check_chunk(chunk, expected=self._expected_rows(s, reader.table), at_most=at_most)
        if reader.table == pb.TESTER_ROWS:
            # the points are checked (`commutative.validate_points`) where they are
            # multiplied, by the executor's task (`ScalarMultiplication`), chunk by chunk
            return Rows()
        if reader.table == pb.MEMBER_VECTORS:
            return Rows(ciphertexts=check_ciphertexts(chunk.ciphertexts, s._tester_key))
        return Rows(ciphertexts=check_ciphertexts(chunk.ciphertexts, s._paillier.public))

    def _table_end(self, s, end: pb.TableEnd) -> None:
        s._reader.check_end(end, expected=self._expected_rows(s, s._reader.table))

    def _aggregates_header(self, s, header: pb.AggregatesHeader):
        groups = _labels(header.groups, "groups", MAX_GROUPS)
        if not groups or len(set(groups)) != len(groups):
            raise ProtocolError("aggregates header: bad group list")
        if s._blind_plan is not None and len(groups) != s._blind_plan.groups:
            raise ProtocolError("aggregates header: the groups differ from the member vectors' (the Hello's width)")
        if not set(header.small_groups) <= set(groups) or len(header.small_groups) > len(groups):
            raise ProtocolError("aggregates header: small groups are not among the groups")
        exact = s._metric.interval == "exact"  # the estimate alone, no replicates (the probabilistic count)
        replicates_ok = header.replicates == 0 if exact else 1 <= header.replicates <= MAX_REPLICATES
        if not replicates_ok or not 0 < header.confidence < 1 or not header.tau > 0:
            raise ProtocolError("aggregates header: bad bootstrap parameters")
        if header.interval not in INTERVALS or (header.interval == "exact") != exact or (
                header.interval == "random_groups" and header.replicates > MAX_RANDOM_GROUPS):
            raise ProtocolError("aggregates header: unknown interval method or too many random groups")
        if header.slot_bits != s._layout.release_slot_bits:
            raise ProtocolError("aggregates header: slot width differs from the one announced")
        expected_mask = "ratio" if s._hello.result_recipient == "client" else "additive"
        if header.mask != expected_mask:
            raise ProtocolError("aggregates header: mask does not match the agreed result recipient")
        plan = s._metric.plan(groups, s._strata_labels, s._layout, s._option, s._params, s._info)
        corrections = None
        if header.interval == "parametric" and not s._metric.moment_interval:
            raise ProtocolError(f"aggregates header: {s._metric.name} has no second moments to release")
        if header.interval == "parametric" and not s._params.get(SECOND_MOMENTS):
            raise ProtocolError("aggregates header: second moments the Hello did not ask for (no squares, "
                                "no stated facts)")
        if s._hello.correction not in ("", "none") or header.interval == "parametric":
            plan, corrections = s._metric.moment_plan(  # M's items, the second moments too
                plan, groups, s._option, s._params, s._info, s._layout)
        if not set(header.unidentifiable) <= set(groups) or \
                len(set(header.unidentifiable)) != len(header.unidentifiable) or \
                (header.unidentifiable and s._hello.correction in ("", "none")):
            raise ProtocolError("aggregates header: the unidentifiable groups are not among the groups")
        if header.items != len(plan.items) or header.item_slots != plan.item_slots \
                or not 1 <= header.items <= MAX_ITEMS \
                or any(i >= header.items for i in header.suppressed_items) \
                or len(set(header.suppressed_items)) != len(header.suppressed_items):
            raise ProtocolError("aggregates header: the cells do not match the metric's plan")
        if header.plain_rows > header.replicates + 1 or header.zero_tests not in (0, header.items) \
                or len(header.noise_sd) not in (0, 2 * header.items * header.item_slots) \
                or not all(math.isfinite(x) and x >= 0 for x in header.noise_sd) \
                or (header.mask == "additive" and (header.plain_rows or header.zero_tests)) \
                or (header.interval == "parametric" and (header.zero_tests or not header.noise_sd
                                                          or (header.mask == "ratio" and header.plain_rows != 1))) \
                or (exact and (header.zero_tests or (header.mask == "ratio" and header.plain_rows != 1))) \
                or not (math.isfinite(header.min_effective_size) and header.min_effective_size >= 0):
            raise ProtocolError("aggregates header: malformed release fields")
        check_joined_members(header, self._members_sent(s))
        return plan, corrections

    def _members_sent(self, s) -> int:
        """The most distinct members the rows this Test-Client sent can hold: each row's
        ids (`Metric.n_ids`), or its member table on LOT's blind path."""
        return max(self.sent_rows.get(pb.CLIENT_ROWS, 0) * s._metric.n_ids, self.sent_rows.get(pb.MEMBER_POINTS, 0))
