"""Values clipped into a declared range, and what that leaves of the result (design §8.3).

A metric whose release noise is sized from a declared range (LOT `raw`:
`relevance_range`; POT and the output metric: `outcome_range`) has the Test-Client clip
every value outside it into it before encryption and count the rows it clipped
(`info["rows_clipped"]`, a count over its own rows, before the join); LOT `idcg` clips
its normalised gaps to [−1, 1] the same way. The result then describes the clipped
values. Where few rows were clipped that is a warning beside the verdict; where a large
share was (at least CLIPPED_SHARE of the rows the count is over), the clipped values are
mostly the range's ends and say little about the data: a gap between them is no measure
of the data's, and the absence of one is no finding (every relevance above the range
reads as its top: every gap 0). The verdict then is not "none" but "inconclusive"
(`common.stats.verdict.with_clipping`), and every page names the parameter to declare.

The share is overall: the count is one number over the Test-Client's table, so which
cells the clipped rows fell in is not known. Its denominator is the rows the count is
over, as the dataset facts state them: `info["rows_checked"]` where the Test-Client
states it, else for LOT `raw` its relevance rows (one per ranked item: the pairs, plus
one per query with pairs, plus the single-item queries) and for LOT `idcg` its pairs.
Where neither is stated the share is unknown and the warning stays a warning.
"""
from __future__ import annotations

from typing import Any

#: a share of the Test-Client's rows clipped at or above which the result describes the
#: range's ends more than the data: the verdict is never "none" (module docstring)
CLIPPED_SHARE = 0.5
#: the dataset fact that states how many rows the clipping count is over, where stated
ROWS_CHECKED = "rows_checked"
#: the dataset facts that split the count by the end of the range a value lay beyond, where stated
BELOW, ABOVE = "rows_clipped_below", "rows_clipped_above"
#: the parameters that declare a range, and what their values are called
RANGE_PARAMETERS = {"relevance_range": "relevances", "outcome_range": "outcomes"}
#: the declared ranges' defaults (every metric's is 0:1)
DEFAULT_RANGE = (0.0, 1.0)


def clipped_facts(metric: str, option: str, params: dict[str, Any], info: dict[str, Any]) -> dict[str, Any] | None:
    """What the result says about its clipped rows (None where none were clipped): the
    count, the rows it is over and the share (None where not stated), whether the share
    is large (at least CLIPPED_SHARE), the parameter that declares the range (None for LOT
    `idcg`, whose gaps have no range to declare), the declared range and which end the
    values lay beyond where the facts say."""
    clipped = _count(info.get("rows_clipped"))
    if not clipped:
        return None
    rows = checked_rows(metric, option, info)
    share = min(1.0, clipped / rows) if rows else None
    parameter = range_parameter(metric, option, params)
    declared = _pair(params.get(parameter)) if parameter else None
    below, above = _count(info.get(BELOW)), _count(info.get(ABOVE))
    return {"rows_clipped": clipped, "rows": rows, "share": share,
            "large": share is not None and share >= CLIPPED_SHARE, "threshold": CLIPPED_SHARE,
            "parameter": parameter, "declared": list(declared or DEFAULT_RANGE) if parameter else None,
            "beyond": ("both ends" if below and above else "below" if below else "above" if above else None)}


def checked_rows(metric: str, option: str, info: dict[str, Any]) -> int | None:
    """How many of the Test-Client's rows the clipping count is over (module docstring),
    None where the dataset facts do not say."""
    stated = _count(info.get(ROWS_CHECKED))
    if stated:
        return stated
    if metric == "lot":
        pairs = _count(info.get("pairs"))
        if option == "raw":
            queries, single = _count(info.get("queries")), _count(info.get("skipped_single_item"))
            return pairs + queries + single if pairs and queries is not None else None
        return pairs or None
    return None


def range_parameter(metric: str, option: str, params: dict[str, Any]) -> str | None:
    """The parameter that declares the clipped values' range: LOT `raw`'s `relevance_range`,
    else `outcome_range`; None for LOT's normalised gaps (option `idcg`)."""
    if metric == "lot":
        return "relevance_range" if option == "raw" else None
    return "outcome_range"


def range_flag(parameter: str) -> str:
    """The flag that declares `parameter`: relevance_range -> --relevance-range."""
    return "--" + parameter.replace("_", "-")


def range_text(value: Any) -> str:
    """A declared range as the flags write it (LO:HI)."""
    pair = _pair(value)
    return f"{pair[0]:g}:{pair[1]:g}" if pair else str(value)


def _pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, str):
        lo, _, hi = value.partition(":")
        value = (lo, hi)
    try:
        return float(value[0]), float(value[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def _count(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number >= 0 else None
