"""The audit result: one object, serialised one way (SPEC.md section 5, "Verdicts").

`finish()` turns the decrypted cell ratios of every replicate into the result; the
Test-Client runs it when it learns the result, the Tester when only it does, so both
report the same thing. Its parts:

* `groups` (by group, with an "overall" entry where the metric has one), `cells`
  (group pairs: LOT per rank pair and pooled, POT's DTI), `curves` (POT's m_j(s_q)),
  `pools` (probabilistic count);
* `differences`: between groups (a − b) and to overall (group − overall), each with
  an interval from the same replicates as the estimates (fairlearn's `*_ci` idea);
* `verdict`: a disparity is *significant* only when the compared difference's
  simultaneous interval excludes 0 (a max-|t| band over the compared family, so that
  picking the largest of many gaps does not manufacture significance); severity is
  "none" (not significant), "low" (significant, |gap| < τ), "moderate" (at least τ)
  or "high" (at least 2τ). Rules per metric: "range" (ERO, output metric: every
  pair of groups; the largest significant gap), "below_overall" (MQOS: overall −
  group > 0), "negative_cells" (LOT: a cell significantly below 0, the lower-ranked
  member more relevant), "nonzero_pairs" (POT: DTI ≠ 0), "inclusion" (probabilistic
  count: Pr(N_j ≥ T) below the inclusion level in some pool; severity "none" or
  "flagged"). A group whose effective size among the joined rows (Σ_i p_ij) is below
  MIN_EFFECTIVE_SIZE takes no part in the verdict (listed in `excluded_groups`).

Intervals: bootstrap percentile intervals (B replicates), or for random groups
(MQOS-AUC exact) the t interval est ± t_{G−1}·sd/√G over G random groups.
`AuditReport.to_dict()` is the `ppre audit --json` contract and also what the
Test-Client sends the Tester (`ClientResult.report_json`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from common.errors import ProtocolError

DEFAULT_TAU = 0.05
#: "flagged" is the inclusion rule's (probabilistic count) only
SEVERITIES = ("none", "low", "moderate", "high", "insufficient data", "flagged")
#: a group whose effective size among the joined rows (Σ_i p_ij) is below this takes no
#: part in a verdict: with a handful of effective members the bootstrap cannot see how
#: much the estimate could vary (a few members with no event give a narrow interval
#: around a rate far from the truth). Its estimate is still reported.
MIN_EFFECTIVE_SIZE = 30.0
#: the preparation counts in the order a reader follows them (others, e.g. BISG sources, after)
PREPARATION_ORDER = ("members_read", "dropped_opt_out", "dropped_non_us", "dropped_excluded_state",
                     "self_id_used", "self_id_not_among_kept", "epsilon", "clipped_rows", "threshold")


def _clean(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------------
# Intervals
# ----------------------------------------------------------------------------------
def t_quantile(p: float, df: int) -> float:
    from common.metrics.scoring import student_t_quantile
    return float(student_t_quantile(p, df))


def marginal_intervals(values: np.ndarray, confidence: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per column of `values` ((R+1, C): row 0 the estimate, rows 1.. the
    bootstrap replicates or the random groups); NaN replicates are ignored."""
    alpha = 1.0 - confidence
    reps = values[1:]
    c = values.shape[1]
    low, high = np.full(c, np.nan), np.full(c, np.nan)
    for j in range(c):
        col = reps[:, j][~np.isnan(reps[:, j])]
        if not np.isfinite(values[0, j]) or col.size == 0:
            continue
        if method == "percentile":
            low[j], high[j] = np.quantile(col, [alpha / 2, 1 - alpha / 2])
        elif col.size >= 2:
            half = t_quantile(1 - alpha / 2, col.size - 1) * col.std(ddof=1) / math.sqrt(col.size)
            low[j], high[j] = values[0, j] - half, values[0, j] + half
    return low, high


