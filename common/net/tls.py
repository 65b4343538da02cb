"""Mutual TLS on every link: service identities, allow-lists, and a development CA.

Every link (operator → Tester, Tester → Test-Client) is mutual TLS: both ends present a
certificate signed by the deployment's CA, and a peer whose certificate the CA did not
sign fails at the TLS handshake. On top of the handshake each service keeps an
allow-list of the *identities* it serves, per role:

* the Tester serves `RunAudit` only to allow-listed operators (`--allow-operator`,
  default `operator.ppre.local`);
* the Test-Client serves `Exchange` only to allow-listed Testers (`--allow-tester`,
  default `tester.ppre.local`);
* the gRPC health service answers any peer with a certificate from the CA (the compose
  healthchecks use the container's own certificate); it reveals only SERVING or not.

A peer's identity is read from the verified certificate (`context.auth_context()`): its
subject alternative names and its subject common name. A peer is allowed when any of
them is on the list, and is then known by that name (the audit log's "who"). A CA-signed
peer that is not on the list is refused with PERMISSION_DENIED, naming its identity, by
`IdentityInterceptor` before the handler runs, so before any protocol message is read
or sent. The dialling side checks the server the same way: the Tester accepts only a
Test-Client whose certificate names `--client-identity` (default `client.ppre.local`),
the operator only a Tester that names `--tester-identity` (default `tester.ppre.local`),
whatever address they are reached at (`grpc.ssl_target_name_override`).

Certificates and keys are the services' long-term identities: PEM files read once at
start-up (`TlsIdentity.from_files` / `from_dir`), unlike the per-audit session keys of
design §7, which never touch a disk. `ppre certs init DIR` writes a development
CA and one certificate per role (`DevCA`); `ppre.local.local_services` makes one in
memory for each run. ECDSA P-256 throughout.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.errors import InputError

log = logging.getLogger("ppre.tls")

#: the three roles of a deployment; each has a certificate `ROLE.pem` and key `ROLE.key`
ROLES = ("tester", "client", "operator")
#: the roles that also serve (their certificates carry loopback names for local use)
SERVICE_ROLES = ("tester", "client")
DOMAIN = "ppre.local"
CA_CERT, CA_KEY = "ca.pem", "ca.key"
DEV_CA_NAME = "PPRE development CA"
DEFAULT_DAYS = 365
#: the warning every command prints on stderr when it runs with --insecure
INSECURE_WARNING = ("WARNING: --insecure: plaintext gRPC, peers are NOT authenticated and the link is NOT "
                    "encrypted; anyone on the network can read, change or impersonate this traffic")


def role_identity(role: str) -> str:
    """The identity the development CA gives a role: `tester.ppre.local`, ..."""
    return f"{role}.{DOMAIN}"


TESTER_IDENTITY = role_identity("tester")
CLIENT_IDENTITY = role_identity("client")
OPERATOR_IDENTITY = role_identity("operator")


# --------------------------------------------------------------------------- identities

def _load_certificates(pem: bytes, label: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        certs = []
    if not certs:
        raise InputError("is not a PEM certificate", file=label)
    return certs


def certificate_names(cert: x509.Certificate) -> tuple[str, ...]:
    """A certificate's identities: its SAN DNS names, URIs, e-mail addresses and IP
    addresses, then its subject common name (deduplicated, in that order)."""
    names: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        for kind in (x509.DNSName, x509.UniformResourceIdentifier, x509.RFC822Name):
            names.extend(san.get_values_for_type(kind))
        names.extend(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    names.extend(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    return tuple(dict.fromkeys(names))


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Signed by `issuer`'s key under `issuer`'s name (a sanity check at start-up; the
    handshake does the full path validation)."""
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def primary_name(cert: x509.Certificate) -> str:
    """The name a certificate goes by: its subject CN, else its first SAN."""
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if cn:
        return str(cn[0].value)
    names = certificate_names(cert)
    return names[0] if names else ""


