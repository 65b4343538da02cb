"""Sub-commands of `ppre`; each module has `register(subparsers)` and `run(args)`."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time

from ppre.flags import RepeatedNames

#: SIGTERM to exit: sessions get this long to end cleanly, gRPC calls a little more
SHUTDOWN_SESSIONS_S = 5.0
SHUTDOWN_GRACE_S = 2.0
SIGNAL_POLL_S = 0.2
# Health stays up answering NOT_SERVING at least this long after SIGTERM, so that a health
# check (compose, a load balancer) sees the drain before the
# port closes, even when no session was running and shutdown is otherwise instant.
NOT_SERVING_MIN_S = 1.0


def listening_words(host: str, port: int) -> str:
    """Where a service listens, as its start-up line says it: the address, and who can
    reach it (a loopback address: this machine only; --host names another)."""
    import ipaddress
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    every = host in ("0.0.0.0", "::", "[::]")
    reach = ("this machine only; --host 0.0.0.0 listens on every interface" if loopback
             else "every interface" if every else "this address")
    return f"{host}:{port} ({reach})"


def add_service_arguments(s: argparse.ArgumentParser) -> None:
    """Options both services share: the peer deadline and the session limit."""
    env = os.environ.get
    s.add_argument("--peer-timeout", type=float, default=env("PPRE_PEER_TIMEOUT", "600"), metavar="SECONDS",
                   help="longest wait for the peer's next message (env PPRE_PEER_TIMEOUT, default 600)")
    s.add_argument("--max-sessions", type=int, default=env("PPRE_MAX_SESSIONS", "4"), metavar="N",
                   help="most audits at once; more are refused (env PPRE_MAX_SESSIONS, default 4)")
    add_executor_argument(s)
    add_log_arguments(s)


def add_log_arguments(s: argparse.ArgumentParser) -> None:
    """`--log-format text|json` (common.logs); applied by `setup_logging`."""
    s.add_argument("--log-format", choices=("text", "json"), default=os.environ.get("PPRE_LOG_FORMAT", "text"),
                   help="log lines as text or json (one JSON object per line: time, level, service, audit_id, "
                        "event, fields) (env PPRE_LOG_FORMAT, default text)")


def setup_logging(args: argparse.Namespace, service: str) -> None:
    """The log format of this process's handlers (`ppre -v` chose the level)."""
    from common import logs
    logs.configure(getattr(args, "log_format", None) or "text", service)


def add_executor_argument(s: argparse.ArgumentParser) -> None:
    s.add_argument("--executor", default=os.environ.get("PPRE_EXECUTOR"), metavar="SPEC",
                   help="where the per-row work runs: processes (default: PPRE_WORKERS or one per CPU), "
                        "processes:N, inline, or dask://HOST:PORT (a Dask scheduler) (env PPRE_EXECUTOR)")


def make_executor(args: argparse.Namespace):
    """The service's executor (`common.execution.executors`), started now: a local pool's workers
    are ready before the first audit, a Dask cluster is checked before anything listens."""
    from common.execution.executors import executor_from_spec
    executor = executor_from_spec(args.executor)
    start = getattr(executor, "start", None)
    if start is not None:
        start()
    return executor


@contextlib.contextmanager
def shut_down_unless_serving(executor):
    """A service's executor (`make_executor`), shut down again when the service does not get
    to serve (a port already taken, a bad input file): its worker processes end with the
    failed start, not at the interpreter's exit, where a process pool left running races
    its own wake-up pipe ("Bad file descriptor" on stderr after the one error line)."""
    try:
        yield executor
    except BaseException:
        executor.shutdown(wait=True)
        raise


def add_names_argument(s: argparse.ArgumentParser, flag: str, env_name: str, default: str, what: str) -> None:
    s.add_argument(flag, action=RepeatedNames, default=os.environ.get(env_name, default), metavar="NAME",
                   help=f"{what} (repeatable, or a comma-separated list; env {env_name}, default {default})")


