"""Both parties' phases and, per party, the one table of what moves a session between
them (design §3), in the manner of h11.

A key of a table is (phase, event): an event is the kind of a message from the peer
(`PeerMessage`'s body: "hello_ack", "chunk", ...) or "start", the Tester's first step. Its
value is the session's handler for it and the phases the step may lead to. The keys are
also the accept rules: a phase accepts exactly the peer's kinds it has a key for
(`accepts`, which the gate of `common.protocol.validation` applies before any content is
read; "abort" and "heartbeat" are accepted in every phase); every other message is a
`PhaseError` there.

`Transitions.run` is the one place a phase changes: it calls the handler with the
message and what its validator returned, and enters the next phase once the handler's
messages are all out (a list at once, a stream when it is exhausted), so a step that
fails leaves the phase where it was. Where a step has more than one outcome (the metric's
path, the last chunk or not), its handler says which with a `Step`; an outcome the table
does not list is a programming error. Entering "done" closes the session (its keys and
member-level data are dropped); `close` moves any other phase to "closed". The error
state is the gate's: once a session failed, it refuses everything, in any phase.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from common.protocol.session import PhaseError


class TesterPhase(enum.Enum):
    START = "start"
    WAIT_HELLO_ACK = "wait_hello_ack"
    WAIT_SHUFFLED = "wait_shuffled"
    WAIT_MEMBERS = "wait_members"
    WAIT_CLIENT_ROWS = "wait_client_rows"
    WAIT_TOTALS = "wait_totals"
    WAIT_SQUARES = "wait_squares"
    WAIT_RESULT = "wait_result"
    DONE = "done"
    CLOSED = "closed"


class ClientPhase(enum.Enum):
    WAIT_HELLO = "wait_hello"
    WAIT_TESTER_ROWS = "wait_tester_rows"
    WAIT_MEMBER_VECTORS = "wait_member_vectors"
    WAIT_SQUARE_REQUEST = "wait_square_request"
    WAIT_AGGREGATES_HEADER = "wait_aggregates_header"
    WAIT_AGGREGATES = "wait_aggregates"
    DONE = "done"
    CLOSED = "closed"


#: events that are no message from the peer
LOCAL_EVENTS = frozenset({"start"})


@dataclass(frozen=True)
class Transition:
    """The session's method for an event in a phase, and the phases it may lead to."""

    handler: str
    next: tuple[enum.Enum, ...]


@dataclass(frozen=True)
class Step:
    """A handler's answer where its transition has more than one outcome: the next
    phase (one of the table's) and the messages to send."""

    next: enum.Enum
    messages: Iterable[Any]


class Transitions:
    """One party's table (module docstring) and its dispatch."""

    def __init__(self, initial: enum.Enum, table: Mapping[tuple[enum.Enum, str], Transition]) -> None:
        self.initial = initial
        self.table = dict(table)
        phases = type(initial)
        self.done, self.closed = phases.DONE, phases.CLOSED
        #: which message kinds from the peer each phase accepts (by the phase's value)
        self.accepts: Mapping[str, frozenset[str]] = {
            phase.value: kinds for phase in phases
            if (kinds := frozenset(e for p, e in self.table if p is phase and e not in LOCAL_EVENTS))}

    def run(self, session, event: str, *args) -> Iterable[Any]:
        """Call the handler of `event` in `session`'s phase with `args`; its messages, after
        which the session is in the next phase."""
        transition = self.table.get((session.phase, event))
        if transition is None:
            raise PhaseError(f"message not allowed in phase {session.phase.value}")
        out = getattr(session, transition.handler)(*args)
        if isinstance(out, Step):
            out, phase = out.messages, out.next
        elif len(transition.next) == 1:
            phase = transition.next[0]
        else:
            raise RuntimeError(f"{transition.handler} did not say which of its phases comes next")
        if phase not in transition.next:
            raise RuntimeError(f"{transition.handler} may not lead to phase {phase.value}")
        if isinstance(out, list):
            self._enter(session, phase)
            return out
        return self._then(session, out, phase)

    def _then(self, session, messages: Iterable[Any], phase: enum.Enum) -> Iterator[Any]:
        yield from messages
        self._enter(session, phase)

    def _enter(self, session, phase: enum.Enum) -> None:
        session.phase = phase
        if phase is self.done:
            session.close()

    def close(self, session) -> None:
        """However the session ended: "closed", unless it is done."""
        if session.phase is not self.done:
            session.phase = self.closed


