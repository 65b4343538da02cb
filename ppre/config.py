"""One configuration file per service, the one table of settings, and `check-config`.

**Settings.** Every option of `ppre tester serve` and `ppre client serve` is a setting,
given (highest first) by its flag, its environment variable, the service's TOML file
(`--config FILE`, env ``PPRE_CONFIG``) or its default. Nothing is declared twice: the
settings are read off the argparse definitions (`settings(service)`): a setting's TOML
key is its flag's long name with ``_`` for ``-`` (``--peer-timeout`` -> ``peer_timeout``),
its environment variable the ``PPRE_*`` variable its default is read from, and its
default what it is with no such variable. ``ppre tester config-table`` prints the one
table of them (docs/configuration.md); `tests/test_config.py` checks the table against
the parsers. (The parser is built once per process, with ``os.environ.get`` shadowed
for the ``PPRE_*`` names while it is built: do it, as `apply` does, before threads start.)

**The file.** Settings are top-level keys (``port = 50051``, ``self_id = "..."``,
``excluded_states = ["TX"]``, ``ca = "certs/ca.pem"``, ``insecure = false``); the two
repeatable ``NAME=VALUE`` flags are tables: ``[columns]`` (``--column``: ``member_id =
"Member ID"``) and ``[datasets]`` (``--dataset``: ``ero = "data/ero.csv"``). Relative
paths in the file are relative to the file's directory. A key that is no setting is an
error naming the key and the file; a value of the wrong type is an error naming the
key, the file and the type expected. An empty environment variable counts as unset.

**How.** `install` adds ``--config`` to a serve parser, records which flags the command
line gave (each action notes itself when argparse calls it) and wraps the command's
function so that the file is applied before it runs; it also adds ``check-config``
(the same options, `check_tester` / `check_client`) and ``config-table``. This module
sits above the service command modules (it reads their parsers and uses their helpers):
they never import it, and `ppre.cli` calls `install_services` once they have registered.
The column mapping flags are `ppre.columns`'.

**check-config** reads the settings and every file they name without opening a port or
contacting anyone, and lists every problem (one per independent check: the file, each
setting group, TLS, each input file, each dataset and metric), exit status 2, or says
all is well, exit status 0; ``--json`` prints one object. Reports hold counts, file
names and column names only, never a member id or a value.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import os
import re
import sys
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from common.errors import InputError, PPREError
from ppre.columns import client_columns, tester_columns

#: the environment variable that names the configuration file
CONFIG_ENV = "PPRE_CONFIG"
#: the services a configuration file configures: (command module, action)
SERVICES = {"tester": ("tester", "serve"), "client": ("client", "serve")}
#: TOML keys that are not the flag's long name: the repeatable NAME=VALUE flags are tables
TABLE_KEYS = {"--column": "columns", "--dataset": "datasets"}
#: settings that name a file or a directory besides those with metavar FILE or DIR:
#: a relative path in a configuration file is relative to the file's directory
PATH_KEYS = frozenset({"members", "self_id", "probabilities", "audit_log", "history", "privacy_ledger",
                       "data_dir", "tls_dir", "ca", "cert", "key"})
#: comma-separated settings that also take a TOML array of strings
LIST_KEYS = frozenset({"excluded_states"})
#: options that are no setting
NOT_SETTINGS = frozenset({"help", "config"})

_GIVEN = "_ppre_given"
_SOURCES = "config_sources"
_PROBLEMS = "config_problems"


# --------------------------------------------------------------------------------------
# The settings, read off the parsers
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    key: str             # the TOML key
    dest: str            # the argparse destination
    flag: str            # the long flag
    env: str | None      # its environment variable
    default: Any         # with no environment variable set
    help: str
    kind: str            # bool, int, float, str, names, columns, datasets
    choices: tuple | None = None
    path: bool = False   # names a file or directory
    type: Any = None

    @property
    def default_text(self) -> str:
        d = self.default
        if self.kind == "bool":
            return "on" if d else "off"
        if d is None or d == "" or d == []:
            return "–"
        return ", ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)


#: what a setting without a help text of its own means (for the table)
FALLBACK_HELP = {"host": "the address to listen on", "port": "the port to listen on",
                 "buckets": "bootstrap buckets the joined rows are assigned to (resampling unit)",
                 "opt_out_column": "the members file's opt-out column (1/true/yes: not measured)"}


def _help_text(text: str) -> str:
    """A flag's help without what the table's other columns say: in each parenthesis, the
    parts (split at ';') that name the environment variable or a plain default."""
    def strip(match: re.Match) -> str:
        parts = [p.strip() for p in match.group(1).split(";")]
        kept = [p for p in parts if not re.match(r"env [A-Z_]+", p) and not re.fullmatch(r"default [^:]*", p)]
        return f" ({'; '.join(kept)})" if kept else ""
    text = re.sub(r"\s*\(((?:[^()]|\([^()]*\))*)\)", strip, text)
    return text.replace("%%", "%").strip()


_BUILD_LOCK = threading.Lock()


def _register(service: str) -> Callable[[argparse._SubParsersAction], None]:
    """The `register` of the service's command module (this module sits above them)."""
    from ppre.commands import client, tester
    return {"tester": tester.register, "client": client.register}[service]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


