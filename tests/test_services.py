"""Both services over real gRPC: the operator RPC, bad inputs, a misbehaving peer, leaks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from client_service.datasets import DatasetRegistry
from common.stats.results import AuditReport
from common.net import channels
from common.crypto import commutative, paillier
from common.races import RACES
from common.crypto.symmetric import RowSealer
from ppre.cli import main as ppre_main
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.inputs import read_probability_table
from tester_service.release import INTERSECTION_REFUSAL
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, free_loopback_port, wait_until, write_inputs

REPO = Path(__file__).resolve().parents[1]


class Recorder(grpc.ServerInterceptor):
    """Records every message of every peer stream, both directions, as serialised bytes."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.stream_stream is None:
            return handler
        inner = handler.stream_stream

        def behaviour(request_iterator, context):
            def requests():
                for r in request_iterator:  # raw bytes: the servicer decodes them itself
                    self.messages.append(r if isinstance(r, bytes) else r.SerializeToString())
                    yield r
            for response in inner(requests(), context):
                self.messages.append(response.SerializeToString())
                yield response

        return grpc.stream_stream_rpc_method_handler(behaviour, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)


@pytest.fixture()
def inputs(tmp_path):
    # 125 joined members: under the release controls the minimum of 100 is checked on a
    # count noised with sd 5 (design §8.2), so 5 sd clear it in all but 3e-7 of the audits
    return write_inputs(tmp_path, 150, 125, seed=12)


def _request(dataset="ero", **kw):
    return pb.AuditRequest(metric=kw.pop("metric", "ero"), client_dataset=dataset, bootstrap=kw.pop("bootstrap", 20),
                           has_seed=True, seed=1, **kw)


def _services(tp, registry, **kw):
    holder = {"path": tp}
    ctx = local_services(lambda: read_probability_table(holder["path"]), registry, modulus_bits=TEST_BITS,
                         allow_insecure=True, **kw, release=NO_RELEASE_CONTROLS)
    return holder, ctx


def test_grpc_audit_records_no_plaintext_and_no_key(inputs, monkeypatch):
    tester, client, tp, cp = inputs
    keys: list[bytes] = []
    orig_com, orig_pai = commutative.CommutativeKey.generate, paillier.generate_keypair

    def com():
        k = orig_com()
        keys.append(k._key.private_bytes_raw())
        return k

    def seal():  # RowSealer.generate, keeping a copy of the key to search the wire for
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        key = AESGCM.generate_key(bit_length=256)
        keys.append(key)
        return RowSealer(AESGCM(key))

    def pai(*a, **kw):
        k = orig_pai(*a, **kw)
        keys.extend(x.to_bytes((x.bit_length() + 7) // 8, "big") for x in (k.p, k.q))
        return k

    monkeypatch.setattr(commutative.CommutativeKey, "generate", staticmethod(com))
    monkeypatch.setattr(RowSealer, "generate", staticmethod(seal))
    monkeypatch.setattr(paillier, "generate_keypair", pai)
    recorder = Recorder()
    _, ctx = _services(tp, DatasetRegistry(named={"ero": cp}), client_interceptors=(recorder,))
    with ctx as svc:
        event = run_audit(svc.tester_address, _request())
        assert event.WhichOneof("event") == "result", event
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])
    assert len(recorder.messages) > 6 and len(keys) == 5  # sk1, sk2, AES key, p, q
    wire = b"".join(recorder.messages)
    for member in list(tester.member_id) + list(client.member_id):
        assert member.encode() not in wire
    for value in tester[list(RACES)].to_numpy().ravel():
        assert np.float64(value).tobytes() not in wire
    for key in keys:
        assert key not in wire


