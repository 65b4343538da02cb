"""The Test-Client's (P2's) side of one audit session, free of I/O (design §3).

`ClientSession.receive(msg)` consumes one message from the Tester and returns the
messages to send back; the gRPC servicer (`client_service.server`) only moves them.
Which message each phase accepts, the handler it goes to and the phases that follow
are one table (`common.protocol.transitions.CLIENT`); the handlers never set a phase.

P2's steps: 1 load the dataset and compute the metric's rows in plaintext
(`common.metrics`: comparisons, sorting, IDCG, kernels happen here, before
encryption), fresh commutative key sk2 and Paillier key pair, salt share, slot plan;
3 doubly encrypt P1's ids, shuffle the rows (with their sealed probability vectors)
and send them back; 4 send its own rows in random order: each row's member ids
Com.Enc_sk2(RO(id)) (two for pair metrics), HE.Enc(packed values), and where the
metric has them a resampling bucket (its units, e.g. queries, mapped to random
buckets here, so P1 never sees a query id) and a stratum; (MQOS-AUC exact: square
P1's additively masked sums; LOT under the release controls: instead of its rows, each
member once, then per member and rank pair masked sums over P1's encrypted vectors and
per rank pair the masks' totals, `client_service.blind_pairs`); 7 decrypt the masked
cells and either finish the
result (P2 learns it and keeps it: only its timings go back, design §3.7) or return the
masked plaintexts.
"""
from __future__ import annotations

import collections
import json
import secrets
from dataclasses import replace
from functools import partial
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from common.protocol import validation, wire
from common.execution import parallel
from common.stats import moments
from common.crypto import commutative, encoding, paillier
from common.stats.correction import finish_corrected
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.crypto.masking import masked_ratio
from common.crypto.symmetric import sealed_width
from common.metrics.base import Layout, Metric
from common.stats.results import AuditReport, finish, with_withheld
from common.protocol.session import PartySession, PhaseClock, chunk_ticks
from common.protocol.transitions import CLIENT, ClientPhase, Step
from proto import ppre_pb2 as pb
from client_service import blind_pairs
from client_service.results import JOINED_MEMBERS_SD

#: the limits on what the Tester sends, with the checks: common.protocol.validation
PROTOCOL_VERSION = validation.PROTOCOL_VERSION

#: (dataset name, metric) -> the dataset as read (its file label in frame.attrs["file"])
DatasetLoader = Callable[[str, Metric], pd.DataFrame]
#: the answer to an AggregatesHeader without release noise when the operator did not opt in
NOISELESS_REFUSED = ("the Tester sent aggregates without release noise (its release controls are off); this "
                     "Test-Client refuses them: its operator can accept them with `ppre client serve "
                     "--accept-noiseless` (env PPRE_ACCEPT_NOISELESS=1)")
#: the answer to a Hello for a metric that, without release noise, the Tester computes from
#: the joined rows' plaintext strata (`Metric.he_under_noise`), when the operator did not opt in
NOISELESS_HELLO_REFUSED = ("the Tester asked for {metric} without release noise (its release controls are off), "
                           "which it would compute from our rows' plaintext strata; this Test-Client refuses: its "
                           "operator can accept it with `ppre client serve --accept-noiseless` "
                           "(env PPRE_ACCEPT_NOISELESS=1)")
#: own ids hashed and encrypted per step of step 4 (a checkpoint and a progress report each)
ID_STEP_ROWS = 32_768


def joined_count(report: AuditReport, header: pb.AggregatesHeader | None) -> AuditReport:
    """`report` with the intersection's count the Tester released (design §8.2, §9.2):
    its distinct joined members as the minimum was checked on them, noised under the
    release controls (sd σ_i), exact without them (sd 0), as `n_matched`, and the sd
    under `client_service.results.JOINED_MEMBERS_SD` in its facts; unchanged (no count:
    `n_matched` 0, kept as null) where the header carries none."""
    if header is None or not header.HasField("joined_members"):
        return report
    return replace(report, n_matched=int(header.joined_members),
                   info={**report.info, JOINED_MEMBERS_SD: float(header.joined_members_sd)})


