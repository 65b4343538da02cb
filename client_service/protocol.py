"""The Test-Client's (P2's) side of one audit session, free of I/O (SPEC.md section 3).

`ClientSession.receive(msg)` consumes one message from the Tester and returns the
messages to send back; the gRPC servicer (`client_service.server`) only moves them.

P2's steps: 1 fresh commutative key sk2 and Paillier key pair, salt share; 3 doubly
encrypt P1's ids, shuffle the rows (with their sealed probability vectors) and send
them back; 4 send its own rows (Com.Enc_sk2(RO(id)), HE.Enc(f + 2^S d)) with the public
key, computing the metric's values in plaintext first; 7 decrypt the masked aggregates
and either finish the statistic (P2 learns it) or return the masked plaintexts.
"""
from __future__ import annotations

import enum
import random
import secrets
from functools import partial
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from common import bootstrap, commutative, encoding, paillier, parallel
from common.session import PhaseClock, chunk_ticks, expect_phase
from common.errors import EncodingOverflowError, InputError, PeerAborted, ProtocolError
from common.estimators import RatioMetric, get_metric
from common.masking import masked_ratio
from common.report import GroupResult
from common.symmetric import sealed_width
from common.wire import TableReader, rows_per_chunk, table_messages
from proto import ppre_pb2 as pb

PROTOCOL_VERSION = 1
#: (f, d) are packed as f + 2^S d with S = slot_bits(modulus); masked aggregates must fit a
#: slot, and both slots must stay below p/3 (decryption works modulo p).
MAX_SLOT_BITS = 448


