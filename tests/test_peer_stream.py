"""Moving PeerMessages between a session and its gRPC stream (common/net/peer_stream.py):
closing an outbox ends its stream after every message already put, never in their
place. A Test-Client whose session ends as soon as its last table is queued (the
probabilistic count: no HE, the Tester computes the result) closes its outbox while
the queue is still full; a close that made room by dropping the oldest message lost a
chunk of the shuffled table, and the Tester refused the audit ("shuffled rows: end
says 100000 rows, 90291 received")."""
from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest

from common.net import peer_stream
from common.protocol import wire
from common.net.channels import LinkSettings
from common.net.peer_stream import QUEUE_MESSAGES, Outbox, ProgressState
from proto import ppre_pb2 as pb


def _outbox(heartbeat_s: float = 60.0) -> Outbox:
    return Outbox(LinkSettings(heartbeat_s=heartbeat_s, peer_timeout_s=5.0), ProgressState(), "peer")


def _chunk(i: int) -> pb.PeerMessage:
    return pb.PeerMessage(table_end=pb.TableEnd(table=pb.SHUFFLED_ROWS, rows=i))


def test_close_sends_every_queued_message_before_the_end():
    outbox = _outbox()
    sent = [_chunk(i) for i in range(QUEUE_MESSAGES)]
    for message in sent:
        outbox.put(message)  # the queue is now full: gRPC has taken nothing yet
    outbox.close()
    assert list(outbox.messages()) == sent


def test_close_ends_a_reader_waiting_on_an_empty_queue():
    outbox = _outbox(heartbeat_s=60.0)
    received: list = []
    reader = threading.Thread(target=lambda: received.extend(outbox.messages()), daemon=True)
    reader.start()
    outbox.put(_chunk(1))
    outbox.close()
    reader.join(30)
    assert not reader.is_alive() and received == [_chunk(1)]  # no heartbeat: the end came at once


def test_a_slow_link_loses_no_row_of_a_metric_that_ends_at_the_test_client(monkeypatch):
    """The probabilistic count through the real services, with small chunks (many
    messages per table) and a link that takes each message slowly, so that the
    Test-Client's outbox is full when its session ends."""
    from ppre import audit_local
    monkeypatch.setattr(wire, "CHUNK_BYTES", 4096)
    plain = Outbox.messages

    def slow(self):
        for message in plain(self):
            time.sleep(0.005)
            yield message

    monkeypatch.setattr(peer_stream.Outbox, "messages", slow)
    rng = np.random.default_rng(5)
    n = 2000
    ids = [f"m{i:05d}" for i in range(n)]
    probabilities = pd.DataFrame(rng.dirichlet(np.full(6, 0.5), n),
                                 columns=["white", "black", "api", "aian", "multiple", "hispanic"])
    probabilities.insert(0, "member_id", ids)
    pools = pd.DataFrame({"member_id": ids, "pool": np.where(np.arange(n) % 2, "a", "b")})
    report = audit_local(pools, probabilities=probabilities, metric="prob-count", release_controls=False,
                         history=False)
    assert report.n_matched == n and {p.members for p in report.pools} == {n // 2}


@pytest.mark.slow
def test_prob_count_at_100000_members_end_to_end(monkeypatch):
    """The probabilistic count on `ppre synth --members 100000` data, without release
    noise (the Tester computes it from the joined rows, so the Test-Client's session ends
    once its rows are sent) and with a link slow enough that the Test-Client's outbox is
    full when its session ends: every row arrives and the audit completes."""
    from ppre import audit_local
    from ppre.synth import SynthConfig, metric_datasets, synthesize
    plain = Outbox.messages

    def slow(self):
        for message in plain(self):
            time.sleep(0.01)
            yield message

    monkeypatch.setattr(peer_stream.Outbox, "messages", slow)
    cfg = SynthConfig(members=100_000, seed=0)
    data = synthesize(cfg)
    pools = metric_datasets(cfg, data)["prob_count"]
    report = audit_local(pools, members=data.members, self_id=data.self_id, metric="prob-count", history=False,
                         release_controls=False)
    assert report.n_matched == 100_000
    assert sum(p.members for p in report.pools if p.group == report.pools[0].group) == 100_000
    assert report.release["controls"] is False