@functools.cache
def settings(service: str) -> tuple[Setting, ...]:
    """The settings of `ppre SERVICE serve`, from its parser built with every ``PPRE_*``
    variable hidden (so defaults are the defaults) and each option's variable noted."""
    module, command = SERVICES[service]
    envs: dict[int, list[str]] = {}
    pending: list[str] = []
    real_get = os.environ.get
    original_add = argparse._ActionsContainer.add_argument

    def get(key, default=None):
        if isinstance(key, str) and key.startswith("PPRE_"):
            pending.append(key)
            return default
        return real_get(key, default)

    def add_argument(self, *a, **k):
        action = original_add(self, *a, **k)
        envs[id(action)] = list(pending)
        pending.clear()
        return action

    with _BUILD_LOCK:
        os.environ.get = get  # an instance attribute: shadows Mapping.get while the parser is built
        argparse._ActionsContainer.add_argument = add_argument
        try:
            root = argparse.ArgumentParser(prog="ppre")
            sub = root.add_subparsers(dest="command")
            _register(service)(sub)
        finally:
            del os.environ.get
            argparse._ActionsContainer.add_argument = original_add
    parser = _subparser(_subparser(root, module), command)
    out = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in NOT_SETTINGS or isinstance(action, argparse._HelpAction):
            continue
        flag = longs[0]
        key = TABLE_KEYS.get(flag, flag[2:].replace("-", "_"))
        if action.nargs == 0:
            kind = "bool"
        elif key in ("columns", "datasets"):
            kind = key
        elif type(action).__name__ == "_Names":
            kind = "names"
        elif action.type is int:
            kind = "int"
        elif action.type is float:
            kind = "float"
        else:
            kind = "str"
        names = [e for e in envs.get(id(action), []) if e != CONFIG_ENV]
        text = _help_text(action.help or FALLBACK_HELP.get(key, ""))
        out.append(Setting(key=key, dest=action.dest, flag=flag, env=names[0] if names else None,
                           default=action.default, help=text, kind=kind,
                           choices=tuple(action.choices) if action.choices else None,
                           path=key in PATH_KEYS or action.metavar in ("FILE", "DIR"), type=action.type))
    return tuple(out)


