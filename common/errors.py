"""Errors every layer raises and the services report (design §3.9).

* `InputError`: a local input (file, column, row, parameter) is wrong. The message
  names the place; it never contains a member id, a probability or a test value.
* `ProtocolError`: the peer sent something the protocol does not allow (wrong phase,
  garbage bytes, points off the curve, ciphertexts out of range, oversized tables).
* `EncodingOverflowError`: a fixed-point / signed value does not fit its plaintext
  slot (design §4.3: detected and reported, never wrapped).
* `PeerTimeoutError`, `ShuttingDownError`, `BusyError`: the audit could not go on
  (stalled peer or cut link, a service stopping, a full session limit).

Each class's `code` is what the operator sees (`{"error": {"code": ...}}`).
"""
from __future__ import annotations


class PPREError(Exception):
    """Base class of every error this project raises on purpose."""

    code = "error"


class InputError(PPREError, ValueError):
    """A local input is wrong: names the file, column, row or parameter. A row is said
    as "data row N", numbered from 1 at the first record after the header (in a CSV
    file without blank lines: line N + 1, as an editor numbers it)."""

    code = "bad_input"

    def __init__(self, message: str, *, file: str | None = None, column: str | None = None,
                 row: int | None = None, parameter: str | None = None) -> None:
        where = []
        if file is not None:
            where.append(f"file {file}")
        if column is not None:
            where.append(f"column '{column}'")
        if row is not None:
            where.append(f"data row {row}")
        if parameter is not None:
            where.append(f"parameter '{parameter}'")
        full = f"{', '.join(where)}: {message}" if where else message
        super().__init__(full)
        self.file, self.column, self.row, self.parameter = file, column, row, parameter


class ProtocolError(PPREError):
    """The peer broke the protocol; the session is aborted and its state dropped."""

    code = "protocol_error"


class PeerAborted(ProtocolError):
    """The peer aborted the session with its own Abort message: carries its code and
    message (never answered with another Abort)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class EncodingOverflowError(PPREError, OverflowError):
    """A value does not fit its plaintext range or slot."""

    code = "overflow"


class PeerTimeoutError(PPREError):
    """The peer sent nothing (not even a heartbeat) for longer than the peer timeout, or
    stopped reading what we send: it is stalled, or the link between the parties is cut."""

    code = "deadline_exceeded"


class ShuttingDownError(PPREError):
    """This service (or its peer) is stopping; running audits end with this error."""

    code = "shutting_down"


class BusyError(PPREError):
    """The service already runs as many audits as its session limit allows."""

    code = "resource_exhausted"
