"""A service's configuration file: reading, checking and applying it (docs/configuration.md).

Settings are top-level keys; ``[columns]`` and ``[datasets]`` are tables. Relative paths
are relative to the file's directory. A key that is no setting is an error naming the
key and the file; a value of the wrong type names the key, the file and the type
expected. `apply` fills what the command line and the environment left unset (highest
first: flag, environment variable, file, default) and notes each setting's source.
"""
from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from pathlib import Path
from typing import Any

from common.errors import InputError
from ppre.config.table import LIST_KEYS, Setting, settings

GIVEN_ATTRIBUTE = "_ppre_given"
SOURCES_ATTRIBUTE = "config_sources"
PROBLEMS_ATTRIBUTE = "config_problems"


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
    given = set(getattr(args, GIVEN_ATTRIBUTE, ()) or ())
    if hasattr(args, GIVEN_ATTRIBUTE):
        delattr(args, GIVEN_ATTRIBUTE)
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
    setattr(args, SOURCES_ATTRIBUTE, sources)
    setattr(args, PROBLEMS_ATTRIBUTE, [str(p) for p in problems])
    return args