def settings_table() -> str:
    """The one Markdown table of both services' settings (docs/configuration.md)."""
    rows: dict[tuple, list[str]] = {}
    for service in SERVICES:
        for s in settings(service):
            row = (s.key, s.flag, s.env or "–", s.default_text, s.help)
            rows.setdefault(row, []).append(service)
    lines = ["| TOML key | flag | environment | default | service | meaning |", "|---|---|---|---|---|---|"]
    for (key, flag, env, default, text), services in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1])):
        who = "both" if len(services) == len(SERVICES) else ", ".join(services)
        cells = (f"`{key}`", f"`{flag}`", f"`{env}`" if env != "–" else env,
                 f"`{default}`" if default != "–" else default, who, text.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------
def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


def _path(value: str, base: Path) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def _convert(s: Setting, value: Any, base: Path, label: str) -> Any:
    """A TOML value as the parsed flag would hold it; InputError naming key, file and type."""
    def wrong(expected: str) -> InputError:
        return InputError(f"expected {expected}, got {_toml_type(value)}", file=label, parameter=s.key)

    def strings(v) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    if s.kind == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if s.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong("an integer")
        return value
    if s.kind == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise wrong("a number")
        return float(value)
    if s.kind == "names":
        if isinstance(value, str):
            return [value]
        if not strings(value):
            raise wrong("a string or an array of strings")
        return list(value)
    if s.kind in ("columns", "datasets"):
        what = ('a table of OURS = "THEIRS" (e.g. [columns] member_id = "Member ID")' if s.kind == "columns"
                else 'a table of NAME = "FILE" (e.g. [datasets] ero = "data/ero.csv")')
        if not isinstance(value, dict):
            raise wrong(what)
        for k, v in value.items():
            if not isinstance(v, str):
                raise InputError(f"{s.key}.{k}: expected a string, got {_toml_type(v)}", file=label,
                                 parameter=s.key)
        if s.kind == "columns":
            return dict(value)
        return [f"{k}={_path(v, base)}" for k, v in value.items()]
    # a string setting (some also take an array of strings)
    if s.key in LIST_KEYS and strings(value):
        value = ",".join(value)
    elif not isinstance(value, str):
        raise wrong("a string or an array of strings" if s.key in LIST_KEYS else "a string")
    if s.choices and value not in s.choices:
        raise InputError(f"must be one of {', '.join(map(str, s.choices))}, got '{value}'", file=label,
                         parameter=s.key)
    if s.type not in (None, str):
        try:
            return s.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise InputError(f"cannot be read ({exc})", file=label, parameter=s.key) from None
    return _path(value, base) if s.path else value


def load_file(path: str | Path, service: str) -> tuple[dict[str, Any], list[InputError]]:
    """({setting key: value as parsed}, every problem of the file)."""
    label = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return {}, [InputError("configuration file not found", file=label)]
    except OSError as exc:
        return {}, [InputError(f"configuration file cannot be read ({exc.strerror})", file=label)]
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, [InputError("is not UTF-8 text", file=label)]
    except tomllib.TOMLDecodeError as exc:
        return {}, [InputError(f"is not valid TOML: {exc}", file=label)]
    by_key = {s.key: s for s in settings(service)}
    values: dict[str, Any] = {}
    problems: list[InputError] = []
    base = Path(path).resolve().parent
    for key, value in data.items():
        s = by_key.get(key)
        if s is None:
            close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            if isinstance(value, dict):
                hint += "; settings are top-level keys (only [columns] and [datasets] are tables)"
            problems.append(InputError(f"unknown setting of `ppre {service} serve`{hint}", file=label,
                                       parameter=key))
            continue
        try:
            values[key] = _convert(s, value, base, label)
        except InputError as exc:
            problems.append(exc)
    return values, problems


def apply(args: argparse.Namespace, service: str, *, collect: bool = False) -> argparse.Namespace:
    """Fill every setting the command line and the environment left unset from the
    configuration file (if any); note each setting's source in ``args.config_sources``.
    Problems of the file raise (all of them, in one error), or with ``collect`` are kept
    in ``args.config_problems`` (check-config)."""
    given = set(getattr(args, _GIVEN, ()) or ())
    if hasattr(args, _GIVEN):
        delattr(args, _GIVEN)
    values: dict[str, Any] = {}
    problems: list[InputError] = []
    if getattr(args, "config", None):
        values, problems = load_file(args.config, service)
    if problems and not collect:
        if len(problems) == 1:
            raise problems[0]
        raise InputError(f"{len(problems)} problems: " + "; ".join(str(p) for p in problems))
    sources = {}
    for s in settings(service):
        if s.dest in given:
            sources[s.key] = "flag"
        elif s.env and os.environ.get(s.env):
            sources[s.key] = "env"
        elif s.key in values:
            setattr(args, s.dest, values[s.key])
            sources[s.key] = "file"
        else:
            sources[s.key] = "default"
    setattr(args, _SOURCES, sources)
    setattr(args, _PROBLEMS, [str(p) for p in problems])
    return args


# --------------------------------------------------------------------------------------
# Wiring into the parsers
# --------------------------------------------------------------------------------------
@functools.cache
def _noting(cls: type) -> type:
    """`cls` whose call also notes, in the namespace, that its option was given."""
    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, _GIVEN, None)
        if given is None:
            given = set()
            setattr(namespace, _GIVEN, given)
        given.add(self.dest)
        return cls.__call__(self, parser, namespace, values, option_string)
    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "_ppre_noting": True})