def simultaneous_bands(values: np.ndarray, confidence: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Bands that hold for every column at once: est ± q·s_c, with s_c the replicates'
    standard deviation and q the confidence quantile of max_c |rep − est|/s_c
    (bootstrap), or Bonferroni t quantiles (random groups)."""
    est = values[0]
    reps = values[1:]
    c = values.shape[1]
    low, high = np.full(c, np.nan), np.full(c, np.nan)
    ok = np.isfinite(est) & (np.sum(np.isfinite(reps), axis=0) >= 2)
    if not ok.any():
        return low, high
    with np.errstate(invalid="ignore"):
        sd = np.nanstd(reps[:, ok], axis=0, ddof=1)
    if method == "percentile":
        safe = np.where(sd > 0, sd, np.inf)
        dev = np.abs(reps[:, ok] - est[ok]) / safe
        dev = np.where(np.isnan(dev), 0.0, dev)
        q = float(np.quantile(dev.max(axis=1), confidence))
        half = q * sd
    else:
        counts = np.sum(np.isfinite(reps[:, ok]), axis=0)
        alpha = 1.0 - confidence
        q = np.array([t_quantile(1 - alpha / (2 * ok.sum()), int(n) - 1) for n in counts])
        half = q * sd / np.sqrt(counts)
    low[ok], high[ok] = est[ok] - half, est[ok] + half
    return low, high


# ----------------------------------------------------------------------------------
# Result parts
# ----------------------------------------------------------------------------------
#: the fields a group or curve entry has only when a correction was asked for
CORRECTED_FIELDS = ("corrected_estimate", "corrected_ci_low", "corrected_ci_high")


@dataclass(frozen=True)
class GroupResult:
    group: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    #: the attenuation-corrected value and its interval (`common.correction`), None when
    #: no correction was asked for or the group's is withheld
    corrected_estimate: float | None = None
    corrected_ci_low: float | None = None
    corrected_ci_high: float | None = None

    @classmethod
    def from_values(cls, group: str, estimate: float, low: float, high: float) -> "GroupResult":
        return cls(group, _clean(estimate), _clean(low), _clean(high))


@dataclass(frozen=True)
class PairResult:
    higher: str
    lower: str
    rank_pair: str | None
    estimate: float | None
    ci_low: float | None
    ci_high: float | None


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


@dataclass(frozen=True)
class Difference:
    """estimate = a − b; kind "between" (two groups) or "to_overall" (b is "overall")."""

    kind: str
    a: str
    b: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class PoolResult:
    pool: str
    group: str
    members: int
    expected_count: float | None  # None: suppressed by the release controls
    prob_at_least: float | None
    included: bool


@dataclass(frozen=True)
class Verdict:
    rule: str
    tau: float
    severity: str
    significant: bool
    flagged: bool
    #: the compared difference: label, estimate, its interval and its simultaneous band
    compared: dict[str, Any] | None
    significant_comparisons: tuple[str, ...] = ()
    non_overlapping: tuple[tuple[str, str], ...] = ()
    message: str = ""
    #: groups left out of the verdict (effective size below MIN_EFFECTIVE_SIZE)
    excluded_groups: tuple[str, ...] = ()


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
    #: the attenuation correction's facts (`common.correction.Corrected.summary`); empty
    #: when none was asked for
    correction: dict[str, Any] = field(default_factory=dict)
    #: how the Tester coarsened the six races into the groups ("hsm=black+hispanic+aian,…";
    #: `common.races.GroupMapping`), "" for none
    group_mapping: str = ""

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
        d.update({
            "differences": [asdict(x) for x in self.differences],
            "verdict": v,
            "params": self.params,
            "info": self.info,
            "result_recipient": self.result_recipient,
            "tau": self.tau,
            "phase_seconds": {k: round(s, 4) for k, s in self.phase_seconds.items()},
            "preparation": {k: (v if k in ("threshold", "epsilon") else int(v)) for k, v in _ordered(self.preparation)},
        })
        if self.release:
            d["release"] = self.release
        if self.correction:
            d["correction"] = self.correction
        if self.group_mapping:
            d["group_mapping"] = self.group_mapping
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
                              excluded_groups=tuple(str(g) for g in v.get("excluded_groups", ())))
            return cls(
                metric=str(d["metric"]), metric_option=str(d["metric_option"]), n_matched=int(d["n_matched"]),
                bootstrap=int(d["bootstrap"]), confidence=float(d["confidence"]), interval=str(d["interval"]),
                groups=[GroupResult(str(g["group"]), _clean(g["estimate"]), _clean(g["ci_low"]),
                                    _clean(g["ci_high"]), *(_clean(g.get(k)) for k in CORRECTED_FIELDS))
                        for g in d["groups"]],
                verdict=verdict,
                cells=[PairResult(str(c["higher"]), str(c["lower"]),
                                  None if c["rank_pair"] is None else str(c["rank_pair"]),
                                  _clean(c["estimate"]), _clean(c["ci_low"]), _clean(c["ci_high"]))
                       for c in d.get("cells", [])],
                curves=[CurvePoint(str(c["group"]), float(c["score"]), _clean(c["estimate"]),
                                   _clean(c["ci_low"]), _clean(c["ci_high"]),
                                   *(_clean(c.get(k)) for k in CORRECTED_FIELDS)) for c in d.get("curves", [])],
                pools=[PoolResult(str(p["pool"]), str(p["group"]), int(p["members"]), _clean(p["expected_count"]),
                                  _clean(p["prob_at_least"]), bool(p["included"])) for p in d.get("pools", [])],
                differences=[Difference(str(x["kind"]), str(x["a"]), str(x["b"]), _clean(x["estimate"]),
                                        _clean(x["ci_low"]), _clean(x["ci_high"]))
                             for x in d.get("differences", [])],
                params=dict(d.get("params", {})), info=dict(d.get("info", {})),
                result_recipient=str(d.get("result_recipient", "client")), tau=float(d.get("tau", DEFAULT_TAU)),
                phase_seconds={str(k): float(s) for k, s in d.get("phase_seconds", {}).items()},
                preparation={str(k): float(s) for k, s in d.get("preparation", {}).items()},
                release=dict(d.get("release", {})), correction=dict(d.get("correction", {})),
                group_mapping=str(d.get("group_mapping", "")))
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

    # ------------------------------------------------------------- the table
    def _corrected_cells(self, part, num) -> str:
        if part.group == "overall":
            return ""
        if part.group in self.correction.get("unidentifiable", ()):
            return f"{'not identifiable at this size':>30}"
        return f"{num(part.corrected_estimate)}{num(part.corrected_ci_low)}{num(part.corrected_ci_high)}"

    def to_table(self) -> str:
        pct = f"{self.confidence:.0%}"
        how = (f"bootstrap B={self.bootstrap}, {pct} percentile CIs" if self.interval == "percentile" else
               f"{self.bootstrap} random groups, {pct} t intervals" if self.interval == "random_groups" else
               "exact (no resampling)")
        option = f" ({self.metric_option})" if self.metric_option else ""
        lines = [f"metric: {self.metric}{option}   joined rows: {self.n_matched}   {how}"]

        def num(x: float | None) -> str:
            return f"{x:>10.4f}" if x is not None else f"{'n/a':>10}"
        if self.groups and self.correction:
            lines.append(f"{'':<14}{'weighted (paper)':^30}  {'corrected (calibration)':^30}")
            lines.append(f"{'group':<14}{'estimate':>10}{'ci_low':>10}{'ci_high':>10}  "
                         f"{'estimate':>10}{'ci_low':>10}{'ci_high':>10}")
            lines += [f"{g.group:<14}{num(g.estimate)}{num(g.ci_low)}{num(g.ci_high)}  "
                      f"{self._corrected_cells(g, num)}" for g in self.groups]
        elif self.groups:
            lines.append(f"{'group':<14}{'estimate':>10}{'ci_low':>10}{'ci_high':>10}")
            lines += [f"{g.group:<14}{num(g.estimate)}{num(g.ci_low)}{num(g.ci_high)}" for g in self.groups]
        if self.cells:
            lines.append(f"{'higher':<12}{'lower':<12}{'ranks':<8}{'estimate':>10}{'ci_low':>10}{'ci_high':>10}")
            lines += [f"{c.higher:<12}{c.lower:<12}{c.rank_pair or 'all':<8}{num(c.estimate)}{num(c.ci_low)}"
                      f"{num(c.ci_high)}" for c in self.cells]
        if self.curves:
            lines.append(f"{'group':<14}{'score':>10}{'estimate':>10}{'ci_low':>10}{'ci_high':>10}")
            lines += [f"{c.group:<14}{c.score:>10.4g}{num(c.estimate)}{num(c.ci_low)}{num(c.ci_high)}"
                      for c in self.curves]
        if self.pools:
            lines.append(f"{'pool':<14}{'group':<12}{'members':>8}{'expected':>10}{'P(N>=T)':>10}  included")
            lines += [f"{p.pool:<14}{p.group:<12}{p.members:>8}{p.expected_count:>10.3f}{p.prob_at_least:>10.4f}"
                      f"  {'yes' if p.included else 'NO'}" if p.expected_count is not None else
                      f"{p.pool:<14}{p.group:<12}{p.members:>8}{'suppressed':>20}" for p in self.pools]
        if self.curves and self.correction:
            lines.append(f"{'group':<14}{'score':>10}{'corrected':>10}{'ci_low':>10}{'ci_high':>10}")
            lines += [f"{c.group:<14}{c.score:>10.4g}{self._corrected_cells(c, num)}" for c in self.curves
                      if c.group != "overall"]
        v = self.verdict
        lines.append(f"verdict: {v.message}")
        if self.correction:
            lines.append("correction: " + correction_summary(self.correction))
        if self.release:
            lines.append("release controls: " + release_summary(self.release))
        if self.group_mapping:
            lines.append("groups: " + self.group_mapping.replace(",", ", "))
        if self.preparation:
            lines.append("preparation: " + ", ".join(
                f"{name.replace('_', ' ')} {value:.4g}" if name in ("threshold", "epsilon") else
                f"{name.replace('_', ' ')} {int(value)}" for name, value in _ordered(self.preparation)))
        return "\n".join(lines)


def _flipped(d: Difference) -> Difference:
    neg = (lambda x: None if x is None else -x)
    return Difference(d.kind, d.b, d.a, neg(d.estimate), neg(d.ci_high), neg(d.ci_low))


def correction_summary(correction: dict[str, Any]) -> str:
    """One line on the attenuation correction (`common.correction`)."""
    cond = correction.get("condition_number")
    parts = ["calibration (M^-1 Num; assumes calibrated probabilities and no proxy effect given race)",
             f"condition number of M {cond:.3g}" if cond is not None else "M singular"]
    if correction.get("unidentifiable"):
        parts.append(f"not identifiable at this size: {', '.join(correction['unidentifiable'])}")
    if correction.get("dropped"):
        parts.append(f"left out (suppressed): {', '.join(correction['dropped'])}")
    parts.append("the verdict compares the weighted estimates")
    return "; ".join(parts)


def release_summary(release: dict[str, Any]) -> str:
    """One line on the release controls an audit ran under (noise, budget, suppression)."""
    if not release.get("controls", True):
        return "OFF (no noise, no thresholds, no budget: results are exact and unprotected)"
    parts = []
    if release.get("rho"):
        parts.append(f"Gaussian noise, rho {release['rho']:g} this audit (epsilon {release['epsilon']:.3g} at "
                     f"delta {release['delta']:g}); estimate noise sd {release['sigma_estimate']:.3g} member(s)")
    else:
        parts.append("no noise")
    if "budget_left" in release:
        parts.append(f"privacy budget left {release['budget_left']:g}")
    parts.append(f"minimum intersection {release.get('min_intersection')}, "
                 f"minimum effective size {release.get('min_effective_size')}")
    if release.get("suppressed"):
        parts.append(f"suppressed: {', '.join(release['suppressed'])}")
    return "; ".join(parts)


def _ordered(counts: dict[str, float]) -> list[tuple[str, float]]:
    rank = {name: i for i, name in enumerate(PREPARATION_ORDER)}
    return sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


# ----------------------------------------------------------------------------------
# Finishing: decrypted cell values -> the result
# ----------------------------------------------------------------------------------
def _severity(magnitude: float, tau: float) -> str:
    if magnitude >= 2 * tau:
        return "high"
    if magnitude >= tau:
        return "moderate"
    return "low"


def _label(cell) -> str:
    if cell.kind == "pair":
        return f"{cell.group}>{cell.other}" + (f"@{cell.rank_pair}" if cell.rank_pair else "")
    return cell.group


def verdict_from(rule: str, labels: Sequence[str], values: np.ndarray, confidence: float, method: str,
                 tau: float, groups: Sequence[GroupResult] = ()) -> Verdict:
    """The verdict over a family of compared differences (`values`: (R+1, C), row 0 the
    estimates), by `rule` (module docstring)."""
    non_overlap = []
    defined = [g for g in groups if g.group != "overall" and g.ci_low is not None]
    for i, a in enumerate(defined):
        for b in defined[i + 1:]:
            if a.ci_high < b.ci_low or b.ci_high < a.ci_low:
                non_overlap.append((a.group, b.group))
    est = values[0] if values.size else np.empty(0)
    if not np.isfinite(est).any():
        return Verdict(rule, tau, "insufficient data", False, False, None, (), tuple(non_overlap),
                       "insufficient data (fewer than two defined estimates to compare)")
    low, high = marginal_intervals(values, confidence, method)
    band_low, band_high = simultaneous_bands(values, confidence, method)
    if rule == "below_overall":
        adverse, significant = est, band_low > 0
    elif rule == "negative_cells":
        adverse, significant = -est, band_high < 0
    else:  # "range", "nonzero_pairs"
        adverse, significant = np.abs(est), (band_low > 0) | (band_high < 0)
    adverse = np.where(np.isfinite(adverse), adverse, -np.inf)
    significant = significant & np.isfinite(est)
    if significant.any():
        pick = int(np.argmax(np.where(significant, adverse, -np.inf)))
        severity = _severity(float(adverse[pick]), tau)
    else:
        # the most adverse difference whose band is defined (one without a band cannot
        # be read as "includes 0"), else the most adverse one
        banded = np.isfinite(band_low) & np.isfinite(band_high)
        pick = int(np.argmax(np.where(banded, adverse, -np.inf))) if banded.any() else int(np.argmax(adverse))
        severity = "none"
    compared = {"label": labels[pick], "estimate": _clean(est[pick]), "ci_low": _clean(low[pick]),
                "ci_high": _clean(high[pick]), "band_low": _clean(band_low[pick]),
                "band_high": _clean(band_high[pick])}
    words = {"range": "largest gap between two groups", "below_overall": "largest shortfall of a group below overall",
             "negative_cells": "most negative pair cell", "nonzero_pairs": "largest DTI"}[rule]
    if severity == "none":
        message = (f"no significant disparity (the {words}, {labels[pick]} = {est[pick]:+.4f}, has a "
                   f"{confidence:.0%} simultaneous interval [{band_low[pick]:+.4f}, {band_high[pick]:+.4f}] "
                   f"that includes 0; tau {tau:g})")
    else:
        message = (f"significant disparity, severity {severity}: {words} {labels[pick]} = {est[pick]:+.4f}, "
                   f"{confidence:.0%} simultaneous interval [{band_low[pick]:+.4f}, {band_high[pick]:+.4f}] "
                   f"excludes 0 (tau {tau:g}; {int(significant.sum())} significant of {len(labels)} compared)")
    if non_overlap:
        message += "; non-overlapping group CIs: " + ", ".join(f"{a}/{b}" for a, b in non_overlap)
    return Verdict(rule, tau, severity, bool(significant.any()), severity in ("moderate", "high"), compared,
                   tuple(labels[i] for i in np.flatnonzero(significant)), tuple(non_overlap), message)


def finish(metric, plan, values: np.ndarray, *, option: str, confidence: float, tau: float,
           params: dict[str, Any], info: dict[str, Any], replicates: int,
           result_recipient: str = "client", small_groups: Sequence[str] = (),
           interval: str | None = None, corrected=None) -> AuditReport:
    """The result from the cells' ratios `values` ((R+1, cells): row 0 the estimate).
    `small_groups` (effective size below MIN_EFFECTIVE_SIZE, from the Tester) take no
    part in the verdict of a per-group metric. `interval`: the method the Tester chose
    (random groups under release noise), else the metric's own. `corrected`: the
    attenuation-corrected values (`common.correction.Corrected`), reported beside the
    weighted ones with intervals from the same replicates; the verdict stays on the
    weighted estimates (the paper's)."""
    cells = list(plan.cells)
    extra_cells, extra = metric.derived(cells, values, params, info)
    if extra_cells:
        cells += extra_cells
        values = np.hstack([values, extra])
    method = interval or metric.interval
    low, high = marginal_intervals(values, confidence, method)
    est = values[0]
    fixed = np.full((3, len(cells)), np.nan)
    if corrected is not None:
        fixed[0, :corrected.values.shape[1]] = corrected.values[0]
        fixed[1:, :corrected.values.shape[1]] = marginal_intervals(corrected.values, confidence, method)
    groups, pairs, curves = [], [], []
    for c, cell in enumerate(cells):
        if cell.kind == "group":
            groups.append(GroupResult(cell.group, _clean(est[c]), _clean(low[c]), _clean(high[c]),
                                      *(_clean(x) for x in fixed[:, c])))
        elif cell.kind == "pair":
            pairs.append(PairResult(cell.group, cell.other, cell.rank_pair, _clean(est[c]), _clean(low[c]),
                                    _clean(high[c])))
        else:
            curves.append(CurvePoint(cell.group, float(cell.score), _clean(est[c]), _clean(low[c]),
                                     _clean(high[c]), *(_clean(x) for x in fixed[:, c])))

    # differences between groups and to overall, from the same replicates
    index = {cell.group: c for c, cell in enumerate(cells) if cell.kind == "group"}
    names = [g for g in index if g != "overall"]
    diff_labels, diff_cols, differences = [], [], []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff_labels.append((("between", a, b)))
            diff_cols.append(values[:, index[a]] - values[:, index[b]])
    if "overall" in index:
        for a in names:
            diff_labels.append(("to_overall", a, "overall"))
            diff_cols.append(values[:, index[a]] - values[:, index["overall"]])
    if diff_cols:
        diffs = np.column_stack(diff_cols)
        dlow, dhigh = marginal_intervals(diffs, confidence, method)
        differences = [Difference(kind, a, b, _clean(diffs[0, i]), _clean(dlow[i]), _clean(dhigh[i]))
                       for i, (kind, a, b) in enumerate(diff_labels)]

    rule = metric.verdict_rule
    small = set(small_groups) if index else set()
    if rule == "range":
        family = [i for i, (kind, a, b) in enumerate(diff_labels)
                  if kind == "between" and a not in small and b not in small]
        labels, cols = [], []
        for i in family:  # every gap oriented as max − min by its estimate: the compared one reads positive
            _, a, b = diff_labels[i]
            flip = bool(diffs[0, i] < 0)
            labels.append(f"{b} - {a}" if flip else f"{a} - {b}")
            cols.append(-diffs[:, i] if flip else diffs[:, i])
        fam = np.column_stack(cols) if cols else np.empty((values.shape[0], 0))
    elif rule == "below_overall":
        family = [i for i, (kind, a, _) in enumerate(diff_labels) if kind == "to_overall" and a not in small]
        labels = [f"overall - {diff_labels[i][1]}" for i in family]
        fam = -diffs[:, family] if family else np.empty((values.shape[0], 0))
    elif rule in ("negative_cells", "nonzero_pairs"):
        family = [c for c, cell in enumerate(cells) if cell.kind == "pair"]
        labels = [_label(cells[c]) for c in family]
        fam = values[:, family]
    else:
        raise ValueError(f"unknown verdict rule {rule}")
    if fam.shape[1] == 0:
        verdict = Verdict(rule, tau, "insufficient data", False, False, None, (), (),
                          "insufficient data (nothing to compare)")
    else:
        verdict = verdict_from(rule, labels, fam, confidence, method, tau,
                               [g for g in groups if g.group not in small])
    excluded = tuple(g.group for g in groups if g.group in small)
    if excluded:
        verdict = replace(verdict, excluded_groups=excluded,
                          message=verdict.message + f"; left out of the verdict (effective size below "
                                                    f"{MIN_EFFECTIVE_SIZE:g}): {', '.join(excluded)}")
    return AuditReport(metric=metric.name, metric_option=option, n_matched=0, bootstrap=replicates,
                       confidence=confidence, interval=method, groups=groups, verdict=verdict, cells=pairs,
                       curves=curves, differences=differences, params=_jsonable(params), info=dict(info),
                       result_recipient=result_recipient, tau=tau,
                       correction=corrected.summary() if corrected is not None else {})


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out

