"""Mutual TLS on every link, allow-listed identities, operator authorisation (common.net.tls).

* `ppre certs init` writes a development CA and the three role certificates (SANs, key
  permissions, kept on a second run);
* an audit runs over mTLS through the local services and through the CLI flags, the
  audit log naming the operator by its certificate identity;
* a peer whose certificate the CA did not sign fails at the TLS handshake (no handler,
  no interceptor sees the call); a CA-signed peer that is not on the allow-list gets
  PERMISSION_DENIED naming its identity before any protocol message (the Tester's
  RunAudit for operators, the Test-Client's Exchange for Testers);
* a service without certificates and without --insecure does not start; --insecure
  says so loudly;
* the identity check itself: every kind of handler guarded before its behaviour runs
  (health alone open), deny by default, any verified name of the peer may be the
  allow-listed one but only exactly, each refusal whole (identity, role, flag) and heard
  by the audit log;
* the development CA: a CA that issues only leaves that cannot issue (usages, names,
  validity whatever the local time zone), its files round trip, and bad TLS material is
  refused naming the file and what is wrong.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from client_service.datasets import DatasetRegistry
from client_service.server import ClientConfig
from client_service.server import serve as serve_client
from common.net import channels, tls
from common.net.tls import DevCA, TlsIdentity
from ppre.cli import main as ppre_main
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.audit_log import AuditLog, verify
from tester_service.inputs import read_probability_table
from tester_service import server as tester_server
from tester_service.server import run_audit
from tests.helpers import CallContext, TEST_BITS, free_loopback_port, wait_until, write_inputs
from tests.processes import child_env, ppre_argv

N, OVERLAP = 160, 130  # above the Tester's minimum intersection


class Probe(grpc.ServerInterceptor):
    """What reaches a server behind its identity check: calls routed to it (`routed`),
    calls whose handler ran (`handled`) and request messages read (`messages`)."""

    def __init__(self) -> None:
        self.routed: list[str] = []
        self.handled: list[str] = []
        self.messages = 0

    def intercept_service(self, continuation, details):
        self.routed.append(details.method)
        handler = continuation(details)
        if handler is None or handler.stream_stream is None:
            return handler
        inner = handler.stream_stream

        def behaviour(request_iterator, context):
            self.handled.append(details.method)

            def counted():
                for r in request_iterator:
                    self.messages += 1
                    yield r
            yield from inner(counted(), context)

        return grpc.stream_stream_rpc_method_handler(behaviour, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)


def _request(**kw) -> pb.AuditRequest:
    return pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=kw.pop("bootstrap", 10), has_seed=True,
                           seed=1, **kw)


@pytest.fixture()
def inputs(tmp_path):
    return write_inputs(tmp_path, N, OVERLAP, seed=21)


@pytest.fixture()
def services(inputs, tmp_path):
    _, _, tp, cp = inputs
    probe = Probe()
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, client_interceptors=(probe,)) as svc:
        svc.tester_config.audit_log = AuditLog(tmp_path / "audit.log")
        yield svc, probe


def _exchange(address: str, identity: TlsIdentity, server_name: str = tls.CLIENT_IDENTITY):
    """Open the Test-Client's Exchange as `identity` and send one Hello: (status code, details)."""
    hello = pb.PeerMessage(hello=pb.Hello(protocol_version=2, metric="ero", client_dataset="ero"))
    with channels.make_channel(address, tls=identity, server_name=server_name) as channel:
        call = channel.stream_stream("/ppre.v1.Client/Exchange", request_serializer=pb.PeerMessage.SerializeToString,
                                     response_deserializer=pb.PeerMessage.FromString)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([hello]), timeout=10))
    return info.value.code(), info.value.details() or ""


