"""Output metric (paper appendix C.1, eq. 18): per-group means of a plain outcome.

Dataset: `member_id, outcome` (real-valued, negative allowed). Cells: each group and
overall. Verdict: the largest gap between two groups (rule "range").

**Declared range.** The outcome's possible range [LO, HI] is declared
(`outcome_range`, `--outcome-range LO:HI`; default 0:1, a binary or rate-like
outcome). The Test-Client clips every outcome into it before encryption, counting the
rows it clipped (`info["rows_clipped"]`; sent to the Tester with the other dataset facts: a count over the Test-Client's own rows, before the join, so nothing about the Tester's members), or refuses the dataset (`out_of_range`
refuse). Per row it encodes, in fixed point (2^-24), f = outcome − c with the range's
centre c = (LO + HI)/2, and d = 1; each cell is c + Σ p_ij f / Σ p_ij (`Cell.offset`),
the same mean, with |f| ≤ (HI − LO)/2.

**Sensitivity** (`tester_service.release`; design §8.3). Replacing one member's probability
vector p by p' (||p − p'||₂ ≤ √2) moves group j's numerator by (p'_j − p_j)·f per row
the member is in, and its denominator by (p'_j − p_j)·1. Over all groups (the overall
cell is their sum: post-processing) and the member's m rows (m: the Tester's count of
the rows one member is in, 1 here, since member ids are unique), the L2 change is at
most √2·m·(HI − LO)/2 on the numerator slot and √2·m on the denominator slot: the
components' bounds (HI − LO)/2 and 1, which `Metric.slot_sensitivity` multiplies by m.
Centring halves the numerator's sensitivity against encoding the outcome itself, and
makes it independent of where the range lies (an outcome in [100, 101] costs what one
in [0, 1] does).

**Interval under release noise** (`common.stats.moments`). With d = 1 the pair items of f
and d give ``Σ p_a·p_b·f`` (= Σ p_a·p_b·f·d) and ``Σ p_a·p_b``; the third second moment,
``Σ p_a·p_b·f²``, needs f² itself, so under a noisy release (`SECOND_MOMENTS`) every
row carries a third component f² = (outcome − c)² (bound ((HI − LO)/2)², 2^-24 fixed
point), aggregated by the pair items (and, in the group items, released at the second
moments' noise; it is not part of the estimate: `Metric.moment_components`). Its
sensitivity is that of any component: √2·m·((HI − LO)/2)² per slot over the groups,
twice that over the pairs (`tester_service.release`).
"""
from __future__ import annotations

import math

import numpy as np

from common.metrics.base import (OUT_OF_RANGE_PARAM, Cell, ClientRows, Component, Metric, Param, Plan,
                                 bounded_column, finite_column, value_range)

#: outcomes are encoded with 24 fractional bits
SCALE_BITS = 24
#: the outcome range when none is declared: a binary (or rate-like) outcome
DEFAULT_OUTCOME_RANGE = (0.0, 1.0)
#: what an outcome may reach at all (`common.metrics.base.MAX_DECLARED`)
MAX_OUTCOME = 1e9

OUTCOME_RANGE_PARAM = Param("outcome_range", "LO:HI, the outcome's possible range; outcomes outside it are "
                            "clipped (or refused: out_of_range); the release noise is sized from it "
                            "(default 0:1)", value_range, DEFAULT_OUTCOME_RANGE)


def centred_bound(lo: float, hi: float) -> tuple[float, float]:
    """(centre, half-width) of a declared range: values are encoded as value − centre."""
    return (lo + hi) / 2.0, (hi - lo) / 2.0


def fixed_bound(value: float, scale_bits: int) -> int:
    """A real bound in fixed point, rounded up (quantised values never exceed it)."""
    return int(math.ceil(value * (1 << scale_bits))) + 1


class OutputMetric(Metric):
    name = "output"
    corrects = True
    moment_interval = True
    moment_squares = True
    description = "output metric: per-group mean of an outcome"
    params = (OUTCOME_RANGE_PARAM, OUT_OF_RANGE_PARAM)
    numeric_columns = ("outcome",)
    verdict_rule = "range"

    def value_bounds(self, option, params):
        lo, hi = params.get("outcome_range") or DEFAULT_OUTCOME_RANGE
        return {"outcome_lo": float(lo), "outcome_hi": float(hi)}

    def value_range(self, option, params):
        return tuple(params.get("outcome_range") or DEFAULT_OUTCOME_RANGE)

    def components(self, option, params, info):
        _, half = centred_bound(*self.value_range(option, params))
        comps = (Component("outcome", SCALE_BITS, fixed_bound(half, SCALE_BITS)),
                 Component("one", SCALE_BITS, 1 << SCALE_BITS))
        if self.moment_components(option, params):
            comps += (Component("outcome squared", SCALE_BITS, fixed_bound(half * half, SCALE_BITS)),)
        return comps

    def client_rows(self, frame, file, option, params, rng):
        lo, hi = self.value_range(option, params)
        info: dict = {"rows_clipped": 0}
        y = bounded_column(finite_column(frame, "outcome", file), lo, hi, params, info, file=file,
                           column="outcome", bound="outcome_range")
        centre, _ = centred_bound(lo, hi)
        columns = [y - centre, np.ones_like(y)]
        if self.moment_components(option, params):
            columns.append((y - centre) ** 2)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=np.column_stack(columns),
                          info=info)

    def check_info(self, info, strata_labels):
        if int(info.get("rows_clipped", 0)) < 0:
            raise ValueError("clipped rows")

    def plan(self, groups, strata_labels, layout, option, params, info):
        centre, _ = centred_bound(*self.value_range(option, params))
        base = super().plan(groups, strata_labels, layout, option, params, info)
        return Plan(tuple(Cell(c.kind, c.group, item=c.item, num_slot=c.num_slot, den_slot=c.den_slot,
                               scale_shift=c.scale_shift, offset=centre) for c in base.cells),
                    base.items, base.item_slots)


METRIC = OutputMetric()
