"""What ``check-config`` shares between the services (docs/configuration.md): the report
(`Report`: each check ok or failed, as text or one JSON object, exit status 2 on any
problem) and the checks both services run (the configuration file, the peer link and
session limits, the allow-list, the executor, TLS, a writable file's directory).
Reports hold counts, file names and column names only, never a member id or a value.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from common.errors import InputError, PPREError
from ppre.config.file import PROBLEMS_ATTRIBUTE, SOURCES_ATTRIBUTE
from ppre.config.table import settings


@dataclass
class Check:
    name: str
    ok: bool
    message: str
    details: dict = field(default_factory=dict)
    #: not a problem (the exit status stays 0), but likely a mistake the report names
    warning: bool = False


class Report:
    def __init__(self, service: str, args: argparse.Namespace) -> None:
        self.service = service
        self.args = args
        self.checks: list[Check] = []

    def ok(self, name: str, message: str, **details) -> None:
        self.checks.append(Check(name, True, message, details))

    def fail(self, name: str, message: str, **details) -> None:
        self.checks.append(Check(name, False, message, details))

    def warn(self, name: str, message: str, **details) -> None:
        """A likely mistake that does not stop the service (a dataset named after a
        metric it cannot serve): said, and listed after the checks; exit status 0."""
        self.checks.append(Check(name, True, message, details, warning=True))

    @property
    def warnings(self) -> list[str]:
        return [f"{c.name}: {c.message}" for c in self.checks if c.warning]

    def run(self, name: str, fn: Callable[[], Any], describe: Callable[[Any], str] | None = None) -> Any:
        """fn(); a PPREError (or an OS error) is a problem of check `name`; None then."""
        try:
            value = fn()
        except PPREError as exc:
            self.fail(name, str(exc))
            return None
        except OSError as exc:
            self.fail(name, f"{type(exc).__name__}: {exc.strerror or exc}")
            return None
        if describe is not None:
            self.ok(name, describe(value))
        return value

    @property
    def problems(self) -> list[str]:
        return [f"{c.name}: {c.message}" for c in self.checks if not c.ok]

    def settings(self) -> dict[str, dict]:
        sources = getattr(self.args, SOURCES_ATTRIBUTE, {})
        out = {}
        for s in settings(self.service):
            value = getattr(self.args, s.dest, None)
            if isinstance(value, Path):
                value = str(value)
            elif not isinstance(value, (str, int, float, bool, list, dict, type(None))):
                value = str(value)
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            out[s.key] = {"value": value, "source": sources.get(s.key, "default")}
        return out

    def to_json(self) -> str:
        return json.dumps({"ok": not self.problems, "service": self.service,
                           "config": getattr(self.args, "config", None), "settings": self.settings(),
                           "checks": [{"check": c.name, "ok": c.ok, "message": c.message, **(
                               {"details": c.details} if c.details else {}), **(
                               {"warning": True} if c.warning else {})} for c in self.checks],
                           "problems": self.problems, "warnings": self.warnings}, indent=2, allow_nan=False, default=str)

    def to_text(self) -> str:
        config = getattr(self.args, "config", None)
        lines = [f"ppre {self.service} check-config" + (f": {config}" if config else " (no configuration file)")]
        given = {k: v for k, v in self.settings().items() if v["source"] != "default"}
        lines.append(f"settings not at their default ({len(given)}; source: flag, env or file):")
        width = max((len(k) for k in given), default=0)
        for key, v in given.items():
            value = v["value"]
            shown = ", ".join(f"{a}={b}" for a, b in value.items()) if isinstance(value, dict) else (
                ", ".join(map(str, value)) if isinstance(value, list) else value)
            shown = '""' if shown == "" else shown
            lines.append(f"  {key:<{width}}  {shown}  ({v['source']})")
        lines.append("checks:")
        for c in self.checks:
            lines.append(f"  {'WARN' if c.warning else 'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.message}")
        problems = self.problems
        if problems:
            lines.append(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}:")
            lines.extend(f"  - {p}" for p in problems)
        warnings = self.warnings
        if warnings:
            lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}:")
            lines.extend(f"  - {w}" for w in warnings)
        if not problems:
            lines.append("all is well" + (" but for the warnings above" if warnings else ""))
        return "\n".join(lines)

    def finish(self) -> int:
        print(self.to_json() if getattr(self.args, "json", False) else self.to_text(), flush=True)
        return 2 if self.problems else 0


def size_words(path: str | Path) -> str:
    """A file's size as people read it ("?" where it cannot be read)."""
    from common.tables import size_text
    try:
        return size_text(os.stat(path).st_size)
    except OSError:
        return "?"