def _log_records(path) -> list[dict]:
    return [json.loads(line)["record"] for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------- ppre certs init

def test_certs_init_writes_a_ca_and_three_role_certificates(tmp_path, capsys):
    directory = tmp_path / "certs"
    assert ppre_main(["certs", "init", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "tester.ppre.local" in out and "operator.ppre.local" in out
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        ["ca.pem", "ca.key", "tester.pem", "tester.key", "client.pem", "client.key", "operator.pem", "operator.key"])
    for path in directory.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), (path.name, oct(mode))

    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role in ("tester", "client", "operator"):
        cert = x509.load_pem_x509_certificate((directory / f"{role}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        assert dns[0] == f"{role}.ppre.local"
        if role == "operator":
            assert dns == ["operator.ppre.local"] and ips == []
        else:  # services: loopback works without overriding the name
            assert "localhost" in dns and "127.0.0.1" in ips
        identity = TlsIdentity.from_dir(directory, role)
        assert identity.identity == f"{role}.ppre.local"
        assert b"PRIVATE KEY" not in repr(identity).encode()  # the key is never printed

    # a second run keeps everything (a restarted compose init must not replace the CA)
    before = (directory / "ca.pem").read_bytes()
    assert ppre_main(["certs", "init", str(directory)]) == 0
    assert "kept" in capsys.readouterr().out and (directory / "ca.pem").read_bytes() == before
    assert ppre_main(["certs", "init", str(directory), "--force"]) == 0
    assert (directory / "ca.pem").read_bytes() != before
    # half a directory is refused, not half-replaced
    (directory / "client.key").unlink()
    assert ppre_main(["certs", "init", str(directory)]) == 2
    assert "--force" in capsys.readouterr().err


def test_tls_material_is_checked_when_read(tmp_path):
    DevCA.generate().write(tmp_path / "a")
    DevCA.generate().write(tmp_path / "b")
    with pytest.raises(Exception, match="not issued by the CA"):
        TlsIdentity.from_files(tmp_path / "a" / "ca.pem", tmp_path / "b" / "tester.pem", tmp_path / "b" / "tester.key")
    with pytest.raises(Exception, match="does not belong to the certificate"):
        TlsIdentity.from_files(tmp_path / "a" / "ca.pem", tmp_path / "a" / "tester.pem", tmp_path / "a" / "client.key")
    with pytest.raises(Exception, match="cannot read"):
        TlsIdentity.from_dir(tmp_path / "a", "nobody")


# --------------------------------------------------------------------------- audits over mTLS

def test_audit_over_mutual_tls_names_the_operator_by_its_certificate(services, tmp_path):
    svc, probe = services
    assert not svc.insecure and svc.tester_config.client_identity == "client.ppre.local"
    event = run_audit(svc.tester_address, _request(), tls=svc.operator_tls)
    assert event.WhichOneof("event") == "result", event
    assert probe.handled == ["/ppre.v1.Client/Exchange"] and probe.messages > 3
    # remembered for this process's loopback services: a plain run_audit(address) is mTLS too
    assert run_audit(svc.tester_address, _request()).WhichOneof("event") == "result"
    (first, second) = _log_records(tmp_path / "audit.log")
    assert first["who"] == second["who"] == "operator.ppre.local"
    assert first["outcome"]["status"] == "result"
    # nothing answers plaintext
    for address in (svc.tester_address, svc.client_address):
        with channels.make_channel(address, insecure=True) as plain:
            with pytest.raises(grpc.RpcError) as info:
                plain.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=3)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # health: any certificate from the CA (here the Test-Client's own), not only allow-listed ones
    assert channels.check_health(svc.client_address, tls=svc.pki.identity("client"),
                                 server_name="client.ppre.local")


def test_cli_audit_and_health_with_tls_dir(inputs, tmp_path, capsys, monkeypatch):
    """The services as `ppre tester/client serve --tls-dir` configure them (in-process
    here), the operator's `ppre audit --tls-dir` and `ppre health --tls-dir`."""
    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    _, _, tp, cp = inputs
    certs = tmp_path / "certs"
    assert ppre_main(["certs", "init", str(certs)]) == 0
    client_cfg = ClientConfig(DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True,
                              tls=TlsIdentity.from_dir(certs, "client"))
    client_server, client_port, _ = serve_client(client_cfg, 0, host="127.0.0.1")
    # the Tester reaches the Test-Client at "localhost": its certificate is checked for client.ppre.local
    tester_cfg = tester_server.TesterConfig(f"localhost:{client_port}", lambda: read_probability_table(tp),
                              min_modulus_bits=TEST_BITS, tls=TlsIdentity.from_dir(certs, "tester"))
    tester_grpc, tester_port, _ = tester_server.serve(tester_cfg, 0, host="127.0.0.1")
    address = f"127.0.0.1:{tester_port}"
    try:
        capsys.readouterr()
        audit = ["audit", "--tester", address, "--client-dataset", "ero", "--metric", "ero", "--bootstrap", "10",
                 "--json"]
        assert ppre_main(audit + ["--tls-dir", str(certs)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["n_matched"] == OVERLAP and "transport" not in report["info"]
        # explicit files instead of a directory
        assert ppre_main(audit + ["--ca", str(certs / "ca.pem"), "--cert", str(certs / "operator.pem"),
                                  "--key", str(certs / "operator.key")]) == 0
        capsys.readouterr()
        # the Tester's certificate is checked for --tester-identity
        assert ppre_main(audit + ["--tls-dir", str(certs), "--tester-identity", "someone-else.ppre.local"]) == 2
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "unavailable"
        # no certificates: refused before dialling
        assert ppre_main(audit) == 2
        err = json.loads(capsys.readouterr().out)["error"]["message"]  # --json: the error is the JSON object
        assert "no TLS certificates" in err and "--insecure" in err
        health = ["health", f"127.0.0.1:{client_port}", "--tls-dir", str(certs)]
        assert ppre_main(health + ["--tls-role", "client"]) == 0
        assert ppre_main(health) == 0  # the operator's certificate will do for health
        assert ppre_main(["health", f"127.0.0.1:{client_port}", "--insecure", "--timeout", "1"]) == 4  # TLS failed
    finally:
        tester_grpc.stop(0).wait(5)
        client_server.stop(0).wait(5)


def test_allow_list_flags_and_environment(monkeypatch):
    from ppre.cli import build_parser
    from common.net.tls import parse_names

    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    base = ["tester", "serve", "--probabilities", "p.csv"]
    assert parse_names(build_parser().parse_args(base).allow_operator) == ("operator.ppre.local",)
    args = build_parser().parse_args(base + ["--allow-operator", "a.example,b.example", "--allow-operator", "c"])
    assert parse_names(args.allow_operator) == ("a.example", "b.example", "c")
    monkeypatch.setenv("PPRE_ALLOW_OPERATORS", "x.example, y.example")
    assert parse_names(build_parser().parse_args(base).allow_operator) == ("x.example", "y.example")
    monkeypatch.setenv("PPRE_ALLOW_TESTERS", "t.example")
    assert parse_names(build_parser().parse_args(["client", "serve"]).allow_tester) == ("t.example",)
    with pytest.raises(Exception, match="allow-list is empty"):
        tester_server.TesterConfig("127.0.0.1:1", lambda: None, allowed_operators=(" ",))


# --------------------------------------------------------------------------- refusals

def test_a_certificate_from_another_ca_fails_at_the_handshake(services, tmp_path):
    svc, probe = services
    stranger = DevCA.generate("someone else's CA")
    # an operator certificate with the right name, from the wrong CA
    event = run_audit(svc.tester_address, _request(), tls=stranger.identity("operator"))
    assert event.error.code == "unavailable", event
    # a Tester certificate with the right name, from the wrong CA, straight at the Test-Client
    code, _ = _exchange(svc.client_address, stranger.identity("tester"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert probe.routed == [] and probe.handled == []  # no call got past the handshake
    assert svc.tester_servicer.active_sessions == 0 and svc.client_servicer.active_sessions == 0
    assert _log_records(tmp_path / "audit.log") == []  # nothing came far enough to be recorded
    # and a Tester that meets a Test-Client with the wrong identity gives up at the handshake too
    svc.tester_config.client_name = "impostor.ppre.local"
    event = run_audit(svc.tester_address, _request())
    assert event.error.code == "unavailable" and "Test-Client" in event.error.message, event
    assert probe.routed == []


def test_an_operator_not_on_the_allow_list_cannot_start_an_audit(services, tmp_path):
    svc, probe = services
    for who, identity in (("rogue.ppre.local", svc.pki.identity("operator", name="rogue.ppre.local")),
                          ("tester.ppre.local", svc.pki.identity("tester"))):  # a Tester is no operator
        event = run_audit(svc.tester_address, _request(), tls=identity)
        assert event.error.code == "permission_denied", event
        assert who in event.error.message and "allow-listed operator" in event.error.message
    assert svc.tester_servicer.active_sessions == 0 and svc.tester_config.sessions == []
    assert probe.routed == []  # the Test-Client never heard of it
    records = _log_records(tmp_path / "audit.log")
    assert [r["who"] for r in records] == ["rogue.ppre.local", "tester.ppre.local"]
    for record in records:  # who and the refusal: nothing of the request, nothing member-level
        assert set(record) == {"who", "method", "outcome"}
        assert record["outcome"]["status"] == "refused" and "permission_denied" in record["outcome"]["reason"]
    assert verify(tmp_path / "audit.log").ok


def test_a_tester_not_on_the_allow_list_gets_no_exchange(services):
    svc, probe = services
    # the operator's certificate is from the CA but is no Tester
    code, details = _exchange(svc.client_address, svc.operator_tls)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "operator.ppre.local" in details and "allow-listed Tester" in details
    code, details = _exchange(svc.client_address, svc.pki.identity("tester", name="tester2.ppre.local"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "tester2.ppre.local" in details
    # routed to the servicer's chain, but refused before its handler read a message
    assert probe.handled == [] and probe.messages == 0
    assert svc.client_servicer.active_sessions == 0
    # the real Tester still gets through
    assert run_audit(svc.tester_address, _request()).WhichOneof("event") == "result"
    assert probe.handled == ["/ppre.v1.Client/Exchange"]


# --------------------------------------------------------------------------- start-up and --insecure

def _ppre_all(*argvs: list[str], timeout: float = 60) -> list[tuple[int, str, str]]:
    """Run `ppre ARGV` processes side by side: [(exit status, stdout, stderr)]."""
    procs = [subprocess.Popen(ppre_argv() + argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for argv in argvs]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        out.append((proc.returncode, stdout, stderr))
    return out


def test_services_without_certificates_refuse_to_start(tmp_path):
    client, tester, nowhere, both = _ppre_all(
        ["client", "serve", "--port", "0", "--data-dir", str(tmp_path)],
        ["tester", "serve", "--port", "0", "--probabilities", str(tmp_path / "p.csv")],
        ["client", "serve", "--port", "0", "--tls-dir", str(tmp_path / "nowhere")],
        ["client", "serve", "--port", "0", "--insecure", "--tls-dir", str(tmp_path)])
    for rc, stdout, stderr in (client, tester):
        assert rc == 2, (rc, stdout, stderr)
        assert "no TLS certificates" in stderr and "ppre certs init" in stderr
        assert "--insecure" in stderr and "serving" not in stdout
    assert nowhere[0] == 2 and "nowhere" in nowhere[2] and "does not exist" in nowhere[2]
    assert both[0] == 2 and "exclude each other" in both[2]


def test_insecure_says_so_loudly(inputs, capsys, tmp_path):
    _, _, tp, cp = inputs
    proc = subprocess.Popen(ppre_argv() + ["client", "serve", "--host", "127.0.0.1", "--port", "0", "--insecure",
                                           "--dataset", f"ero={cp}"], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "client serving" in line and "INSECURE" in line, line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert tls.INSECURE_WARNING in err

    capsys.readouterr()
    code = ppre_main(["audit", "--local", "--insecure", "--metric", "ero", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--bootstrap", "10", "--json"])
    captured = capsys.readouterr()
    assert code == 0 and "WARNING: --insecure: plaintext gRPC, peers are NOT authenticated" in captured.err
    assert json.loads(captured.out)["info"]["transport"].startswith("insecure")


def test_local_services_can_run_plaintext(inputs):
    _, _, tp, cp = inputs
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, tls=False) as svc:
        assert svc.insecure and svc.operator_tls is None
        assert svc.tester_config.client_identity == svc.client_address
        event = run_audit(svc.tester_address, _request())
        assert event.WhichOneof("event") == "result", event
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0)


def test_plaintext_local_services_ignore_a_tls_dial_left_for_a_reused_port(inputs, monkeypatch):
    """A TLS service this process once ran on a port left its dial behind; plaintext local
    services that get the same port remember it as plaintext for their lifetime, so the
    operator's channel does not try TLS (it failed with "Tls handshake failed")."""
    import ppre.local as local
    _, _, tp, cp = inputs
    port = free_loopback_port()
    stale = DevCA.generate("another run's CA").identity("operator")
    channels.remember_dial(f"127.0.0.1:{port}", stale, tls.TESTER_IDENTITY)
    monkeypatch.setattr(local, "serve_tester", lambda config, _port, host: tester_server.serve(config, port, host))
    try:
        with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                            modulus_bits=TEST_BITS, allow_insecure=True, tls=False) as svc:
            assert svc.tester_address == f"127.0.0.1:{port}"
            event = run_audit(svc.tester_address, _request(), timeout=60)
            assert event.WhichOneof("event") == "result", event
        assert channels.known_dial(svc.tester_address) is None and channels.known_dial(svc.client_address) is None
    finally:
        channels.forget_dial(f"127.0.0.1:{port}")


# --------------------------------------------------------------------------- identities, allow-lists, the development CA
def _operators():
    from common.net.tls import AllowList
    return AllowList.of("operator", ["operator.ppre.local"], "--allow-operator")


def test_an_identity_refusal_is_recorded_with_its_method_identity_and_reason():
    """A refused caller is aborted with PERMISSION_DENIED and told to `on_refused` (the
    Tester's audit log) with the method, the identity and the reason."""
    import grpc
    from common.net.tls import IdentityInterceptor
    recorded = []
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()},
                                      on_refused=lambda *args: recorded.append(args))
    context = CallContext(x509_common_name=["evil.example"], x509_subject_alternative_name=["evil.example"])
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED
    assert len(recorded) == 1
    method, identity, message = recorded[0]
    assert (method, identity) == ("/ppre.v1.Tester/RunAudit", "evil.example") and "evil.example" in message


def test_a_method_under_no_rule_is_refused_even_to_an_allow_listed_peer():
    """Deny by default: a method no rule covers is refused with PERMISSION_DENIED."""
    import grpc
    from common.net.tls import IdentityInterceptor
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()})
    context = CallContext(x509_common_name=["operator.ppre.local"])
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Other/Do", context)
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("key", ["x509_subject_alternative_name", "peer_dns", "peer_uri", "peer_email", "peer_ip"])
def test_a_peer_allow_listed_by_a_subject_alternative_name_is_admitted(key):
    """Any verified name of the peer may be the allow-listed one, not only its CN."""
    from common.net.tls import IdentityInterceptor
    context = CallContext(x509_common_name=["some-host.example"], **{key: ["operator.ppre.local"]})
    IdentityInterceptor({"/ppre.v1.Tester/": _operators()}).check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted is None


def test_the_audit_logs_who_is_the_name_the_caller_was_admitted_under():
    """`caller_identity`: the allow-listed name the peer matched; without a list its CN,
    else its first name; without TLS nothing."""
    from common.net.tls import caller_identity
    context = CallContext(x509_common_name=["cn.example"],
                       x509_subject_alternative_name=["other.example", "operator.ppre.local"])
    assert caller_identity(context, _operators()) == "operator.ppre.local"
    assert caller_identity(context) == "cn.example"
    assert caller_identity(CallContext(x509_subject_alternative_name=["a.example", "b.example"])) == "a.example"
    assert caller_identity(CallContext()) == ""


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method


def test_every_kind_of_handler_is_guarded_and_only_health_is_open():
    """`intercept_service` wraps each of the four handler kinds so that the identity is
    checked before the behaviour runs, keeps its (de)serialisers, and leaves health open."""
    import grpc
    from common.net.tls import IdentityInterceptor
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": _operators()})
    ran = []

    def behaviour(request, context):
        ran.append(request)
        return ("answer", context)
    makers = {"unary_unary": grpc.unary_unary_rpc_method_handler,
              "unary_stream": grpc.unary_stream_rpc_method_handler,
              "stream_unary": grpc.stream_unary_rpc_method_handler,
              "stream_stream": grpc.stream_stream_rpc_method_handler}
    for kind, make in makers.items():
        original = make(behaviour, request_deserializer=bytes.decode, response_serializer=str.encode)
        handler = interceptor.intercept_service(lambda details: {"/ppre.v1.Tester/RunAudit": original}[details.method],
                                                _Details("/ppre.v1.Tester/RunAudit"))
        assert handler is not original and getattr(handler, kind) is not None, kind
        assert handler.request_deserializer is bytes.decode and handler.response_serializer is str.encode, kind
        assert handler.request_streaming == original.request_streaming, kind
        assert handler.response_streaming == original.response_streaming, kind
        refused = CallContext(x509_common_name=["evil.example"])
        with pytest.raises(PermissionError):
            getattr(handler, kind)("request", refused)
        assert ran == [], kind
        allowed = CallContext(x509_common_name=["operator.ppre.local"])
        assert getattr(handler, kind)("request", allowed) == ("answer", allowed)
        assert ran == ["request"], kind
        ran.clear()
    health = grpc.unary_unary_rpc_method_handler(behaviour)
    assert interceptor.intercept_service(lambda d: health, _Details("/grpc.health.v1.Health/Check")) is health
    assert interceptor.intercept_service(lambda d: None, _Details("/ppre.v1.Tester/Nothing")) is None


def test_an_allow_list_refusal_names_the_identity_the_role_and_the_flag():
    """The refusal is PERMISSION_DENIED with one message, whole, naming the peer (its CN)
    and the allow-list's role and flag, or the method when no rule covers it; the hook
    hears (method, identity, message), and a hook that fails still refuses."""
    import grpc

    from common.errors import InputError
    from common.net import tls
    from tests.helpers import CallContext
    allow = tls.AllowList.of("operator", "op.example, other.example", flag="--operators")
    assert allow == tls.AllowList("operator", frozenset({"op.example", "other.example"}), "--operators")
    with pytest.raises(InputError, match="the allow-list is empty") as empty:
        tls.AllowList.of("operator", " , ", flag="--operators")
    assert empty.value.parameter == "--operators"
    assert tls.AllowList.of("client", "c.example").flag == ""
    heard = []
    interceptor = tls.IdentityInterceptor({"/ppre.v1.Tester/": allow}, on_refused=lambda *a: heard.append(a))
    stranger = {"x509_common_name": ["mallory.example"], "x509_subject_alternative_name": ["alias.example"]}
    context = CallContext(**stranger)
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Tester/RunAudit", context)
    text = "peer identity 'mallory.example' is not an allow-listed operator (--operators)"
    assert context.aborted == (grpc.StatusCode.PERMISSION_DENIED, text)
    assert heard == [("/ppre.v1.Tester/RunAudit", "mallory.example", text)]  # its CN, not its first SAN
    unflagged = tls.IdentityInterceptor({"/ppre.v1.Tester/": tls.AllowList.of("operator", "op.example")})
    context = CallContext(**stranger)
    with pytest.raises(PermissionError):
        unflagged.check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted[1] == "peer identity 'mallory.example' is not an allow-listed operator"
    context = CallContext(**stranger)
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Other/Call", context)
    assert context.aborted[1] == "peer identity 'mallory.example' may not call /ppre.v1.Other/Call"
    context = CallContext()
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Tester/RunAudit", context)
    assert context.aborted[1] == "peer identity '(no certificate identity)' is not an allow-listed operator " \
                                 "(--operators)"
    no_cn = CallContext(x509_subject_alternative_name=["san-only.example"])
    with pytest.raises(PermissionError):
        interceptor.check("/ppre.v1.Tester/RunAudit", no_cn)
    assert "'san-only.example'" in no_cn.aborted[1]

    def failing(*args):
        raise OSError("disk full")
    context = CallContext(**stranger)
    with pytest.raises(PermissionError):
        tls.IdentityInterceptor({"/ppre.v1.Tester/": allow}, on_refused=failing).check("/ppre.v1.Tester/X", context)
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED
    # an allowed peer passes, by any of its names
    interceptor.check("/ppre.v1.Tester/RunAudit", CallContext(x509_subject_alternative_name=["x", "op.example"]))
    assert tls.peer_names(CallContext(peer_dns=["d.example"], x509_common_name=["c.example"])) == \
        ("d.example", "c.example")
    assert tls.peer_common_name(CallContext(**stranger)) == "mallory.example"
    assert tls.peer_common_name(CallContext()) == ""


def test_the_development_ca_issues_leaves_that_cannot_issue():
    """The CA: a CA of path length 0 whose key signs certificates and CRLs only; a leaf: no
    CA, a key for signatures only, client authentication (and server for a service),
    its name as CN and first SAN (loopback names for a service only), issued by the CA's
    key, valid from 5 minutes ago for the days asked (P-256, SHA-256 throughout)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID as EKU
    from cryptography.x509.oid import NameOID

    from common.net import tls
    ca = tls.DevCA.generate(days=30)
    cert = ca.cert
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)

    def usages(**on):
        names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
                 "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
        return x509.KeyUsage(**{name: on.get(name, False) for name in names})
    assert usage.critical and usage.value == usages(key_cert_sign=True, crl_sign=True)
    assert not cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).critical
    assert cert.subject == cert.issuer and cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        tls.DEV_CA_NAME and cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "PPRE"
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(days=30, minutes=5)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    assert cert.signature_hash_algorithm.name == "sha256"
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    for server in (False, True):
        issued = ca.issue("someone.example", server=server, extra_names=("alias.example",), days=7)
        leaf = x509.load_pem_x509_certificate(issued.cert_pem)
        leaf_constraints = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
        assert leaf_constraints.critical and not leaf_constraints.value.ca
        leaf_usage = leaf.extensions.get_extension_for_class(x509.KeyUsage)
        assert leaf_usage.critical and leaf_usage.value == usages(digital_signature=True)
        assert not any(leaf.extensions.get_extension_for_class(kind).critical for kind in (
            x509.ExtendedKeyUsage, x509.SubjectAlternativeName, x509.AuthorityKeyIdentifier))
        assert issued.name == "someone.example"
        assert leaf.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "PPRE"
        ekus = list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert ekus == ([EKU.CLIENT_AUTH, EKU.SERVER_AUTH] if server else [EKU.CLIENT_AUTH])
        assert tls.certificate_names(leaf) == (("someone.example", "alias.example", "localhost", "127.0.0.1", "::1")
                                               if server else ("someone.example", "alias.example"))
        assert tls.primary_name(leaf) == "someone.example" and leaf.issuer == cert.subject
        leaf.verify_directly_issued_by(cert)
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
        assert aki == ski
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == dt.timedelta(days=7, minutes=5)
        assert leaf.not_valid_before_utc < dt.datetime.now(dt.timezone.utc) < leaf.not_valid_after_utc
        assert leaf.signature_hash_algorithm.name == "sha256"


def test_a_certificate_without_a_common_name_goes_by_its_first_san():
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from common.net import tls
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)

    def cert(sans):
        builder = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(x509.Name([]))
                   .public_key(key.public_key()).serial_number(1).not_valid_before(now)
                   .not_valid_after(now + dt.timedelta(days=1)))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(key, hashes.SHA256())
    first = cert([x509.DNSName("first.example"), x509.DNSName("second.example")])
    assert tls.primary_name(first) == "first.example"
    assert tls.certificate_names(first) == ("first.example", "second.example")
    assert tls.primary_name(cert([])) == "" and tls.certificate_names(cert([])) == ()
    from cryptography.x509.oid import NameOID
    named = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cn.example")]))
             .issuer_name(x509.Name([])).public_key(key.public_key()).serial_number(2).not_valid_before(now)
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.SubjectAlternativeName([x509.DNSName("san.example")]), critical=False)
             .sign(key, hashes.SHA256()))
    assert tls.primary_name(named) == "cn.example"  # the CN first, though a SAN comes first among the names
    assert tls.certificate_names(named) == ("san.example", "cn.example")


def test_development_certificates_are_valid_now_whatever_the_local_time_zone(monkeypatch):
    import datetime as dt
    import time as time_module

    from cryptography import x509

    from common.net import tls
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # nine hours ahead of UTC: local time taken as UTC starts in the future
    time_module.tzset()
    try:
        ca = tls.DevCA.generate()
        leaf = x509.load_pem_x509_certificate(ca.issue("x.example").cert_pem)
    finally:
        monkeypatch.delenv("TZ")
        time_module.tzset()
    now = dt.datetime.now(dt.timezone.utc)
    for cert in (ca.cert, leaf):
        assert now - dt.timedelta(minutes=6) < cert.not_valid_before_utc < now


def test_the_development_ca_and_its_files_round_trip(tmp_path):
    """`write` puts the CA and every role's certificate and key in place (keys 0600,
    certificates 0644, parents created); `load` gives the same CA back, and a directory
    without one is an error naming it."""
    from common.errors import InputError
    from common.net import tls
    ca = tls.DevCA.generate()
    written = ca.write(tmp_path / "nested" / "certs", days=3)
    assert sorted(written) == sorted(tls.dev_files(tmp_path / "nested" / "certs"))
    assert all(p.stat().st_mode & 0o777 == (0o600 if p.suffix == ".key" else 0o644) for p in written)
    again = tls.DevCA.load(tmp_path / "nested" / "certs")
    assert again.cert == ca.cert and again.key_pem == ca.key_pem and repr(again) == f"DevCA({tls.DEV_CA_NAME!r})"
    import datetime as dt
    for role in tls.ROLES:
        identity = tls.TlsIdentity.from_dir(tmp_path / "nested" / "certs", role)
        assert identity.identity == tls.role_identity(role) and identity.ca_pem == ca.cert_pem
        assert identity.source == str(tmp_path / "nested" / "certs" / f"{role}.pem")
        leaf = identity.certificate
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == dt.timedelta(days=3, minutes=5)
    made = ca.identity("tester", days=2)
    assert made.source == "development CA (tester)" and made.identity == tls.role_identity("tester")
    assert made.certificate.not_valid_after_utc - made.certificate.not_valid_before_utc == dt.timedelta(days=2,
                                                                                                         minutes=5)
    with pytest.raises(InputError, match="no readable development CA") as refused:
        tls.DevCA.load(tmp_path)
    assert refused.value.file == str(tmp_path)


def test_bad_tls_material_is_refused_naming_the_file_and_what_is_wrong(tmp_path):
    """Each refusal whole, with the file it names: a missing file (which of the three), a
    path that is no directory, a certificate or key that is not PEM, a key of another
    certificate, a certificate another CA issued."""
    from common.errors import InputError
    from common.net import tls
    ca = tls.DevCA.generate()
    ca.write(tmp_path / "certs")
    d = tmp_path / "certs"

    def refusal(call):
        with pytest.raises(InputError) as refused:
            call()
        return str(refused.value), refused.value.file

    text, file = refusal(lambda: tls.TlsIdentity.from_files(d / "absent.pem", d / "tester.pem", d / "tester.key"))
    assert "cannot read the CA certificate (No such file or directory)" in text and file == str(d / "absent.pem")
    text, file = refusal(lambda: tls.TlsIdentity.from_files(d / "ca.pem", d / "nope.pem", d / "tester.key"))
    assert "cannot read the certificate (No such file or directory)" in text and file == str(d / "nope.pem")
    text, file = refusal(lambda: tls.TlsIdentity.from_files(d / "ca.pem", d / "tester.pem", d / "nope.key"))
    assert "cannot read the private key (No such file or directory)" in text and file == str(d / "nope.key")
    text, file = refusal(lambda: tls.TlsIdentity.from_dir(d / "ca.pem", "tester"))
    assert "is a file, not a directory (create one with `ppre certs init DIR`)" in text and file == str(d / "ca.pem")
    text, file = refusal(lambda: tls.TlsIdentity.from_dir(d / "nowhere", "tester"))
    assert "does not exist (create one with `ppre certs init DIR`)" in text and file == str(d / "nowhere")
    good = tls.TlsIdentity.from_dir(d, "tester")
    text, file = refusal(lambda: tls.TlsIdentity(b"not pem", good.cert_pem, good.key_pem, source="S"))
    assert "is not a PEM certificate" in text and file == "S (CA)"
    text, file = refusal(lambda: tls.TlsIdentity(good.ca_pem, b"not pem", good.key_pem))
    assert "is not a PEM certificate" in text and file == "TLS material (certificate)"
    text, file = refusal(lambda: tls.TlsIdentity(good.ca_pem, good.cert_pem, b"not pem", source="S"))
    assert "is not an unencrypted PEM private key" in text and file == "S (key)"
    other = tls.TlsIdentity.from_dir(d, "client")
    text, file = refusal(lambda: tls.TlsIdentity(good.ca_pem, good.cert_pem, other.key_pem, source="S"))
    assert "the private key does not belong to the certificate" in text and file == "S"
    stranger = tls.DevCA.generate(name="another CA")
    text, file = refusal(lambda: tls.TlsIdentity(stranger.cert_pem, good.cert_pem, good.key_pem, source="S"))
    assert f"the certificate ('{tls.role_identity('tester')}') was not issued by the CA ('another CA')" in text
    assert file == "S"


def test_allow_lists_match_identities_exactly():
    """No prefix, no suffix, no case folding, no whitespace trimming of the peer's name:
    only the exact identity on the list is admitted."""
    from common.net.tls import AllowList, IdentityInterceptor
    allow = AllowList.of("operator", ["operator.ppre.local"], "--allow-operator")
    assert allow.match(["operator.ppre.local"]) == "operator.ppre.local"
    near = ["operator.ppre.local.evil.example", "operator.ppre.loca", "OPERATOR.ppre.local", "Operator.PPRE.Local",
            "operator", "x.operator.ppre.local", " operator.ppre.local", "operator.ppre.local "]
    for name in near:
        assert allow.match([name]) is None, name
    interceptor = IdentityInterceptor({"/ppre.v1.Tester/": allow})
    interceptor.check("/ppre.v1.Tester/RunAudit", CallContext(x509_common_name=["operator.ppre.local"]))
    for name in near:
        context = CallContext(x509_common_name=[name], x509_subject_alternative_name=[name])
        with pytest.raises(PermissionError):
            interceptor.check("/ppre.v1.Tester/RunAudit", context)
        assert context.aborted is not None
