"""The results this Test-Client keeps: under result recipient `client` the result is its
own, and only its own (design §3.7, §9.3).

`ResultStore.keep(audit_id, report)` holds each finished result in memory by the
audit's id (the most recent `MAX_KEPT`; `ppre audit --local` and the Python API read
it back with `pop`, since one user holds both sides there) and, with a directory
(`ppre client serve --results-dir DIR`), writes it to ``DIR/<audit id>.json``: the
``ppre audit --json`` object, readable by this user only (mode 0600), created
atomically (a temporary file, then a link that fails if the name is taken: a Tester
that repeats an audit id cannot overwrite an earlier result).

The exact joined rows are not the Test-Client's to count: an exact intersection size
would tell it whether one member is in the Tester's table (design §8.2, §9.2); the
Tester's receipt holds it (§9.3). What the Tester does send (the AggregatesHeader's
`joined_members`) is the count of distinct joined members the minimum intersection was
checked on: under the release controls that check's own noised count (Gaussian, sd σ_i,
5 members at the defaults; rounded, at least 0), a release whose ρ_i the answered audit
already spends; without the controls the exact count. The kept result has it as
``n_matched`` and its sd in its facts, ``info["joined_members_sd"]``
(`JOINED_MEMBERS_SD`; 0 for an exact count), and the reports say "about 5,003 members
(noised count, sd 5)" (`ppre.report.model.joined_rows_text`). It counts distinct
members: for a metric with one row per member (ERO, output, POT, MQOS-NDCG, the
probabilistic count) the joined rows, for the pair metrics (LOT, MQOS-AUC) the members
in the joined pairs. A result from a Tester that sent no count says ``"n_matched":
null`` rather than 0; `read_kept` reads such a file back, and the reports say whose
count it is.
"""
from __future__ import annotations

import collections
import json
import os
import secrets
import threading
from pathlib import Path

from common import logs
from common.errors import InputError, PPREError
from common.stats.results import JOINED_MEMBERS_SD, AuditReport  # present exactly when the Tester sent the count

#: results kept in memory at most (the oldest go first; the directory keeps them all)
MAX_KEPT = 64
#: a kept result's file mode: the Test-Client's operator only
FILE_MODE = 0o600


class ResultNotKept(PPREError):
    """A finished result could not be written to the results directory: the audit fails
    rather than end with a receipt for a result that is nowhere."""

    code = "internal"


def results_directory(value: str | os.PathLike) -> Path:
    """`--results-dir`, checked at start-up: an existing directory this process can write to."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise InputError(f"'{path}' is not an existing directory: create it first (mkdir -m 700 {path})",
                         parameter="--results-dir")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"'{path}' is not writable by this user: the Test-Client writes each audit's result "
                         "there", parameter="--results-dir")
    return path


class ResultStore:
    """Finished results by audit id: in memory, and in `directory` when one is given."""

    def __init__(self, directory: str | os.PathLike | None = None, *, keep: int = MAX_KEPT) -> None:
        self.directory = results_directory(directory) if directory is not None else None
        self._keep = keep
        self._lock = threading.Lock()
        self._results: collections.OrderedDict[str, AuditReport] = collections.OrderedDict()

    def keep(self, audit_id: str, report: AuditReport) -> None:
        """Hold `report` under `audit_id` (a valid id, `common.logs`); written to the
        directory first, so a result is in memory only once it is on disk too."""
        if not logs.valid_audit_id(audit_id):
            raise ResultNotKept("the audit has no valid audit id: its result cannot be kept")
        if self.directory is not None:
            self._write(audit_id, report)
        with self._lock:
            self._results[audit_id] = report
            self._results.move_to_end(audit_id)
            while len(self._results) > self._keep:
                self._results.popitem(last=False)

    def get(self, audit_id: str) -> AuditReport | None:
        with self._lock:
            return self._results.get(audit_id)

    def pop(self, audit_id: str) -> AuditReport | None:
        with self._lock:
            return self._results.pop(audit_id, None)

    def path(self, audit_id: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{audit_id}.json"

    def _write(self, audit_id: str, report: AuditReport) -> None:
        final = self.path(audit_id)
        temp = self.directory / f".{audit_id}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(kept_json(report))
                    out.flush()
                    os.fsync(out.fileno())
                os.link(temp, final)  # fails if the name is taken: never an overwrite
            finally:
                temp.unlink(missing_ok=True)
        except FileExistsError:
            raise ResultNotKept(f"a result for audit id {audit_id} is kept already") from None
        except OSError as exc:
            raise ResultNotKept(f"the result could not be written to the results directory "
                                f"({exc.strerror or type(exc).__name__})") from None


def kept_json(report: AuditReport) -> str:
    """The result as this Test-Client keeps it: the `ppre audit --json` object, whose
    ``"n_matched"`` is the joined count the Tester released, noised (its sd in
    ``info["joined_members_sd"]``), or null where it released none (module docstring:
    the exact intersection's size is the Tester's)."""
    data = report.to_dict()
    if JOINED_MEMBERS_SD not in report.info:
        data["n_matched"] = None
    return json.dumps(data)


def read_kept(text: str) -> AuditReport:
    """A result as `kept_json` (or `ppre audit --json`) wrote it; a null joined-row
    count reads as 0, which the reports show as the Tester's to know, and a released
    one with its sd (`ppre.report.model.joined_rows_text`)."""
    try:
        data = json.loads(text)
    except ValueError:
        return AuditReport.from_json(text)  # its own error for what is not JSON
    if isinstance(data, dict) and data.get("n_matched", 0) is None:
        data["n_matched"] = 0
    return AuditReport.from_dict(data)
