"""The audit result as one well-typed object, serialised to JSON (ROADMAP 5; SPEC 5 verdicts).

`AuditReport.to_json()` is the `ppre audit --json` contract:
{"metric", "n_matched", "bootstrap", "confidence", "groups": [{"group", "estimate",
"ci_low", "ci_high"}, ...]} plus extra keys (verdict, timings). A group whose
denominator is zero has null estimate and interval.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from proto import ppre_pb2 as pb

DEFAULT_TAU = 0.05
#: the preparation counts in the order a reader follows them (others, e.g. BISG sources, after)
PREPARATION_ORDER = ("members_read", "dropped_opt_out", "dropped_non_us", "dropped_excluded_state",
                     "self_id_used", "self_id_not_among_kept", "clipped_rows", "threshold")


def _ordered(counts: dict[str, float]) -> list[tuple[str, float]]:
    rank = {name: i for i, name in enumerate(PREPARATION_ORDER)}
    return sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


@dataclass(frozen=True)
class GroupResult:
    group: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None

    @classmethod
    def from_values(cls, group: str, estimate: float, low: float, high: float) -> "GroupResult":
        def clean(x: float) -> float | None:
            return None if x is None or not math.isfinite(x) else float(x)
        return cls(group, clean(estimate), clean(low), clean(high))

    def to_proto(self) -> pb.GroupEstimate:
        defined = self.estimate is not None
        return pb.GroupEstimate(group=self.group, defined=defined,
                                estimate=self.estimate if defined else 0.0,
                                ci_low=self.ci_low if self.ci_low is not None else 0.0,
                                ci_high=self.ci_high if self.ci_high is not None else 0.0)

    @classmethod
    def from_proto(cls, g: pb.GroupEstimate) -> "GroupResult":
        if not g.defined:
            return cls(g.group, None, None, None)
        return cls.from_values(g.group, g.estimate, g.ci_low, g.ci_high)


@dataclass(frozen=True)
class Verdict:
    tau: float
    max_gap: float | None
    flagged: bool
    significant_pairs: tuple[tuple[str, str], ...]
    severity: str

    @classmethod
    def of(cls, groups: list[GroupResult], tau: float) -> "Verdict":
        defined = [g for g in groups if g.estimate is not None]
        if len(defined) < 2:
            return cls(tau, None, False, (), "insufficient data")
        gap = max(g.estimate for g in defined) - min(g.estimate for g in defined)
        pairs = []
        for i, a in enumerate(defined):
            for b in defined[i + 1:]:
                if None in (a.ci_low, a.ci_high, b.ci_low, b.ci_high):
                    continue
                if a.ci_high < b.ci_low or b.ci_high < a.ci_low:
                    pairs.append((a.group, b.group))
        flagged = gap > tau
        if not flagged:
            severity = "none"
        elif gap > 2 * tau:
            severity = "high"
        else:
            severity = "moderate"
        return cls(tau, gap, flagged, tuple(pairs), severity)


@dataclass(frozen=True)
class AuditReport:
    metric: str
    n_matched: int
    bootstrap: int
    confidence: float
    groups: list[GroupResult]
    result_recipient: str = "client"
    metric_option: str = ""
    tau: float = DEFAULT_TAU
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: the Tester's preparation counts (members read, dropped by opt-out and geography,
    #: Self-ID rows used, clipping threshold); empty for a prepared probability table
    preparation: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return Verdict.of(self.groups, self.tau)

    def to_dict(self) -> dict:
        v = self.verdict
        return {
            "metric": self.metric,
            "n_matched": self.n_matched,
            "bootstrap": self.bootstrap,
            "confidence": self.confidence,
            "groups": [{"group": g.group, "estimate": g.estimate, "ci_low": g.ci_low, "ci_high": g.ci_high}
                       for g in self.groups],
            "metric_option": self.metric_option,
            "result_recipient": self.result_recipient,
            "verdict": {"tau": v.tau, "max_gap": v.max_gap, "flagged": v.flagged, "severity": v.severity,
                        "significant_pairs": [list(p) for p in v.significant_pairs]},
            "phase_seconds": {k: round(s, 4) for k, s in self.phase_seconds.items()},
            "preparation": {k: (v if k == "threshold" else int(v)) for k, v in _ordered(self.preparation)},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_proto(self) -> pb.AuditResult:
        return pb.AuditResult(metric=self.metric, n_matched=self.n_matched, bootstrap=self.bootstrap,
                              confidence=self.confidence, groups=[g.to_proto() for g in self.groups],
                              result_recipient=self.result_recipient, metric_option=self.metric_option,
                              phase_seconds=self.phase_seconds, tau=self.tau, preparation=self.preparation)

    @classmethod
    def from_proto(cls, r: pb.AuditResult) -> "AuditReport":
        return cls(metric=r.metric, n_matched=r.n_matched, bootstrap=r.bootstrap, confidence=r.confidence,
                   groups=[GroupResult.from_proto(g) for g in r.groups], result_recipient=r.result_recipient,
                   metric_option=r.metric_option, tau=r.tau, phase_seconds=dict(r.phase_seconds),
                   preparation=dict(r.preparation))

    def to_table(self) -> str:
        pct = f"{self.confidence:.0%}"
        lines = [f"metric: {self.metric} ({self.metric_option})   matched members: {self.n_matched}   "
                 f"bootstrap: B={self.bootstrap}, {pct} percentile CIs",
                 f"{'group':<12}{'estimate':>10}{'ci_low':>10}{'ci_high':>10}"]
        for g in self.groups:
            if g.estimate is None:
                lines.append(f"{g.group:<12}{'n/a':>10}{'':>10}{'':>10}")
            else:
                lines.append(f"{g.group:<12}{g.estimate:>10.4f}{g.ci_low:>10.4f}{g.ci_high:>10.4f}")
        v = self.verdict
        if v.max_gap is None:
            lines.append("verdict: insufficient data")
        else:
            pairs = ", ".join(f"{a}/{b}" for a, b in v.significant_pairs) or "none"
            lines.append(f"verdict: max gap {v.max_gap:.4f} vs tau {v.tau:g} -> "
                         f"{'FLAGGED' if v.flagged else 'not flagged'} (severity {v.severity}); "
                         f"non-overlapping CIs: {pairs}")
        if self.preparation:
            lines.append("preparation: " + ", ".join(
                f"{name.replace('_', ' ')} {value:.4g}" if name == "threshold" else
                f"{name.replace('_', ' ')} {int(value)}" for name, value in _ordered(self.preparation)))
        return "\n".join(lines)
