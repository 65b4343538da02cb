"""Sub-commands of `ppre`; each module has `register(subparsers)` and `run(args)`."""
from __future__ import annotations

import argparse
import os
import signal
import threading

#: SIGTERM to exit: sessions get this long to end cleanly, gRPC calls a little more
SHUTDOWN_SESSIONS_S = 5.0
SHUTDOWN_GRACE_S = 2.0
SIGNAL_POLL_S = 0.2


def add_service_arguments(s: argparse.ArgumentParser) -> None:
    """Options both services share: the peer deadline and the session limit."""
    env = os.environ.get
    s.add_argument("--peer-timeout", type=float, default=env("PPRE_PEER_TIMEOUT", "600"), metavar="SECONDS",
                   help="longest wait for the peer's next message (env PPRE_PEER_TIMEOUT, default 600)")
    s.add_argument("--max-sessions", type=int, default=env("PPRE_MAX_SESSIONS", "4"), metavar="N",
                   help="most audits at once; more are refused (env PPRE_MAX_SESSIONS, default 4)")


def link_settings(args: argparse.Namespace):
    from common.channels import LinkSettings
    return LinkSettings.from_env(peer_timeout_s=args.peer_timeout)


def serve_forever(server, servicer) -> int:
    """Block until SIGTERM/SIGINT, then shut down within about 10 s: health NOT_SERVING,
    no new audit, running sessions ended with a "shutting down" error to the operator
    and the peer, gRPC stopped, worker processes terminated."""
    from common import parallel

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Wait in short slices: a process-directed signal may land on any thread, and CPython
    # runs its handler only when the main thread next returns to the interpreter loop — a
    # wait without a timeout could sleep through SIGTERM for ever.
    while not stop.wait(SIGNAL_POLL_S):
        pass
    servicer.shutdown(SHUTDOWN_SESSIONS_S)
    server.stop(grace=SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S + 1)  # bounded: never hang on a stuck call
    parallel.shutdown(wait=False)
    return 0