def config_problems(report: Report) -> None:
    """The configuration file's problems (`ppre.config.file.apply`) as the report's first check."""
    problems = getattr(report.args, PROBLEMS_ATTRIBUTE, [])
    config = getattr(report.args, "config", None)
    for p in problems:
        report.fail("configuration file", p)
    if config and not problems:
        report.ok("configuration file", f"{config}: read")


def check_service_settings(report: Report, names_flag: str, names_role: str) -> None:
    """The settings both services share: the links (peer timeout, session limit), the allow-list
    of `names_flag` (`names_role`s) and the executor."""
    args = report.args
    from common.net.tls import AllowList, parse_names
    from ppre.commands import link_settings

    def links():
        settings_ = link_settings(args)
        if not args.peer_timeout > 0:
            raise InputError("must be above 0", parameter="--peer-timeout")
        if args.max_sessions < 1:
            raise InputError("must be at least 1", parameter="--max-sessions")
        return settings_

    report.run("links", links, lambda s: f"peer timeout {s.peer_timeout_s:g} s, keepalive {s.keepalive_s:g} s, "
                                         f"heartbeat {s.heartbeat_s:g} s, at most {args.max_sessions} audits at once")
    dest = names_flag[2:].replace("-", "_")
    report.run("allow-list", lambda: AllowList.of(names_role, parse_names(getattr(args, dest)), names_flag),
               lambda a: f"{names_role}s allowed: {', '.join(parse_names(getattr(args, dest)))}")

    def executor():
        from common.execution.executors import executor_from_spec
        spec = args.executor
        if spec and spec.strip().startswith(("dask://", "tcp://", "tls://")):
            return f"{spec.strip()} (the scheduler is not contacted here)"
        return executor_from_spec(spec).name
    report.run("executor", executor, lambda name: name)


def check_tls(report: Report) -> None:
    """The TLS identity: its certificate, key and CA, and how long it is valid (or --insecure)."""
    import datetime as dt

    from ppre.commands import tls_identity

    def load():
        identity = tls_identity(report.args)
        if identity is None:
            return None
        cert = identity.certificate
        until = cert.not_valid_after_utc
        if until < dt.datetime.now(dt.timezone.utc):
            raise InputError(f"the certificate ({identity.identity}) expired on {until:%Y-%m-%d}",
                             file=identity.source or None)
        return identity, until

    def describe(value):
        if value is None:
            return "INSECURE: plaintext gRPC, peers not authenticated (--insecure)"
        identity, until = value
        return (f"mutual TLS as {identity.identity} (names: {', '.join(identity.names)}); the key matches the "
                f"certificate, which the CA issued; valid until {until:%Y-%m-%d}")
    report.run("TLS", load, describe)


def check_writable_parent(report: Report, name: str, path: str | None, what: str) -> None:
    """Whether the file `path` (`what`: how it is written) can be written: its directory exists
    and it is a file if it exists."""
    if not path:
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        report.fail(name, f"{path}: its directory {parent} does not exist")
    elif Path(path).exists() and not Path(path).is_file():
        report.fail(name, f"{path}: is not a file")
    else:
        state = "exists" if Path(path).exists() else "will be created"
        report.ok(name, f"{path} ({what}; {state})")