@dataclass(frozen=True)
class TlsIdentity:
    """One party's TLS material, PEM bytes read once: the CA certificate it trusts, its
    own certificate chain and its private key (never printed: `repr` leaves it out)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    #: where it came from, for messages ("DIR (role tester)", "in-memory development CA")
    source: str = ""

    def __post_init__(self) -> None:
        ca = _load_certificates(self.ca_pem, f"{self.source or 'TLS material'} (CA)")
        chain = _load_certificates(self.cert_pem, f"{self.source or 'TLS material'} (certificate)")
        try:
            key = serialization.load_pem_private_key(self.key_pem, password=None)
        except (ValueError, TypeError):
            raise InputError("is not an unencrypted PEM private key", file=f"{self.source or 'TLS material'} (key)") \
                from None
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
                chain[0].public_key().public_bytes(serialization.Encoding.DER, spki):
            raise InputError("the private key does not belong to the certificate", file=self.source or None)
        if not any(_issued_by(chain[0], c) for c in ca + chain[1:]):
            raise InputError(f"the certificate ({primary_name(chain[0])!r}) was not issued by the CA "
                             f"({', '.join(primary_name(c) for c in ca)!r})", file=self.source or None)

    @classmethod
    def from_files(cls, ca: str | Path, cert: str | Path, key: str | Path) -> "TlsIdentity":
        data = []
        for what, path in (("CA certificate", ca), ("certificate", cert), ("private key", key)):
            try:
                data.append(Path(path).read_bytes())
            except OSError as exc:
                raise InputError(f"cannot read the {what} ({exc.strerror})", file=str(path)) from None
        return cls(data[0], data[1], data[2], source=str(cert))

    @classmethod
    def from_dir(cls, directory: str | Path, role: str) -> "TlsIdentity":
        """`ppre certs init`'s layout: DIR/ca.pem, DIR/ROLE.pem, DIR/ROLE.key."""
        d = Path(directory)
        if not d.is_dir():
            what = "is a file, not a directory" if d.exists() else "does not exist"
            raise InputError(f"{what} (create one with `ppre certs init DIR`)", file=str(d))
        return cls.from_files(d / CA_CERT, d / f"{role}.pem", d / f"{role}.key")

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificates(self.cert_pem)[0]

    @property
    def identity(self) -> str:
        """This party's own name (its certificate's CN, else its first SAN)."""
        return primary_name(self.certificate)

    @property
    def names(self) -> tuple[str, ...]:
        return certificate_names(self.certificate)

    def server_credentials(self) -> grpc.ServerCredentials:
        """A server that requires and verifies a client certificate from the CA."""
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A channel that presents this certificate and verifies the server's against the CA."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)


# --------------------------------------------------------------------------- diagnosis

#: what gRPC says when the server's certificate does not name the expected identity
HOSTNAME_CHECK_FAILED = "Hostname Verification Check failed"
#: the service a default identity belongs to, in a user's words
SERVICE_WORDS = {TESTER_IDENTITY: "a Tester", CLIENT_IDENTITY: "a Test-Client", OPERATOR_IDENTITY: "an operator"}


def presented_names(address: str, timeout: float = 3.0) -> tuple[str, ...] | None:
    """The names in the certificate the TLS service at HOST:PORT presents, read for a
    message only (not trusted: nothing is sent after the handshake); None when no
    handshake gets that far (nothing listens, no TLS)."""
    import socket
    import ssl
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=host.strip("[]") or None) as tls_socket:
                der = tls_socket.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    return certificate_names(x509.load_der_x509_certificate(der)) if der else None