def _note_given(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction) \
                and not getattr(type(action), "_ppre_noting", False):
            action.__class__ = _noting(type(action))


def layered(func: Callable[[argparse.Namespace], int], service: str, *, collect: bool = False):
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        return func(apply(args, service, collect=collect))
    return run


def install_services(commands: argparse._SubParsersAction) -> None:
    """`install` on each service whose command `commands` holds (`ppre.cli` calls it once
    the command modules have registered: they do not import this module)."""
    for service, (module, action) in SERVICES.items():
        parser = commands.choices.get(module)
        if parser is not None:
            actions = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            install(actions, actions.choices[action], service)


def install(actions: argparse._SubParsersAction, serve: argparse.ArgumentParser, service: str) -> None:
    """`--config` on `ppre SERVICE serve` (call once its options and `func` are set), and
    the sub-commands ``check-config`` (the same options, and ``--json``) and ``config-table``."""
    serve.add_argument("--config", default=os.environ.get(CONFIG_ENV), metavar="FILE",
                       help=f"a TOML file of settings: keys are the flags' long names with '_' (e.g. peer_timeout "
                            f"= 600); flags and environment variables win over it (env {CONFIG_ENV}; "
                            "docs/configuration.md)")
    _note_given(serve)
    serve.set_defaults(func=layered(serve.get_default("func"), service))
    check = actions.add_parser("check-config", parents=[serve], add_help=False,
                               help="check the settings and the files they name, without serving",
                               description="Read the settings (flags, environment, --config FILE) and every "
                                           "file they name, as `serve` would, without opening a port: list every "
                                           "problem (exit status 2) or say that all is well (0).")
    check.add_argument("--json", action="store_true", help="print the report as one JSON object")
    check.add_argument("--data-only", action="store_true",
                       help="check the data files and the settings that read them only, not TLS, the peer link "
                            "or the session limits (for `ppre audit --local`, which makes its own certificates)")
    check.set_defaults(func=layered(check_tester if service == "tester" else check_client, service, collect=True))
    table = actions.add_parser("config-table", help="print the table of both services' settings (Markdown)")
    table.set_defaults(func=lambda args: print(settings_table()) or 0)


# --------------------------------------------------------------------------------------
# check-config
# --------------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    ok: bool
    message: str
    details: dict = field(default_factory=dict)


class Report:
    def __init__(self, service: str, args: argparse.Namespace) -> None:
        self.service = service
        self.args = args
        self.checks: list[Check] = []

    def ok(self, name: str, message: str, **details) -> None:
        self.checks.append(Check(name, True, message, details))

    def fail(self, name: str, message: str, **details) -> None:
        self.checks.append(Check(name, False, message, details))

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
        sources = getattr(self.args, _SOURCES, {})
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
                               {"details": c.details} if c.details else {})} for c in self.checks],
                           "problems": self.problems}, indent=2, allow_nan=False, default=str)

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
            lines.append(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.message}")
        problems = self.problems
        if problems:
            lines.append(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}:")
            lines.extend(f"  - {p}" for p in problems)
        else:
            lines.append("all is well")
        return "\n".join(lines)

    def finish(self) -> int:
        print(self.to_json() if getattr(self.args, "json", False) else self.to_text(), flush=True)
        return 2 if self.problems else 0


