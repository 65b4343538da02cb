"""The executor a service runs its chunk functions on, from its text form (`--executor`,
``PPRE_EXECUTOR``): the one module that knows every implementation. The interface and
the local executors are `common.execution.parallel`'s, the Dask one
`common.execution.dask_executor`'s (which builds on `common.execution.parallel`); neither
imports this module, so the executors form no import cycle (an implementation added later
is named here, and only here).
"""
from __future__ import annotations

import os

from common.execution import parallel
from common.execution.dask_executor import DaskExecutor
from common.errors import InputError

#: the environment variable that names a service's executor (`executor_from_spec`)
EXECUTOR_ENV = "PPRE_EXECUTOR"


def executor_from_spec(spec: str | None = None) -> parallel.Executor:
    """An executor from its text form (`--executor`, else `PPRE_EXECUTOR`, else
    `processes`): `inline`, `processes` (PPRE_WORKERS or the CPU count),
    `processes:N`, or `dask://HOST:PORT` (a Dask distributed scheduler)."""
    text = (spec if spec is not None else os.environ.get(EXECUTOR_ENV, "")).strip() or "processes"
    if text == "inline":
        return parallel.InlineExecutor()
    if text == "processes":
        return parallel.ProcessExecutor()
    if text.startswith("processes:"):
        count = text.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise InputError(f"'{text}': the number of processes must be a whole number of at least 1",
                             parameter="--executor")
        return parallel.ProcessExecutor(int(count))
    if text.startswith(("dask://", "tcp://", "tls://")):
        return DaskExecutor(text)
    raise InputError(f"'{text}' is not an executor: inline, processes, processes:N or dask://HOST:PORT",
                     parameter="--executor")
