"""The audit result: one object, serialised one way (design §5.10).

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
  "none" (not significant, a gap of τ was detectable, and no group was left out),
  "inconclusive" (not significant, and one of those fails), "low" (significant,
  |gap| < τ), "moderate" (at least τ) or "high" (at least 2τ), read off the estimate; where
  the band's end nearer 0 reads milder, the message says how small the band lets the gap
  be (a wide band's finding is of a gap, not of its size). Rules per metric: "range" (ERO, output metric: every
  pair of groups; the largest significant gap), "below_overall" (MQOS: overall −
  group > 0), "negative_cells" (LOT: a cell significantly below 0, the lower-ranked
  member more relevant), "nonzero_pairs" (POT: DTI ≠ 0), "inclusion" (probabilistic
  count: Pr(N_j ≥ T) below the inclusion level in some pool; severity "none" or
  "flagged"). Groups too small for their intervals to be trusted take no part in the
  verdict (`excluded_groups`, "Left out" below).

Left out: a group takes no part in a verdict (its estimate is still reported) when the
Tester finds it too small (`small_groups`). Without release noise, for a rate metric
(ERO: rows are 0/1 events) its Kish effective sample size n_K = (Σ_i p_ij)² / Σ_i p_ij²
among the joined rows is below MIN_KISH_SIZE (300; `small_for_verdict`; other metrics:
Σ_i p_ij below MIN_EFFECTIVE_SIZE, as their outcomes can vary far less than a rate's
r(1 − r), so a group of a few hundred can be informative). Reason: an estimate carried by few effective members has a
bootstrap interval whose width follows its own few events, narrow exactly when the
estimate is far from the truth (`ppre synth` data, 10,000 members: aian, n_K ≈ 270,
has a bootstrap sd down to 0.4 of the true one and |t| > 2.9 in 6% of datasets, a normal
0.4%; with it the null flag rate was 12.6%, `bench/bench_null.py`); and below 300
effective members no rate in [0.05, 0.95] can be informative (z·√(r(1−r)/n_K) ≤ τ/2
needs n_K ≥ (2z/τ)²·r(1−r), 300 at r = 0.05, τ = 0.05), so such a group looks
informative only through too narrow an interval. Kish rather than Σ_i p_ij: it counts
the rows that carry the estimate (one-hot probabilities: the group's count, so small
test populations keep their groups of 300 or more), and it depends on the Tester's
probabilities alone, not on outcomes. Under release noise exact sizes would leak (the
list reaches the Test-Client): the Tester decides on the noised effective sizes it
releases anyway (Σ_i p_ij plus Gaussian noise, `tester_service.release`), below
MIN_EFFECTIVE_SIZE or below the policy's minimum (then also withheld). A left-out group
rules out a green "none": nothing significant then reads "inconclusive".

Ranges (post-processing of released values, no privacy cost): every reported estimate,
interval end, difference and corrected value is clipped to its range, `value_range`:
the metric's declared one (`Metric.value_range`), [0, 1] for rates, AUC, NDCG and
probabilities (and LOT's normalised relevances), else the declared `outcome_range`;
differences and pair cells to [lo − hi, hi − lo]. Estimates are clipped before the
differences are formed; the replicates are not (they measure the noise as it is).

Informative: an estimate or difference is *informative* when its interval's half-width
is at most INFORMATIVE_SHARE·τ (τ/2), measured before clipping (`informative` in the
JSON of every group, cell, curve point and difference; `corrected_informative` for the
corrected values). Minimum detectable difference (MDD, `verdict.mdd`): per compared
difference h + z_0.8·se (h the simultaneous band's half-width, se the standard error
the intervals come from: the replicates' sd, or sd/√G over random groups): the true gap
found significant with 80% power; the verdict's MDD is the largest over its family.
Severity "inconclusive": nothing significant, and either the MDD exceeds τ or some
group (pair cell) is not informative at the overall's value (`uninformative`), so the
audit could not have shown a gap of τ; `members_factor` ≈ (MDD/τ)² (or the
uninformative groups' (half-width/(τ/2))², the larger) is how many times the members
would make it conclusive (the MDD shrinks as 1/√n). The simultaneous bands are clipped
to the compared differences' range [lo − hi, hi − lo] (post-processing: the true gap lies
in it); an MDD beyond the largest gap the metric can take (hi − lo) means no gap is
detectable at this size: the verdict then states neither an MDD nor a factor of members
(noise, not sampling, dominates such an interval, and it does not shrink as 1/√n).
"none" (green) therefore means:
not significant, a gap of τ would have been found, and no group was left out. A comparison that involves an
uninformative group counts as significant only when its band clears τ itself (a
small group's bootstrap interval can under-cover); under release noise the intervals
come from the released aggregates' own variances (`common.stats.moments`, or random groups),
which cover at small sizes too, so there a comparison counts at the band's level (null
flag rate at nominal: bench/RESULTS.md). Either way the compared pair is the most
adverse significant comparison between informative groups, if there is one. With a correction, `verdict.attenuation`
holds the compared pair's corrected gap and whether the weighted gap understates it.

Intervals: bootstrap percentile intervals (B replicates, or parametric draws under
release noise), or for random groups (MQOS-AUC: exact without release noise, sampled
always) the t interval est ± t_{G−1}·sd/√G over G random groups. Without
release noise the verdict's test (`verdict.compared`'s intervals and the MDD, not the
group and difference intervals reported) takes each group's spread at the overall's
value, as a score test (or Wilson's interval) takes the variance at the null:
replicates widened by √(spread(overall)/spread(est)), spread(x) = (x − lo)(hi − x) on
the metric's range, for groups nearer a bound than the overall (`null_scaled`); a low
rate's bootstrap spread is small exactly when the low estimate is a false finding. On
`ppre synth` ERO data (`bench/bench_null.py`, `bench/RESULTS.md`) the null flag rate was
12.6% at 10,000 members, 5.1% with this and the Kish rule (5.5% at 100,000 members,
was 6.2%; 800 datasets each); power for a black gap of 0.05 at 10,000 members unchanged.
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
SEVERITIES = ("none", "low", "moderate", "high", "inconclusive", "insufficient data", "flagged")
#: an estimate or difference is informative when its interval's half-width is at most this share of τ
INFORMATIVE_SHARE = 0.5
#: the power at which the minimum detectable difference is stated, and its normal quantile
POWER = 0.8
Z_POWER = 0.8416212335729143
#: metrics whose group estimates are rates, AUCs, NDCGs or probabilities: [0, 1]
UNIT_RANGE_METRICS = ("ero", "mqos-auc", "mqos-ndcg", "prob-count")
#: a group whose effective size among the joined rows (Σ_i p_ij) is below this takes no
#: part in a verdict: with a handful of effective members the bootstrap cannot see how
#: much the estimate could vary (a few members with no event give a narrow interval
#: around a rate far from the truth). Its estimate is still reported. Under release
#: noise the Tester decides on the noised size (module docstring, "Left out").
MIN_EFFECTIVE_SIZE = 30.0
#: without release noise (bootstrap intervals), a group of a rate metric whose Kish
#: effective sample size (Σ_i p_ij)² / Σ_i p_ij² among the joined rows is below this takes
#: no part in a verdict (module docstring, "Left out"); Kish ≥ Σ_i p_ij, so this subsumes
#: MIN_EFFECTIVE_SIZE
MIN_KISH_SIZE = 300.0
#: metrics whose rows are 0/1 events, so that a group's estimate is a rate: the premise of
#: MIN_KISH_SIZE (a rate's variance is r(1 − r)/n; other outcomes in a range vary less)
RATE_METRICS = ("ero",)
#: the preparation counts in the order a reader follows them (others, e.g. BISG sources, after)
PREPARATION_ORDER = ("members_read", "dropped_opt_out", "dropped_non_us", "dropped_excluded_state",
                     "self_id_used", "self_id_not_among_kept", "self_id_not_among_members", "epsilon",
                     "clipped_rows", "threshold")


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
    (bootstrap), or Bonferroni t quantiles over the distinct tests (random groups,
    `distinct_tests`)."""
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
        tests = distinct_tests(values[:, ok])
        q = np.array([t_quantile(1 - alpha / (2 * tests), int(n) - 1) for n in counts])
        half = q * sd / np.sqrt(counts)
    low[ok], high[ok] = est[ok] - half, est[ok] + half
    return low, high