def _size(path: str | Path) -> str:
    from common.tables import _size_text
    try:
        return _size_text(os.stat(path).st_size)
    except OSError:
        return "?"


def _config_problems(report: Report) -> None:
    problems = getattr(report.args, _PROBLEMS, [])
    config = getattr(report.args, "config", None)
    for p in problems:
        report.fail("configuration file", p)
    if config and not problems:
        report.ok("configuration file", f"{config}: read")


def _check_service_settings(report: Report, names_flag: str, names_role: str) -> None:
    args = report.args
    from common.tls import AllowList, parse_names
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
        from common.executors import executor_from_spec
        spec = args.executor
        if spec and spec.strip().startswith(("dask://", "tcp://", "tls://")):
            return f"{spec.strip()} (the scheduler is not contacted here)"
        return executor_from_spec(spec).name
    report.run("executor", executor, lambda name: name)


def _check_tls(report: Report) -> None:
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


def _check_writable_parent(report: Report, name: str, path: str | None, what: str) -> None:
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


def check_tester(args: argparse.Namespace) -> int:
    """`ppre tester check-config`."""
    import pyarrow as pa

    from tester_service.demographics.bisg import SOURCES
    from common.tables import check_member_ids, clean_member_ids
    from ppre.commands.tester import preparation_config
    from tester_service.demographics.preparation import (prepare, read_members, read_self_id, self_id_categories,
                                                         validate_members)
    from tester_service.inputs import read_probability_table
    from tester_service.release import PrivacyAccountant, ReleasePolicy

    report = Report("tester", args)
    _config_problems(report)
    columns = report.run("column mapping", lambda: tester_columns(args),
                         lambda m: ", ".join(f"{a} <- '{b}'" for a, b in m.items()) or "none (the standard names)")
    prep = report.run("preparation settings", lambda: preparation_config(args),
                      lambda p: f"epsilon {p.epsilon:g}, "
                                f"T {'by the 90% rule' if p.threshold is None else p.threshold}, "
                                f"geography {p.geo}{', first names (BIFSG)' if p.first_names else ''}"
                                f"{', excluded states ' + ','.join(p.excluded_states) if p.excluded_states else ''}"
                                f"{', groups ' + ','.join(p.group_mapping.names) if p.group_mapping else ''}")

    def release():
        if args.no_release_controls:
            return "OFF (--no-release-controls): exact results, no noise, no thresholds, no budget"
        policy = ReleasePolicy(min_intersection=args.min_intersection, min_effective_size=args.min_effective_size,
                               rho=args.noise_rho, budget=args.privacy_budget)
        from ppre.commands.tester import require_ledger
        if not args.data_only:  # a service setting: noise on needs a ledger, or --ephemeral-budget said out loud
            require_ledger(args, policy)
        PrivacyAccountant(policy.budget, args.privacy_ledger)  # reads the ledger, if any; writes nothing
        ledger = f"ledger {args.privacy_ledger}" if args.privacy_ledger else "ledger in memory"
        return (f"min intersection {policy.min_intersection}, min effective size {policy.min_effective_size:g}, "
                f"rho {policy.rho:g} per audit, budget {policy.budget:g} ({ledger})")
    report.run("release controls", release, lambda text: text)
    if args.buckets < 1:
        report.fail("bootstrap buckets", f"--buckets must be at least 1, got {args.buckets}")
    if not args.data_only:
        _check_service_settings(report, "--allow-operator", "operator")
        _check_writable_parent(report, "audit log", args.audit_log, "appended to")
        _check_writable_parent(report, "run history", getattr(args, "history", None), "SQLite run history")
        _check_tls(report)

    if bool(args.probabilities) == bool(args.members):
        report.fail("inputs", "give exactly one of --probabilities (a prepared table) and --members")
    elif columns is None:
        report.fail("inputs", "not read: the column mapping is wrong (above)")
    elif args.probabilities:
        mapping = prep.group_mapping if prep is not None else None

        def describe(table):
            groups = [c for c in table.columns if c != "member_id"]
            return (f"{args.probabilities}: {len(table)} members, {_size(args.probabilities)}; "
                    f"groups {', '.join(groups)}")
        report.run("probability table", lambda: read_probability_table(args.probabilities, mapping, columns),
                   describe)
    else:
        opt_out = prep.opt_out_column if prep is not None else args.opt_out_column

        def members():
            frame = read_members(args.members, opt_out, columns)
            validate_members(frame, str(args.members), opt_out)
            return frame
        member_frame = report.run("members file", members, lambda f: (
            f"{args.members}: {len(f)} members, {_size(args.members)}; columns {', '.join(f.columns)}"))
        survey = None
        if args.self_id:
            def self_id():
                frame = read_self_id(args.self_id, columns)
                ids = clean_member_ids(pa.array(frame["member_id"].to_numpy(dtype=object)), str(args.self_id))
                check_member_ids(ids, str(args.self_id))
                self_id_categories(frame, str(args.self_id))
                return frame
            survey = report.run("Self-ID file", self_id, lambda f: (
                f"{args.self_id}: {len(f)} answers, {_size(args.self_id)}"))
        if member_frame is not None and prep is not None and (survey is not None or not args.self_id):
            def preparation():
                out = prepare(member_frame, survey, prep, labels=(str(args.members), str(args.self_id)))
                return out.attrs["preparation"]

            def describe(st):
                kept = st.members_in - st.dropped_opt_out - st.dropped_non_us - st.dropped_excluded_state
                sources = ", ".join(f"{s} {st.sources.get(s, 0)} ({st.sources.get(s, 0) / max(kept, 1):.1%})"
                                    for s in SOURCES)
                return (f"{kept} of {st.members_in} members kept (dropped: {st.dropped_opt_out} opted out, "
                        f"{st.dropped_non_us} outside the US, {st.dropped_excluded_state} in excluded states); "
                        f"BISG sources: {sources}; Self-ID answers used {st.self_id_used}, of members not kept "
                        f"{st.self_id_dropped}, of people not in the members file {st.self_id_not_among_members} "
                        f"(dropped); T = {st.threshold:.4f}, {st.clipped_rows} rows clipped")
            stats = report.run("preparation (BISG, Self-ID, clipping; in memory)", preparation, describe)
            if stats is not None:
                report.checks[-1].details = {"members_in": stats.members_in, "bisg_sources": dict(stats.sources),
                                             "self_id_used": stats.self_id_used, "threshold": stats.threshold}
    return report.finish()


