"""The audit result: one object, serialised one way (design §5.10).

`finish()` turns the decrypted cell ratios of every replicate into the result; the
Test-Client runs it when it learns the result, the Tester when only it does, so both
report the same thing. Its parts:

* `groups` (by group, with an "overall" entry where the metric has one), `cells`
  (group pairs: LOT per rank pair and pooled, POT's DTI), `curves` (POT's m_j(s_q)),
  `pools` (probabilistic count);
* `differences`: between groups (a − b) and to overall (group − overall), each with
  an interval from the same replicates as the estimates (fairlearn's `*_ci` idea);
* `verdict` (`common.stats.verdict`: the rules, the severities, the groups left out).

Every reported estimate, interval end, difference and corrected value is clipped to its
range, and flagged informative or not, as `common.stats.intervals` says; the verdict's
sentences are `common.stats.wording`'s. The groups too small to take part in a verdict
are chosen by `common.stats.left_out`. The plain-text table and the HTML page of a
result are the renderers' (`ppre.report`).

`AuditReport.to_dict()` is the `ppre audit --json` contract and also what the
Test-Client sends the Tester (`ClientResult.report_json`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from common.errors import ProtocolError
from common.stats.declared_range import clipped_facts
from common.stats.intervals import (clip, difference_range, estimate_intervals, finite_or_none, is_informative,
                                    null_scaled, resolved, value_range)
from common.stats.verdict import Verdict, verdict_of

DEFAULT_TAU = 0.05
#: the preparation counts in the order a reader follows them (others, e.g. BISG sources, after)
PREPARATION_ORDER = ("members_read", "dropped_opt_out", "dropped_non_us", "dropped_excluded_state",
                     "self_id_used", "self_id_not_among_kept", "self_id_not_among_members", "epsilon",
                     "clipped_rows", "threshold")


# ----------------------------------------------------------------------------------
# Result parts
# ----------------------------------------------------------------------------------
#: the fields a group or curve entry has only when a correction was asked for
CORRECTED_FIELDS = ("corrected_estimate", "corrected_ci_low", "corrected_ci_high", "corrected_informative")


@dataclass(frozen=True)
class GroupResult:
    group: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    #: the attenuation-corrected value and its interval (`common.stats.correction`), None when
    #: no correction was asked for or the group's is withheld
    corrected_estimate: float | None = None
    corrected_ci_low: float | None = None
    corrected_ci_high: float | None = None
    #: whether the interval's half-width is at most INFORMATIVE_SHARE·τ (`common.stats.intervals`)
    informative: bool = False
    corrected_informative: bool | None = None

    @classmethod
    def from_values(cls, group: str, estimate: float, low: float, high: float) -> "GroupResult":
        return cls(group, finite_or_none(estimate), finite_or_none(low), finite_or_none(high))


@dataclass(frozen=True)
class PairResult:
    higher: str
    lower: str
    rank_pair: str | None
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    informative: bool = False


@dataclass(frozen=True)
class CurvePoint:
    group: str
    score: float
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    corrected_estimate: float | None = None
    corrected_ci_low: float | None = None
    corrected_ci_high: float | None = None
    informative: bool = False
    corrected_informative: bool | None = None


@dataclass(frozen=True)
class Difference:
    """estimate = a − b; kind "between" (two groups) or "to_overall" (b is "overall")."""

    kind: str
    a: str
    b: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    informative: bool = False


#: the result's `info` key that says the pools' member counts are noised (the probabilistic
#: count's encrypted form: each the sum of its groups' noised counts)
NOISED_MEMBERS = "pool_members_noised"
#: the result's `info` key under which a Test-Client's kept copy holds the noise sd (members;
#: 0: exact) of its `n_matched`, the joined count the Tester released (`client_service.results`)
JOINED_MEMBERS_SD = "joined_members_sd"


@dataclass(frozen=True)
class PoolResult:
    pool: str
    group: str
    members: int
    expected_count: float | None  # None: suppressed by the release controls
    prob_at_least: float | None
    included: bool | None  # None: withheld, unknown (neither included nor missing)



@dataclass(frozen=True)
class AuditReport:
    metric: str
    metric_option: str
    n_matched: int
    bootstrap: int
    confidence: float
    interval: str
    groups: list[GroupResult]
    verdict: Verdict
    cells: list[PairResult] = field(default_factory=list)
    curves: list[CurvePoint] = field(default_factory=list)
    pools: list[PoolResult] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    result_recipient: str = "client"
    tau: float = DEFAULT_TAU
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: the Tester's preparation counts (members read, dropped, Self-ID used, clipping threshold)
    preparation: dict[str, float] = field(default_factory=dict)
    #: the Tester's release controls as applied to this audit (noise, privacy budget,
    #: suppressed cells; `tester_service.release`); empty when the report left no Tester
    release: dict[str, Any] = field(default_factory=dict)
    #: the attenuation correction's facts (`common.stats.correction.Corrected.summary`); empty
    #: when none was asked for
    correction: dict[str, Any] = field(default_factory=dict)
    #: how the Tester coarsened the six races into the groups ("hsm=black+hispanic+aian,…";
    #: `common.races.GroupMapping`), "" for none
    group_mapping: str = ""
    #: "client" on the Tester's receipt of an audit whose result only the Test-Client
    #: holds (result recipient `client`, design §3.7): no groups, cells, curves,
    #: differences or verdict, only the Tester's own facts; "" on a result
    delivered_to: str = ""
    #: the audit's id (common.logs) on a receipt and on the Test-Client's kept result, by
    #: which the Test-Client's copy is found (`ppre client serve --results-dir`); "" otherwise
    audit_id: str = ""

    @property
    def is_receipt(self) -> bool:
        """Whether this is the Tester's receipt, not a result (`delivered_to`)."""
        return bool(self.delivered_to)

    def group(self, name: str) -> GroupResult:
        return next(g for g in self.groups if g.group == name)

    @property
    def overall(self) -> GroupResult | None:
        return next((g for g in self.groups if g.group == "overall"), None)

    @property
    def by_group(self) -> list[GroupResult]:
        return [g for g in self.groups if g.group != "overall"]

    def difference(self, a: str | None = None, b: str | None = None) -> Difference | None:
        """A difference between groups with its interval (fairlearn's `difference()`): with
        no arguments the largest gap between two groups, oriented max − min by the
        estimates; `difference(a, b)` is a − b ("overall" allowed as b). None where the
        metric compares no groups (LOT, POT, probabilistic count)."""
        if a is None and b is None:
            between = [d for d in self.differences if d.kind == "between" and d.estimate is not None]
            if not between:
                return None
            d = max(between, key=lambda x: abs(x.estimate))
            return d if d.estimate >= 0 else _flipped(d)
        if a is None or b is None:
            raise ValueError("give both groups, or neither for the largest gap")
        for d in self.differences:
            if (d.a, d.b) == (a, b):
                return d
            if (d.a, d.b) == (b, a):
                return _flipped(d)
        known = ", ".join(g.group for g in self.groups)
        raise KeyError(f"no difference {a} - {b} in this result (groups: {known or 'none'})")

    def to_frame(self):
        """The per-group entries as a pandas DataFrame indexed by group (the corrected
        columns too when a correction was asked for)."""
        import pandas as pd
        rows = [self._entry(g) for g in self.groups]
        return pd.DataFrame(rows, columns=["group", "estimate", "ci_low", "ci_high",
                                           *(CORRECTED_FIELDS if self.correction else ())]).set_index("group")

    # ------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        d = {
            "metric": self.metric,
            "metric_option": self.metric_option,
            "n_matched": self.n_matched,
            "bootstrap": self.bootstrap,
            "confidence": self.confidence,
            "interval": self.interval,
            "groups": [self._entry(g) for g in self.groups],
        }
        if self.cells:
            d["cells"] = [asdict(c) for c in self.cells]
        if self.curves:
            d["curves"] = [self._entry(c) for c in self.curves]
        if self.pools:
            d["pools"] = [asdict(p) for p in self.pools]
        v = asdict(self.verdict)
        v["significant_comparisons"] = list(v["significant_comparisons"])
        v["non_overlapping"] = [list(p) for p in v["non_overlapping"]]
        v["excluded_groups"] = list(v["excluded_groups"])
        v["uninformative"] = list(v["uninformative"])
        if v["clipped"] is None:  # only where the Test-Client clipped rows (`common.stats.declared_range`)
            del v["clipped"]
        d.update({
            "differences": [asdict(x) for x in self.differences],
            "verdict": v,
            "params": self.params,
            "info": self.info,
            "result_recipient": self.result_recipient,
            "tau": self.tau,
            "phase_seconds": {k: round(s, 4) for k, s in self.phase_seconds.items()},
            "preparation": {k: (v if k in ("threshold", "epsilon") else int(v))
                            for k, v in preparation_in_order(self.preparation)},
        })
        if self.release:
            d["release"] = release_clean(self.release)
        if self.correction:
            d["correction"] = self.correction
        if self.group_mapping:
            d["group_mapping"] = self.group_mapping
        if self.delivered_to:
            d["delivered_to"] = self.delivered_to
        if self.audit_id:
            d["audit_id"] = self.audit_id
        return d

    def _entry(self, part) -> dict:
        entry = asdict(part)
        if not self.correction:
            for name in CORRECTED_FIELDS:
                del entry[name]
        return entry

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "AuditReport":
        """The inverse of `to_dict`; anything malformed is a ProtocolError (it comes from a peer)."""
        try:
            v = dict(d["verdict"])
            verdict = Verdict(rule=str(v["rule"]), tau=float(v["tau"]), severity=str(v["severity"]),
                              significant=bool(v["significant"]), flagged=bool(v["flagged"]),
                              compared=v.get("compared"),
                              significant_comparisons=tuple(str(s) for s in v.get("significant_comparisons", ())),
                              non_overlapping=tuple((str(a), str(b)) for a, b in v.get("non_overlapping", ())),
                              message=str(v.get("message", "")),
                              excluded_groups=tuple(str(g) for g in v.get("excluded_groups", ())),
                              mdd=finite_or_none(v.get("mdd")),
                              uninformative=tuple(str(g) for g in v.get("uninformative", ())),
                              members_factor=finite_or_none(v.get("members_factor")),
                              attenuation=dict(v["attenuation"]) if v.get("attenuation") else None,
                              clipped=dict(v["clipped"]) if v.get("clipped") else None,
                              equivalent=_flag(v.get("equivalent")),
                              may_reach_tau=bool(v.get("may_reach_tau", False)))
            return cls(
                metric=str(d["metric"]), metric_option=str(d["metric_option"]), n_matched=int(d["n_matched"]),
                bootstrap=int(d["bootstrap"]), confidence=float(d["confidence"]), interval=str(d["interval"]),
                groups=[GroupResult(str(g["group"]), finite_or_none(g["estimate"]), finite_or_none(g["ci_low"]),
                                    finite_or_none(g["ci_high"]),
                                    *(finite_or_none(g.get(k)) for k in CORRECTED_FIELDS[:3]),
                                    informative=bool(g.get("informative", False)),
                                    corrected_informative=_flag(g.get("corrected_informative")))
                        for g in d["groups"]],
                verdict=verdict,
                cells=[PairResult(str(c["higher"]), str(c["lower"]),
                                  None if c["rank_pair"] is None else str(c["rank_pair"]),
                                  finite_or_none(c["estimate"]), finite_or_none(c["ci_low"]),
                                  finite_or_none(c["ci_high"]),
                                  informative=bool(c.get("informative", False)))
                       for c in d.get("cells", [])],
                curves=[CurvePoint(str(c["group"]), float(c["score"]), finite_or_none(c["estimate"]),
                                   finite_or_none(c["ci_low"]), finite_or_none(c["ci_high"]),
                                   *(finite_or_none(c.get(k)) for k in CORRECTED_FIELDS[:3]),
                                   informative=bool(c.get("informative", False)),
                                   corrected_informative=_flag(c.get("corrected_informative")))
                       for c in d.get("curves", [])],
                pools=[PoolResult(str(p["pool"]), str(p["group"]), int(p["members"]),
                                  finite_or_none(p["expected_count"]),
                                  finite_or_none(p["prob_at_least"]),
                                  None if p["included"] is None else bool(p["included"]))
                       for p in d.get("pools", [])],
                differences=[Difference(str(x["kind"]), str(x["a"]), str(x["b"]), finite_or_none(x["estimate"]),
                                        finite_or_none(x["ci_low"]), finite_or_none(x["ci_high"]),
                                        informative=bool(x.get("informative", False)))
                             for x in d.get("differences", [])],
                params=dict(d.get("params", {})), info=dict(d.get("info", {})),
                result_recipient=str(d.get("result_recipient", "client")), tau=float(d.get("tau", DEFAULT_TAU)),
                phase_seconds={str(k): float(s) for k, s in d.get("phase_seconds", {}).items()},
                preparation={str(k): float(s) for k, s in d.get("preparation", {}).items()},
                release=dict(d.get("release", {})), correction=dict(d.get("correction", {})),
                group_mapping=str(d.get("group_mapping", "")), delivered_to=str(d.get("delivered_to", "")),
                audit_id=str(d.get("audit_id", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"the result is malformed ({type(exc).__name__}: {exc})") from None

    def to_proto(self) -> "object":
        from proto import ppre_pb2 as pb
        return pb.AuditResult(report_json=self.to_json())

    @classmethod
    def from_proto(cls, result) -> "AuditReport":
        return cls.from_json(result.report_json)

    @classmethod
    def from_json(cls, text: str) -> "AuditReport":
        try:
            data = json.loads(text)
        except ValueError:
            raise ProtocolError("the result is not JSON") from None
        if not isinstance(data, dict):
            raise ProtocolError("the result is not a JSON object")
        return cls.from_dict(data)

    @property
    def intervals_from_moments(self) -> bool:
        """Whether the intervals are parametric draws from the released second moments
        (`common.stats.moments`, release noise on), not a bootstrap."""
        return str(self.release.get("interval_from", "")).startswith("second moments")



def _flipped(d: Difference) -> Difference:
    neg = (lambda x: None if x is None else -x)
    return Difference(d.kind, d.b, d.a, neg(d.estimate), neg(d.ci_high), neg(d.ci_low), d.informative)


def _flag(x: Any) -> bool | None:
    return None if x is None else bool(x)


def release_clean(release: dict[str, Any]) -> dict[str, Any]:
    """The release facts as reported: effective sizes are sizes (a noised size below 0 reads 0)."""
    sizes = release.get("effective_sizes")
    if not isinstance(sizes, dict):
        return release
    return {**release, "effective_sizes": {g: (max(0.0, float(v)) if finite_or_none(v) is not None else v)
                                           for g, v in sizes.items()}}


def preparation_in_order(counts: dict[str, float]) -> list[tuple[str, float]]:
    """The preparation counts in PREPARATION_ORDER, others after by name."""
    rank = {name: i for i, name in enumerate(PREPARATION_ORDER)}
    return sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


# ----------------------------------------------------------------------------------
# Receipts
# ----------------------------------------------------------------------------------
#: what the Tester adds to a result it passes on, and all a receipt holds beside the
#: audit's settings (design §3.7): its own facts, never an estimate
TESTER_FACTS = ("metric", "metric_option", "n_matched", "result_recipient", "tau", "phase_seconds", "preparation",
                "release", "group_mapping")
#: a receipt's verdict message, and the first words of its one line
DELIVERED = "result delivered to the Test-Client"


def receipt(*, metric: str, option: str, bootstrap: int, confidence: float, interval: str, tau: float,
            params: dict[str, Any], audit_id: str) -> AuditReport:
    """The Tester's receipt of an audit whose result only the Test-Client holds (result
    recipient `client`, design §3.7): the audit's settings and id; no group, cell,
    curve, difference or verdict. The Tester adds its own facts (`TESTER_FACTS`)."""
    verdict = Verdict(rule="", tau=tau, severity="", significant=False, flagged=False, compared=None,
                      message=f"{DELIVERED}; audit id {audit_id}")
    return AuditReport(metric=metric, metric_option=option, n_matched=0, bootstrap=bootstrap, confidence=confidence,
                       interval=interval, groups=[], verdict=verdict, params=dict(params), tau=tau,
                       delivered_to="client", audit_id=audit_id)



def delivered(receipt_: AuditReport, result: AuditReport) -> AuditReport:
    """The Test-Client's result with the Tester's facts from its receipt: what one user who
    holds both sides sees (local mode, design §3.7), as the Tester finished it before."""
    if result.audit_id and receipt_.audit_id and result.audit_id != receipt_.audit_id:
        raise ValueError(f"the result is audit {result.audit_id}'s, the receipt audit {receipt_.audit_id}'s")
    facts = {name: getattr(receipt_, name) for name in TESTER_FACTS}
    withheld = [c for c in result.release.get("suppressed", ()) if c not in receipt_.release.get("suppressed", ())]
    if withheld:  # cells the Test-Client withheld itself (`Metric.withheld_by_size`), after the Tester's
        facts["release"] = {**receipt_.release,
                            "suppressed": list(receipt_.release.get("suppressed", ())) + withheld}
    return replace(result, delivered_to="", audit_id="", **facts)


def with_withheld(report: AuditReport, labels: Sequence[str]) -> AuditReport:
    """`report` with the cells its finishing party withheld for their noised size
    (`Metric.withheld_by_size`) listed among the release's suppressed cells."""
    if not labels:
        return report
    known = list(report.release.get("suppressed", ()))
    return replace(report, release={**report.release, "suppressed": known + [x for x in labels if x not in known]})



# ----------------------------------------------------------------------------------
# Finishing: decrypted cell values -> the result
# ----------------------------------------------------------------------------------
def finish(metric, plan, values: np.ndarray, *, option: str, confidence: float, tau: float,
           params: dict[str, Any], info: dict[str, Any], replicates: int,
           result_recipient: str = "client", small_groups: Sequence[str] = (),
           interval: str | None = None, corrected=None, noisy: bool | None = None,
           min_size: float = 0.0) -> AuditReport:
    """The result from the cells' ratios `values` ((R+1, cells): row 0 the estimate).
    `small_groups` (from the Tester: `common.stats.left_out`) take no part in the
    verdict of a per-group metric. `noisy`: whether release noise was on (None: not
    known); without it (False) the verdict tests with each group's spread at the
    overall's value (`null_scaled`), and only with it does its advice name the privacy
    budget. `interval`: the method the Tester chose
    (random groups under release noise), else the metric's own. `corrected`: the
    attenuation-corrected values (`common.stats.correction.Corrected`), reported beside the
    weighted ones with intervals from the same replicates where they were asked for
    (`Corrected.reported`; otherwise, computed off the released second moments, they serve
    the verdict's attenuation statement alone); the verdict stays on the weighted estimates
    (the paper's) and says how the corrected gap bears on it.
    Every reported value is clipped to its range (`common.stats.intervals.value_range`),
    after the values are taken at their resolution (`common.stats.intervals.resolved`: a
    masked ratio's rounding is no measurement). Rows the Test-Client clipped into a
    declared range (`info["rows_clipped"]`) are weighed in the verdict
    (`common.stats.declared_range`). A metric whose cells are counts reports them itself
    (`Metric.cell_report`), withholding a count below `min_size`, the controls' minimum
    effective size."""
    counted = metric.cell_report(plan, values, option=option, params=params, info=info, confidence=confidence,
                                 tau=tau, min_size=min_size)
    if counted is not None:
        return replace(counted, result_recipient=result_recipient, tau=tau)
    cells = list(plan.cells)
    bounds = value_range(metric, option, params)
    pair_bounds = difference_range(bounds) if not params.get("dti_weights") else None
    values = _clip_estimates(resolved(values), cells, bounds, pair_bounds)
    extra_cells, extra = metric.derived(cells, values, params, info)
    if extra_cells:
        cells += extra_cells
        values = _clip_estimates(np.hstack([values, resolved(extra)]), cells, bounds, pair_bounds)
    method = interval or metric.interval
    low, high = estimate_intervals(values, confidence, method)
    entries = _entries(cells, values, low, high, bounds, pair_bounds, tau)
    fixed = [(None, None, None, None)] * len(cells)
    if corrected is not None:
        cvalues = _clip_estimates(resolved(corrected.values), cells[:corrected.values.shape[1]], bounds,
                                  pair_bounds)
        corrected = replace(corrected, values=cvalues)  # the verdict reads them as reported
    if corrected is not None and corrected.reported:
        clow, chigh = estimate_intervals(cvalues, confidence, method)
        fixed = _entries(cells[:cvalues.shape[1]], cvalues, clow, chigh, bounds, pair_bounds, tau)
        fixed += [(None, None, None, None)] * (len(cells) - len(fixed))
    groups, pairs, curves = [], [], []
    for c, cell in enumerate(cells):
        e, lo, hi, inf = entries[c]
        if cell.kind == "group":
            groups.append(GroupResult(cell.group, e, lo, hi, *fixed[c][:3], informative=inf,
                                      corrected_informative=fixed[c][3]))
        elif cell.kind == "pair":
            pairs.append(PairResult(cell.group, cell.other, cell.rank_pair, e, lo, hi, informative=inf))
        else:
            curves.append(CurvePoint(cell.group, float(cell.score), e, lo, hi, *fixed[c][:3], informative=inf,
                                     corrected_informative=fixed[c][3]))

    index = {cell.group: c for c, cell in enumerate(cells) if cell.kind == "group"}
    diff_labels, diffs, differences = _differences(index, values, confidence, method, tau, bounds)
    if noisy is False and index:  # the verdict's test: each group's spread at the overall's value
        diffs = _differences(index, null_scaled(values, index, bounds), confidence, method, tau, bounds)[1]
    verdict = verdict_of(metric.verdict_rule, cells, groups, pairs, index, diff_labels, diffs, values,
                         small=set(small_groups) if index else set(), confidence=confidence, method=method, tau=tau,
                         bounds=bounds, pair_bounds=pair_bounds, noisy=noisy, metric=metric.name, corrected=corrected,
                         clipped=clipped_facts(metric.name, option, params, info))
    return AuditReport(metric=metric.name, metric_option=option, n_matched=0, bootstrap=replicates,
                       confidence=confidence, interval=method, groups=groups, verdict=verdict, cells=pairs,
                       curves=curves, differences=differences, params=_jsonable(params), info=dict(info),
                       result_recipient=result_recipient, tau=tau,
                       correction=corrected.summary() if corrected is not None and corrected.reported else {})


def _differences(index: dict[str, int], values: np.ndarray, confidence: float, method: str, tau: float,
                 bounds) -> tuple[list, np.ndarray | None, list[Difference]]:
    """Differences between groups (a − b) and to overall, from the same replicates."""
    names = [g for g in index if g != "overall"]
    diff_labels, diff_cols = [], []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff_labels.append(("between", a, b))
            diff_cols.append(values[:, index[a]] - values[:, index[b]])
    if "overall" in index:
        for a in names:
            diff_labels.append(("to_overall", a, "overall"))
            diff_cols.append(values[:, index[a]] - values[:, index["overall"]])
    if not diff_cols:
        return diff_labels, None, []
    diffs = np.column_stack(diff_cols)
    dlow, dhigh = estimate_intervals(diffs, confidence, method)
    rng = difference_range(bounds)
    return diff_labels, diffs, [
        Difference(kind, a, b, clip(diffs[0, i], rng), clip(dlow[i], rng), clip(dhigh[i], rng),
                   informative=is_informative(dlow[i], dhigh[i], tau))
        for i, (kind, a, b) in enumerate(diff_labels)]


def _clip_estimates(values: np.ndarray, cells: Sequence, bounds, pair_bounds) -> np.ndarray:
    """`values` with row 0 (the estimates) inside each cell's range: post-processing of
    the released values (no privacy cost); the replicates stay as released, so that the
    intervals measure the noise and sampling as they are."""
    values = values.copy()
    for c, cell in enumerate(cells):
        rng = bounds if cell.kind in ("group", "curve") else pair_bounds
        if rng is not None and np.isfinite(values[0, c]):
            values[0, c] = min(max(values[0, c], rng[0]), rng[1])
    return values


def _entries(cells, values, low, high, bounds, pair_bounds, tau):
    """Per cell: (estimate, ci_low, ci_high, informative), clipped to the cell's range;
    informative from the interval before clipping (clipping would narrow it)."""
    out = []
    for c, cell in enumerate(cells):
        rng = bounds if cell.kind in ("group", "curve") else pair_bounds
        out.append((clip(values[0, c], rng), clip(low[c], rng), clip(high[c], rng),
                    is_informative(low[c], high[c], tau)))
    return out


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out