T, C = TesterPhase, ClientPhase

#: The Tester (P1): steps 1-7 of design §3; LOT's blind path through the member table and
#: the masked totals (`common.metrics.lot`), MQOS-AUC exact through the squares (design §5.6).
TESTER = Transitions(T.START, {
    (T.START, "start"): Transition("_hello", (T.WAIT_HELLO_ACK,)),
    (T.WAIT_HELLO_ACK, "hello_ack"): Transition("_on_hello_ack", (T.WAIT_SHUFFLED,)),
    (T.WAIT_SHUFFLED, "chunk"): Transition("_on_shuffled_chunk", (T.WAIT_SHUFFLED,)),            # step 3
    (T.WAIT_SHUFFLED, "table_end"): Transition("_on_shuffled_end", (T.WAIT_CLIENT_ROWS, T.WAIT_MEMBERS)),
    (T.WAIT_MEMBERS, "chunk"): Transition("_on_member_chunk", (T.WAIT_MEMBERS,)),                # the blind path
    (T.WAIT_MEMBERS, "table_end"): Transition("_member_vectors", (T.WAIT_CLIENT_ROWS,)),
    (T.WAIT_CLIENT_ROWS, "chunk"): Transition("_on_rows_chunk", (T.WAIT_CLIENT_ROWS,)),          # step 4
    (T.WAIT_CLIENT_ROWS, "table_end"): Transition(                                               # steps 5-6
        "_on_rows_end", (T.WAIT_RESULT, T.WAIT_SQUARES, T.WAIT_TOTALS, T.DONE)),
    (T.WAIT_TOTALS, "chunk"): Transition("_on_totals_chunk", (T.WAIT_TOTALS,)),                  # the blind path
    (T.WAIT_TOTALS, "table_end"): Transition("_aggregate_blind", (T.WAIT_RESULT,)),
    (T.WAIT_SQUARES, "chunk"): Transition("_on_squares_chunk", (T.WAIT_SQUARES,)),              # MQOS-AUC exact
    (T.WAIT_SQUARES, "table_end"): Transition("_after_squares", (T.WAIT_RESULT,)),
    (T.WAIT_RESULT, "client_result"): Transition("_on_client_result", (T.DONE,)),               # step 7
    (T.WAIT_RESULT, "masked_plaintexts"): Transition("_on_masked_plaintexts", (T.WAIT_RESULT, T.DONE)),
})

#: The Test-Client (P2): its steps 1, 3-4 and 7 of design §3, the blind path's member
#: vectors and MQOS-AUC exact's square requests between.
CLIENT = Transitions(C.WAIT_HELLO, {
    (C.WAIT_HELLO, "hello"): Transition("_on_hello", (C.WAIT_TESTER_ROWS,)),
    (C.WAIT_TESTER_ROWS, "chunk"): Transition("_on_tester_rows_chunk", (C.WAIT_TESTER_ROWS,)),  # step 3
    (C.WAIT_TESTER_ROWS, "table_end"): Transition(                                               # steps 3-4
        "_on_tester_rows_end", (C.WAIT_AGGREGATES_HEADER, C.WAIT_SQUARE_REQUEST, C.WAIT_MEMBER_VECTORS, C.DONE)),
    (C.WAIT_MEMBER_VECTORS, "chunk"): Transition("_on_member_vectors_chunk", (C.WAIT_MEMBER_VECTORS,)),
    (C.WAIT_MEMBER_VECTORS, "table_end"): Transition("_send_masked_sums", (C.WAIT_AGGREGATES_HEADER,)),
    (C.WAIT_SQUARE_REQUEST, "chunk"): Transition("_on_ciphertexts_chunk", (C.WAIT_SQUARE_REQUEST,)),
    (C.WAIT_SQUARE_REQUEST, "table_end"): Transition("_square", (C.WAIT_AGGREGATES_HEADER,)),
    (C.WAIT_AGGREGATES_HEADER, "aggregates_header"): Transition("_on_aggregates_header", (C.WAIT_AGGREGATES,)),
    (C.WAIT_AGGREGATES, "chunk"): Transition("_on_ciphertexts_chunk", (C.WAIT_AGGREGATES,)),   # step 7
    (C.WAIT_AGGREGATES, "table_end"): Transition("_on_aggregates_end", (C.DONE,)),
})
