"""BISG quality validation against the Self-ID survey (paper appendix D; design §2.6).

`ppre tester validate-bisg` compares BISG variants with the members' own answers, the
way the paper chose baseline BISG for production (appendix D, section 8.1.4):

* ``bisg``: baseline BISG, surname + geography (``--geo``: ZCTA or tract);
* ``bifsg``: BIFSG, surname + first name + geography (with ``--first-names``);
* ``bisf``: BISF, surname + first name, no geography (with ``--first-names``;
  `tester_service.demographics.bisg` with ``geo='none'``).

Members and Self-ID are read and checked by `tester_service.demographics.preparation`'s readers
(errors name the file, column and row, never a value). Members who opted out, live
outside the US or in an excluded state are dropped first (`drop_out_of_scope`), and
their answers with them; members without an answer are not used; an answer whose id is
not among the members is counted and dropped, not an error — the rule of an audit's
preparation (`tester_service.demographics.preparation.prepare`), and as there, no answer among the
members at all is an error. The Self-ID answers are used raw (no
randomized response): this is the Tester's own check of its BISG, run on the Tester
alone. Nothing is sent anywhere and nothing is written to disk; the output is
aggregates only.

For each variant, over the members with an answer (categories `common.races.RACES`):

* **Cross-entropy**: the mean of ``−ln max(p, 1e-12)`` (nats; `PROBABILITY_FLOOR`),
  ``p`` the variant's probability of the member's self-reported race, overall and per
  self-reported group, with the group's member count. Lower is better.
* **Calibration** per group ``g``: members binned by their predicted ``Pr(g)`` in
  ``bins`` equal-width bins over [0, 1] (bin ``b`` holds ``b/bins ≤ p < (b+1)/bins``,
  the last bin also ``p = 1``); per bin its member count, the mean predicted ``Pr(g)``
  and the observed share of its members who self-reported ``g``. A calibrated variant
  has mean predicted ≈ observed share in every bin.

Small cells are withheld (`withheld_cells`): a group row or a bin with fewer than
``min_bin_count`` members (default 10, empty ones included) shows
``suppressed (< N members)`` instead of its numbers. Where the withheld cells of one
table (the group rows; one group's bins) together hold between 1 and N−1 members, the
table's totals (overall count, the group counts) would reveal them by subtraction, so
the smallest shown cell is withheld too (``suppressed (complementary: ...)``).

The report (`validate`, printed by `format_report` or as JSON with ``--json``) is a
dict with the keys:

* ``validation``: a one-line description; ``cross_entropy``: its definition;
* ``settings``: ``geo``, ``first_names``, ``bins``, ``min_bin_count``,
  ``probability_floor``;
* ``members``: ``read``, ``dropped_opt_out``, ``dropped_non_us``,
  ``dropped_excluded_state``;
* ``self_id``: ``read`` (answers in the file), ``used`` (answers of kept members),
  ``not_among_members`` (ids not in the members file), ``of_dropped_members``;
* ``variants``: variant name (``bisg``, ``bifsg``, ``bisf``) -> ``{"name": "BISG",
  "inputs": "surname + geography (zcta)", "overall": ROW, "groups": {race: ROW},
  "calibration": {race: [BIN, ...]}}`` where a ROW is ``{"count", "cross_entropy"}``,
  a BIN is ``{"lower", "upper", "count", "mean_predicted", "observed_share"}``, and a
  withheld ROW or BIN is ``{"suppressed": reason}`` (a BIN keeps ``lower``/``upper``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import InputError
from common.races import RACES
from common.tables import (ID_COLUMN, arrow_to_numpy, check_member_ids, did_you_mean, file_columns, numpy_to_arrow,
                           read_text_table, table_column)
from tester_service.demographics.bisg import GEO_TABLES, BisgResult, bisg
from tester_service.demographics.preparation import (SELF_ID_REQUIRED, PreparationConfig, drop_out_of_scope,
                                                     read_members_table, self_id_categories, validate_members)

#: p is clipped from below at this value before the log (a probability of 0 would give ∞).
PROBABILITY_FLOOR = 1e-12
DEFAULT_BINS = 10
MAX_BINS = 100
DEFAULT_MIN_BIN_COUNT = 10

#: Variant -> (printed name, inputs) (paper appendix D).
VARIANTS: dict[str, tuple[str, str]] = {
    "bisg": ("BISG", "surname + geography"),
    "bifsg": ("BIFSG", "surname + first name + geography"),
    "bisf": ("BISF", "surname + first name, no geography"),
}


@dataclass(frozen=True)
class SelfIdSample:
    """The members with a Self-ID answer (rows of the members table) and their answers."""

    members: pa.Table  # the answering members' rows (kept members only)
    categories: np.ndarray  # (n,) self-reported race, index into RACES
    counts: dict[str, dict[str, int]]  # "members" and "self_id" counts for the report


# --------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------
def cross_entropies(probs: np.ndarray, categories: np.ndarray) -> np.ndarray:
    """Per member ``−ln max(p, PROBABILITY_FLOOR)``, ``p`` its probability of its own race."""
    p = probs[np.arange(len(categories)), categories]
    return -np.log(np.maximum(p, PROBABILITY_FLOOR))


def bin_index(predicted: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bin of each probability in [0, 1]; 1.0 falls in the last bin."""
    return np.minimum(np.floor(predicted * bins), bins - 1).astype(np.int64)


