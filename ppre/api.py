"""The Python API, for notebooks: a local audit on pandas DataFrames or files.

    from ppre import audit_local
    result = audit_local(members="members.csv", self_id="self_id.csv",
                         client_data=outputs_df, metric="ero", correction="calibration")
    result.to_frame()        # estimate, ci_low, ci_high (and corrected_*) per group
    result.difference()      # the largest gap between two groups, with its interval
    result.overall, result.by_group, result.verdict.message

It runs exactly what `ppre audit --local` runs: both services start as real gRPC
servers on loopback in this process (mutual TLS with an in-memory development CA), the
Tester prepares its probabilities (BISG + privatised Self-ID + clipping, design
§2) or takes a probability table, and the two talk only through the protocol
(design §3). DataFrames stay in memory: nothing of them is written to disk. The
result is the `common.stats.results.AuditReport` the CLI serialises (`to_json()` is the
`ppre audit --json` object). A refused or failed audit raises `AuditFailed` with the
error code and message the CLI would print. The calling process is protected first
(`common.execution.memory.protect_process`: no core dump, not dumpable, for the rest of its life;
design §7), as every process holding member data is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from common.stats import bootstrap as boot
from common.stats.results import DEFAULT_TAU, AuditReport
from tester_service.release import (DEFAULT_BUDGET, DEFAULT_MAX_POPULATION_REFUSALS, DEFAULT_POPULATION_BUDGET,
                                    DEFAULT_RHO_PER_AUDIT)

#: the dataset name the Test-Client knows the local data by
LOCAL_DATASET = "local"
#: how a notebook user changes the budget and its ledger, quoted by a refusal
API_SETTINGS = ("audit_local(privacy_budget=...) sets the budget, audit_local(privacy_ledger=PATH) keeps it in "
                "another file; each pair of inputs has its own budget")


#: the default wait for an audit: as long as the Tester lets one run
#: (`tester_service.server.AUDIT_DEADLINE_S`, not imported here to keep this module light)
AUDIT_TIMEOUT_S = 6 * 3600.0


class AuditFailed(RuntimeError):
    """The audit ended without a result: `code` as in `ppre audit --json`'s error object
    (bad_input, release_refused, protocol_error, ...), `message` in words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def audit_local(client_data, *, metric: str = "ero", members=None, self_id=None, probabilities=None,
                option: str = "", params: Mapping[str, Any] | None = None,
                bootstrap: int = boot.DEFAULT_REPLICATES, confidence: float = boot.DEFAULT_CONFIDENCE,
                tau: float = DEFAULT_TAU, seed: int | None = None, correction: str = "none",
                result_recipient: str = "client", release_controls: bool = True,
                noise_rho: float = DEFAULT_RHO_PER_AUDIT, privacy_budget: float = DEFAULT_BUDGET,
                population_budget: float = DEFAULT_POPULATION_BUDGET,
                max_population_refusals: int | None = DEFAULT_MAX_POPULATION_REFUSALS,
                privacy_ledger: str | Path | None = None, history: bool | str | Path | None = True,
                preparation=None, executor=None, timeout: float = AUDIT_TIMEOUT_S,
                on_progress: Callable | None = None, tester_columns: Mapping[str, str] | None = None,
                client_columns: Mapping[str, str] | None = None) -> AuditReport:
    """One audit through both services on loopback.

    `client_data`: the Test-Client's dataset for `metric` (a DataFrame, or a CSV/Parquet
    file). The Tester's side: `members` (and optionally `self_id`), prepared per audit
    with `preparation` (a `tester_service.demographics.preparation.PreparationConfig`; default: the
    service's defaults), or a ready `probabilities` table (member_id + group columns).
    `params`: the metric's parameters (`ppre audit --metric-param`). `release_controls`:
    False turns them off (exact results, no protection: docs/threat-model.md,
    design §8). With them on, the audit spends `noise_rho` of the budget
    `privacy_budget` of this pair of inputs, kept in `privacy_ledger` (default: the
    ledger `ppre audit --local` keeps in the user's data directory; `_release`), exactly
    as `ppre audit --local --noise-rho --privacy-budget --privacy-ledger` does: the
    third audit of one pair at the defaults is refused (`AuditFailed`, code
    `privacy_budget_exhausted`), and so is any audit once all pairs with the same
    Tester inputs together have spent `population_budget` (`--population-budget`), or
    once `max_population_refusals` audits of those Tester inputs were refused for their
    intersection (`--max-population-refusals`; None: no limit). `history`: True (default) keeps the result in the run
    history `ppre audit --local` keeps (`ppre runs list`), a path keeps it there,
    False or None keeps nothing. `executor`: a `common.execution.parallel.Executor` for the
    per-row work (default: inline). `on_progress(progress)`: called with each
    `Progress` event. `tester_columns`, `client_columns`: the column mappings (our
    column name -> the file's or DataFrame's, as `--tester-column` / `--client-column`
    give them: ``client_columns={"member_id": "Member ID", "y_pred": "prediction"}``).
    `result_recipient`: who finishes the result (design §3.7); with `"client"` the
    Test-Client keeps it and the Tester a receipt, and since this process holds both
    sides the result returned is the Test-Client's with the Tester's facts
    (`ppre.local`), as with `"tester"`. The run history keeps that result too
    (aggregates only: `tester_service.history`, "A local run")."""
    from client_service.datasets import DatasetRegistry
    from common.errors import InputError
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.server import run_audit

    from common.tables import parse_column_mapping
    from ppre.commands.audit import in_context
    from common.execution.memory import protect_process
    protect_process()  # this process (the notebook's) now holds members' data: no core dump (design §7)
    metric = _metric(metric)
    tester_map = parse_column_mapping(items=tester_columns or {}, parameter="tester_columns")
    client_map = parse_column_mapping(items=client_columns or {}, parameter="client_columns")
    load = in_context(_tester_loader(members, self_id, probabilities, preparation, tester_map),
                      _api_mapping("tester_columns"))
    load()  # fail fast, before any service starts
    if isinstance(client_data, pd.DataFrame):
        registry = DatasetRegistry(frames={LOCAL_DATASET: client_data}, columns=client_map,
                                   how=_api_mapping("client_columns"))
    else:
        registry = DatasetRegistry(named={LOCAL_DATASET: Path(client_data)}, columns=client_map,
                                   how=_api_mapping("client_columns"))
    request = pb.AuditRequest(metric=metric, client_dataset=LOCAL_DATASET, bootstrap=bootstrap,
                              confidence=confidence, has_seed=seed is not None, seed=seed or 0,
                              result_recipient=result_recipient, metric_option=option, tau=tau,
                              metric_params={k: _param_text(v) for k, v in (params or {}).items()},
                              correction=correction)
    try:
        release, accountant = _release(release_controls, noise_rho, privacy_budget, privacy_ledger,
                                       (probabilities, None) if probabilities is not None else (members, self_id),
                                       client_data, population_budget, max_population_refusals)
    except InputError as exc:  # e.g. a client file that cannot be read: as the Test-Client would say it
        raise AuditFailed(exc.code, str(exc)) from None
    with local_services(load, registry, release=release, accountant=accountant, executor=executor,
                        history=_history(history)) as services:
        event = run_audit(services.tester_address, request, timeout=timeout, on_progress=on_progress,
                          tls=services.operator_tls)
    if event.WhichOneof("event") != "result":
        raise AuditFailed(event.error.code, event.error.message)
    return AuditReport.from_proto(event.result)


