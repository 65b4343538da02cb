"""Chunked tables on the wire (design §3.8).

Every table crosses the wire as TableChunk messages of at most `CHUNK_BYTES`, then one
TableEnd carrying the row count. Fixed-width columns are packed back to back, so a
million-row table is a sequence of ~1 MiB messages and never one large message.
`TableReader` checks a received table's chunks: right table, consistent widths, row
counts against the announced total (`expected`) or a cap; `common.protocol.validation` calls it
(with the totals each party knows) before any handler sees a chunk.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from common.crypto.commutative import POINT_BYTES
from common.errors import ProtocolError
from proto import ppre_pb2 as pb

CHUNK_BYTES = 1 << 20
#: gRPC message cap both services configure; chunks stay far below it.
MAX_MESSAGE_BYTES = 8 << 20
#: most rows a peer may send in one table (refuse memory exhaustion by a peer)
MAX_TABLE_ROWS = 50_000_000

TABLE_NAMES = {pb.TESTER_ROWS: "tester rows", pb.SHUFFLED_ROWS: "shuffled rows",
               pb.CLIENT_ROWS: "client rows", pb.AGGREGATES: "aggregates",
               pb.SQUARE_REQUEST: "square requests", pb.SQUARES: "squares",
               pb.MEMBER_POINTS: "member points", pb.MEMBER_VECTORS: "member vectors",
               pb.BLIND_TOTALS: "masked totals"}


def parse_peer_message(data: bytes) -> pb.PeerMessage:
    """Decode one PeerMessage ourselves, so that bytes which are not one become a
    clean ProtocolError the session can answer with an Abort (gRPC's own decoder would
    fail the whole call with INTERNAL instead, and in grpcio 1.85 a server whose call
    failed that way can hang in `stop()`)."""
    message = pb.PeerMessage()
    try:
        message.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError, or others on odd bytes
        raise ProtocolError("the peer sent bytes that are not a PeerMessage") from exc
    if message.WhichOneof("body") is None:
        raise ProtocolError("the peer sent an empty PeerMessage")
    return message


def rows_per_chunk(row_bytes: int) -> int:
    return max(1, CHUNK_BYTES // max(1, row_bytes))


#: the columns a TableChunk may carry, in order (proto/ppre.proto, TableChunk)
COLUMNS = ("points", "sealed", "ciphertexts", "units", "strata", "tester_ciphertexts")
#: bytes of one unit or stratum value (big-endian unsigned)
INDEX_BYTES = 4


@dataclass(frozen=True)
class TableLayout:
    """One table's columns and their widths in bytes per row (0: the column is absent).

    Every table of the protocol is declared by the functions below; `table_messages`
    sends one and `TableReader` checks one against its layout."""

    table: int
    points: int = 0
    sealed: int = 0
    ciphertexts: int = 0
    units: int = 0
    strata: int = 0
    tester_ciphertexts: int = 0

    def width(self, column: str) -> int:
        return getattr(self, column)

    @property
    def row_bytes(self) -> int:
        return sum(self.width(c) for c in COLUMNS)


def tester_rows(sealed_width: int) -> TableLayout:
    """Step 2: Com.Enc_sk1(RO(id)), Sym.Enc(race_p)."""
    return TableLayout(pb.TESTER_ROWS, points=POINT_BYTES, sealed=sealed_width)


def shuffled_rows(sealed_width: int) -> TableLayout:
    """Step 3: the Tester's rows doubly encrypted and shuffled."""
    return TableLayout(pb.SHUFFLED_ROWS, points=POINT_BYTES, sealed=sealed_width)


def client_rows(n_ids: int, n_ciphertexts: int, ciphertext_bytes: int, *, units: bool, strata: bool) -> TableLayout:
    """Step 4: each row's member ids (Com.Enc_sk2(RO(id)), one per id slot), its encrypted
    values, and where the metric has them its resampling bucket and plaintext stratum."""
    return TableLayout(pb.CLIENT_ROWS, points=n_ids * POINT_BYTES, ciphertexts=n_ciphertexts * ciphertext_bytes,
                       units=INDEX_BYTES if units else 0, strata=INDEX_BYTES if strata else 0)


def member_points() -> TableLayout:
    """LOT under release noise (design §5.3, "The Tester blind to the pairs"): each of the
    Test-Client's members once, Com.Enc_sk2(RO(id)), in a secret random order."""
    return TableLayout(pb.MEMBER_POINTS, points=POINT_BYTES)


def member_vectors(n_ciphertexts: int, ciphertext_bytes: int) -> TableLayout:
    """The Tester's answer to `member_points`, row for row: HE_T.Enc of the member's
    probability vector (zeros where it did not join) under the Tester's own key."""
    return TableLayout(pb.MEMBER_VECTORS, ciphertexts=n_ciphertexts * ciphertext_bytes)