def wrong_service(address: str, expected: str, flag: str, wanted: str, identity_flag: str,
                  timeout: float = 3.0) -> str:
    """Why a service's certificate failed the name check, in words: whose service
    answers at `address` (its certificate's names), that `flag` needs `wanted`, and
    `identity_flag` for a deployment whose `wanted` goes by another name."""
    names = presented_names(address, timeout) or ()
    known = next((n for n in names if n in SERVICE_WORDS), None)
    said = ", ".join(f"'{n}'" for n in names[:4])
    if known is not None:
        who = f"the service at {address} is {SERVICE_WORDS[known]} (its certificate names '{known}')"
    elif names:
        who = f"the certificate of the service at {address} names {said}, not '{expected}'"
    else:
        who = f"the certificate of the service at {address} does not name '{expected}'"
    return (f"{who}; {flag} needs the address of {wanted}, whose certificate names '{expected}' (if "
            f"{wanted}'s certificate carries another name, give it with {identity_flag})")


# --------------------------------------------------------------------------- allow-lists

def parse_names(values: Iterable[str] | str | None) -> tuple[str, ...]:
    """Names from repeated flags and/or comma-separated lists, in order, deduplicated."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        out.extend(part.strip() for part in str(value).split(",") if part.strip())
    return tuple(dict.fromkeys(out))


def peer_names(context) -> tuple[str, ...]:
    """The names in the verified peer certificate of a server-side call (empty without TLS)."""
    try:
        auth = context.auth_context() or {}
    except Exception:  # noqa: BLE001 - a context without TLS
        return ()
    names: list[str] = []
    for key in ("x509_subject_alternative_name", "peer_dns", "peer_uri", "peer_email", "peer_ip",
                "x509_common_name"):
        for value in auth.get(key, ()):
            names.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
    return tuple(dict.fromkeys(n for n in names if n))


def peer_common_name(context) -> str:
    try:
        values = (context.auth_context() or {}).get("x509_common_name", ())
    except Exception:  # noqa: BLE001
        return ""
    return values[0].decode("utf-8", "replace") if values else ""


@dataclass(frozen=True)
class AllowList:
    """Who may call one service: a role name (for messages), the allowed identities, and
    the flag that sets them (named in refusals)."""

    role: str
    names: frozenset[str]
    flag: str = ""

    @classmethod
    def of(cls, role: str, names: Iterable[str] | str, flag: str = "") -> "AllowList":
        parsed = parse_names(names)
        if not parsed:
            raise InputError("the allow-list is empty: nobody could call this service", parameter=flag or role)
        return cls(role, frozenset(parsed), flag)

    def match(self, names: Sequence[str]) -> str | None:
        """The peer's name that is on the list (None: not allowed)."""
        return next((n for n in names if n in self.names), None)


#: always answered for any peer the CA vouches for (health reveals only SERVING or not)
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def caller_identity(context, allow: AllowList | None = None) -> str:
    """The verified identity of a server-side call's peer ("" without TLS): the name it is
    allow-listed under when `allow` is given and it is on it, else its CN or first name."""
    names = peer_names(context)
    if not names:
        return ""
    matched = allow.match(names) if allow is not None else None
    return matched or peer_common_name(context) or names[0]


class IdentityInterceptor(grpc.ServerInterceptor):
    """Refuses any call whose verified peer identity is not on the allow-list of the
    called service, before the handler runs (PERMISSION_DENIED naming the identity).

    `rules` maps a method prefix (`/ppre.v1.Tester/`) to its AllowList; a method under
    no rule and not health is refused too (deny by default). `on_refused(method,
    identity, message)` is told of each refusal (the Tester records it in its audit log).
    """

    def __init__(self, rules: Mapping[str, AllowList], *,
                 on_refused: Callable[[str, str, str], None] | None = None,
                 open_prefixes: Sequence[str] = OPEN_PREFIXES) -> None:
        self.rules = dict(rules)
        self.on_refused = on_refused
        self.open_prefixes = tuple(open_prefixes)

    def _rule(self, method: str) -> AllowList | None:
        return next((rule for prefix, rule in self.rules.items() if method.startswith(prefix)), None)

    def check(self, method: str, context) -> None:
        names = peer_names(context)
        rule = self._rule(method)
        who = rule.match(names) if rule is not None else None
        if who is not None:
            return
        shown = peer_common_name(context) or (names[0] if names else "(no certificate identity)")
        if rule is None:
            message = f"peer identity '{shown}' may not call {method}"
        else:
            hint = f" ({rule.flag})" if rule.flag else ""
            message = f"peer identity '{shown}' is not an allow-listed {rule.role}{hint}"
        log.warning("refused %s: %s", method, message)
        if self.on_refused is not None:
            try:
                self.on_refused(method, shown, message)
            except Exception:  # noqa: BLE001 - never turn a refusal into an internal error
                log.exception("recording a refusal failed")
        context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self.open_prefixes):
            return handler
        check = self.check

        def guard(behavior):
            def guarded(request_or_iterator, context):
                check(method, context)  # first, before any request is looked at
                return behavior(request_or_iterator, context)
            return guarded

        kwargs = dict(request_deserializer=handler.request_deserializer,
                      response_serializer=handler.response_serializer)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(guard(handler.stream_stream), **kwargs)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(guard(handler.stream_unary), **kwargs)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(guard(handler.unary_stream), **kwargs)
        return grpc.unary_unary_rpc_method_handler(guard(handler.unary_unary), **kwargs)


