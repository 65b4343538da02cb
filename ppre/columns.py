"""The column mapping flags of the services and of ``ppre audit --local``: how a party's
files name PPRE's columns (``--id-column NAME``, ``--column OURS=THEIRS``, docs/inputs.md;
`common.tables.parse_column_mapping` reads them), checked against the columns each party
reads. The command modules (`ppre.commands.tester`, `ppre.commands.client`,
`ppre.commands.audit`) and the configuration (`ppre.config`) use it; it imports neither.
"""
from __future__ import annotations

import argparse
import difflib
import os
from typing import Iterable, Mapping

from common.errors import InputError
from ppre.flags import RepeatedNames

#: environment variables of the column mapping (services only; `ppre audit --local` has flags)
ID_COLUMN_ENV = "PPRE_ID_COLUMN"
COLUMNS_ENV = "PPRE_COLUMNS"


def add_column_arguments(s: argparse.ArgumentParser, prefix: str = "", *, env: bool = True,
                         whose: str = "the files") -> None:
    """``--[PREFIX]id-column NAME`` and ``--[PREFIX]column OURS=THEIRS`` (repeatable); with
    ``env``, their defaults come from ``PPRE_ID_COLUMN`` and ``PPRE_COLUMNS`` (a comma list)."""
    dest = prefix.replace("-", "_")
    s.add_argument(f"--{prefix}id-column", dest=f"{dest}id_column", metavar="NAME",
                   default=os.environ.get(ID_COLUMN_ENV) if env else None,
                   help=f"the column of {whose} that holds the member ids, if it is not 'member_id' "
                        f"(same as --{prefix}column member_id=NAME)" + (f" (env {ID_COLUMN_ENV})" if env else ""))
    s.add_argument(f"--{prefix}column", dest=f"{dest}column", action=RepeatedNames, metavar="OURS=THEIRS",
                   default=os.environ.get(COLUMNS_ENV, "") if env else "",
                   help=f"read the column THEIRS of {whose} as PPRE's column OURS, e.g. y_pred=prediction "
                        "(repeatable)" + (f" (env {COLUMNS_ENV}: a comma-separated list)" if env else ""))


def column_mapping(args: argparse.Namespace, prefix: str = "") -> dict[str, str]:
    """The column mapping of `add_column_arguments` (a flag list, the env's comma list, or
    a TOML table), checked: {our name: the file's name}."""
    from common.tables import parse_column_mapping
    dest = prefix.replace("-", "_")
    items = getattr(args, f"{dest}column", None) or ()
    if isinstance(items, str):
        items = [x for x in items.split(",") if x.strip()]
    return parse_column_mapping(getattr(args, f"{dest}id_column", None), items, parameter=f"--{prefix}column")


def _check_known(mapping: Mapping[str, str], known: Iterable[str], parameter: str, what: str) -> None:
    known = sorted(set(known))
    for ours in mapping:
        if ours not in known:
            close = difflib.get_close_matches(ours, known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise InputError(f"'{ours}' is not a column {what} reads{hint}; the columns are: {', '.join(known)}",
                             parameter=parameter)


def tester_columns(args: argparse.Namespace, prefix: str = "") -> dict[str, str]:
    """The Tester's column mapping, for its members and Self-ID files (or its probability
    table, whose group columns may have any name)."""
    from tester_service.demographics.preparation import MEMBER_OPTIONAL, MEMBER_REQUIRED, SELF_ID_REQUIRED
    mapping = column_mapping(args, prefix)
    if getattr(args, "members", None) or getattr(args, "tester_members", None):
        opt_out = (getattr(args, "opt_out_column", None) or "opt_out").strip().lower()
        _check_known(mapping, (*MEMBER_REQUIRED, *MEMBER_OPTIONAL, *SELF_ID_REQUIRED, opt_out),
                     f"--{prefix}column", "the Tester's members or Self-ID file")
    return mapping


def members_columns(args: argparse.Namespace, prefix: str = "") -> dict[str, str]:
    """A members file's column mapping alone (`ppre bisg`: `--id-column`, `--column
    OURS=THEIRS`, docs/inputs.md), checked against the columns a members file has."""
    from tester_service.demographics.preparation import MEMBER_OPTIONAL, MEMBER_REQUIRED
    mapping = column_mapping(args, prefix)
    _check_known(mapping, (*MEMBER_REQUIRED, *MEMBER_OPTIONAL), f"--{prefix}column", "the members file")
    return mapping


def client_columns(args: argparse.Namespace, prefix: str = "") -> dict[str, str]:
    """The Test-Client's column mapping, for every dataset; its names are the metrics' columns."""
    mapping = column_mapping(args, prefix)
    _check_known(mapping, client_column_names(), f"--{prefix}column", "a Test-Client dataset")
    return mapping


def client_column_names() -> set[str]:
    from common.metrics import METRICS
    from common.tables import ID_COLUMN
    names = {ID_COLUMN}
    for metric in METRICS.values():
        names.update(metric.numeric_columns, metric.text_columns, metric.optional_columns,
                     getattr(metric, "threshold_columns", ()))
    return names
