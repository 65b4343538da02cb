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
  says so loudly.
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
from tests.helpers import TEST_BITS, free_loopback_port, wait_until, write_inputs
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
    assert nowhere[0] == 2 and "nowhere" in nowhere[2] and "is not a directory" in nowhere[2]
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