def slot_bits(modulus_bits: int) -> int:
    return min(MAX_SLOT_BITS, (modulus_bits // 2 - 8) // 2)
MAX_GROUPS = 64
MAX_REPLICATES = 100_000

DatasetLoader = Callable[[str, RatioMetric], pd.DataFrame]
#: own ids hashed and encrypted per step of step 4 (a checkpoint and a progress report each)
ID_STEP_ROWS = 32_768


class Phase(enum.Enum):
    WAIT_HELLO = "wait_hello"
    WAIT_TESTER_ROWS = "wait_tester_rows"
    WAIT_AGGREGATES_HEADER = "wait_aggregates_header"
    WAIT_AGGREGATES = "wait_aggregates"
    DONE = "done"
    CLOSED = "closed"


class ClientSession:
    def __init__(self, load_dataset: DatasetLoader, *, modulus_bits: int = paillier.MIN_MODULUS_BITS,
                 allow_insecure: bool = False, checkpoint: Callable[[], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        """`checkpoint()` runs between chunks of the long steps (encryption, decryption);
        whatever it raises ends the session (the servicer stops work for a Tester that left,
        or when it shuts down). `progress(phase, done, total)` reports what the session is
        busy with (the servicer's heartbeats carry it to the Tester)."""
        self._load_dataset = load_dataset
        self._checkpoint = checkpoint
        self._progress = progress or (lambda phase, done, total: None)
        self._modulus_bits = modulus_bits
        self._allow_insecure = allow_insecure
        self.phase = Phase.WAIT_HELLO
        self._clock = PhaseClock()
        self.phase_seconds = self._clock.seconds
        self.dataset = ""
        self._hello: pb.Hello | None = None
        self._com_key: commutative.CommutativeKey | None = None
        self._paillier: paillier.PrivateKey | None = None
        self._ids: list[str] | None = None
        self._values: list[int] | None = None
        self._salt: bytes | None = None
        self._reader: TableReader | None = None
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
        self._doubled = []
        self._sealed = []
        self._aggregates = []
        if self.phase is not Phase.DONE:
            self.phase = Phase.CLOSED

    def receive(self, msg: pb.PeerMessage) -> Iterable[pb.PeerMessage]:
        kind = msg.WhichOneof("body")
        handler = {
            "hello": self._on_hello,
            "chunk": self._on_chunk,
            "table_end": self._on_table_end,
            "aggregates_header": self._on_aggregates_header,
        }.get(kind)
        if kind == "abort":
            raise PeerAborted(msg.abort.code or "peer_error", f"the Tester aborted: {msg.abort.message}")
        if handler is None:
            raise ProtocolError(f"unexpected message '{kind}' from the Tester")
        return handler(getattr(msg, kind))

    # ---------------------------------------------------------------- step 1
    def _on_hello(self, hello: pb.Hello) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_HELLO)
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
        try:
            metric = get_metric(hello.metric)
        except InputError:
            raise ProtocolError("the Tester asked for a metric this Test-Client does not know") from None
        option = hello.metric_option or metric.options[0]
        if option not in metric.options:
            raise ProtocolError(f"the Tester asked for '{option}', which is not an option of {metric.name}")
        self._progress("load_dataset", 0, 0)
        frame = self._load_dataset(hello.client_dataset, metric)
        f, d = metric.values(frame, option)
        bound = metric.value_bound
        if len(f) and max(int(np.abs(f).max()), int(np.abs(d).max())) > bound:
            raise InputError(f"the {metric.name} values computed from the dataset exceed the metric's bound "
                             f"{bound}", file=hello.client_dataset)
        self.dataset = hello.client_dataset
        self._ids = frame["member_id"].astype(str).tolist()
        self._slot_bits = slot_bits(self._modulus_bits)
        self._values = [int(a) + (int(b) << self._slot_bits) for a, b in zip(f.tolist(), d.tolist())]
        del frame, f, d
        self._hello = hello
        self._progress("keygen", 0, 0)
        self._com_key = commutative.CommutativeKey.generate()
        self._paillier = paillier.generate_keypair(self._modulus_bits, allow_insecure=self._allow_insecure)
        share = secrets.token_bytes(32)
        self._salt = commutative.session_salt(hello.salt_share, share)
        n_bytes, h_bytes = self._paillier.public.to_bytes()
        self.phase = Phase.WAIT_TESTER_ROWS
        self._reader = TableReader(pb.TESTER_ROWS, point_width=commutative.POINT_BYTES,
                                   sealed_width=hello.sealed_width)
        self._lap("keygen_and_load")
        return [pb.PeerMessage(hello_ack=pb.HelloAck(salt_share=share, paillier_n=n_bytes, paillier_h=h_bytes,
                                                     slot_bits=self._slot_bits, value_bound=metric.value_bound))]

    # ---------------------------------------------------------------- steps 3-4
    def _on_chunk(self, chunk: pb.TableChunk) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_TESTER_ROWS, Phase.WAIT_AGGREGATES)
        self._reader.check_chunk(chunk)
        if self.phase is Phase.WAIT_TESTER_ROWS:
            doubled = self._com_key.encrypt_packed(chunk.points)
            self._doubled.append(doubled)
            self._sealed.append(chunk.sealed)
            self._progress("double_encrypt", self._reader.rows, 0)
        else:
            self._aggregates += paillier.ciphertexts_from_bytes(chunk.ciphertexts, self._paillier.public)
        return []

    def _on_table_end(self, end: pb.TableEnd) -> Iterable[pb.PeerMessage]:
        self._expect(Phase.WAIT_TESTER_ROWS, Phase.WAIT_AGGREGATES)
        self._reader.check_end(end)
        if self.phase is Phase.WAIT_TESTER_ROWS:
            return self._send_tables()
        return self._finish()

    def _send_tables(self) -> Iterator[pb.PeerMessage]:
        self._progress("shuffle", 0, 0)
        points = commutative.split_points(b"".join(self._doubled))
        width = self._reader.sealed_width
        sealed = b"".join(self._sealed)
        self._doubled, self._sealed = [], []
        order = list(range(len(points)))
        random.SystemRandom().shuffle(order)
        shuffled_points = b"".join(points[i] for i in order)
        shuffled_sealed = b"".join(sealed[i * width:(i + 1) * width] for i in order)
        del points, sealed, order
        self._lap("psi_double_encrypt_and_shuffle")
        n_tester = len(shuffled_points) // commutative.POINT_BYTES
        yield from table_messages(pb.SHUFFLED_ROWS, n_tester, points=shuffled_points,
                                  point_width=commutative.POINT_BYTES, sealed=shuffled_sealed, sealed_width=width)
        del shuffled_points, shuffled_sealed

        ids, values = self._ids, self._values
        self._ids = self._values = None
        pub = self._paillier.public
        parts = []
        for start in range(0, len(ids), ID_STEP_ROWS):
            stop = min(len(ids), start + ID_STEP_ROWS)
            hashed = commutative.hash_ids(self._salt, ids[start:stop])
            parts.append(self._com_key.encrypt_points(commutative.split_points(hashed)))
            self._tick("encrypt_ids", stop, len(ids))
        own_points = b"".join(parts)
        del ids, parts
        self._com_key = None  # SPEC 7: no longer needed once both tables are encrypted
        self._lap("psi_encrypt_own_ids")
        step = rows_per_chunk(pub.ciphertext_bytes)
        tasks = [(pub.n, pub.h, values[i:i + step]) for i in range(0, len(values), step)]
        if len(tasks) < parallel.chunk_count():
            tasks = [(pub.n, pub.h, part) for part in parallel.split(values, parallel.chunk_count())]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "he_encrypt"))
        cts = [c for part in parallel.run_chunks(paillier.encrypt_chunk, tasks, checkpoint=ticks) for c in part]
        del values
        self._lap("he_encrypt_values")
        self.phase = Phase.WAIT_AGGREGATES_HEADER
        yield from table_messages(pb.CLIENT_ROWS, len(cts), points=own_points, point_width=commutative.POINT_BYTES,
                                  ciphertexts=paillier.ciphertexts_to_bytes(cts, pub.ciphertext_bytes),
                                  ciphertext_width=pub.ciphertext_bytes)

    # ---------------------------------------------------------------- step 7
    def _on_aggregates_header(self, header: pb.AggregatesHeader) -> list[pb.PeerMessage]:
        self._expect(Phase.WAIT_AGGREGATES_HEADER)
        if not 1 <= len(header.groups) <= MAX_GROUPS or len(set(header.groups)) != len(header.groups):
            raise ProtocolError("aggregates header: bad group list")
        if not 1 <= header.replicates <= MAX_REPLICATES or not 0 < header.confidence < 1:
            raise ProtocolError("aggregates header: bad bootstrap parameters")
        if header.slot_bits != self._slot_bits:
            raise ProtocolError("aggregates header: slot width differs from the one announced")
        expected_mask = "ratio" if self._hello.result_recipient == "client" else "additive"
        if header.mask != expected_mask:
            raise ProtocolError("aggregates header: mask does not match the agreed result recipient")
        self._header = header
        self.phase = Phase.WAIT_AGGREGATES
        self._reader = TableReader(pb.AGGREGATES, ciphertext_width=self._paillier.public.ciphertext_bytes)
        self._lap("wait_for_aggregates")
        return []

    def _finish(self) -> list[pb.PeerMessage]:
        header = self._header
        k = len(header.groups)
        expected = (header.replicates + 1) * k
        if len(self._aggregates) != expected:
            raise ProtocolError(f"{len(self._aggregates)} aggregates received, {expected} expected")
        key = self._paillier
        parts = parallel.split(self._aggregates, parallel.chunk_count(parallel.CHECKPOINT_CHUNKS))
        tasks = [(key.p, key.q, part) for part in parts]
        ticks = chunk_ticks(len(tasks), partial(self._tick, "decrypt"))
        plain = [m for part in parallel.run_chunks(paillier.decrypt_mod_p_chunk, tasks, checkpoint=ticks)
                 for m in part]
        signed = [encoding.decode_signed(m, key.p) for m in plain]
        self._aggregates = []
        self._lap("decrypt")
        self.phase = Phase.DONE
        if header.mask == "additive":
            width = max(1, max((v.bit_length() + 8) // 8 for v in signed))
            out = []
            step = rows_per_chunk(width)
            for i in range(0, len(signed), step):
                part = signed[i:i + step]
                out.append(pb.PeerMessage(masked_plaintexts=pb.MaskedPlaintexts(
                    values=b"".join(v.to_bytes(width, "big", signed=True) for v in part), width=width,
                    last=i + step >= len(signed), phase_seconds=self.phase_seconds if i + step >= len(signed) else {})))
            self.close()
            return out
        layout = encoding.SlotLayout(self._slot_bits, 2)
        ratios = np.full((header.replicates + 1, k), np.nan)
        for idx, value in enumerate(signed):
            try:
                a, b = layout.unpack(value)
            except EncodingOverflowError:
                raise ProtocolError("an aggregate does not decode: overflow") from None
            r = masked_ratio(a, b)
            if r is not None:
                ratios[divmod(idx, k)] = r
        low, high = bootstrap.percentile_interval(ratios[1:], header.confidence)
        groups = [GroupResult.from_values(g, ratios[0, j], low[j], high[j]).to_proto()
                  for j, g in enumerate(header.groups)]
        self._lap("finish_statistic")
        self.close()
        return [pb.PeerMessage(client_result=pb.ClientResult(groups=groups, phase_seconds=self.phase_seconds))]