def _release(controls: bool, rho: float, budget: float, ledger, tester_inputs, client_data,
             population_budget: float, max_population_refusals: int | None):
    """The release policy and privacy accountant of `ppre audit --local` (its
    `local_release`): the budget of this pair of inputs and that of the Tester's inputs'
    population (`release.local_accountant`), or with the controls off no control and an
    unlimited, unkept budget."""
    from tester_service.release import PrivacyAccountant, ReleasePolicy, local_accountant
    if not controls:
        policy = ReleasePolicy.off()
        return policy, PrivacyAccountant(policy.budget)
    policy = ReleasePolicy(rho=rho, budget=budget)
    return policy, local_accountant(policy.budget, tester_inputs, client_data, ledger, settings=API_SETTINGS,
                                    population_budget=population_budget,
                                    max_population_refusals=max_population_refusals)


def _history(history):
    """The run history `audit_local` writes to, as `ppre audit --local --history` does."""
    from tester_service.history import RunHistory, local_history_path
    if history is None or history is False:
        return None
    return RunHistory(local_history_path() if history is True else history)


def _metric(name: str) -> str:
    """A metric's name, in any case and with `_` for `-`; a near miss: a did-you-mean."""
    from common.errors import InputError
    from common.metrics import METRICS
    from common.tables import did_you_mean
    metric = str(name).strip().lower().replace("_", "-")
    if metric not in METRICS:
        raise InputError(f"unknown metric '{name}'{did_you_mean(str(name), METRICS)}; the metrics: "
                         f"{', '.join(METRICS)}", parameter="metric")
    return metric


def _api_mapping(parameter: str) -> Callable[[str], str]:
    """How a column is mapped in the API, for a missing column's message."""
    return lambda column: f"audit_local({parameter}={{'{column}': NAME}})"


def _renamed(frame: pd.DataFrame, columns: Mapping[str, str]) -> pd.DataFrame:
    """A DataFrame's columns under our names (the column mapping; names matched as the
    file readers match them: case and surrounding spaces ignored)."""
    theirs = {v.strip().lower(): k for k, v in columns.items()}
    return frame.rename(columns={c: theirs[str(c).strip().lower()] for c in frame.columns
                                 if str(c).strip().lower() in theirs})


def _tester_loader(members, self_id, probabilities, preparation,
                   columns: Mapping[str, str] | None = None) -> Callable[[], pd.DataFrame]:
    """The Tester's probabilities per audit, from DataFrames (in memory) or files."""
    from common.errors import InputError
    from tester_service.demographics.preparation import PreparationConfig, prepare

    if (members is None) == (probabilities is None):
        raise InputError("give the Tester's members (and self_id) or a probabilities table, not both",
                         parameter="members")
    cfg = preparation or PreparationConfig()
    if probabilities is not None:
        from tester_service.inputs import read_probability_table
        return lambda: read_probability_table(probabilities, cfg.group_mapping, columns)  # a file or a DataFrame
    if isinstance(members, pd.DataFrame):
        from common.tables import DATAFRAME_LABEL
        from tester_service.demographics.preparation import read_self_id
        if self_id is None or isinstance(self_id, pd.DataFrame):
            survey, label = None if self_id is None else _renamed(self_id, columns or {}), DATAFRAME_LABEL
        else:
            survey, label = read_self_id(self_id, columns), str(self_id)
        people = _renamed(members, columns or {})
        return lambda: prepare(people.copy(), None if survey is None else survey.copy(), cfg,
                               labels=(DATAFRAME_LABEL, label))
    from tester_service.server import prepare_from_files
    return lambda: prepare_from_files(members, self_id, cfg, columns)


def _param_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