def test_bad_inputs_reach_the_operator_and_services_stay_healthy(inputs, tmp_path):
    tester, client, tp, cp = inputs
    registry = DatasetRegistry(data_dir=tmp_path, named={"ero": cp})
    holder, ctx = _services(tp, registry)

    def write(name, frame):
        path = tmp_path / name
        frame.to_csv(path, index=False)
        return path

    cases = []
    bad = tester.copy()
    bad.loc[4, "black"] += 0.3
    cases.append(("tester", write("sum.csv", bad), "ero", "row 5", "sum to 1"))
    bad = tester.copy()
    bad.loc[2, "white"] = -0.1
    cases.append(("tester", write("neg.csv", bad), "ero", "column 'white', data row 3", "negative"))
    cases.append(("tester", write("misspelt.csv", tester.rename(columns={"hispanic": "hispnic"})), "ero",
                  "column 'hispanic'", "misspelt"))
    bad = tester.copy()
    bad.loc[7, "member_id"] = bad.loc[3, "member_id"]
    cases.append(("tester", write("dup.csv", bad), "ero", "row 8", "duplicate member id"))
    cases.append(("tester", tmp_path / "missing.csv", "ero", "missing.csv", "file not found"))
    bad = client.copy()
    bad.loc[9, "y_pred"] = 2
    write("labels.csv", bad)
    cases.append(("client", tp, "labels", "column 'y_pred', data row 10", "0 or 1"))
    write("nolabel.csv", client.drop(columns=["y_true"]))
    cases.append(("client", tp, "nolabel", "column 'y_true'", "missing"))
    bad = client.copy()
    bad.loc[5, "member_id"] = bad.loc[1, "member_id"]
    write("dupclient.csv", bad)
    cases.append(("client", tp, "dupclient", "row 6", "duplicate"))
    cases.append(("client", tp, "nosuchdataset", "unknown dataset 'nosuchdataset'", "client dataset"))
    write("disjoint.csv", client.assign(member_id=[f"zz{i}" for i in range(len(client))]))

    with ctx as svc:
        for side, prob_path, dataset, where, what in cases:
            holder["path"] = prob_path
            event = run_audit(svc.tester_address, _request(dataset))
            assert event.WhichOneof("event") == "error", (dataset, prob_path)
            assert where in event.error.message and what in event.error.message, event.error.message
            assert event.error.code == "bad_input"
            for member in tester.member_id[:20]:
                assert member not in event.error.message
            assert channels.check_health(svc.tester_address) and channels.check_health(svc.client_address)
            assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])
        event = run_audit(svc.tester_address, _request("disjoint"))  # refused, as a small intersection
        assert (event.error.code, event.error.message) == ("release_refused", INTERSECTION_REFUSAL)
        event = run_audit(svc.tester_address, _request(metric="nonsense"))
        assert event.error.code == "bad_input" and "unknown metric 'nonsense'" in event.error.message
        holder["path"] = tp
        event = run_audit(svc.tester_address, _request())
        assert event.WhichOneof("event") == "result"  # still healthy for the next audit


