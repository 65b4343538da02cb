"""The attacks beyond the harness's four, each run as its test runs it, for the report.

One runner per attack (`RUNNERS`): it runs the attack with the defence removed and with
the defaults (as the attack's own test does) and returns one `Line` per setting:
recovered against the blind guess. Attacks that are checks rather than guesses
(operations) and any attack test without a runner here (the pair-graph linker, when its
test exists) run through pytest; their line is the test count and the outcomes their
tests print.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from common.races import RACES
from tester_service.release import ReleasePolicy
from tests.helpers import one_key_inline_chunks

HERE = Path(__file__).resolve().parent
REMOVED, DEFAULTS = "defence removed", "defaults"


@dataclass
class Line:
    attack: str
    setting: str
    recovered: float | str
    blind: float | str
    total: int | str
    note: str = ""


@contextlib.contextmanager
def _patched() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def small_groups(root: Path) -> list[Line]:
    """(A) the small-groups list through LOT (`test_small_groups`)."""
    from tests.attacks import test_small_groups as a
    blind = round(a.N_TARGETS / len(RACES), 1)
    with one_key_inline_chunks():
        return [Line("A small groups", REMOVED, a._attack(ReleasePolicy.off()), blind, a.N_TARGETS,
                     "controls off: the list from exact sizes"),
                Line("A small groups", DEFAULTS, a._attack(ReleasePolicy()), blind, a.N_TARGETS)]


def membership_oracle(root: Path) -> list[Line]:
    """(D) one-member datasets against the Tester's table (`membership`)."""
    from tests.attacks import membership
    table = membership.make_table(root / "membership", 16)
    with _patched() as mp:
        membership.with_count_in_refusal(mp)
        off = membership.run(table, root / "membership-off", mp, release=membership.without_refusal_limit())
    with _patched() as mp:
        on = membership.run(table, root / "membership-on", mp, release=membership.without_refusal_limit())
    return [Line("D membership oracle", REMOVED, off.recovered, off.blind, off.targets, "the count in the refusal"),
            Line("D membership oracle", DEFAULTS, on.recovered, on.blind, on.targets,
                 "one message (refusal limit lifted to ask every target)")]


def noiseless_tester(root: Path) -> list[Line]:
    """(B2) a Tester with its controls off reads false-positive bits (`noiseless_tester`)."""
    from tests.attacks import noiseless_tester as b2
    with _patched() as mp:
        b2.send_result_back(mp)
        off = b2.run(mp, _fresh(root / "b2-off"), accept_noiseless=True)
    with _patched() as mp:
        on = b2.run(mp, _fresh(root / "b2-on"), accept_noiseless=False)
    return [Line("B2 noiseless Tester", REMOVED, off.recovered, off.blind, off.targets,
                 "Test-Client accepts noiseless aggregates and sends its result"),
            Line("B2 noiseless Tester", DEFAULTS, on.recovered, on.blind, on.targets, on.error or "")]


def averaging_reads(root: Path) -> list[Line]:
    """(e) averaging repeated reads of a Self-ID answer (`averaging`, `test_averaging`)."""
    from tester_service.demographics import preparation
    from tests.attacks import averaging
    from tests.attacks.harness import make_population
    from tests.attacks.test_averaging import N_TARGETS, POPULATION
    population = make_population(root / "averaging", **POPULATION)
    targets = population.targets[:N_TARGETS]
    lines = []
    for setting, epoch in ((averaging.REDRAWN, averaging.per_audit_epochs(seed=1)), (averaging.FIXED, None)):
        with _patched() as mp:
            if epoch:  # the defence removed: a new epoch per audit
                mp.setattr(preparation, "process_epoch", epoch)
            else:  # this Tester's own epoch, one draw per member
                mp.setattr(preparation, "_epoch", None)
            with averaging.tester(population, setting, _fresh(root / f"averaging-{bool(epoch)}")) as attacker:
                result = averaging.run(attacker, targets)
        lines.append(Line("averaging reads", REMOVED if epoch else DEFAULTS, result.outcome.recovered,
                          f"{result.outcome.targets * result.baseline_rate:.1f} (margin {result.baseline_margin})",
                          result.outcome.targets, f"one read: {result.first_read.recovered}"))
    return lines


def row_linking_attack(root: Path) -> list[Line]:
    """(B) the Tester links the joined rows (`row_linking`): the blob and vector-value
    linkers, a label decoder on ERO's linked rows, and the strata still read."""
    from tests.attacks import row_linking as b
    setup = b.make_setup(root / "linking")
    lines = []
    with one_key_inline_chunks():
        view, frame = b.run(setup, "ero")
        for linker in ("blob", "vector"):
            link = b.linking(setup, view, linker)
            lines.append(Line(f"B {linker} linker (inherent)", DEFAULTS, link.linked, 0, link.joined,
                              f"joined members linked; {link.wrong} wrong"))
        for metric in ("ero", "output", "mqos-ndcg", "pot"):
            view, frame = b.run(setup, metric) if metric != "ero" else (view, frame)
            read = b.decode_labels(setup, view, b.truth(metric, frame), metric)
            lines.append(Line(f"B linked rows, {metric}", DEFAULTS, read.recovered, read.blind, read.total,
                              "labels from the rows' plaintext"))
        lines.append(_label_as_stratum(setup))
        lines += _strata_leaks(setup)
    return lines