def _metric_variants():
    """(label, metric, the columns it needs, its parameters) for every metric (ERO twice:
    with y_pred, and from scores with a decision threshold)."""
    from common.metrics import METRICS
    from common.tables import ID_COLUMN
    for metric in METRICS.values():
        needed = [c for c in (ID_COLUMN, *metric.numeric_columns, *metric.text_columns)
                  if c not in metric.optional_columns]
        yield metric.name, metric, needed, {}
        if getattr(metric, "threshold_columns", None):
            yield (f"{metric.name} with --decision-threshold", metric, [ID_COLUMN, *metric.threshold_columns],
                   {"decision_threshold": "0.5"})


def _check_dataset(report: Report, registry, name: str, columns: dict[str, str]) -> None:
    import numpy as np

    from common.tables import column_listing, file_header, mapped_name
    path = report.run(f"dataset {name}", lambda: registry.path(name))
    if path is None:
        return
    header = report.run(f"dataset {name}", lambda: file_header(path))
    if header is None:
        return
    names, rows = header
    lower = {n.lower() for n in names}
    served, missing = [], {}
    failed = False
    for label, metric, needed, params in _metric_variants():
        absent = [c for c in needed if mapped_name(c, columns) not in lower]
        if absent:
            missing[label] = absent
            continue

        def rows_for(metric=metric, params=params):
            option = metric.options[0]
            metric = metric.for_option(option)
            frame = metric.read(str(path), columns=columns)
            parsed = metric.parse_params(params)
            return metric.client_rows(frame, str(path), option, parsed, np.random.default_rng(0))
        out = report.run(f"dataset {name} for {label}", lambda: rows_for())
        if out is None:
            failed = True
        else:
            served.append(label)
    details = {"file": str(path), "rows": rows, "columns": names, "metrics": served,
               "missing": {k: v for k, v in missing.items()}}
    if served:
        report.ok(f"dataset {name}", f"{path}: {rows} rows, {_size(path)}; serves {', '.join(served)}", **details)
    elif not failed:
        closest, absent = min(missing.items(), key=lambda kv: len(kv[1]))
        lacks = ", ".join(c if mapped_name(c, columns) == c else f"{c} (read from '{columns[c]}' by the column mapping)"
                          for c in absent)
        report.fail(f"dataset {name}", f"{path}: serves no metric (the closest, {closest}, lacks {lacks}); the file "
                                       f"has {column_listing(names)}; map a column with --column OURS=THEIRS",
                    **details)


