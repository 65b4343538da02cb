"""The parties' tables of transitions (`common.protocol.transitions`): one table per
party, the accept rules derived from it, its handlers there, and the one place a phase
changes."""
from __future__ import annotations

import ast
import pathlib

import pytest

from client_service.protocol import ClientSession
from common.errors import ProtocolError
from common.protocol import transitions, validation
from common.protocol.session import PhaseError
from common.protocol.transitions import CLIENT, TESTER, ClientPhase, Step, Transition, Transitions
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec, TesterSession

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("table, session", [(TESTER, TesterSession), (CLIENT, ClientSession)])
def test_every_handler_of_a_table_is_a_method_of_its_session(table, session):
    assert session.transitions is table
    for (phase, event), transition in table.table.items():
        assert callable(getattr(session, transition.handler, None)), (phase, event, transition.handler)
        assert transition.next and all(isinstance(p, type(table.initial)) for p in transition.next)


def test_the_accept_rules_are_the_tables_keys():
    assert validation.TESTER_ACCEPTS is TESTER.accepts and validation.CLIENT_ACCEPTS is CLIENT.accepts
    assert TESTER.accepts["wait_result"] == {"client_result", "masked_plaintexts"}
    assert CLIENT.accepts["wait_aggregates_header"] == {"aggregates_header"}
    assert set(TESTER.accepts) == {p.value for p in transitions.TesterPhase} - {"start", "done", "closed"}
    assert set(CLIENT.accepts) == {p.value for p in ClientPhase} - {"done", "closed"}
    assert all("start" not in kinds for kinds in TESTER.accepts.values())


def test_every_phase_but_the_last_two_is_reached_and_left():
    for table in (TESTER, CLIENT):
        phases = type(table.initial)
        reached = {table.initial} | {p for t in table.table.values() for p in t.next}
        left = {phase for phase, _ in table.table}
        assert reached == set(phases) - {phases.CLOSED}
        assert left == set(phases) - {phases.DONE, phases.CLOSED}


@pytest.mark.parametrize("module", ["tester_service/protocol.py", "client_service/protocol.py",
                                    "common/protocol/validation.py", "common/protocol/session.py",
                                    "tester_service/release_items.py"])
def test_no_party_module_sets_a_phase_but_at_its_start(module):
    """Phases change in `Transitions` alone; a session only starts in its table's first."""
    tree = ast.parse((ROOT / module).read_text())
    sets = [(node.lineno, ast.unparse(node.value)) for node in ast.walk(tree) if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Attribute) and target.attr == "phase"]
    assert all(value.endswith(".initial") for _, value in sets), sets


class _Session:
    """A stand-in session for the table's dispatch: handlers that record and answer."""

    def __init__(self, phase):
        self.phase, self.closed, self.calls = phase, 0, []

    def close(self):
        self.closed += 1
        TABLE.close(self)

    def one(self, *args):
        self.calls.append(("one", args))
        return ["a"]

    def two(self, *args):
        return Step(ClientPhase.DONE, iter(["b", "c"]))

    def stray(self, *args):
        return Step(ClientPhase.WAIT_AGGREGATES, [])

    def undecided(self, *args):
        return []


C = ClientPhase
TABLE = Transitions(C.WAIT_HELLO, {
    (C.WAIT_HELLO, "hello"): Transition("one", (C.WAIT_TESTER_ROWS,)),
    (C.WAIT_TESTER_ROWS, "table_end"): Transition("two", (C.DONE, C.WAIT_AGGREGATES_HEADER)),
    (C.WAIT_AGGREGATES_HEADER, "aggregates_header"): Transition("stray", (C.DONE,)),
    (C.WAIT_AGGREGATES, "table_end"): Transition("undecided", (C.DONE, C.WAIT_HELLO)),
})


def test_a_list_moves_the_phase_at_once_and_a_stream_once_it_is_out():
    s = _Session(C.WAIT_HELLO)
    assert TABLE.run(s, "hello", 1, 2) == ["a"] and s.phase is C.WAIT_TESTER_ROWS and s.calls == [("one", (1, 2))]
    stream = TABLE.run(s, "table_end")
    assert s.phase is C.WAIT_TESTER_ROWS  # nothing sent yet
    assert next(stream) == "b" and s.phase is C.WAIT_TESTER_ROWS
    assert list(stream) == ["c"] and s.phase is C.DONE and s.closed == 1  # done closes the session
    s.close()
    assert s.phase is C.DONE


def test_an_event_the_phase_has_no_row_for_is_a_phase_error_and_an_outcome_off_the_table_a_bug():
    with pytest.raises(PhaseError, match="^message not allowed in phase wait_hello$"):
        TABLE.run(_Session(C.WAIT_HELLO), "table_end")
    with pytest.raises(RuntimeError, match="may not lead to phase wait_aggregates"):
        TABLE.run(_Session(C.WAIT_AGGREGATES_HEADER), "aggregates_header")
    with pytest.raises(RuntimeError, match="did not say which"):
        TABLE.run(_Session(C.WAIT_AGGREGATES), "table_end")
    s = _Session(C.WAIT_TESTER_ROWS)
    s.close()
    assert s.phase is C.CLOSED


def test_a_failed_session_stays_failed_in_every_phase():
    """The gate's error state sticks: after one refused message, every later one is
    refused, whatever its kind and the phase."""
    from tests.helpers import make_inputs
    tester, _ = make_inputs(20, 20, 10)
    t = TesterSession(AuditSpec(metric="ero", client_dataset="d"), tester)
    t.start()
    with pytest.raises(PhaseError):
        list(t.receive(pb.PeerMessage(client_result=pb.ClientResult())))
    assert t.failed and t.phase is transitions.TesterPhase.WAIT_HELLO_ACK
    for msg in (pb.PeerMessage(hello_ack=pb.HelloAck()), pb.PeerMessage(heartbeat=pb.Heartbeat()),
                pb.PeerMessage(table_end=pb.TableEnd())):
        with pytest.raises(PhaseError, match="already failed"):
            list(t.receive(msg))
    with pytest.raises(PhaseError):
        t.start()
    t.close()
    assert t.phase is transitions.TesterPhase.CLOSED


def test_the_tester_starts_once():
    from tests.helpers import make_inputs
    tester, _ = make_inputs(20, 20, 10)
    t = TesterSession(AuditSpec(metric="ero", client_dataset="d"), tester)
    assert t.phase is TESTER.initial
    hello, = t.start()
    assert hello.WhichOneof("body") == "hello" and t.phase is transitions.TesterPhase.WAIT_HELLO_ACK
    with pytest.raises(ProtocolError, match="not allowed in phase wait_hello_ack"):
        t.start()
    assert transitions.LOCAL_EVENTS == {"start"}