def _label_as_stratum(setup) -> Line:
    from tests.attacks import row_linking as b
    with _patched() as mp:
        b.label_as_stratum(mp)
        view, frame = b.run(setup, "ero")
    read = b.decode_labels(setup, view, b.truth("ero", frame), "ero")
    return Line("B linked rows, ero", REMOVED, read.recovered, read.blind, read.total, "y_true sent as a stratum")


def _strata_leaks(setup) -> list[Line]:
    """What linked rows give of each metric's strata under the defaults, and LOT's with
    its defence removed (the rows the blind path no longer sends)."""
    from common.metrics.lot import Lot
    from tests.attacks import row_linking as b
    view, frame = b.run(setup, "lot")
    lot = b.read_lot(setup, view, frame)
    with _patched() as mp:
        mp.setattr(Lot, "blind_pairs", False)
        rows_view, _ = b.run(setup, "lot", frame=frame)
    rows = b.read_lot(setup, rows_view, frame)
    view, frame = b.run(setup, "mqos-auc")
    rho, n = b.read_exact_auc(setup, view, frame)
    view, frame = b.run(setup, "prob-count")
    pools = b.read_pools(setup, view, frame)
    return [Line("B linked rows, LOT", DEFAULTS, lot.recovered, lot.blind, lot.total,
                 "rank pairs; no row reaches the Tester (design §5.3)"),
            Line("B linked rows, LOT", REMOVED, rows.recovered, rows.blind, rows.total,
                 "rank pairs; the rows with both ids and the rank pair"),
            Line("B linked rows, MQOS-AUC exact", DEFAULTS, f"Spearman {rho:.2f}", 0, n,
                 "score order; bins inside the ciphertexts"),
            Line("B linked rows, prob-count", DEFAULTS, pools.recovered, pools.blind, pools.total,
                 "pools; inside the ciphertexts")]


def out_of_bounds_attack(root: Path) -> list[Line]:
    """(C, out of model) a modified Test-Client encodes f = 2^16 (`out_of_bounds`)."""
    from tests.attacks import out_of_bounds
    with one_key_inline_chunks():
        outcome = out_of_bounds.run(3)
    return [Line("C modified Test-Client", DEFAULTS, outcome.recovered, round(outcome.blind, 1), outcome.targets,
                 f"out of model (range proofs: roadmap); error {outcome.max_error:.0e}; our Test-Client refuses")]


def rows_per_member_attack(root: Path) -> list[Line]:
    """(C) a Test-Client states one row per member on LOT's blind path (`rows_per_member`);
    the defence (the Tester's own cap) is in the code, so the line before it is the one
    measured on the commit before the cap."""
    from tests.attacks import rows_per_member
    with one_key_inline_chunks():
        outcome = rows_per_member.run()
    return [Line("C under-stated rows per member", REMOVED, 14, round(outcome.blind, 1), outcome.targets,
                 "measured before the cap: the noise sized from the stated rows"),
            Line("C under-stated rows per member", DEFAULTS, outcome.recovered, round(outcome.blind, 1),
                 outcome.targets, "the noise sized from rows_per_member (default 4), rows beyond it dropped")]


def pytest_lines(name: str, test_file: str) -> Callable[[Path], list[Line]]:
    """An attack whose test has no runner here: its tests through pytest (count and the
    outcomes they print)."""
    def run(root: Path) -> list[Line]:
        path = HERE / test_file
        if not path.exists():
            return [Line(name, "-", "-", "-", "-", f"{test_file} not present")]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(path)],
                              capture_output=True, text=True, cwd=HERE.parent.parent)
        tail = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        printed = [ln.lstrip(".xsF") for ln in tail[:-1] if ":" in ln and not ln.startswith(("tests/", "="))]
        return [Line(name, "tests", tail[-1] if tail else "no output", "-", "-", "; ".join(printed[:6]))]
    return run


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


RUNNERS: dict[str, Callable[[Path], list[Line]]] = {
    "small-groups": small_groups,
    "membership-oracle": membership_oracle,
    "noiseless-tester": noiseless_tester,
    "averaging": averaging_reads,
    "row-linking": row_linking_attack,
    "out-of-bounds": out_of_bounds_attack,
    "rows-per-member": rows_per_member_attack,
    "pair-graph": pytest_lines("B pair-graph linker", "test_pair_graph.py"),
    "operations": pytest_lines("F operations", "test_operations.py"),
}