def test_misbehaving_peer_gets_a_clean_error_over_grpc(inputs):
    _, _, tp, cp = inputs
    _, ctx = _services(tp, DatasetRegistry(named={"ero": cp}))
    with ctx as svc, channels.make_channel(svc.client_address) as channel:
        raw = channel.stream_stream("/ppre.v1.Client/Exchange", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        def replies_and_status(call):  # the Abort first, then the call's status
            replies = []
            try:
                replies.extend(call)
            except grpc.RpcError as exc:
                return replies, exc.code()
            return replies, grpc.StatusCode.OK

        for garbage in (b"\xff\xfe garbage \x00" * 10, b""):  # not a PeerMessage / an empty one
            raw_replies, status = replies_and_status(raw(iter([garbage]), timeout=10))
            replies = [pb.PeerMessage.FromString(b) for b in raw_replies]
            assert len(replies) == 1 and replies[0].abort.code == "protocol_error", replies
            assert "PeerMessage" in replies[0].abort.message
            assert status == grpc.StatusCode.INVALID_ARGUMENT
        typed = channel.stream_stream("/ppre.v1.Client/Exchange",
                                      request_serializer=pb.PeerMessage.SerializeToString,
                                      response_deserializer=pb.PeerMessage.FromString)
        wrong_phase = [pb.PeerMessage(table_end=pb.TableEnd(table=pb.AGGREGATES))]
        replies, status = replies_and_status(typed(iter(wrong_phase), timeout=10))
        assert replies[-1].abort.code == "protocol_error" and "phase" in replies[-1].abort.message
        assert status == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as info:  # an oversized message
            list(typed(iter([pb.PeerMessage(chunk=pb.TableChunk(points=b"\x00" * (9 << 20)))]), timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a stream that stops half-way (missing messages) ends the session cleanly
        hello = pb.PeerMessage(hello=pb.Hello(protocol_version=2, metric="ero", client_dataset="ero", buckets=128,
                                              salt_share=b"\x01" * 32, probability_bits=32,
                                              result_recipient="client", sealed_width=76))
        replies = list(typed(iter([hello]), timeout=20))
        assert replies[0].HasField("hello_ack")
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0)
        assert channels.check_health(svc.client_address)
        event = run_audit(svc.tester_address, _request())
        assert event.WhichOneof("event") == "result"


def test_cli_local_audit_prints_one_json_object(inputs, capsys):
    tester, client, tp, cp = inputs
    code = ppre_main(["audit", "--local", "--no-release-controls", "--metric", "ero", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--bootstrap", "30", "--seed", "4", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)  # exactly one JSON object
    assert report["metric"] == "ero" and report["n_matched"] == 125 and report["bootstrap"] == 30
    assert report["confidence"] == 0.95
    assert [g["group"] for g in report["groups"]] == [*RACES, "overall"]
    for g in report["groups"]:
        assert set(g) >= {"group", "estimate", "ci_low", "ci_high"}
        assert g["ci_low"] <= g["estimate"] <= g["ci_high"]
    code = ppre_main(["audit", "--local", "--no-release-controls", "--metric", "ero", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--bootstrap", "10"])
    out = capsys.readouterr().out
    assert code == 0 and "white" in out and "ci_low" in out and "verdict" in out


def test_cli_reports_bad_input_with_exit_code_2(inputs, capsys):
    _, _, tp, cp = inputs
    code = ppre_main(["audit", "--local", "--metric", "ero", "--tester-probabilities", str(tp) + ".nope",
                      "--client-data", str(cp), "--json"])
    captured = capsys.readouterr()  # --json: the error is the one JSON object on stdout, stderr stays empty
    assert code == 2 and "file not found" in json.loads(captured.out)["error"]["message"] and captured.err == ""


def _start_service_processes(tp, cp, cwd, env, flags: list[str], output):
    """`ppre [flags] client serve` and `ppre [flags] tester serve` on free loopback ports,
    the Tester on probability table `tp`, the Test-Client on dataset `ero` = `cp`:
    ([tester port, client port], tester process, client process)."""
    ports = [free_loopback_port(), free_loopback_port()]
    cmd = [sys.executable, "-m", "ppre.cli", *flags]
    from tests.processes import serve_tls  # mutual TLS with the tests' development CA
    client_p = subprocess.Popen(cmd + ["client", "serve", "--host", "127.0.0.1", "--port", str(ports[1]),
                                       "--dataset", f"ero={cp}", *serve_tls(f"127.0.0.1:{ports[1]}", "client")],
                                cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
    tester_p = subprocess.Popen(cmd + ["tester", "serve", "--host", "127.0.0.1", "--port", str(ports[0]),
                                       "--client", f"127.0.0.1:{ports[1]}", "--probabilities", str(tp), "--ephemeral-budget",
                                       *serve_tls(f"127.0.0.1:{ports[0]}", "tester")],
                                cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
    return ports, tester_p, client_p


@pytest.mark.slow
def test_services_as_processes_write_no_files_and_log_no_member_data(inputs, tmp_path):
    tester, client, tp, cp = inputs
    run_dir = tmp_path / "run"
    (run_dir / "tmp").mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(run_dir / "tmp"), "HOME": str(run_dir), "PYTHONPATH": str(REPO)}
    ports, tester_p, client_p = _start_service_processes(tp, cp, run_dir, env, ["-vv"], subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not (channels.check_health(f"127.0.0.1:{ports[0]}", 1) and channels.check_health(f"127.0.0.1:{ports[1]}", 1)):
            assert time.time() < deadline, "services did not become healthy"
            time.sleep(0.3)
        event = run_audit(f"127.0.0.1:{ports[0]}", _request(bootstrap=20))
        assert event.WhichOneof("event") == "result", event
        # no core dumps (design §7): the services and the worker processes they started
        pids = [tester_p.pid, client_p.pid]
        pids += [int(c) for pid in pids for task in Path(f"/proc/{pid}/task").iterdir()
                 for c in _children(task)]
        checked = 0
        for pid in pids:
            try:
                limits = Path(f"/proc/{pid}/limits").read_text()
            except FileNotFoundError:  # a helper process that has already exited
                continue
            core = next(line for line in limits.splitlines() if line.startswith("Max core file size"))
            assert core.split()[4:6] == ["0", "0"], (pid, core)
            checked += 1
        assert checked > 2, "no worker process of the services was found"
    finally:
        for p in (tester_p, client_p):
            p.terminate()
        try:
            logs = b"".join(p.communicate(timeout=30)[0] for p in (tester_p, client_p))
        finally:  # a service that ignored SIGTERM fails the test but is not left behind
            for p in (tester_p, client_p):
                if p.poll() is None:
                    p.kill()
                    p.communicate(timeout=10)
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert written == [], written
    assert logs, "the services logged nothing at -vv"
    assert b" DEBUG " in logs or b"DEBUG" in logs, "nothing was logged at DEBUG level"
    for member in list(tester.member_id) + list(client.member_id):
        assert member.encode() not in logs
    for value in tester.iloc[:50, 1:].to_numpy().ravel():  # probabilities, as Python would print them
        assert repr(float(value)).encode() not in logs


def test_unreachable_client_is_reported_not_hung(inputs):
    from tester_service.server import TesterConfig
    from tester_service.server import serve as serve_tester
    _, _, tp, _ = inputs
    dead = f"127.0.0.1:{free_loopback_port()}"
    config = TesterConfig(dead, lambda: read_probability_table(tp), min_modulus_bits=TEST_BITS, deadline_s=20, release=NO_RELEASE_CONTROLS)
    server, port, _ = serve_tester(config, 0, host="127.0.0.1")
    try:
        event = run_audit(f"127.0.0.1:{port}", _request(), timeout=60)
        assert event.error.code == "unavailable" and dead in event.error.message
        assert channels.check_health(f"127.0.0.1:{port}")
    finally:
        server.stop(0).wait(10)


def test_garbage_from_the_test_client_is_a_protocol_error_at_the_tester(inputs):
    """A Test-Client that answers with bytes that are not a PeerMessage."""
    from concurrent import futures

    from tester_service.server import TesterConfig
    from tester_service.server import serve as serve_tester
    _, _, tp, _ = inputs

    def exchange(request_iterator, context):
        next(request_iterator)  # the Tester's Hello
        yield b"\x0a\xff\xff\xff garbage"

    fake = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.stream_stream_rpc_method_handler(exchange)
    fake.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ppre.v1.Client",
                                                                       {"Exchange": handler}),))
    fake_port = fake.add_insecure_port("127.0.0.1:0")
    fake.start()
    config = TesterConfig(f"127.0.0.1:{fake_port}", lambda: read_probability_table(tp),
                          min_modulus_bits=TEST_BITS, deadline_s=20, release=NO_RELEASE_CONTROLS)
    server, port, _ = serve_tester(config, 0, host="127.0.0.1")
    try:
        event = run_audit(f"127.0.0.1:{port}", _request(), timeout=60)
        assert event.error.code == "protocol_error" and "PeerMessage" in event.error.message, event
        assert wait_until(lambda: config.sessions == [])
        assert channels.check_health(f"127.0.0.1:{port}")
    finally:
        server.stop(0).wait(10)
        fake.stop(0).wait(10)


@pytest.mark.parametrize("stop_after", ["handshake", "join", "bootstrap"])
def test_operator_cancelling_mid_audit_stops_and_drops_both_sessions(inputs, stop_after):
    """The operator goes away (Ctrl-C) part-way: progress has arrived phase by phase, the
    audit stops at its next checkpoint (no aggregates are computed for nobody), and both
    parties drop their session state."""
    from proto import ppre_pb2_grpc as pb_grpc
    _, _, tp, cp = inputs
    recorder = Recorder()
    _, ctx = _services(tp, DatasetRegistry(named={"ero": cp}), client_interceptors=(recorder,))
    with ctx as svc, channels.make_channel(svc.tester_address) as channel:
        bootstrap = 3000 if stop_after == "join" else 1000  # join: a bootstrap long enough to interrupt
        call = pb_grpc.TesterStub(channel).RunAudit(_request(bootstrap=bootstrap), timeout=120)
        seen = []
        for event in call:
            seen.append(event.progress.phase)
            if event.progress.phase == stop_after:
                break
        assert seen[-1] == stop_after, seen
        call.cancel()
        assert wait_until(lambda: svc.tester_config.sessions == [] and svc.client_servicer.active_sessions == 0,
                          timeout=60), (svc.tester_config.sessions, svc.client_servicer.active_sessions)
        sent = [pb.PeerMessage.FromString(m).WhichOneof("body") for m in recorder.messages]
        assert "client_result" not in sent and "masked_plaintexts" not in sent
        if stop_after != "bootstrap":  # cancelled before the (long) bootstrap could finish
            assert "aggregates_header" not in sent
        assert channels.check_health(svc.tester_address) and channels.check_health(svc.client_address)
        recorder.messages.clear()
        event = run_audit(svc.tester_address, _request())
        assert event.WhichOneof("event") == "result", event


def test_two_concurrent_audits_both_succeed(inputs):
    from concurrent.futures import ThreadPoolExecutor

    tester, client, tp, cp = inputs
    _, ctx = _services(tp, DatasetRegistry(named={"ero": cp}))
    with ctx as svc, ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_audit, svc.tester_address, _request(bootstrap=15)) for _ in range(2)]
        events = [f.result(timeout=120) for f in futures]
        assert all(e.WhichOneof("event") == "result" for e in events), events
        estimates = [[g.estimate for g in AuditReport.from_proto(e.result).groups] for e in events]
        assert np.allclose(estimates[0], estimates[1], atol=1e-9)  # same data, same answer
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])


@pytest.mark.slow
def test_sigterm_always_stops_the_services(inputs, tmp_path):
    """SIGTERM after an audit stops both services, every time (a signal can land on any
    thread; a main thread that waited without a timeout slept through it now and then:
    two runs of this test in three failed before the fix)."""
    _, _, tp, cp = inputs
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(10):
        ports, tester_p, client_p = _start_service_processes(tp, cp, tmp_path, env, [], subprocess.DEVNULL)
        try:
            assert wait_until(lambda: all(channels.check_health(f"127.0.0.1:{p}", 1) for p in ports), 60)
            event = run_audit(f"127.0.0.1:{ports[0]}", _request(bootstrap=10))
            assert event.WhichOneof("event") == "result", event
            t0 = time.monotonic()
            for p in (tester_p, client_p):
                p.terminate()
            assert tester_p.wait(10) == 0 and client_p.wait(10) == 0
            assert time.monotonic() - t0 < 10
        finally:
            for p in (tester_p, client_p):
                if p.poll() is None:
                    p.kill()
                    p.wait(10)


def _children(task: Path) -> list[str]:
    """The child pids a thread started ([] for a thread that ended meanwhile)."""
    try:
        return (task / "children").read_text().split()
    except FileNotFoundError:
        return []