def calibration(predicted: np.ndarray, observed: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin: member count, mean predicted probability, observed share (NaN when empty)."""
    b = bin_index(predicted, bins)
    counts = np.bincount(b, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_predicted = np.bincount(b, weights=predicted, minlength=bins) / counts
        share = np.bincount(b, weights=observed.astype(float), minlength=bins) / counts
    return counts, mean_predicted, share


def withheld_cells(counts: np.ndarray, min_count: int) -> list[str | None]:
    """Why each cell of one table is withheld (None: shown); module docstring."""
    counts = np.asarray(counts)
    small = counts < min_count
    reasons: list[str | None] = [f"suppressed (< {min_count} members)" if s else None for s in small]
    if 0 < counts[small].sum() < min_count and (~small).any():
        shown = np.flatnonzero(~small)
        reasons[int(shown[np.argmin(counts[shown])])] = \
            f"suppressed (complementary: the totals would reveal cells under {min_count} members)"
    return reasons


def score(probs: np.ndarray, categories: np.ndarray, bins: int = DEFAULT_BINS,
          min_count: int = DEFAULT_MIN_BIN_COUNT) -> dict:
    """Cross-entropy and calibration of one variant's ``(n, 6)`` probabilities against the
    self-reported ``categories``, small cells withheld (``overall``, ``groups`` and
    ``calibration`` of a variant in the module docstring)."""
    n = len(categories)
    ce = cross_entropies(probs, categories)
    counts = np.bincount(categories, minlength=len(RACES))
    sums = np.bincount(categories, weights=ce, minlength=len(RACES))
    overall_reason = withheld_cells(np.array([n]), min_count)[0]
    out: dict = {"overall": {"suppressed": overall_reason} if overall_reason else
                 {"count": int(n), "cross_entropy": float(ce.mean())}}
    out["groups"] = {race: {"suppressed": reason} if reason else
                     {"count": int(counts[j]), "cross_entropy": float(sums[j] / counts[j])}
                     for j, (race, reason) in enumerate(zip(RACES, withheld_cells(counts, min_count)))}
    out["calibration"] = {}
    for j, race in enumerate(RACES):
        count, mean_predicted, share = calibration(probs[:, j], categories == j, bins)
        rows = []
        for b, reason in enumerate(withheld_cells(count, min_count)):
            row: dict = {"lower": b / bins, "upper": (b + 1) / bins}
            row.update({"suppressed": reason} if reason else
                       {"count": int(count[b]), "mean_predicted": float(mean_predicted[b]),
                        "observed_share": float(share[b])})
            rows.append(row)
        out["calibration"][race] = rows
    return out


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------
def check_settings(geo: str, bins: int, min_bin_count: int) -> None:
    """Refuse a geography without a Census table, and ``bins`` / ``min_bin_count`` out of range."""
    if geo not in GEO_TABLES:
        raise InputError(f"must be one of {', '.join(GEO_TABLES)}, got '{geo}'", parameter="--geo")
    if not 1 <= bins <= MAX_BINS:
        raise InputError(f"must be between 1 and {MAX_BINS}, got {bins}", parameter="--bins")
    if min_bin_count < 1:
        raise InputError(f"must be at least 1, got {min_bin_count}", parameter="--min-bin-count")


def self_id_sample(members_path: str | Path, self_id_path: str | Path, *, geo: str = "zcta",
                   first_names: bool = False, excluded_states: tuple[str, ...] = (),
                   opt_out_column: str = "opt_out", columns: Mapping[str, str] | None = None) -> SelfIdSample:
    """Read and check both files (preparation's readers and rules) and join the answers
    to the kept members by ``member_id``. ``columns``: the column mapping of both files
    (``--id-column``, ``--column OURS=THEIRS``; docs/inputs.md, "Column mapping"), as
    `ppre tester serve` reads them."""
    m_label, s_label = str(members_path), str(self_id_path)
    members = read_members_table(members_path, opt_out_column, columns)
    member_ids = members.column("member_id").combine_chunks()
    validate_members(members, m_label, opt_out_column, ids=member_ids)
    found = file_columns(members)
    if geo == "tract" and "tract" not in members.column_names:
        raise InputError(f"is missing column 'tract' needed by --geo tract{did_you_mean('tract', found)}",
                         file=m_label)
    if first_names and "first_name" not in members.column_names:
        raise InputError(f"is missing column 'first_name' needed by --first-names"
                         f"{did_you_mean('first_name', found)}", file=m_label)
    answers = read_text_table(self_id_path, SELF_ID_REQUIRED, columns=columns)  # `read_self_id`, in Arrow
    answer_ids = answers.column("member_id").combine_chunks()
    check_member_ids(answer_ids, s_label, table_column(answers, ID_COLUMN))
    categories = self_id_categories(answers, s_label)

    config = PreparationConfig(excluded_states=excluded_states, geo=geo, first_names=first_names,
                               opt_out_column=opt_out_column)
    keep, dropped = drop_out_of_scope(members.to_pandas(), config, m_label)
    pos = arrow_to_numpy(pc.index_in(answer_ids, value_set=member_ids), null=-1).astype(np.int64)
    among = pos >= 0
    if not among.any():
        raise InputError(f"no member id is among the members of {m_label}", file=s_label, column="member_id")
    used = among & keep[np.where(among, pos, 0)]
    if not used.any():
        raise InputError("every answer belongs to a member dropped as opted out, outside the US or in an "
                         "excluded state", file=s_label)
    counts = {"members": {"read": members.num_rows, "dropped_opt_out": dropped["opt_out"],
                          "dropped_non_us": dropped["non_us"], "dropped_excluded_state": dropped["excluded_state"]},
              "self_id": {"read": answers.num_rows, "used": int(used.sum()),
                          "not_among_members": int((~among).sum()), "of_dropped_members": int((among & ~used).sum())}}
    return SelfIdSample(members=members.take(numpy_to_arrow(pos[used])), categories=categories[used], counts=counts)


def variant_probabilities(sample: SelfIdSample, geo: str, first_names: bool) -> dict[str, BisgResult]:
    """BISG, and with first names BIFSG and BISF, for the answering members."""
    m = sample.members
    tracts = m["tract"] if geo == "tract" else None
    out = {"bisg": bisg(m["surname"], zips=m["zip"], tracts=tracts, geo=geo)}
    if first_names:
        out["bifsg"] = bisg(m["surname"], zips=m["zip"], tracts=tracts, first_names=m["first_name"], geo=geo)
        out["bisf"] = bisg(m["surname"], first_names=m["first_name"], geo="none")
    return out


def validate(members_path: str | Path, self_id_path: str | Path, *, geo: str = "zcta", first_names: bool = False,
             bins: int = DEFAULT_BINS, min_bin_count: int = DEFAULT_MIN_BIN_COUNT,
             excluded_states: tuple[str, ...] = (), opt_out_column: str = "opt_out",
             columns: Mapping[str, str] | None = None) -> dict:
    """The validation report (module docstring): aggregates only, small cells withheld.
    ``columns``: the column mapping of both files (`self_id_sample`)."""
    check_settings(geo, bins, min_bin_count)
    sample = self_id_sample(members_path, self_id_path, geo=geo, first_names=first_names,
                            excluded_states=excluded_states, opt_out_column=opt_out_column, columns=columns)
    report: dict = {
        "validation": "BISG variants against Self-ID answers (paper appendix D)",
        "cross_entropy": f"mean of -ln max(p, {PROBABILITY_FLOOR:g}), p = the predicted probability of the "
                         "self-reported race (nats; lower is better)",
        "settings": {"geo": geo, "first_names": first_names, "bins": bins, "min_bin_count": min_bin_count,
                     "probability_floor": PROBABILITY_FLOOR},
        **sample.counts,
        "variants": {},
    }
    for key, result in variant_probabilities(sample, geo, first_names).items():
        name, inputs = VARIANTS[key]
        report["variants"][key] = {"name": name, "inputs": inputs + (f" ({geo})" if key != "bisf" else ""),
                                   **score(result.probabilities, sample.categories, bins, min_bin_count)}
    return report


# --------------------------------------------------------------------------------------
# Text output
# --------------------------------------------------------------------------------------
def format_report(report: dict) -> str:
    """The report as plain-text tables (one cross-entropy table, then the calibration
    tables of each variant)."""
    m, s, cfg = report["members"], report["self_id"], report["settings"]
    variants = report["variants"]
    dropped = m["dropped_opt_out"] + m["dropped_non_us"] + m["dropped_excluded_state"]
    lines = [
        f"{report['validation']}; aggregates only",
        f"members: {m['read']} read, {dropped} dropped ({m['dropped_opt_out']} opted out, "
        f"{m['dropped_non_us']} outside the US, {m['dropped_excluded_state']} in excluded states)",
        f"Self-ID: {s['read']} answers, {s['used']} used; {s['not_among_members']} not among the members, "
        f"{s['of_dropped_members']} of dropped members",
        f"cross-entropy: {report['cross_entropy']}",
        f"cells with fewer than {cfg['min_bin_count']} members are withheld",
        "",
        "variants: " + "; ".join(f"{v['name']} = {v['inputs']}" for v in variants.values()),
        "",
        f"{'cross-entropy':<14}{'members':>9}" + "".join(f"{v['name']:>10}" for v in variants.values()),
    ]
    for label in ("overall", *RACES):  # the same members in every variant: the same rows withheld
        cells = [v["overall"] if label == "overall" else v["groups"][label] for v in variants.values()]
        if "suppressed" in cells[0]:
            lines.append(f"{label:<14}{cells[0]['suppressed']}")
        else:
            lines.append(f"{label:<14}{cells[0]['count']:>9}" + "".join(f"{c['cross_entropy']:>10.4f}" for c in cells))
    for v in variants.values():
        lines += ["", f"calibration of {v['name']}, {v['inputs']}: members binned by their predicted Pr(group)"]
        for race in RACES:
            lines.append(f"  {race}")
            lines.append(f"    {'Pr(' + race + ')':<14}{'members':>9}{'mean predicted':>16}{'observed share':>16}")
            for b in v["calibration"][race]:
                bracket = "]" if b["upper"] == 1.0 else ")"
                span = f"[{b['lower']:.2f}, {b['upper']:.2f}{bracket}"
                if "suppressed" in b:
                    lines.append(f"    {span:<14}{b['suppressed']}")
                else:
                    lines.append(f"    {span:<14}{b['count']:>9}"
                                 f"{b['mean_predicted']:>16.4f}{b['observed_share']:>16.4f}")
    return "\n".join(lines)