def distinct_tests(values: np.ndarray) -> int:
    """How many different tests the columns of `values` ((R+1, C)) make: a column that is
    another's negative in every row (POT's DTI a/b and b/a, a gap and its reverse) tests
    the same hypothesis with the same two-sided band, so Bonferroni counts it once."""
    seen: list[np.ndarray] = []
    for col in values.T:
        if not any(np.array_equal(col, s, equal_nan=True) or np.array_equal(-col, s, equal_nan=True)
                   for s in seen):
            seen.append(col)
    return max(1, len(seen))


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
    #: whether the interval's half-width is at most INFORMATIVE_SHARE·τ (module docstring)
    informative: bool = False
    corrected_informative: bool | None = None

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


def score_bins_words(info: dict[str, Any], sep: str) -> str:
    """MQOS-AUC exact under the release controls (`info["score_bins"]`): the estimate is the
    AUC of the score in that many bins of equal counts (design §5.6), said with the
    metric's option; "" otherwise."""
    bins = info.get("score_bins")  # mqos_auc.SCORE_BINS_INFO (stats imports no metric)
    return f"{sep}AUC of the score in {int(bins)} bins" if isinstance(bins, int) and bins > 0 else ""


def members_heading(info: dict[str, Any]) -> str:
    """What the table and the page head a pool's member count with."""
    return "members (noised)" if info.get(NOISED_MEMBERS) else "members"


