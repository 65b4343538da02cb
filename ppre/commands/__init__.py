"""Sub-commands of `ppre`; each module has `register(subparsers)` and `run(args)`."""
from __future__ import annotations

import signal
import threading


def serve_forever(server) -> int:
    """Block until SIGTERM/SIGINT, then stop the gRPC server gracefully."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait(15)  # bounded: never hang on a call gRPC failed to finish
    return 0
