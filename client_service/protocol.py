"""The Test-Client's (P2's) side of one audit session, free of I/O (SPEC.md section 3).

`ClientSession.receive(msg)` consumes one message from the Tester and returns the
messages to send back; the gRPC servicer (`client_service.server`) only moves them.

P2's steps: 1 load the dataset and compute the metric's rows in plaintext
(`common.metrics`: comparisons, sorting, IDCG, kernels happen here, before
encryption), fresh commutative key sk2 and Paillier key pair, salt share, slot plan;
3 doubly encrypt P1's ids, shuffle the rows (with their sealed probability vectors)
and send them back; 4 send its own rows in random order: each row's member ids
Com.Enc_sk2(RO(id)) (two for pair metrics), HE.Enc(packed values), and where the
metric has them a resampling bucket (its units, e.g. queries, mapped to random
buckets here, so P1 never sees a query id) and a stratum; (MQOS-AUC exact: square
P1's additively masked sums); 7 decrypt the masked cells and either finish the
result (P2 learns it) or return the masked plaintexts.
"""
from __future__ import annotations

import enum
import json
import random
import secrets
from functools import partial
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from common import commutative, encoding, paillier, parallel, validation, wire
from common.errors import EncodingOverflowError, InputError, ProtocolError
from common.masking import masked_ratio
from common.metrics.base import Layout, Metric
from common.results import finish
from common.session import PhaseClock, chunk_ticks, expect_phase
from proto import ppre_pb2 as pb

#: the limits on what the Tester sends, with the checks: common.validation
PROTOCOL_VERSION = validation.PROTOCOL_VERSION

#: (dataset name, metric) -> the dataset as read (its file label in frame.attrs["file"])
DatasetLoader = Callable[[str, Metric], pd.DataFrame]
#: own ids hashed and encrypted per step of step 4 (a checkpoint and a progress report each)
ID_STEP_ROWS = 32_768


class Phase(enum.Enum):
    WAIT_HELLO = "wait_hello"
    WAIT_TESTER_ROWS = "wait_tester_rows"
    WAIT_SQUARE_REQUEST = "wait_square_request"
    WAIT_AGGREGATES_HEADER = "wait_aggregates_header"
    WAIT_AGGREGATES = "wait_aggregates"
    DONE = "done"
    CLOSED = "closed"