# --------------------------------------------------------------------------- a development CA

def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class IssuedCertificate:
    name: str
    cert_pem: bytes
    key_pem: bytes = field(repr=False)


class DevCA:
    """A development certificate authority (ECDSA P-256) that issues role certificates.

    `ppre certs init DIR` writes one to disk (`write`); `local_services` keeps one in
    memory for one run. Not for production: there, use the organisation's CA and give
    each party only the CA certificate and its own certificate and key.
    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert

    def __repr__(self) -> str:
        return f"DevCA({primary_name(self.cert)!r})"

    @classmethod
    def generate(cls, name: str = DEV_CA_NAME, days: int = DEFAULT_DAYS) -> "DevCA":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, "PPRE")])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @classmethod
    def load(cls, directory: str | Path) -> "DevCA":
        d = Path(directory)
        try:
            cert = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
            key = serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise InputError(f"no readable development CA ({exc})", file=str(d)) from None
        return cls(key, cert)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _pem_key(self._key)

    def issue(self, name: str, *, server: bool = False, extra_names: Sequence[str] = (),
              days: int = DEFAULT_DAYS) -> IssuedCertificate:
        """A certificate for identity `name` (CN and first SAN). `server`: also a TLS server
        certificate, with `localhost` and 127.0.0.1 / ::1 so loopback works."""
        key = ec.generate_private_key(ec.SECP256R1())
        dns = [name, *extra_names] + (["localhost"] if server else [])
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(dns)]
        if server:
            sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))]
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        now = _now()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "PPRE")]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=False, crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        return IssuedCertificate(name, cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def identity(self, role: str, *, name: str | None = None, days: int = DEFAULT_DAYS) -> TlsIdentity:
        """A role's TlsIdentity issued by this CA (name: its identity, default ROLE.ppre.local)."""
        issued = self.issue(name or role_identity(role), server=role in SERVICE_ROLES, days=days)
        return TlsIdentity(self.cert_pem, issued.cert_pem, issued.key_pem, source=f"development CA ({role})")

    def write(self, directory: str | Path, *, days: int = DEFAULT_DAYS) -> list[Path]:
        """ca.pem, ca.key and ROLE.pem / ROLE.key for every role; keys 0600, certificates 0644."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        written = [_write(d / CA_KEY, self.key_pem, 0o600), _write(d / CA_CERT, self.cert_pem, 0o644)]
        for role in ROLES:
            issued = self.issue(role_identity(role), server=role in SERVICE_ROLES, days=days)
            written.append(_write(d / f"{role}.key", issued.key_pem, 0o600))
            written.append(_write(d / f"{role}.pem", issued.cert_pem, 0o644))
        return written


def dev_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    return [d / CA_CERT, d / CA_KEY] + [d / f"{role}.{ext}" for role in ROLES for ext in ("pem", "key")]


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Write through a new file created with `mode` (a key is never readable by others,
    not even for a moment), then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path
