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
(the same options, `check_tester` / `check_client`) and ``config-table``. This package
sits above the service command modules (it reads their parsers and uses their helpers):
they never import it, and `ppre.cli` calls `install_services` once they have registered.
The column mapping flags are `ppre.columns`'.

**check-config** reads the settings and every file they name without opening a port or
contacting anyone, and lists every problem (one per independent check: the file, each
setting group, TLS, each input file, each dataset and metric), exit status 2, or says
all is well, exit status 0; ``--json`` prints one object. Reports hold counts, file
names and column names only, never a member id or a value.

**Modules.** Shared by both services, once: `table` (the settings read off the parsers,
and their table), `file` (reading, checking and applying a configuration file), `check`
(the check-config report and the checks both services run) and `wiring` (``--config``,
``check-config`` and ``config-table`` on the parsers). One module per service: `tester`
(``ppre tester check-config``) and `client` (``ppre client check-config``).
"""
from __future__ import annotations

from ppre.columns import client_columns, tester_columns
from ppre.config.check import Check, Report
from ppre.config.client import check_client
from ppre.config.file import apply, load_file
from ppre.config.table import (CONFIG_ENV, FALLBACK_HELP, LIST_KEYS, NOT_SETTINGS, PATH_KEYS, SERVICES, TABLE_KEYS,
                               Setting, settings, settings_table)
from ppre.config.tester import check_tester
from ppre.config.wiring import install, install_services, layered

__all__ = ["CONFIG_ENV", "FALLBACK_HELP", "LIST_KEYS", "NOT_SETTINGS", "PATH_KEYS", "SERVICES", "TABLE_KEYS",
           "Check", "Report", "Setting", "apply", "check_client", "check_tester", "client_columns", "install",
           "install_services", "layered", "load_file", "settings", "settings_table", "tester_columns"]
