"""Run a PPRE entry point in a fresh Python process and read back, from inside it, whether
it was protected (`common.execution.memory.protect_process`: core-size limit 0, not dumpable) each
time it opened one of its input files and when it exited.

The child runs `HOOK` first: an audit hook notes the process's state at every `open` of
a watched file and at the first import of each module named in ``PROTECTION_IMPORTS``,
and an exit handler prints all the notes as one ``PROTECTION [...]`` line on stderr. `unprotected=True` replaces `protect_process` with a no-op before the
entry point runs (the defence removed, for the attack tests).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.processes import child_env

ROOT = Path(__file__).resolve().parent.parent

HOOK = r'''
import atexit, ctypes, json, os, resource, sys
_libc = ctypes.CDLL(None, use_errno=True)
_notes = []
def _note(where):
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    _notes.append({"where": where, "core": [soft, hard], "dumpable": _libc.prctl(3, 0, 0, 0, 0)})  # PR_GET_DUMPABLE
_watched = {os.path.realpath(p) for p in os.environ.get("PROTECTION_WATCH", "").split(os.pathsep) if p}
_first_imports = {m for m in os.environ.get("PROTECTION_IMPORTS", "").split(",") if m}
def _on_event(event, args):
    if event == "import" and args and args[0] in _first_imports:
        _first_imports.discard(args[0])
        _note("import " + args[0])
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path in _watched:
            _note("open " + path)
sys.addaudithook(_on_event)
atexit.register(lambda: (_note("exit"), print("PROTECTION " + json.dumps(_notes), file=sys.stderr, flush=True)))
if os.environ.get("PROTECTION_OFF") == "1":
    import common.execution.memory
    common.execution.memory.protect_process = lambda: None
'''

CLI = "import sys\nfrom ppre.cli import main\nsys.exit(main(sys.argv[1:]))\n"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    notes: list[dict]

    @property
    def protected(self) -> bool:
        """Protected at every note (each watched open, and the exit)."""
        return bool(self.notes) and all(n["core"] == [0, 0] and n["dumpable"] == 0 for n in self.notes)

    @property
    def imported(self) -> list[str]:
        return [n["where"] for n in self.notes if n["where"].startswith("import ")]

    @property
    def opened(self) -> list[str]:
        return [n["where"] for n in self.notes if n["where"].startswith("open ")]


def run_protected(body: str, argv: list[str], *, cwd: Path, watch: list[Path] = (), unprotected: bool = False,
                  env: dict[str, str] | None = None, timeout: float = 300) -> Run:
    """`body` (Python, after `HOOK`) with `argv` as sys.argv[1:], in `cwd` (also HOME)."""
    extra = {"HOME": str(cwd), "XDG_DATA_HOME": str(cwd / "data-home"), "PYTHONPATH": str(ROOT),
             "PROTECTION_WATCH": os.pathsep.join(str(p) for p in watch),
             "PROTECTION_OFF": "1" if unprotected else "0", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", HOOK + body, *argv], cwd=cwd, env=child_env(extra),
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("PROTECTION ")]
    notes = json.loads(lines[-1][len("PROTECTION "):]) if lines else []
    return Run(proc.returncode, proc.stdout, proc.stderr, notes)


def run_cli(argv: list[str], **kw) -> Run:
    """`ppre ARGV` under the hook."""
    return run_protected(CLI, argv, **kw)