def check_client(args: argparse.Namespace) -> int:
    """`ppre client check-config`."""
    from client_service.datasets import DatasetRegistry
    from ppre.commands.client import _named

    report = Report("client", args)
    _config_problems(report)
    columns = report.run("column mapping", lambda: client_columns(args),
                         lambda m: ", ".join(f"{a} <- '{b}'" for a, b in m.items()) or "none (the standard names)")
    if not args.data_only:
        _check_service_settings(report, "--allow-tester", "Tester")
        _check_tls(report)
        if getattr(args, "results_dir", None):
            from client_service.results import results_directory
            report.run("results directory", lambda: results_directory(args.results_dir),
                       lambda p: f"{p} (results of audits whose recipient is the Test-Client)")
    named = report.run("named datasets", lambda: _named(args.dataset)) if args.dataset else {}
    if args.data_dir and not Path(args.data_dir).is_dir():
        report.fail("data directory", f"{args.data_dir}: is not a directory")
    registry = DatasetRegistry(args.data_dir, named or {}, columns or {})
    names = registry.names()
    if not names:
        report.fail("datasets", "none: give --data-dir DIR (files NAME.csv or NAME.parquet) or --dataset NAME=FILE")
    elif columns is None:
        report.fail("datasets", "not read: the column mapping is wrong (above)")
    else:
        for name in names:
            _check_dataset(report, registry, name, columns)
        _check_mapped_columns(report, registry, names, columns)
    return report.finish()


def _check_mapped_columns(report: Report, registry, names: list[str], columns: dict[str, str]) -> None:
    """Each column the mapping reads must be in at least one dataset (one mapping serves
    all of them): a misspelt mapped name fails here, with the closest column found."""
    from common.tables import column_listing, did_you_mean, file_header
    headers: dict[str, list[str]] = {}
    for name in names:
        try:
            path = registry.path(name)
            headers[str(path)] = file_header(path)[0]
        except Exception:  # noqa: BLE001 - the dataset's own check reported it
            continue
    if not headers:
        return
    found = {c.strip().lower() for header in headers.values() for c in header}
    every = [c for header in headers.values() for c in header]
    for ours, theirs in columns.items():
        if theirs.strip().lower() in found or theirs.strip().lower() == ours:
            continue
        files = ", ".join(headers)
        has = column_listing(next(iter(headers.values()))) if len(headers) == 1 else "other columns"
        flag = "--id-column NAME" if ours == "member_id" else f"--column {ours}=NAME"
        report.fail("column mapping", f"{ours}={theirs}: no dataset has a column '{theirs}'"
                                      f"{did_you_mean(theirs, every)}; file {files} has {has}; correct the "
                                      f"name ({flag})")