def blind_client_rows(n_tester_cts: int, tester_ct_bytes: int, n_cts: int, ct_bytes: int) -> TableLayout:
    """Step 4 of LOT under release noise: per row of `member_points`, in its order and
    without ids, the masked sums HE_T.Enc(z + r) per rank pair."""
    return TableLayout(pb.CLIENT_ROWS, ciphertexts=n_cts * ct_bytes, tester_ciphertexts=n_tester_cts * tester_ct_bytes)


def blind_totals(n_tester_cts: int, tester_ct_bytes: int, n_cts: int, ct_bytes: int) -> TableLayout:
    """Then, per rank pair: the masks' totals HE_T.Enc(Σ_a w_a·r + m) under the Tester's
    key and the item masks HE.Enc(m) under the Test-Client's (`tester_service.blind_pairs`)."""
    return TableLayout(pb.BLIND_TOTALS, ciphertexts=n_cts * ct_bytes, tester_ciphertexts=n_tester_cts * tester_ct_bytes)


def ciphertext_table(table: int, ciphertext_bytes: int) -> TableLayout:
    """Aggregates (step 6) and the squares round trip: one ciphertext per row."""
    return TableLayout(table, ciphertexts=ciphertext_bytes)


def pack_indices(values) -> bytes:
    import numpy as np
    return np.asarray(values, dtype=">u4").tobytes()


def unpack_indices(data: bytes):
    import numpy as np
    return np.frombuffer(data, dtype=">u4").astype(np.int64)


def chunk_messages(layout: TableLayout, n_rows: int, **columns: bytes) -> Iterator[pb.PeerMessage]:
    """Cut `n_rows` rows of packed columns (named as in COLUMNS) into TableChunk messages
    of at most `CHUNK_BYTES`: one part of a table that is streamed as it is produced."""
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}")
    step = rows_per_chunk(layout.row_bytes)
    for start in range(0, n_rows, step):
        end = min(n_rows, start + step)
        parts = {c: columns.get(c, b"")[start * layout.width(c):end * layout.width(c)] for c in COLUMNS}
        yield pb.PeerMessage(chunk=pb.TableChunk(table=layout.table, rows=end - start, **parts))


def table_end(layout: TableLayout, n_rows: int) -> pb.PeerMessage:
    return pb.PeerMessage(table_end=pb.TableEnd(table=layout.table, rows=n_rows))


def table_messages(layout: TableLayout, n_rows: int, **columns: bytes) -> Iterator[pb.PeerMessage]:
    """A whole table: its chunks, then a TableEnd."""
    yield from chunk_messages(layout, n_rows, **columns)
    yield table_end(layout, n_rows)


@dataclass
class TableReader:
    """Accepts the chunks of one expected table and checks them against its layout."""

    layout: TableLayout
    rows: int = 0
    done: bool = False
    _name: str = field(init=False)

    def __post_init__(self) -> None:
        self._name = TABLE_NAMES.get(self.layout.table, str(self.layout.table))

    @property
    def table(self) -> int:
        return self.layout.table

    def check_chunk(self, chunk: pb.TableChunk, *, expected: int | None = None,
                    at_most: int = MAX_TABLE_ROWS) -> None:
        """Check one chunk and count its rows: `expected` is the table's announced total
        (more rows are refused as they arrive, not at the end), `at_most` a cap where
        nothing was announced."""
        if chunk.table != self.table:
            raise ProtocolError(f"expected a chunk of {self._name}, got table {chunk.table}")
        if self.done:
            raise ProtocolError(f"chunk of {self._name} after its end")
        n = chunk.rows
        if n == 0:
            raise ProtocolError(f"empty chunk of {self._name}")
        for column in COLUMNS:
            data = getattr(chunk, column)
            if len(data) != n * self.layout.width(column):
                raise ProtocolError(f"chunk of {self._name}: {column} column has {len(data)} bytes for {n} rows")
        self.rows += n
        limit = min(at_most, MAX_TABLE_ROWS)
        if expected is not None and self.rows > expected:
            raise ProtocolError(f"{self._name}: more than the {expected} rows announced")
        if self.rows > limit:
            raise ProtocolError(f"{self._name} exceed {limit} rows")

    def check_end(self, end: pb.TableEnd, *, expected: int | None = None) -> None:
        if end.table != self.table:
            raise ProtocolError(f"expected the end of {self._name}, got table {end.table}")
        if self.done:
            raise ProtocolError(f"second end of {self._name}")
        if end.rows != self.rows:
            raise ProtocolError(f"{self._name}: end says {end.rows} rows, {self.rows} received")
        if expected is not None and self.rows != expected:
            raise ProtocolError(f"{self._name}: {self.rows} rows received, {expected} announced")
        self.done = True