def secret_permutation(n: int) -> np.ndarray:
    """A uniformly random order of n rows from the OS's secret randomness: the ranks of
    fresh 64-bit random keys (ties, with probability below n^2 / 2^65, only keep two
    rows in their original order)."""
    return np.argsort(np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64), kind="stable")


#: the Test-Client's phases, moved only by its table of transitions (`common.protocol.transitions`)
Phase = ClientPhase


class ClientSession(PartySession):
    transitions = CLIENT

    def __init__(self, load_dataset: DatasetLoader, *, modulus_bits: int = paillier.MIN_MODULUS_BITS,
                 allow_insecure: bool = False, checkpoint: Callable[[], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 max_received_bytes: int = validation.DEFAULT_MAX_RECEIVED_BYTES,
                 executor: parallel.Executor | None = None, accept_noiseless: bool = True,
                 deliver: Callable[[str, AuditReport], None] | None = None) -> None:
        """`checkpoint()` runs between chunks of the long steps (encryption, decryption);
        whatever it raises ends the session (the servicer stops work for a Tester that left,
        or when it shuts down). `progress(phase, done, total)` reports what the session is
        busy with (the servicer's heartbeats carry it to the Tester). `max_received_bytes`:
        the most the Tester may send in this session (`common.protocol.validation`). `executor`:
        where the per-row work runs (the service's; default inline, `common.execution.parallel`).
        `accept_noiseless`: go on with aggregates that carry no release noise (the
        Tester's controls off, design §8.6); the service passes its operator's choice,
        `ClientConfig.accept_noiseless` (`ppre client serve --accept-noiseless`; default
        there: refuse), and this sans-I/O default serves in-process use, where one user
        holds both sides. `deliver(audit_id, report)`: where a result this session
        finishes goes (result recipient `client`, design §3.7; the service's
        `client_service.results.ResultStore`), before the Tester hears that it is done;
        whatever it raises fails the session. The result is also `self.result`, and only
        its timings go to the Tester."""
        self._executor = executor or parallel.InlineExecutor()
        self._accept_noiseless = accept_noiseless
        self._deliver = deliver
        #: the result this session finished (result recipient `client`); None until then
        self.result: AuditReport | None = None
        self._load_dataset = load_dataset
        self._checkpoint = checkpoint
        self._progress = progress or (lambda phase, done, total: None)
        self._modulus_bits = modulus_bits
        self._allow_insecure = allow_insecure
        self.phase = CLIENT.initial
        #: every message from the Tester is checked here first (common.protocol.validation)
        self._inbound = validation.ClientInbound(max_received_bytes=max_received_bytes)
        self._clock = PhaseClock()
        self.phase_seconds = self._clock.seconds
        self.dataset = ""
        self._hello: pb.Hello | None = None
        self._metric: Metric | None = None
        self._option = ""
        self._params: dict = {}
        self._info: dict = {}
        self._strata_labels: tuple[str, ...] = ()
        self._layout: Layout | None = None
        self._com_key: commutative.CommutativeKey | None = None
        self._paillier: paillier.PrivateKey | None = None
        self._ids: list[np.ndarray] | None = None
        self._values: list[int] | None = None
        self._units: np.ndarray | None = None
        self._strata: np.ndarray | None = None
        self._salt: bytes | None = None
        self._reader: wire.TableReader | None = None
        self._own_points: list | None = None  # futures: each distinct member's Com.Enc_sk2(RO(id))
        self._own_todo: collections.deque = collections.deque()  # their chunks not yet submitted
        self._own_codes: np.ndarray | None = None  # per id slot of every row: its distinct member
        self._doubled: list = []  # futures: the Tester's points, doubly encrypted, per chunk
        self._sealed: list[bytes] = []
        self._header: pb.AggregatesHeader | None = None
        self._correction = None  # common.stats.correction.CorrectionPlan when the Tester asked for one
        self._aggregates: list[int] = []
        #: the blind path (`common.metrics.lot`, "The Tester blind to the pairs"): the Tester's
        #: key, the slot plan, our rows as (head, tail, rank pair, quantised gap) arrays and,
        #: once the member table is sent, the heads and tails as its positions
        self._tester_key: paillier.PublicKey | None = None
        self._blind_plan = None
        self._blind_rows: tuple | None = None
        self._blind_groups: tuple[str, ...] = ()
        self._member_vectors: list[int] = []

    def _report_rows(self, phase: str, done: int, total: int, message: str) -> None:
        self._progress(phase, done, total)

    def _drop_secrets(self) -> None:
        """Keys and all member-level data (`close`, however the session ended)."""
        self._com_key = None
        self._paillier = None
        self._ids = None
        self._values = None
        self._units = None
        self._strata = None
        for future in self._doubled + (self._own_points or []):
            future.cancel()
        self._own_points = None
        self._own_todo = collections.deque()
        self._own_codes = None
        self._doubled = []
        self._sealed = []
        self._aggregates = []
        self._blind_rows = None
        self._member_vectors = []

    # ---------------------------------------------------------------- step 1
    def _on_hello(self, hello: pb.Hello, choice: validation.HelloChoice) -> list[pb.PeerMessage]:
        metric = choice.metric
        if metric.he_under_noise and not metric.encrypted(choice.params) and not self._accept_noiseless:
            raise ProtocolError(NOISELESS_HELLO_REFUSED.format(metric=metric.name))
        self._option, self._params = choice.option, choice.params
        self._metric = metric
        self._progress("load_dataset", 0, 0)
        frame = self._load_dataset(hello.client_dataset, metric)
        file = frame.attrs.get("file", hello.client_dataset)
        # our own random choices (unit buckets, sampled pairs, which member of a pair goes
        # first) come from fresh secret randomness, never from the audit's --seed, which
        # the Tester knows: it could otherwise replay them
        rng = np.random.default_rng(secrets.randbits(128))
        rows = metric.client_rows(frame, file, self._option, self._params, rng)
        del frame
        n = rows.n_rows
        self._info = dict(rows.info)
        self._strata_labels = tuple(rows.strata_labels)
        # own rows in random order (never the file's order); units to random buckets
        order = secret_permutation(n)
        self._ids = [np.asarray(ids, dtype=object)[order] for ids in rows.ids]
        if metric.resampling == "unit":
            keys, inverse = np.unique(rows.units[order], return_inverse=True)
            self._units = rng.integers(0, hello.buckets, size=len(keys))[inverse]
        elif metric.resampling == "client_groups":
            self._units = np.asarray(rows.units, dtype=np.int64)[order]
        if metric.row_strata(self._params):
            self._strata = np.asarray(rows.strata, dtype=np.int64)[order]
        self._tester_key = choice.tester_key
        self.dataset = hello.client_dataset
        self._hello = hello
        ack = pb.HelloAck(rows=n, strata_labels=list(self._strata_labels), info_json=json.dumps(self._info),
                          value_bounds=metric.value_bounds(self._option, self._params))  # what rows were clipped to
        if metric.encrypted(self._params):
            comps = metric.components(self._option, self._params, self._info)
            ints = []
            for c, comp in enumerate(comps):
                try:
                    ints.append(comp.quantize(rows.values[order, c]))
                except EncodingOverflowError as exc:
                    raise InputError(str(exc), file=file) from None
            self._layout = metric.layout(self._option, self._params, self._info, n_rows=n, n_units=hello.buckets,
                                         recipient=hello.result_recipient, modulus_bits=self._modulus_bits)
            if self._tester_key is not None:  # the blind path sends no row's values (`_send_masked_sums`)
                # the Tester's group count (its names come with the header); per row its
                # rank pair and quantised gap (heads and tails follow from the ids, `_send_members`)
                self._blind_groups = ("",) * ((hello.sealed_width - sealed_width(0)) // 8)
                self._blind_rows = (np.asarray(rows.strata, dtype=np.int64)[order], np.asarray(ints[0], dtype=object))
            else:
                matrix = np.column_stack(ints) if all(i.dtype != object for i in ints) else \
                    np.array([list(r) for r in zip(*ints)], dtype=object)
                self._values = self._layout.pack(matrix)
                del matrix
            del ints
            self._progress("keygen", 0, 0)
            self._paillier = paillier.generate_keypair(self._modulus_bits, allow_insecure=self._allow_insecure)
            ack.paillier_n, ack.paillier_h = self._paillier.public.to_bytes()
            ack.slot_bits, ack.slots = self._layout.slot_bits, self._layout.slots
        del rows
        self._com_key = commutative.CommutativeKey.generate()
        share = secrets.token_bytes(32)
        self._salt = commutative.session_salt(hello.salt_share, share)
        ack.salt_share = share
        self._start_own_ids()
        self._reader = wire.TableReader(wire.tester_rows(hello.sealed_width))
        self._lap("keygen_and_load")
        return [pb.PeerMessage(hello_ack=ack)]

    # ---------------------------------------------------------------- steps 3-4
    def _start_own_ids(self) -> None:
        """Step 4's ids, started as soon as the salt is known, so that the executor works
        on them while the Tester's rows arrive: Com.Enc_sk2(RO(id)) of each distinct
        member once (`_own_codes` maps every id slot of every row to it)."""
        n_ids = len(self._ids)
        flat = np.empty(len(self._ids[0]) * n_ids, dtype=object)
        for s, ids in enumerate(self._ids):
            flat[s::n_ids] = ids
        self._ids = None
        codes, unique = pd.factorize(pd.Series(flat, dtype=object))
        del flat
        self._own_codes = codes
        unique = [str(u) for u in unique]
        hash_task, multiply = self._salt.hash_task(), self._com_key.multiply_task()
        self._own_todo = collections.deque((hash_task, multiply, unique[start:start + ID_STEP_ROWS])
                                           for start in range(0, len(unique), ID_STEP_ROWS))
        self._own_points = []
        self._feed_own_ids()

    def _feed_own_ids(self, everything: bool = False) -> None:
        """Keep the executor busy with our own ids without making the Tester's chunks
        wait: at most one chunk of them per worker in flight, topped up as the Tester's
        rows arrive (their double encryption is on the critical path: the shuffled table
        goes back first); `everything` submits the rest."""
        todo = self._own_todo
        while todo and (everything or sum(not f.done() for f in self._own_points) < self._executor.workers):
            self._own_points.append(self._executor.submit(commutative.encrypt_ids, *todo.popleft()))

    def _on_tester_rows_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        """Step 3 on the executor, while the next chunks arrive (the points were checked by
        the gate, common.protocol.validation; the task checks them again where it runs)."""
        first = self._reader.rows - chunk.rows
        future = self._executor.submit(self._com_key.multiply_task(), chunk.points, first)
        if future.done():
            future.result()  # a chunk that failed already (e.g. inline) fails the session now
        self._doubled.append(future)
        self._sealed.append(chunk.sealed)
        self._feed_own_ids()
        self._progress("double_encrypt", self._reader.rows, 0)
        return []

    def _on_member_vectors_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        self._member_vectors += rows.ciphertexts
        return []

    def _on_ciphertexts_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        """The square requests, or the aggregates."""
        self._aggregates += rows.ciphertexts
        return []

    def _on_tester_rows_end(self, end: pb.TableEnd, _: None) -> Step:
        """Steps 3-4: the shuffled table, then our own rows (on the blind path our members);
        a metric without HE is done once they are sent."""
        if self._tester_key is not None:
            after = Phase.WAIT_MEMBER_VECTORS
        elif not self._metric.encrypted(self._params):
            after = Phase.DONE
        else:
            after = Phase.WAIT_SQUARE_REQUEST if self._metric.needs_squares else Phase.WAIT_AGGREGATES_HEADER
        return Step(after, self._send_tables())

    def _on_aggregates_end(self, end: pb.TableEnd, _: None) -> list[pb.PeerMessage]:
        """Step 7 (`_finish`)."""
        return self._finish()

    def _wait(self, futures: list, phase: str) -> bytes:
        """The results of `futures`, in order, joined; a progress tick (and the session's
        checkpoint) after each."""
        parts = []
        for i, future in enumerate(futures):
            parts.append(future.result())
            self._tick(phase, i + 1, len(futures))
        return b"".join(parts)

    def _send_tables(self) -> Iterator[pb.PeerMessage]:
        width = self._reader.layout.sealed
        self._feed_own_ids(everything=True)  # done while the shuffled table is sent
        doubled, self._doubled = self._doubled, []
        points = np.frombuffer(self._wait(doubled, "double_encrypt"), dtype=f"V{commutative.POINT_BYTES}")
        sealed = np.frombuffer(b"".join(self._sealed), dtype=f"V{width}") if width else None
        self._sealed = []
        self._progress("shuffle", 0, 0)
        n_tester = len(points)
        order = secret_permutation(n_tester)
        shuffled_points = points[order].tobytes()
        shuffled_sealed = sealed[order].tobytes() if sealed is not None else b""
        del points, sealed, order
        self._lap("psi_double_encrypt_and_shuffle")
        yield from wire.table_messages(wire.shuffled_rows(width), n_tester, points=shuffled_points,
                                       sealed=shuffled_sealed)
        del shuffled_points, shuffled_sealed

        metric = self._metric
        codes, self._own_codes = self._own_codes, None
        futures, self._own_points = self._own_points, []
        encrypted = np.frombuffer(self._wait(futures, "encrypt_ids"), dtype=f"V{commutative.POINT_BYTES}")
        if self._tester_key is not None:
            yield from self._send_members(encrypted, codes)
            return
        own_points = encrypted[codes].tobytes()  # every id slot of every row, row-major
        del encrypted, codes
        self._com_key = None  # design §7: no longer needed once both tables are encrypted
        self._lap("psi_encrypt_own_ids")
        n_ids = metric.n_ids
        n = len(own_points) // (commutative.POINT_BYTES * n_ids)
        units, strata = self._units, self._strata
        self._units = self._strata = None
        width = n_cts = 0
        encrypted = metric.encrypted(self._params)
        if encrypted:
            width, n_cts = self._paillier.public.ciphertext_bytes, self._layout.n_ciphertexts
            if metric.needs_squares:
                self._reader = wire.TableReader(wire.ciphertext_table(pb.SQUARE_REQUEST, width))
        layout = wire.client_rows(n_ids, n_cts, width, units=units is not None, strata=strata is not None)
        step = wire.rows_per_chunk(layout.row_bytes)
        starts = range(0, n, step)

        def columns(start: int, stop: int) -> dict[str, bytes]:
            cols = {"points": own_points[start * n_ids * commutative.POINT_BYTES:stop * n_ids * commutative.POINT_BYTES]}
            if units is not None:
                cols["units"] = wire.pack_indices(units[start:stop])
            if strata is not None:
                cols["strata"] = wire.pack_indices(strata[start:stop])
            return cols

        if encrypted:
            # HE.Enc of each chunk's values on the executor, sent as each chunk is ready
            # (the Tester joins one chunk while the next ones are encrypted)
            pub = self._paillier.public
            encrypt = self._paillier.encrypt_task()
            # signed encoding (design §4.3): a packed value whose top slot is negative is x + n
            values = [v % pub.n if v < 0 else v for v in self._values]
            self._values = None
            tasks = ((values[a * n_cts:min(n, a + step) * n_cts],) for a in starts)
            done = 0
            for a, cts in zip(starts, self._executor.stream(encrypt, tasks)):
                b = min(n, a + step)
                yield from wire.chunk_messages(layout, b - a, ciphertexts=cts, **columns(a, b))
                done = b
                self._tick("he_encrypt", done, n)
            del values, encrypt
            self._lap("he_encrypt_values")
        else:
            for a in starts:
                b = min(n, a + step)
                yield from wire.chunk_messages(layout, b - a, **columns(a, b))
        yield wire.table_end(layout, n)
        del own_points
        if not encrypted:
            # nothing more to do: P1 computes the statistic from the joined rows alone (done)
            self._lap("send_rows")

    # ---------------------------------------------------------------- the blind path
    def _send_members(self, encrypted: np.ndarray, codes: np.ndarray) -> Iterator[pb.PeerMessage]:
        """The blind path's step 4 (`common.metrics.lot`, "The Tester blind to the pairs"):
        each of our members once, Com.Enc_sk2(RO(id)), in a fresh secret order; our rows
        keep only their heads' and tails' places in it."""
        self._com_key = None
        order = secret_permutation(len(encrypted))
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        strata, gaps = self._blind_rows
        self._blind_rows = (place[codes[0::2]], place[codes[1::2]], strata, gaps)
        points = encrypted[order].tobytes()
        del encrypted, codes, order, place
        self._lap("psi_encrypt_own_ids")
        plan = self._blind_plan = self._metric.blind_plan(
            self._blind_groups, len(self._strata_labels), self._option, self._params,
            n_members=len(points) // commutative.POINT_BYTES, tester_modulus_bits=self._tester_key.n.bit_length())
        self._reader = wire.TableReader(wire.member_vectors(plan.member_cts, self._tester_key.ciphertext_bytes))
        yield from wire.table_messages(wire.member_points(), len(points) // commutative.POINT_BYTES, points=points)

    def _send_masked_sums(self, end: pb.TableEnd, _: None) -> Iterator[pb.PeerMessage]:
        """The blind path's rows and totals (`client_service.blind_pairs`): per member of the
        member table, in its order and without ids, HE_T.Enc(z + r) per rank pair; then per
        rank pair the masks' totals HE_T.Enc(Σ_a w_a·r + m) and the item masks HE.Enc(m).
        Both are formed range by range of the member table on the executor
        (`blind_pairs.member_part`)."""
        plan, tester = self._blind_plan, self._tester_key
        heads, tails, strata, gaps = self._blind_rows
        self._blind_rows = None
        vectors, self._member_vectors = self._member_vectors, []
        n_members = len(vectors) // plan.member_cts
        base = paillier.randomizer_base(tester.n)  # ours: a weak h of the Tester's switches nothing off
        heads_list = blind_pairs.head_vectors(plan, vectors)
        stride, per = plan.member_cts, plan.vector_cts
        tasks = []
        for first, stop, rows in blind_pairs.member_ranges(
                heads, n_members, plan.range_count(n_members, self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS))):
            tail_cts = [vectors[stride * b:stride * b + 2 * per] for b in tails[rows].tolist()]
            tasks.append((plan, tester, base, heads[rows] - first, strata[rows], [gaps[i] for i in rows.tolist()],
                          tail_cts, heads_list[first:stop]))
        del heads, tails, strata, gaps, vectors, heads_list
        ticks = chunk_ticks(len(tasks), partial(self._tick, "he_encrypt"))
        parts = self._executor.run_chunks(blind_pairs.member_part, tasks, checkpoint=ticks)
        del tasks
        masked = b"".join(cts for cts, _ in parts)
        totals = paillier.add_encrypted([share for _, share in parts], tester.n2)
        del parts
        self._lap("he_encrypt_values")
        layout = wire.blind_client_rows(plan.strata * plan.vector_cts, tester.ciphertext_bytes, 0, 0)
        yield from wire.table_messages(layout, n_members, tester_ciphertexts=masked)
        del masked
        yield from self._send_totals(totals, base)

    def _send_totals(self, totals: list[int], base: int) -> Iterator[pb.PeerMessage]:
        """Per rank pair: the masks' totals Π_a U_a^(r_asj) for every slot j (`totals`, per
        rank pair, slot and weights ciphertext), masked by m_sj, and Enc(m) per item under
        our key (`client_service.blind_pairs`)."""
        plan, tester, key = self._blind_plan, self._tester_key, self._paillier
        per = plan.strata
        row = plan.sum_slots * plan.weight_cts
        items = self._metric.blind_items(self._blind_groups, self._params)
        _, num_slot = self._layout.position(0)
        _, den_slot = self._layout.position(1)
        bits = self._layout.slot_bits
        tester_cts, own = [], []
        for s in range(per):
            m = blind_pairs.draw(plan.total_mask_bits, plan.sum_slots, plan.weights)
            tester_cts += blind_pairs.add_masks(totals[s * row:(s + 1) * row], tester,
                                                blind_pairs.totals_plaintexts(plan, m), base)
            own += blind_pairs.own_mask_plaintexts(items, plan.groups, m, num_slot * bits, den_slot * bits)
        own_cts = key.encrypt_task()([x % key.public.n for x in own])
        self._lap("he_encrypt_values")
        layout = wire.blind_totals(plan.sum_slots * plan.weight_cts, tester.ciphertext_bytes, len(items),
                                   key.public.ciphertext_bytes)
        yield from wire.table_messages(layout, per, ciphertexts=own_cts,
                                       tester_ciphertexts=paillier.ciphertexts_to_bytes(tester_cts, tester.ciphertext_bytes))

    # ---------------------------------------------------------------- MQOS-AUC exact
    def _square(self, end: pb.TableEnd, _: None) -> Iterator[pb.PeerMessage]:
        """Decrypt each additively masked request, answer it in plaintext as the metric
        says (`ExactAuc.square_answers`: squares of t + r; with score bins also the masked
        bins' inner products and the bins one by one), encrypt the answers."""
        key = self._paillier
        pub = key.public
        masked = self._aggregates
        self._aggregates = []
        # on the executor, with the key's narrow tasks (never the key itself)
        parts = parallel.split(masked, self._executor.chunk_count())
        decrypt = key.decrypt_task()
        plain = [m for part in self._executor.run_chunks(decrypt, [(p,) for p in parts]) for m in part]
        del decrypt
        try:
            answers = self._metric.square_answers(plain, self._layout, pub.n)
        except ValueError as exc:
            raise ProtocolError(f"square requests: {exc}") from None
        del plain
        encrypt = key.encrypt_task()
        squares = b"".join(self._executor.run_chunks(
            encrypt, [(part,) for part in parallel.split(answers, len(parts))]))
        del encrypt
        self._lap("squares")
        layout = wire.ciphertext_table(pb.SQUARES, pub.ciphertext_bytes)
        yield from wire.table_messages(layout, len(answers), ciphertexts=squares)

    # ---------------------------------------------------------------- step 7
    def _on_aggregates_header(self, header: pb.AggregatesHeader, plans) -> list[pb.PeerMessage]:
        if not header.noise_sd and not self._accept_noiseless:
            raise ProtocolError(NOISELESS_REFUSED)
        self._plan, self._correction = plans
        self._header = header
        self._reader = wire.TableReader(wire.ciphertext_table(pb.AGGREGATES, self._paillier.public.ciphertext_bytes))
        self._lap("wait_for_aggregates")
        return []

    def _finish(self) -> list[pb.PeerMessage]:
        header, plan = self._header, self._plan
        # the table's length was checked on arrival (common.protocol.validation)
        zero_tests = self._aggregates[len(self._aggregates) - header.zero_tests:]
        self._aggregates = self._aggregates[:len(self._aggregates) - header.zero_tests]
        empty = [i for i, z in enumerate(self._paillier.decrypt_task()(zero_tests)) if z == 0]
        # workers get the narrow decryption task (p and h_p), never the key (common.crypto.paillier)
        decrypt = self._paillier.decrypt_task(signed=True)
        parts = parallel.split(self._aggregates, self._executor.chunk_count(parallel.CHECKPOINT_CHUNKS))
        tasks = [(part,) for part in parts]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "decrypt"))
        try:
            signed = [m for part in self._executor.run_chunks(decrypt, tasks, checkpoint=ticks) for m in part]
        except EncodingOverflowError:
            raise ProtocolError("an aggregate does not decode: overflow") from None
        del decrypt
        self._aggregates = []
        self._lap("decrypt")
        if header.mask == "additive":
            width = max(1, max((v.bit_length() + 8) // 8 for v in signed))
            out = []
            step = wire.rows_per_chunk(width)
            for i in range(0, len(signed), step):
                part = signed[i:i + step]
                last = i + step >= len(signed)
                out.append(pb.PeerMessage(masked_plaintexts=pb.MaskedPlaintexts(
                    values=b"".join(v.to_bytes(width, "big", signed=True) for v in part), width=width,
                    last=last, phase_seconds=self.phase_seconds if last else {})))
            return out  # done: the table closes the session
        layout = encoding.SlotLayout(header.slot_bits, plan.item_slots)
        decoded = []
        for value in signed:
            try:
                decoded.append(layout.unpack(value))
            except EncodingOverflowError:
                raise ProtocolError("an aggregate does not decode: overflow") from None
        # an empty item of the estimate (its zero test): its cells are undefined, not a ratio of noises
        withheld = list(header.suppressed_items) + empty
        corrects = self._hello.correction not in ("", "none")
        interval = header.interval or self._metric.interval
        by_size: list[int] = []
        if header.interval == moments.FORM:  # one row of noised aggregates and second moments
            by_size = self._metric.withheld_by_size(plan, decoded[:header.items], header.min_effective_size,
                                                    self._params)
            withheld += by_size
            values, corrected = moments.finish_release(plan, self._correction, decoded, header.noise_sd,
                                                       header.replicates, withheld=withheld, correct=corrects,
                                                       bounds=moments.estimate_bounds(self._metric, self._option,
                                                                                      self._params))
            interval = "percentile"  # of the parametric draws (common.stats.moments)
        else:
            values = plan.cell_values(decoded, masked_ratio, plain_rows=header.plain_rows, noise_sd=header.noise_sd,
                                      pseudo_values=header.interval == "random_groups"
                                      and self._metric.interval == "percentile")
            values = plan.suppress(values, withheld)
            corrected = None if not corrects else finish_corrected(
                self._correction, decoded, plan, withheld, header.unidentifiable,
                header.noise_sd if header.plain_rows > 0 else (),
                pseudo_values=header.interval == "random_groups" and self._metric.interval == "percentile",
                bounds=moments.estimate_bounds(self._metric, self._option, self._params))
        report = finish(self._metric, plan, values, option=self._option, confidence=header.confidence,
                        interval=interval,
                        tau=header.tau, params=self._params, info=self._info, replicates=header.replicates,
                        small_groups=[g for g in header.small_groups if g in header.groups], corrected=corrected,
                        noisy=header.plain_rows > 0,  # rows released as noised aggregates: noise on
                        min_size=header.min_effective_size)
        report = with_withheld(report, plan.labels_of(by_size))
        self._lap("finish_statistic")
        return self._keep(report)

    def _keep(self, report: AuditReport) -> list[pb.PeerMessage]:
        """The result stays here (design §3.7): kept, then delivered; the Tester gets only
        our timings, as the sign that the audit is done. Its joined count is the one the
        Tester's AggregatesHeader released (`joined_count`), or none."""
        report = joined_count(report, self._header)
        self.result = replace(report, metric_option=self._option, result_recipient="client",
                              audit_id=self._hello.audit_id)
        if self._deliver is not None:
            self._deliver(self._hello.audit_id, self.result)
        return [pb.PeerMessage(client_result=pb.ClientResult(phase_seconds=self.phase_seconds))]