class ClientSession:
    def __init__(self, load_dataset: DatasetLoader, *, modulus_bits: int = paillier.MIN_MODULUS_BITS,
                 allow_insecure: bool = False, checkpoint: Callable[[], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 max_received_bytes: int = validation.DEFAULT_MAX_RECEIVED_BYTES,
                 executor: parallel.Executor | None = None) -> None:
        """`checkpoint()` runs between chunks of the long steps (encryption, decryption);
        whatever it raises ends the session (the servicer stops work for a Tester that left,
        or when it shuts down). `progress(phase, done, total)` reports what the session is
        busy with (the servicer's heartbeats carry it to the Tester). `max_received_bytes`:
        the most the Tester may send in this session (`common.validation`). `executor`:
        where the per-row work runs (the service's; default inline, `common.parallel`)."""
        self._executor = executor or parallel.InlineExecutor()
        self._load_dataset = load_dataset
        self._checkpoint = checkpoint
        self._progress = progress or (lambda phase, done, total: None)
        self._modulus_bits = modulus_bits
        self._allow_insecure = allow_insecure
        self.phase = Phase.WAIT_HELLO
        #: every message from the Tester is checked here first (common.validation)
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
        self._doubled: list[bytes] = []
        self._sealed: list[bytes] = []
        self._header: pb.AggregatesHeader | None = None
        self._aggregates: list[int] = []

    def _lap(self, name: str) -> None:
        self._clock.lap(name)

    def _tick(self, phase: str, done: int, total: int) -> None:
        self._progress(phase, done, total)
        if self._checkpoint is not None:
            self._checkpoint()

    def _expect(self, *phases: Phase) -> None:
        expect_phase(self.phase, *phases)

    def close(self) -> None:
        """Drop keys and all member-level data, however the session ended."""
        self._com_key = None
        self._paillier = None
        self._ids = None
        self._values = None
        self._units = None
        self._strata = None
        self._doubled = []
        self._sealed = []
        self._aggregates = []
        if self.phase is not Phase.DONE:
            self.phase = Phase.CLOSED

    def receive(self, msg: pb.PeerMessage) -> Iterable[pb.PeerMessage]:
        """Consume one message from the Tester; returns the messages to send back.
        `common.validation.ClientInbound` checks it (phase, order, content) before its
        `_on_<kind>` handler runs; a session that failed refuses every later message."""
        return self._inbound.receive(self, msg)

    @property
    def failed(self) -> bool:
        return self._inbound.failed

    # ---------------------------------------------------------------- step 1
    def _on_hello(self, hello: pb.Hello, choice: validation.HelloChoice) -> list[pb.PeerMessage]:
        metric = choice.metric
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
        order = list(range(n))
        random.SystemRandom().shuffle(order)
        order = np.asarray(order, dtype=np.int64)
        self._ids = [np.asarray(ids, dtype=object)[order] for ids in rows.ids]
        if metric.resampling == "unit":
            keys, inverse = np.unique(rows.units[order], return_inverse=True)
            self._units = rng.integers(0, hello.buckets, size=len(keys))[inverse]
        elif metric.resampling == "client_groups":
            self._units = np.asarray(rows.units, dtype=np.int64)[order]
        if metric.uses_strata:
            self._strata = np.asarray(rows.strata, dtype=np.int64)[order]
        self.dataset = hello.client_dataset
        self._hello = hello
        ack = pb.HelloAck(rows=n, strata_labels=list(self._strata_labels), info_json=json.dumps(self._info))
        if metric.needs_he:
            comps = metric.components(self._option, self._params, self._info)
            ints = []
            for c, comp in enumerate(comps):
                try:
                    ints.append(comp.quantize(rows.values[order, c]))
                except EncodingOverflowError as exc:
                    raise InputError(str(exc), file=file) from None
            self._layout = metric.layout(self._option, self._params, self._info, n_rows=n, n_units=hello.buckets,
                                         recipient=hello.result_recipient, modulus_bits=self._modulus_bits)
            matrix = np.column_stack(ints) if all(i.dtype != object for i in ints) else \
                np.array([list(r) for r in zip(*ints)], dtype=object)
            self._values = self._layout.pack(matrix)
            del ints, matrix
            self._progress("keygen", 0, 0)
            self._paillier = paillier.generate_keypair(self._modulus_bits, allow_insecure=self._allow_insecure)
            ack.paillier_n, ack.paillier_h = self._paillier.public.to_bytes()
            ack.slot_bits, ack.slots = self._layout.slot_bits, self._layout.slots
        del rows
        self._com_key = commutative.CommutativeKey.generate()
        share = secrets.token_bytes(32)
        self._salt = commutative.session_salt(hello.salt_share, share)
        ack.salt_share = share
        self.phase = Phase.WAIT_TESTER_ROWS
        self._reader = wire.TableReader(wire.tester_rows(hello.sealed_width))
        self._lap("keygen_and_load")
        return [pb.PeerMessage(hello_ack=ack)]

    # ---------------------------------------------------------------- steps 3-4
    def _on_chunk(self, chunk: pb.TableChunk, rows: validation.Rows) -> list[pb.PeerMessage]:
        if self.phase is Phase.WAIT_TESTER_ROWS:
            doubled = self._com_key.encrypt_points(rows.points)
            self._doubled.append(doubled)
            self._sealed.append(chunk.sealed)
            self._progress("double_encrypt", self._reader.rows, 0)
        else:
            self._aggregates += rows.ciphertexts
        return []

    def _on_table_end(self, end: pb.TableEnd, _: None) -> Iterable[pb.PeerMessage]:
        if self.phase is Phase.WAIT_TESTER_ROWS:
            return self._send_tables()
        if self.phase is Phase.WAIT_SQUARE_REQUEST:
            return self._square()
        return self._finish()

    def _encrypt_own_ids(self) -> bytes:
        """Com.Enc_sk2(RO(id)) of every id slot of every row, each distinct member once."""
        n = len(self._ids[0])
        n_ids = len(self._ids)
        flat = np.empty(n * n_ids, dtype=object)
        for s, ids in enumerate(self._ids):
            flat[s::n_ids] = ids
        codes, unique = pd.factorize(pd.Series(flat, dtype=object))
        unique = [str(u) for u in unique]
        parts = []
        for start in range(0, len(unique), ID_STEP_ROWS):
            stop = min(len(unique), start + ID_STEP_ROWS)
            hashed = commutative.hash_ids(self._salt, unique[start:stop])
            parts.append(self._com_key.encrypt_points(commutative.split_points(hashed)))
            self._tick("encrypt_ids", stop, len(unique))
        encrypted = commutative.split_points(b"".join(parts))
        del parts, unique
        return b"".join(encrypted[c] for c in codes)

    def _send_tables(self) -> Iterator[pb.PeerMessage]:
        self._progress("shuffle", 0, 0)
        points = commutative.split_points(b"".join(self._doubled))
        width = self._reader.layout.sealed
        sealed = b"".join(self._sealed)
        self._doubled, self._sealed = [], []
        order = list(range(len(points)))
        random.SystemRandom().shuffle(order)
        shuffled_points = b"".join(points[i] for i in order)
        shuffled_sealed = b"".join(sealed[i * width:(i + 1) * width] for i in order)
        del points, sealed, order
        self._lap("psi_double_encrypt_and_shuffle")
        n_tester = len(shuffled_points) // commutative.POINT_BYTES
        yield from wire.table_messages(wire.shuffled_rows(width), n_tester, points=shuffled_points,
                                       sealed=shuffled_sealed)
        del shuffled_points, shuffled_sealed

        metric = self._metric
        n = len(self._ids[0])
        own_points = self._encrypt_own_ids()
        self._ids = None
        self._com_key = None  # SPEC 7: no longer needed once both tables are encrypted
        self._lap("psi_encrypt_own_ids")
        columns = {"points": own_points}
        if self._units is not None:
            columns["units"] = wire.pack_indices(self._units)
        if self._strata is not None:
            columns["strata"] = wire.pack_indices(self._strata)
        self._units = self._strata = None
        width = 0
        n_cts = 0
        if metric.needs_he:
            pub = self._paillier.public
            # signed encoding (SPEC 4): a packed value whose top slot is negative is x + n
            values = [v % pub.n if v < 0 else v for v in self._values]
            self._values = None
            step = wire.rows_per_chunk(pub.ciphertext_bytes)
            tasks = [(pub.n, pub.h, values[i:i + step]) for i in range(0, len(values), step)]
            if len(tasks) < self._executor.chunk_count():
                tasks = [(pub.n, pub.h, part) for part in parallel.split(values, self._executor.chunk_count())]
            ticks = chunk_ticks(len(tasks), partial(self._tick, "he_encrypt"))
            cts = [c for part in self._executor.run_chunks(paillier.encrypt_chunk, tasks, checkpoint=ticks) for c in part]
            del values
            self._lap("he_encrypt_values")
            width, n_cts = pub.ciphertext_bytes, self._layout.n_ciphertexts
            columns["ciphertexts"] = paillier.ciphertexts_to_bytes(cts, width)
            del cts
            self.phase = Phase.WAIT_SQUARE_REQUEST if metric.needs_squares else Phase.WAIT_AGGREGATES_HEADER
            if metric.needs_squares:
                self._reader = wire.TableReader(wire.ciphertext_table(pb.SQUARE_REQUEST, width))
        layout = wire.client_rows(metric.n_ids, n_cts, width, units="units" in columns, strata="strata" in columns)
        yield from wire.table_messages(layout, n, **columns)
        if not metric.needs_he:
            # nothing more to do: P1 computes the statistic from the joined rows alone
            self.phase = Phase.DONE
            self._lap("send_rows")
            self.close()

    # ---------------------------------------------------------------- MQOS-AUC exact
    def _square(self) -> Iterator[pb.PeerMessage]:
        """Decrypt each additively masked value t + r, square it, encrypt the square."""
        key = self._paillier
        pub = key.public
        masked = self._aggregates
        self._aggregates = []
        plain = key.decrypt_mod_p(masked)
        squares = paillier.encrypt_chunk(pub.n, pub.h, [m * m % pub.n for m in plain])
        self.phase = Phase.WAIT_AGGREGATES_HEADER
        self._lap("squares")
        layout = wire.ciphertext_table(pb.SQUARES, pub.ciphertext_bytes)
        yield from wire.table_messages(layout, len(squares),
                                       ciphertexts=paillier.ciphertexts_to_bytes(squares, pub.ciphertext_bytes))

    # ---------------------------------------------------------------- step 7
    def _on_aggregates_header(self, header: pb.AggregatesHeader, plan) -> list[pb.PeerMessage]:
        self._plan = plan
        self._header = header
        self.phase = Phase.WAIT_AGGREGATES
        self._reader = wire.TableReader(wire.ciphertext_table(pb.AGGREGATES, self._paillier.public.ciphertext_bytes))
        self._lap("wait_for_aggregates")
        return []

    def _finish(self) -> list[pb.PeerMessage]:
        header, plan = self._header, self._plan
        # the table's length was checked on arrival (common.validation)
        zero_tests = self._aggregates[len(self._aggregates) - header.zero_tests:]
        self._aggregates = self._aggregates[:len(self._aggregates) - header.zero_tests]
        empty = [i for i, z in enumerate(self._paillier.decrypt_task()(zero_tests)) if z == 0]
        # workers get the narrow decryption task (p and h_p), never the key (common.paillier)
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
        self.phase = Phase.DONE
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
            self.close()
            return out
        layout = encoding.SlotLayout(header.slot_bits, plan.item_slots)
        decoded = []
        for value in signed:
            try:
                decoded.append(layout.unpack(value))
            except EncodingOverflowError:
                raise ProtocolError("an aggregate does not decode: overflow") from None
        values = plan.cell_values(decoded, masked_ratio, plain_rows=header.plain_rows, noise_sd=header.noise_sd,
                                  pseudo_values=header.interval == "random_groups"
                                  and self._metric.interval == "percentile")
        # an empty item of the estimate (its zero test): its cells are undefined, not a ratio of noises
        values = plan.suppress(values, list(header.suppressed_items) + empty)
        report = finish(self._metric, plan, values, option=self._option, confidence=header.confidence,
                        interval=header.interval or self._metric.interval,
                        tau=header.tau, params=self._params, info=self._info, replicates=header.replicates,
                        small_groups=[g for g in header.small_groups if g in header.groups])
        self._lap("finish_statistic")
        self.close()
        return [pb.PeerMessage(client_result=pb.ClientResult(report_json=report.to_json(),
                                                             phase_seconds=self.phase_seconds))]