@dataclass(frozen=True)
class PoolResult:
    pool: str
    group: str
    members: int
    expected_count: float | None  # None: suppressed by the release controls
    prob_at_least: float | None
    included: bool | None  # None: withheld, unknown (neither included nor missing)


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
    #: the minimum detectable difference at these settings (module docstring), None when undefined
    mdd: float | None = None
    #: groups (or pair cells) not compared because not informative; any makes "none" impossible
    uninformative: tuple[str, ...] = ()
    #: inconclusive only: about how many times the joined members would make the audit conclusive
    members_factor: float | None = None
    #: with a correction: the compared pair's corrected gap and whether the weighted one understates it
    attenuation: dict[str, Any] | None = None


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
            d["release"] = _release_clean(self.release)
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
                              mdd=_clean(v.get("mdd")),
                              uninformative=tuple(str(g) for g in v.get("uninformative", ())),
                              members_factor=_clean(v.get("members_factor")),
                              attenuation=dict(v["attenuation"]) if v.get("attenuation") else None)
            return cls(
                metric=str(d["metric"]), metric_option=str(d["metric_option"]), n_matched=int(d["n_matched"]),
                bootstrap=int(d["bootstrap"]), confidence=float(d["confidence"]), interval=str(d["interval"]),
                groups=[GroupResult(str(g["group"]), _clean(g["estimate"]), _clean(g["ci_low"]),
                                    _clean(g["ci_high"]), *(_clean(g.get(k)) for k in CORRECTED_FIELDS[:3]),
                                    informative=bool(g.get("informative", False)),
                                    corrected_informative=_flag(g.get("corrected_informative")))
                        for g in d["groups"]],
                verdict=verdict,
                cells=[PairResult(str(c["higher"]), str(c["lower"]),
                                  None if c["rank_pair"] is None else str(c["rank_pair"]),
                                  _clean(c["estimate"]), _clean(c["ci_low"]), _clean(c["ci_high"]),
                                  informative=bool(c.get("informative", False)))
                       for c in d.get("cells", [])],
                curves=[CurvePoint(str(c["group"]), float(c["score"]), _clean(c["estimate"]),
                                   _clean(c["ci_low"]), _clean(c["ci_high"]),
                                   *(_clean(c.get(k)) for k in CORRECTED_FIELDS[:3]),
                                   informative=bool(c.get("informative", False)),
                                   corrected_informative=_flag(c.get("corrected_informative")))
                       for c in d.get("curves", [])],
                pools=[PoolResult(str(p["pool"]), str(p["group"]), int(p["members"]), _clean(p["expected_count"]),
                                  _clean(p["prob_at_least"]),
                                  None if p["included"] is None else bool(p["included"]))
                       for p in d.get("pools", [])],
                differences=[Difference(str(x["kind"]), str(x["a"]), str(x["b"]), _clean(x["estimate"]),
                                        _clean(x["ci_low"]), _clean(x["ci_high"]),
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

    # ------------------------------------------------------------- the table
    @property
    def intervals_from_moments(self) -> bool:
        """Whether the intervals are parametric draws from the released second moments
        (`common.stats.moments`, release noise on), not a bootstrap."""
        return str(self.release.get("interval_from", "")).startswith("second moments")

    def to_table(self) -> str:
        """The result as plain-text tables: every column as wide as its longest value
        (columns never run together); `inf.` marks an informative estimate (interval
        half-width at most INFORMATIVE_SHARE·τ) with "yes", else "no". A receipt is one
        line: where the result went."""
        if self.is_receipt:
            return receipt_line(self)
        pct = f"{self.confidence:.0%}"
        how = (f"{pct} CIs from the released second moments ({self.bootstrap} parametric draws)"
               if self.intervals_from_moments else
               f"bootstrap B={self.bootstrap}, {pct} percentile CIs" if self.interval == "percentile" else
               f"{self.bootstrap} random groups, {pct} t intervals" if self.interval == "random_groups" else
               "exact (no resampling)")
        option = f" ({self.metric_option}{score_bins_words(self.info, '; ')})" if self.metric_option else ""
        lines = [f"metric: {self.metric}{option}   joined rows: {self.n_matched}   {how}"]
        unidentifiable = set(self.correction.get("unidentifiable", ())) if self.correction else set()

        def corrected(part) -> list[str]:
            if part.group == "overall":
                return ["", "", "", ""]
            if part.group in unidentifiable:
                return ["not identifiable at this size", "", "", ""]
            return [_num(part.corrected_estimate), _num(part.corrected_ci_low), _num(part.corrected_ci_high),
                    _yes(part.corrected_informative)]
        if self.groups:
            head = ["group", "estimate", "ci_low", "ci_high", "inf."]
            rows = [[g.group, _num(g.estimate), _num(g.ci_low), _num(g.ci_high), _yes(g.informative)]
                    + (corrected(g) if self.correction else []) for g in self.groups]
            if self.correction:
                head += ["corrected", "ci_low", "ci_high", "inf."]
                lines.append("weighted (paper) estimates, then corrected (calibration) ones")
            lines += _columns(head, rows)
        if self.cells:
            lines += _columns(["higher", "lower", "ranks", "estimate", "ci_low", "ci_high", "inf."],
                              [[c.higher, c.lower, c.rank_pair or "all", _num(c.estimate), _num(c.ci_low),
                                _num(c.ci_high), _yes(c.informative)] for c in self.cells])
        if self.curves:
            lines += _columns(["group", "score", "estimate", "ci_low", "ci_high", "inf."],
                              [[c.group, f"{c.score:.4g}", _num(c.estimate), _num(c.ci_low), _num(c.ci_high),
                                _yes(c.informative)] for c in self.curves])
        if self.pools:
            lines += _columns(["pool", "group", members_heading(self.info), "expected", "P(N>=T)", "included"],
                              [[p.pool, p.group, str(p.members), f"{p.expected_count:.3f}",
                                _num(p.prob_at_least), "yes" if p.included else "NO"]
                               if p.expected_count is not None else
                               [p.pool, p.group, str(p.members), "suppressed", "", "unknown"] for p in self.pools])
        if self.curves and self.correction:
            lines += _columns(["group", "score", "corrected", "ci_low", "ci_high", "inf."],
                              [[c.group, f"{c.score:.4g}", *corrected(c)] for c in self.curves
                               if c.group != "overall"])
        if any(True for _ in (self.groups or self.cells or self.curves)) and self.verdict.rule != "inclusion":
            lines.append(f"inf.: informative, the interval's half-width at most {INFORMATIVE_SHARE:g} tau "
                         f"= {INFORMATIVE_SHARE * self.tau:g}")
        v = self.verdict
        clipped = int(self.info.get("rows_clipped") or 0)
        if clipped:  # the estimates are of the clipped values: say so beside the verdict
            declared = ", ".join(f"{k} {_range_words(self.params[k])}" for k in ("outcome_range", "relevance_range")
                                 if self.params.get(k) is not None)
            lines.append(f"warning: {clipped:,} rows lay outside the declared range ({declared or 'the default'}) and "
                         f"were clipped into it before encryption; the results describe the clipped values "
                         f"(declare the range the values can take, or --out-of-range refuse)")
        lines.append(f"verdict: {v.message}")
        if v.severity == "inconclusive" and v.members_factor is not None and self.n_matched:
            lines.append(f"conclusive from about {math.ceil(v.members_factor * self.n_matched):,} joined members "
                         f"at these settings (the detectable gap shrinks as 1/sqrt(members))")
        if self.correction:
            lines.append("correction: " + correction_summary(self.correction))
        if self.release:
            lines.append("release controls: " + release_summary(_release_clean(self.release)))
        if self.group_mapping:
            lines.append("groups: " + self.group_mapping.replace(",", ", "))
        if self.preparation:
            lines.append("preparation: " + ", ".join(
                f"{name.replace('_', ' ')} {value:.4g}" if name in ("threshold", "epsilon") else
                f"{name.replace('_', ' ')} {int(value)}" for name, value in _ordered(self.preparation)))
        return "\n".join(lines)


def _num(x: float | None) -> str:
    return f"{x:.4f}" if x is not None and abs(x) < 1e6 else (f"{x:.4g}" if x is not None else "n/a")


def _yes(flag: bool | None) -> str:
    return "" if flag is None else ("yes" if flag else "no")


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of text cells as aligned lines: each column as wide as its longest cell, two
    spaces between columns; the first columns (names) left-aligned, numbers right-aligned."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    numeric = [i > 0 and all(_is_number(r[i]) for r in rows) for i in range(len(head))]
    out = []
    for r in [head, *rows]:
        out.append("  ".join(str(c).rjust(w) if num else str(c).ljust(w)
                             for c, w, num in zip(r, widths, numeric)).rstrip())
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text in ("n/a", "")
    return True


def _range_words(value) -> str:
    """A declared range as the flags write it (LO:HI), from its JSON form."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{float(value[0]):g}:{float(value[1]):g}"
    return str(value)


def _flipped(d: Difference) -> Difference:
    neg = (lambda x: None if x is None else -x)
    return Difference(d.kind, d.b, d.a, neg(d.estimate), neg(d.ci_high), neg(d.ci_low), d.informative)


def _flag(x: Any) -> bool | None:
    return None if x is None else bool(x)


def _release_clean(release: dict[str, Any]) -> dict[str, Any]:
    """The release facts as reported: effective sizes are sizes (a noised size below 0 reads 0)."""
    sizes = release.get("effective_sizes")
    if not isinstance(sizes, dict):
        return release
    return {**release, "effective_sizes": {g: (max(0.0, float(v)) if _clean(v) is not None else v)
                                           for g, v in sizes.items()}}


def correction_summary(correction: dict[str, Any]) -> str:
    """One line on the attenuation correction (`common.stats.correction`)."""
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


def _severity(magnitude: float, tau: float) -> str:
    if magnitude >= 2 * tau:
        return "high"
    if magnitude >= tau:
        return "moderate"
    return "low"


def _label(cell) -> str:
    return _pair_label(cell.group, cell.other, cell.rank_pair) if cell.kind == "pair" else cell.group


def _pair_label(higher: str, lower: str, rank_pair: str | None) -> str:
    return f"{higher}>{lower}" + (f"@{rank_pair}" if rank_pair else "")


# ----------------------------------------------------------------------------------
# Groups left out of a verdict
# ----------------------------------------------------------------------------------
def kish_sizes(probabilities: np.ndarray) -> np.ndarray:
    """Per column of `probabilities` ((rows, groups), probabilities or integers on one
    common scale): the Kish effective sample size (Σ_i p_ij)² / Σ_i p_ij² (0 for an
    empty group). One-hot probabilities give the group's count; a group spread thinly
    over many rows gets more than Σ_i p_ij, one carried by a few rows with large p_ij
    about that few."""
    p = np.asarray(probabilities, dtype=np.float64)
    total, squares = p.sum(axis=0), np.square(p).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(squares > 0, total * total / np.where(squares > 0, squares, 1.0), 0.0)


def small_for_verdict(probabilities: np.ndarray, groups: Sequence[str], metric: str,
                      scale: float = 1.0) -> list[str]:
    """The groups left out of a verdict without release noise (module docstring, "Left
    out"): for a rate metric (RATE_METRICS) a Kish effective sample size below
    MIN_KISH_SIZE, for any other an effective size Σ_i p_ij below MIN_EFFECTIVE_SIZE
    (`probabilities` on the scale `scale`: 2^32 for quantised ones). Exact sizes: only
    for audits without release noise (the list is sent to the Test-Client)."""
    if metric in RATE_METRICS:
        sizes, floor = kish_sizes(probabilities), MIN_KISH_SIZE
    else:
        sizes, floor = np.asarray(probabilities, dtype=np.float64).sum(axis=0) / scale, MIN_EFFECTIVE_SIZE
    return [g for g, size in zip(groups, sizes) if size < floor]


def left_out_words(noisy: bool | None, metric: str) -> str:
    """Why groups were left out of a verdict, in words (module docstring, "Left out")."""
    if noisy:
        return f"noised effective size below {MIN_EFFECTIVE_SIZE:g} or below the release controls' minimum"
    if metric in RATE_METRICS:
        return f"effective sample size below {MIN_KISH_SIZE:g}"
    return f"effective size below {MIN_EFFECTIVE_SIZE:g}"


def null_scaled(values: np.ndarray, index: dict[str, int], bounds: tuple[float, float] | None) -> np.ndarray:
    """`values` with each group's replicates spread as they would be at the overall's value:
    rep ← est + (rep − est)·s, s = max(1, √(spread(overall)/spread(est))), spread(x) =
    (x − lo)(hi − x) the binomial-type variance on the range [lo, hi] (module docstring,
    "Intervals"). The verdict's test is of "no gap", under which every group's value is
    the overall's; a group whose estimate sits nearer a bound than the overall's (few
    events: a low rate) has a bootstrap spread that is too small exactly when its
    estimate is far from the truth, which is how a small group makes false findings.
    Only widens; unbounded metrics and groups at a bound are left as they are."""
    if bounds is None or "overall" not in index:
        return values
    lo, hi = bounds
    overall = values[0, index["overall"]]
    at_overall = (overall - lo) * (hi - overall) if np.isfinite(overall) else 0.0
    if not at_overall > 0:
        return values
    out = values.copy()
    for group, c in index.items():
        x = values[0, c]
        spread = (x - lo) * (hi - x) if np.isfinite(x) else 0.0
        if group != "overall" and 0 < spread < at_overall:
            out[1:, c] = x + (values[1:, c] - x) * math.sqrt(at_overall / spread)
    return out


# ----------------------------------------------------------------------------------
# Ranges, informativeness, detectable differences
# ----------------------------------------------------------------------------------
def value_range(metric, option: str, params: dict[str, Any]) -> tuple[float, float] | None:
    """The range a group's (or curve point's) estimate lies in: the metric's declared one
    (`Metric.value_range`), else [0, 1] for the rate metrics and LOT's normalised
    relevances, else the operator's declared outcome range (`outcome_range`), else None."""
    declared = metric.value_range(option, params)
    if declared is not None:
        return float(declared[0]), float(declared[1])
    if metric.name in UNIT_RANGE_METRICS or (metric.name == "lot" and option != "raw"):
        return 0.0, 1.0
    return _outcome_range(params.get("outcome_range"))


def _outcome_range(value: Any) -> tuple[float, float] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        lo_text, _, hi_text = value.partition(":")
        value = (lo_text, hi_text)
    try:
        lo, hi = float(value[0]), float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo < hi else None


def difference_range(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """The range of a − b for a, b in `bounds`."""
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


def _clip(x: Any, bounds: tuple[float, float] | None) -> float | None:
    x = _clean(x)
    if x is None or bounds is None:
        return x
    return min(max(x, bounds[0]), bounds[1])


def is_informative(low: Any, high: Any, tau: float) -> bool:
    """An estimate is informative when its interval's half-width is at most
    INFORMATIVE_SHARE·τ (module docstring); an undefined interval is not."""
    low, high = _clean(low), _clean(high)
    return low is not None and high is not None and (high - low) / 2.0 <= INFORMATIVE_SHARE * tau + 1e-12


def standard_errors(values: np.ndarray, method: str) -> np.ndarray:
    """Per column: the replicates' standard deviation (bootstrap), or sd/√G (random
    groups): the standard error the intervals are built from; NaN where fewer than two
    replicates are defined."""
    reps = values[1:]
    counts = np.sum(np.isfinite(reps), axis=0)
    se = np.full(values.shape[1], np.nan)
    ok = counts >= 2
    if ok.any():
        with np.errstate(invalid="ignore"):
            se[ok] = np.nanstd(reps[:, ok], axis=0, ddof=1)
        if method != "percentile":
            se[ok] = se[ok] / np.sqrt(counts[ok])
    return se


def detectable_differences(values: np.ndarray, confidence: float, method: str) -> np.ndarray:
    """Per compared difference, the minimum detectable difference (MDD): the true gap the
    simultaneous band detects with probability POWER, h + z_POWER·se, h the band's
    half-width (q·se) and se the difference's standard error (module docstring)."""
    band_low, band_high = simultaneous_bands(values, confidence, method)
    se = standard_errors(values, method)
    return (band_high - band_low) / 2.0 + Z_POWER * se


def _interval_words(low: Any, high: Any) -> str:
    low, high = _clean(low), _clean(high)
    if low is None or high is None:
        return "undefined (too few defined replicates)"
    return f"[{low:+.4f}, {high:+.4f}]"


def _relation(low: Any, high: Any) -> str:
    """What a band says about 0, in words that match its numbers."""
    low, high = _clean(low), _clean(high)
    if low is None or high is None:
        return "says nothing"
    if low > 0:
        return "lies above 0"
    if high < 0:
        return "lies below 0"
    return "includes 0"


def _nearer_end(rule: str, estimate: float, band_low: float, band_high: float) -> float:
    """The end of a significant comparison's band nearer 0, as an adverse magnitude (the
    smallest gap the band allows, in the direction the rule judges)."""
    if rule == "below_overall":
        return float(band_low)
    if rule == "negative_cells":
        return float(-band_high)
    return float(band_low) if estimate >= 0 else float(-band_high)


def _uncertain_size(severity: str, nearer: float, tau: float) -> str:
    """Words for a significant gap whose band reaches into a milder severity than its
    estimate's: the severity is read off the estimate, and the band says the gap may be
    as small as its nearer end (module docstring, "none" and severity)."""
    if not math.isfinite(nearer) or _severity(nearer, tau) == severity:
        return ""
    return (f"; the severity is the estimate's: the band allows a gap as small as {nearer:.4f} "
            f"({_severity(nearer, tau)}), so how large the gap is stays uncertain")


def _needed(factor: float | None, noisy: bool | None = None, widest: str | None = None) -> str:
    """What would make an inconclusive audit conclusive; the privacy budget only where
    release noise is on (`noisy` None: not known, both said); `widest`: the comparison
    or group that needs the factor `factor` (the others need fewer)."""
    known = factor is not None and math.isfinite(factor)
    more = (f"more members (about {factor:,.1f}x as many" + (f"; {widest} needs the most" if widest else "") + ")"
            if known else "more members")
    if noisy is None:
        return (f"conclusive with {more}, fewer groups (--group-mapping) or, under the release controls, "
                f"a larger privacy budget (rho)")
    if noisy:
        return f"conclusive with {more}, fewer groups (--group-mapping) or a larger privacy budget (rho)"
    return f"conclusive with {more} or fewer groups (--group-mapping)"


def verdict_from(rule: str, labels: Sequence[str], values: np.ndarray, confidence: float, method: str,
                 tau: float, groups: Sequence[GroupResult] = (), *, left_out: Sequence[str] = (),
                 left_out_factor: float | None = None, left_out_widest: str | None = None,
                 strict: Sequence[bool] | None = None,
                 excluded: Sequence[str] = (), noisy: bool | None = None, metric: str = "",
                 strict_significance: bool = True, span: tuple[float, float] | None = None) -> Verdict:
    """The verdict over a family of compared differences (`values`: (R+1, C), row 0 the
    estimates), by `rule` (module docstring). `left_out`: the groups (or cells) that
    could not take part as not informative; `excluded`: the groups left out of the
    verdict for their size or withheld (module docstring, "Left out"): with any of
    either, no verdict is "none"; `left_out_factor`: how many times the members they
    would need (`left_out_widest`: the one that needs it); `noisy`: whether release noise was on (what the advice names); `metric`:
    the metric's name (which size rule left groups out); `strict_significance`: whether a
    comparison with an uninformative group must clear tau to count (without release
    noise; module docstring) — either way the compared pair is picked among the
    informative groups' comparisons first."""
    non_overlap = []
    defined = [g for g in groups if g.group != "overall" and g.ci_low is not None]
    for i, a in enumerate(defined):
        for b in defined[i + 1:]:
            if a.ci_high < b.ci_low or b.ci_high < a.ci_low:
                non_overlap.append((a.group, b.group))
    est = values[0] if values.size else np.empty(0)
    excluded_words = (f"; left out of the verdict ({left_out_words(noisy, metric)}): {', '.join(excluded)}"
                      if excluded else "")
    if not np.isfinite(est).any():
        left_out_factor = _with_excluded(left_out_factor, excluded)
        if left_out or excluded:
            message = ("inconclusive at this size and privacy level: no two groups can be compared"
                       + (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau = "
                          f"{INFORMATIVE_SHARE * tau:g}): {', '.join(left_out)}" if left_out else "")
                       + f"{excluded_words}; {_needed(left_out_factor, noisy, left_out_widest)}")
            return Verdict(rule, tau, "inconclusive", False, False, None, (), tuple(non_overlap), message,
                           excluded_groups=tuple(excluded), uninformative=tuple(left_out),
                           members_factor=_round_factor(left_out_factor))
        return Verdict(rule, tau, "insufficient data", False, False, None, (), tuple(non_overlap),
                       "insufficient data (fewer than two defined estimates to compare)")
    low, high = marginal_intervals(values, confidence, method)
    band_low, band_high = (np.clip(b, *span) if span is not None else b
                           for b in simultaneous_bands(values, confidence, method))
    mdds = detectable_differences(values, confidence, method)
    if rule == "below_overall":
        adverse, significant = est, band_low > 0
    elif rule == "negative_cells":
        adverse, significant = -est, band_high < 0
    else:  # "range", "nonzero_pairs"
        adverse, significant = np.abs(est), (band_low > 0) | (band_high < 0)
    adverse = np.where(np.isfinite(adverse), adverse, -np.inf)
    significant = significant & np.isfinite(est)
    if strict is not None and np.any(strict) and strict_significance:
        # a comparison with a group left out as not informative counts only when its band
        # clears tau itself (its interval may under-cover: module docstring)
        beyond = {"below_overall": band_low > tau, "negative_cells": band_high < -tau}.get(
            rule, (band_low > tau) | (band_high < -tau))
        significant = significant & (~np.asarray(strict) | beyond)
    banded = np.isfinite(band_low) & np.isfinite(band_high)
    if strict is not None and np.any(strict) and not np.all(strict):
        banded = banded & ~np.asarray(strict)
    finite_mdd = mdds[banded & np.isfinite(mdds)]
    mdd = float(finite_mdd.max()) if finite_mdd.size else None
    mdd_widest = labels[int(np.nanargmax(np.where(banded & np.isfinite(mdds), mdds, np.nan)))] \
        if mdd is not None else None
    beyond_range = mdd is not None and _detectable(mdd, span) is None
    factor, widest = max([f for f in (((mdd / tau) ** 2 if mdd is not None and not beyond_range else None,
                                       mdd_widest),
                                      (left_out_factor, left_out_widest)) if f[0] is not None],
                         default=(None, None), key=lambda f: f[0])
    factor = _with_excluded(factor, excluded)
    if significant.any():
        preferred = significant & ~np.asarray(strict, dtype=bool) if strict is not None else significant
        pick = int(np.argmax(np.where(preferred if preferred.any() else significant, adverse, -np.inf)))
        severity = _severity(float(adverse[pick]), tau)
    else:
        # the most adverse difference whose band is defined (one without a band cannot
        # be read as "includes 0"), else the most adverse one
        pick = int(np.argmax(np.where(banded, adverse, -np.inf))) if banded.any() else int(np.argmax(adverse))
        conclusive = not left_out and not excluded and mdd is not None and mdd <= tau and bool(banded.all())
        severity = "none" if conclusive else "inconclusive"
    compared = {"label": labels[pick], "estimate": _clean(est[pick]), "ci_low": _clean(low[pick]),
                "ci_high": _clean(high[pick]), "band_low": _clean(band_low[pick]),
                "band_high": _clean(band_high[pick]), "informative": is_informative(low[pick], high[pick], tau),
                "mdd": _detectable(mdds[pick], span)}
    words = {"range": "largest gap between two groups", "below_overall": "largest shortfall of a group below overall",
             "negative_cells": "most negative pair cell", "nonzero_pairs": "largest DTI"}[rule]
    if rule == "below_overall" and est[pick] < 0:  # no group lies below overall: no shortfall to name
        words = "group closest to overall (none lies below it)"
    band = _interval_words(band_low[pick], band_high[pick])
    mdd_words = (f"no gap the metric can take (at most {span[1]:g}) is detectable with {POWER:.0%} power at "
                 f"this size" if beyond_range else
                 f"the smallest gap this audit detects with {POWER:.0%} power is {mdd:.4f}" if mdd is not None
                 else "the smallest gap this audit could detect is undefined (no defined band)")
    if severity == "none":
        message = (f"no significant disparity (the {words}, {labels[pick]} = {est[pick]:+.4f}, has a "
                   f"{confidence:.0%} simultaneous interval {band} that {_relation(band_low[pick], band_high[pick])}; "
                   f"tau {tau:g}; {mdd_words}, at most tau)")
    elif severity == "inconclusive":
        message = (f"inconclusive at this size and privacy level: the {words}, {labels[pick]} = {est[pick]:+.4f}, "
                   f"has a {confidence:.0%} simultaneous interval {band} that "
                   f"{_relation(band_low[pick], band_high[pick])}"
                   + (f", but {mdd_words}" if mdd is None or beyond_range
                      else f", but {mdd_words}, above tau {tau:g}" if mdd > tau
                      else f"; {mdd_words} (tau {tau:g}) among the groups compared"))
        if left_out:
            message += (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau), so not "
                        f"judged: {', '.join(left_out)}")
        message += excluded_words + "; " + _needed(factor, noisy, widest)
    else:
        message = (f"significant disparity, severity {severity}: {words}, {labels[pick]} = {est[pick]:+.4f}, "
                   f"{confidence:.0%} simultaneous interval {band} excludes 0 (tau {tau:g}; "
                   f"{int(significant.sum())} significant of {len(labels)} compared)")
        message += _uncertain_size(severity, _nearer_end(rule, est[pick], band_low[pick], band_high[pick]), tau)
        if left_out and strict_significance:
            message += (f"; not informative, so compared only for gaps whose band clears tau: "
                        f"{', '.join(left_out)}")
        elif left_out:
            message += (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau): "
                        f"{', '.join(left_out)}")
    if severity != "inconclusive":
        message += excluded_words
    if non_overlap:
        pairs_words = ", ".join(f"{a}/{b}" for a, b in non_overlap)
        message += (f"; non-overlapping group CIs: {pairs_words}" if significant.any() else
                    f"; group CIs that do not overlap (marginal intervals, not a finding: the verdict judges "
                    f"the simultaneous bands): {pairs_words}")
    return Verdict(rule, tau, severity, bool(significant.any()), severity in ("moderate", "high"), compared,
                   tuple(labels[i] for i in np.flatnonzero(significant)), tuple(non_overlap), message,
                   excluded_groups=tuple(excluded), mdd=_detectable(mdd, span),
                   members_factor=_round_factor(factor) if severity == "inconclusive" else None,
                   uninformative=tuple(left_out))


def _detectable(mdd: Any, span: tuple[float, float] | None) -> float | None:
    """An MDD as the verdict states it: None where undefined or beyond the largest gap the
    compared differences can take (`span`'s upper end: no gap is detectable; module docstring)."""
    mdd = _clean(mdd)
    return None if mdd is None or (span is not None and mdd > span[1]) else mdd


def _with_excluded(factor: float | None, excluded: Sequence[str]) -> float | None:
    """How many times the members would make the audit conclusive, None (unknown) where
    groups left out for their size say more members are needed but not how many."""
    return None if excluded and (factor is None or factor <= 1.0) else factor


def _round_factor(factor: float | None) -> float | None:
    factor = _clean(factor)
    return None if factor is None else round(max(factor, 1.0), 1)


# ----------------------------------------------------------------------------------
# Finishing: decrypted cell values -> the result
# ----------------------------------------------------------------------------------
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
        out.append((_clip(values[0, c], rng), _clip(low[c], rng), _clip(high[c], rng),
                    is_informative(low[c], high[c], tau)))
    return out


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


def receipt_line(report: AuditReport) -> str:
    """A receipt in one line: where the result is, and how to read it there."""
    return (f"{DELIVERED} (result recipient client); audit id {report.audit_id}; metric {report.metric}, "
            f"joined rows {report.n_matched}; read it there: ppre client serve --results-dir DIR keeps it "
            f"in DIR/{report.audit_id}.json")


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


def finish(metric, plan, values: np.ndarray, *, option: str, confidence: float, tau: float,
           params: dict[str, Any], info: dict[str, Any], replicates: int,
           result_recipient: str = "client", small_groups: Sequence[str] = (),
           interval: str | None = None, corrected=None, noisy: bool | None = None,
           min_size: float = 0.0) -> AuditReport:
    """The result from the cells' ratios `values` ((R+1, cells): row 0 the estimate).
    `small_groups` (from the Tester: module docstring, "Left out") take no part in the
    verdict of a per-group metric. `noisy`: whether release noise was on (None: not
    known); without it (False) the verdict tests with each group's spread at the
    overall's value (`null_scaled`), and only with it does its advice name the privacy
    budget. `interval`: the method the Tester chose
    (random groups under release noise), else the metric's own. `corrected`: the
    attenuation-corrected values (`common.stats.correction.Corrected`), reported beside the
    weighted ones with intervals from the same replicates; the verdict stays on the
    weighted estimates (the paper's) and says how the corrected gap bears on it.
    Every reported value is clipped to its range (`value_range`, module docstring). A
    metric whose cells are counts reports them itself (`Metric.cell_report`), withholding
    a count below `min_size`, the controls' minimum effective size."""
    counted = metric.cell_report(plan, values, option=option, params=params, info=info, confidence=confidence,
                                 tau=tau, min_size=min_size)
    if counted is not None:
        return replace(counted, result_recipient=result_recipient, tau=tau)
    cells = list(plan.cells)
    bounds = value_range(metric, option, params)
    pair_bounds = difference_range(bounds) if not params.get("dti_weights") else None
    values = _clip_estimates(values, cells, bounds, pair_bounds)
    extra_cells, extra = metric.derived(cells, values, params, info)
    if extra_cells:
        cells += extra_cells
        values = _clip_estimates(np.hstack([values, extra]), cells, bounds, pair_bounds)
    method = interval or metric.interval
    low, high = marginal_intervals(values, confidence, method)
    entries = _entries(cells, values, low, high, bounds, pair_bounds, tau)
    fixed = [(None, None, None, None)] * len(cells)
    if corrected is not None:
        cvalues = _clip_estimates(corrected.values, cells[:corrected.values.shape[1]], bounds, pair_bounds)
        clow, chigh = marginal_intervals(cvalues, confidence, method)
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
    rule = metric.verdict_rule
    small = set(small_groups) if index else set()
    labels, fam, left_out, (factor, widest), strict = _family(rule, cells, groups, pairs, index, diff_labels, diffs,
                                                              values, small, tau, bounds)
    excluded = tuple(g.group for g in groups if g.group in small)
    factor, widest = max([f for f in ((factor, widest),
                                      _widest([(g.group, g.ci_low, g.ci_high) for g in groups if g.group in small], tau,
                                              bounds))
                          if f[0] is not None], default=(None, None), key=lambda f: f[0])
    if fam.shape[1] == 0 and not left_out and not excluded:
        verdict = Verdict(rule, tau, "insufficient data", False, False, None, (), (),
                          "insufficient data (nothing to compare)")
    else:
        verdict = verdict_from(rule, labels, fam, confidence, method, tau,
                               [g for g in groups if g.group not in small], left_out=left_out, left_out_factor=factor,
                               left_out_widest=widest, strict=strict, excluded=excluded, noisy=noisy, metric=metric.name,
                               strict_significance=not noisy, span=pair_bounds)
    if corrected is not None and verdict.compared and rule in ("range", "below_overall"):
        verdict = _with_attenuation(verdict, corrected, cells, index, confidence, method, bounds, groups)
    return AuditReport(metric=metric.name, metric_option=option, n_matched=0, bootstrap=replicates,
                       confidence=confidence, interval=method, groups=groups, verdict=verdict, cells=pairs,
                       curves=curves, differences=differences, params=_jsonable(params), info=dict(info),
                       result_recipient=result_recipient, tau=tau,
                       correction=corrected.summary() if corrected is not None else {})


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
    dlow, dhigh = marginal_intervals(diffs, confidence, method)
    rng = difference_range(bounds)
    return diff_labels, diffs, [
        Difference(kind, a, b, _clip(diffs[0, i], rng), _clip(dlow[i], rng), _clip(dhigh[i], rng),
                   informative=is_informative(dlow[i], dhigh[i], tau))
        for i, (kind, a, b) in enumerate(diff_labels)]


def _eligible(g: GroupResult, overall: GroupResult | None, bounds, tau: float) -> bool:
    """Whether a group takes part in the verdict: informative at the overall's value.
    For a bounded metric the group's half-width is rescaled from its own estimate's
    binomial-type spread (x − lo)(hi − x) to the overall's, so that a group is not picked
    because its estimate happens to sit near a bound (few events: a narrow interval
    around a low rate, the case in which its interval under-covers); unbounded metrics
    use the half-width as it is."""
    if not g.informative and bounds is None:
        return False
    if g.ci_low is None or g.ci_high is None or g.estimate is None:
        return False
    half = (g.ci_high - g.ci_low) / 2.0
    if bounds is not None and overall is not None and overall.estimate is not None:
        lo, hi = bounds
        spread = (g.estimate - lo) * (hi - g.estimate)
        at_overall = (overall.estimate - lo) * (hi - overall.estimate)
        if spread <= 0:
            return False
        half *= math.sqrt(at_overall / spread)
    return half <= INFORMATIVE_SHARE * tau + 1e-12


def _family(rule, cells, groups, pairs, index, diff_labels, diffs, values, small, tau, bounds=None):
    """The compared family (labels, (R+1, C) values), the groups or cells left out of it
    (not informative, or withheld) and how many times the members would make them
    informative ((half-width / (INFORMATIVE_SHARE·τ))², the largest)."""
    empty = np.empty((values.shape[0], 0))
    if rule in ("range", "below_overall"):
        judged = [g for g in groups if g.group != "overall" and g.group not in small]
        overall = next((g for g in groups if g.group == "overall"), None)
        ok = {g.group for g in judged if _eligible(g, overall, bounds, tau)}
        left = [g for g in judged if g.group not in ok]
        if rule == "below_overall" and "overall" in index and not any(
                g.informative for g in groups if g.group == "overall"):
            left += [g for g in judged if g.informative]
            ok = set()
    else:
        left_cells = [p for p in pairs if not p.informative]
        left = left_cells
    factor = _widest([(_result_label(x), x.ci_low, x.ci_high) for x in left], tau,
                     bounds if rule in ("range", "below_overall") else difference_range(bounds))
    named = {g.group for g in groups if g.group != "overall" and g.group not in small}
    if rule == "range":
        family = [i for i, (kind, a, b) in enumerate(diff_labels) if kind == "between" and a in named and b in named]
        labels, cols = [], []
        for i in family:  # every gap oriented as max − min by its estimate: the compared one reads positive
            _, a, b = diff_labels[i]
            flip = bool(diffs[0, i] < 0)
            labels.append(f"{b} - {a}" if flip else f"{a} - {b}")
            cols.append(-diffs[:, i] if flip else diffs[:, i])
        fam = np.column_stack(cols) if cols else empty
        strict = [not (diff_labels[i][1] in ok and diff_labels[i][2] in ok) for i in family]
        return labels, fam, [g.group for g in left], factor, strict
    if rule == "below_overall":
        family = [i for i, (kind, a, _) in enumerate(diff_labels) if kind == "to_overall" and a in named]
        labels = [f"overall - {diff_labels[i][1]}" for i in family]
        fam = -diffs[:, family] if family else empty
        return labels, fam, [g.group for g in left], factor, [diff_labels[i][1] not in ok for i in family]
    if rule in ("negative_cells", "nonzero_pairs"):
        pair_cells = [c for c, cell in enumerate(cells) if cell.kind == "pair"]
        labels = [_label(cells[c]) for c in pair_cells]
        fam = values[:, pair_cells] if pair_cells else empty
        return (labels, fam, [_label(cells[c]) for c, p in zip(pair_cells, pairs) if not p.informative], factor,
                [not p.informative for p in pairs])
    raise ValueError(f"unknown verdict rule {rule}")


def _widest(entries, tau: float, span: tuple[float, float] | None = None) -> tuple[float | None, str | None]:
    """(how many times the members would make the widest of `entries` ((label, low, high))
    informative, its label): ((half-width / (INFORMATIVE_SHARE·τ))², the largest). An
    interval that fills its whole range `span` was clipped: its true width, and so the
    factor, is unknown (inf: "more members", no number)."""
    widths = [((hi - lo) / 2.0, label) for label, lo, hi in entries if lo is not None and hi is not None]
    if not widths:
        return None, None
    width, label = max(widths, key=lambda w: w[0])
    if span is not None and 2.0 * width >= (span[1] - span[0]) - 1e-12:
        return math.inf, label
    return (width / (INFORMATIVE_SHARE * tau)) ** 2, label


def _result_label(part) -> str:
    """How the verdict names a group or a pair cell of the result (as `_label` its cell)."""
    return _pair_label(part.higher, part.lower, part.rank_pair) if isinstance(part, PairResult) else part.group


def _with_attenuation(verdict: Verdict, corrected, cells, index, confidence, method, bounds, groups) -> Verdict:
    """The compared pair's corrected gap (`common.stats.correction`) beside the weighted one,
    and whether the weighted gap understates it (module docstring)."""
    label = verdict.compared["label"]
    a, _, b = label.partition(" - ")
    width = corrected.values.shape[1]
    col = {g: c for g, c in index.items() if c < width}
    unidentifiable = set(corrected.summary().get("unidentifiable", ())) if hasattr(corrected, "summary") else set()
    by_name = {g.group: g for g in groups}
    if a == "overall" and b in col:
        est = by_name.get("overall")
        ga = None if est is None else est.estimate
        gb = by_name[b].corrected_estimate
        series = None
    elif a in col and b in col:
        ga, gb = by_name[a].corrected_estimate, by_name[b].corrected_estimate
        series = corrected.values[:, col[a]] - corrected.values[:, col[b]]
    else:
        return verdict
    if ga is None or gb is None or a in unidentifiable or b in unidentifiable:
        return verdict
    gap = ga - gb
    weighted = verdict.compared["estimate"]
    low = high = None
    if series is not None:
        lo, hi = marginal_intervals(np.column_stack([np.r_[gap, series[1:]]]), confidence, method)
        rng = difference_range(bounds)
        low, high = _clip(lo[0], rng), _clip(hi[0], rng)
    understates = weighted is not None and abs(gap) > abs(weighted) and gap * weighted >= 0
    facts = {"pair": label, "weighted": weighted, "corrected": round(gap, 12), "corrected_ci_low": low,
             "corrected_ci_high": high, "understates": bool(understates)}
    words = (f"; corrected for attenuation, {label} = {gap:+.4f}"
             + (f" ({confidence:.0%} interval {_interval_words(low, high)})" if series is not None else "")
             + (": the weighted gap understates it (BISG probabilities pull group estimates towards each "
                "other), so the severity above is a lower bound" if understates else
                ": the weighted gap does not understate it"))
    return replace(verdict, attenuation=facts, message=verdict.message + words)


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out