def add_tls_arguments(s: argparse.ArgumentParser, role: str | None) -> None:
    """Mutual TLS material for `role` (tester, client, operator; None: `--tls-role` picks),
    or `--insecure`. Read with `tls_identity(args)`."""
    from common.net.tls import ROLES

    env = os.environ.get
    g = s.add_argument_group("mutual TLS (see docs/configuration.md, 'Certificates and identities')")
    files = f"DIR/ca.pem, DIR/{role}.pem, DIR/{role}.key" if role else "DIR/ca.pem, DIR/ROLE.pem, DIR/ROLE.key"
    g.add_argument("--tls-dir", default=env("PPRE_TLS_DIR"), metavar="DIR",
                   help=f"certificates as `ppre certs init DIR` writes them: {files} (env PPRE_TLS_DIR)")
    if role is None:
        g.add_argument("--tls-role", choices=ROLES, default=env("PPRE_TLS_ROLE", "operator"),
                       help="whose certificate to present from --tls-dir (env PPRE_TLS_ROLE, default operator)")
    g.add_argument("--ca", default=env("PPRE_TLS_CA"), metavar="FILE",
                   help="the CA certificate every peer's certificate must chain to (env PPRE_TLS_CA; "
                        "instead of DIR/ca.pem)")
    g.add_argument("--cert", default=env("PPRE_TLS_CERT"), metavar="FILE",
                   help="this party's certificate chain, PEM (env PPRE_TLS_CERT)")
    g.add_argument("--key", default=env("PPRE_TLS_KEY"), metavar="FILE",
                   help="this party's private key, PEM (env PPRE_TLS_KEY)")
    g.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC: no encryption, no peer authentication, no allow-lists (says so loudly)")
    if role is not None:
        s.set_defaults(tls_role=role)


def tls_identity(args: argparse.Namespace):
    """The party's `TlsIdentity`, or None with --insecure (after the warning on stderr).
    Neither: a clear error, nothing starts."""
    import sys
    from pathlib import Path

    from common.errors import InputError
    from common.net.tls import CA_CERT, INSECURE_WARNING, TlsIdentity

    given = {flag: value for flag, value in (("--tls-dir", args.tls_dir), ("--ca", args.ca), ("--cert", args.cert),
                                             ("--key", args.key)) if value}
    if args.insecure:
        if given:
            raise InputError(f"--insecure and TLS material ({', '.join(given)}, or their PPRE_TLS_* variables) "
                             "exclude each other: choose one")
        print(INSECURE_WARNING, file=sys.stderr, flush=True)
        return None
    role = args.tls_role
    if not given:
        raise InputError("no TLS certificates: give --tls-dir DIR (create one with `ppre certs init DIR`) or "
                         "--ca, --cert and --key (env PPRE_TLS_DIR, PPRE_TLS_CA, PPRE_TLS_CERT, PPRE_TLS_KEY); "
                         "plaintext only with --insecure")
    directory = Path(args.tls_dir) if args.tls_dir else None
    if directory is not None and not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise InputError(f"'{directory}' {what}: give the directory that holds ca.pem, ROLE.pem and ROLE.key "
                         "(create one with `ppre certs init DIR`), or the files with --ca, --cert and --key",
                         parameter="--tls-dir")
    paths = {"--ca": args.ca or (directory / CA_CERT if directory else None),
             "--cert": args.cert or (directory / f"{role}.pem" if directory else None),
             "--key": args.key or (directory / f"{role}.key" if directory else None)}
    missing = [flag for flag, path in paths.items() if path is None]
    if missing:
        raise InputError(f"TLS needs {', '.join(missing)} too (or --tls-dir)")
    for flag, path in paths.items():
        if Path(path).is_dir():  # a directory where a file goes: perhaps meant as --tls-dir
            raise InputError(f"'{path}' is a directory: give the PEM file, or the directory as --tls-dir DIR "
                             f"(which holds ca.pem, {role}.pem and {role}.key)", parameter=flag)
    return TlsIdentity.from_files(paths["--ca"], paths["--cert"], paths["--key"])


def link_settings(args: argparse.Namespace):
    from common.net.channels import LinkSettings
    return LinkSettings.from_env(peer_timeout_s=args.peer_timeout)


class StopRequest:
    """A stop asked for by SIGTERM or SIGINT. The handler only sets a flag: CPython runs a
    handler in the main thread between two of its bytecodes, so a handler that took a lock
    (`threading.Event.set` takes its condition's) could interrupt that thread while it holds
    the same lock inside `Event.wait`, and wait on itself for ever. The waiting loop sleeps
    in short slices and reads the flag: a process-directed signal may land on any thread,
    and the handler runs only when the main thread next returns to the interpreter loop."""

    def __init__(self) -> None:
        self.asked = False

    def ask(self, *_: object) -> None:
        self.asked = True

    def wait(self, poll_s: float = SIGNAL_POLL_S) -> None:
        while not self.asked:
            time.sleep(poll_s)


def serve_forever(server, servicer, executor=None) -> int:
    """Block until SIGTERM/SIGINT (`StopRequest`), then shut down within about 10 s: health
    NOT_SERVING, no new audit, running sessions ended with a "shutting down" error to the
    operator and the peer, gRPC stopped, worker processes terminated."""
    stop = StopRequest()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop.ask)
    stop.wait()
    draining_since = time.monotonic()
    servicer.shutdown(SHUTDOWN_SESSIONS_S)
    time.sleep(max(0.0, NOT_SERVING_MIN_S - (time.monotonic() - draining_since)))
    server.stop(grace=SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S + 1)  # bounded: never hang on a stuck call
    if executor is not None:
        executor.shutdown(wait=False)
    return 0
