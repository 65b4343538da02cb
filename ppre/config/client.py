"""``ppre client check-config`` (docs/configuration.md): the Test-Client's settings and
every dataset they name, each read as every metric would read it, and the column mapping
checked against the datasets' headers, without opening a port or contacting anyone.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ppre.columns import client_columns
from ppre.config.check import Report, check_service_settings, check_tls, config_problems, size_words


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
    served, missing, failed_labels = [], {}, []
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
            failed_labels.append(label)
        else:
            served.append(label)
    details = {"file": str(path), "rows": rows, "columns": names, "metrics": served,
               "missing": {k: v for k, v in missing.items()}}
    if served:
        report.ok(f"dataset {name}", f"{path}: {rows} rows, {size_words(path)}; serves {', '.join(served)}", **details)
        _named_after_another_metric(report, name, path, served, missing, columns, failed_labels)
    elif not failed_labels:
        closest, absent = min(missing.items(), key=lambda kv: len(kv[1]))
        lacks = ", ".join(c if mapped_name(c, columns) == c else f"{c} (read from '{columns[c]}' by the column mapping)"
                          for c in absent)
        report.fail(f"dataset {name}", f"{path}: serves no metric (the closest, {closest}, lacks {lacks}); the file "
                                       f"has {column_listing(names)}; map a column with --column OURS=THEIRS",
                    **details)


def check_client(args: argparse.Namespace) -> int:
    """`ppre client check-config`."""
    from client_service.datasets import DatasetRegistry
    from ppre.commands.client import dataset_files

    report = Report("client", args)
    config_problems(report)
    columns = report.run("column mapping", lambda: client_columns(args),
                         lambda m: ", ".join(f"{a} <- '{b}'" for a, b in m.items()) or "none (the standard names)")
    if not args.data_only:
        check_service_settings(report, "--allow-tester", "Tester")
        check_tls(report)
        if getattr(args, "results_dir", None):
            from client_service.results import results_directory
            report.run("results directory", lambda: results_directory(args.results_dir),
                       lambda p: f"{p} (results of audits whose recipient is the Test-Client)")
    named = report.run("named datasets", lambda: dataset_files(args.dataset)) if args.dataset else {}
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


def _named_after_another_metric(report: Report, name: str, path, served: list[str], missing: dict[str, list[str]],
                                columns: dict[str, str], failed: list[str] = ()) -> None:
    """A dataset named after a metric (`ero.csv`) that cannot serve that metric is most
    likely missing a column: a warning naming the columns, and how to map one. A metric in
    ``failed`` (its columns are there, a value is wrong) has its failure said already: no warning."""
    from common.metrics import METRICS
    metric = name.strip().lower().replace("_", "-")
    if metric not in METRICS or any(label.split(" ")[0] == metric for label in (*served, *failed)):
        return
    absent = missing.get(metric) or min((v for k, v in missing.items() if k.split(" ")[0] == metric),
                                        key=len, default=[])
    lacks = ", ".join(c if c not in columns else f"{c} (read from '{columns[c]}')" for c in absent) or "?"
    report.warn(f"dataset {name}", f"{path}: named after {metric} but cannot serve it: it lacks {lacks} "
                                   f"(add the column, or map one with --column {absent[0] if absent else 'OURS'}=THEIRS; "
                                   f"it serves {', '.join(served)})", metric=metric, missing=absent)


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
