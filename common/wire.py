"""Chunked tables on the wire (SPEC.md section 3; ROADMAP 2-3).

Every table crosses the wire as TableChunk messages of at most `CHUNK_BYTES`, then one
TableEnd carrying the row count. Fixed-width columns are packed back to back, so a
million-row table is a sequence of ~1 MiB messages and never one large message.
`TableReader` is the one place that checks a received table: right table for the
phase, consistent widths, row counts, size caps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from common.errors import ProtocolError
from proto import ppre_pb2 as pb

CHUNK_BYTES = 1 << 20
#: gRPC message cap both services configure; chunks stay far below it.
MAX_MESSAGE_BYTES = 8 << 20
#: most rows a peer may send in one table (refuse memory exhaustion by a peer)
MAX_TABLE_ROWS = 50_000_000

TABLE_NAMES = {pb.TESTER_ROWS: "tester rows", pb.SHUFFLED_ROWS: "shuffled rows",
               pb.CLIENT_ROWS: "client rows", pb.AGGREGATES: "aggregates"}


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


def table_messages(table: int, n_rows: int, *, points: bytes = b"", point_width: int = 0,
                   sealed: bytes = b"", sealed_width: int = 0, ciphertexts: bytes = b"",
                   ciphertext_width: int = 0) -> Iterator[pb.PeerMessage]:
    """Chunk packed columns into PeerMessages, then a TableEnd."""
    step = rows_per_chunk(point_width + sealed_width + ciphertext_width)
    for start in range(0, n_rows, step):
        end = min(n_rows, start + step)
        yield pb.PeerMessage(chunk=pb.TableChunk(
            table=table, rows=end - start,
            points=points[start * point_width:end * point_width],
            sealed=sealed[start * sealed_width:end * sealed_width],
            ciphertexts=ciphertexts[start * ciphertext_width:end * ciphertext_width]))
    yield pb.PeerMessage(table_end=pb.TableEnd(table=table, rows=n_rows))


@dataclass
class TableReader:
    """Accepts the chunks of one expected table and checks their shape."""

    table: int
    point_width: int = 0
    sealed_width: int = 0
    ciphertext_width: int = 0
    rows: int = 0
    done: bool = False
    _name: str = field(init=False)

    def __post_init__(self) -> None:
        self._name = TABLE_NAMES.get(self.table, str(self.table))

    def check_chunk(self, chunk: pb.TableChunk) -> None:
        if chunk.table != self.table:
            raise ProtocolError(f"expected a chunk of {self._name}, got table {chunk.table}")
        if self.done:
            raise ProtocolError(f"chunk of {self._name} after its end")
        n = chunk.rows
        if n == 0:
            raise ProtocolError(f"empty chunk of {self._name}")
        for data, width, what in ((chunk.points, self.point_width, "points"),
                                  (chunk.sealed, self.sealed_width, "sealed"),
                                  (chunk.ciphertexts, self.ciphertext_width, "ciphertexts")):
            if len(data) != n * width:
                raise ProtocolError(f"chunk of {self._name}: {what} column has {len(data)} bytes for {n} rows")
        self.rows += n
        if self.rows > MAX_TABLE_ROWS:
            raise ProtocolError(f"{self._name} exceed {MAX_TABLE_ROWS} rows")

    def check_end(self, end: pb.TableEnd) -> None:
        if end.table != self.table:
            raise ProtocolError(f"expected the end of {self._name}, got table {end.table}")
        if self.done:
            raise ProtocolError(f"second end of {self._name}")
        if end.rows != self.rows:
            raise ProtocolError(f"{self._name}: end says {end.rows} rows, {self.rows} received")
        self.done = True
