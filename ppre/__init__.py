"""Operator-side entry points: the `ppre` command (CLI, demo, local audits) and the
Python API (`from ppre import audit_local`: `ppre.api`).

The parties themselves live in `tester_service` and `client_service`; this package
only wires them to a command line, as `docker-compose.yml` and an operator would.

Importing it protects the process first (design §7: `protect_process`, no core dump,
not dumpable), before any module that may read member data is imported: every command
and the Python API come through here, and the commands' own imports take seconds under load.
"""
from __future__ import annotations

import os

from common.execution.memory import protect_process

protect_process()

#: gRPC's C core logs through absl, which writes INFO lines to stderr unless told
#: otherwise: a peer that shuts down with calls in flight makes it print "Got goaway".
#: stderr is part of this command's contract (`--json` writes only the audit id there),
#: so the core keeps to errors unless the operator asks for more (GRPC_VERBOSITY is read
#: once, when grpc is first imported: hence here, before any command module).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

#: what `from ppre import ...` offers, loaded on first use (the CLI stays light)
_API = {"audit_local": "ppre.api", "AuditFailed": "ppre.api", "AuditReport": "common.stats.results"}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        import importlib
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'ppre' has no attribute '{name}'")
