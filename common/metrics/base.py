"""What a metric declares (design §5): the unit of extension of the catalog.

Every metric of the catalog is, under encryption, a set of ratio cells
`Num[c] / Den[c]` with `Num[c] = Σ_rows w_c(row)·v_num(row)`: the Test-Client turns
its dataset into rows of values in plaintext (comparisons, sorting, IDCG, kernels:
design §4.5), the Tester weights them with plaintext weights
computed from the members' race probabilities, and both sides finish the decrypted
cells the same way (fairlearn's MetricFrame idea: compute the cells once, then compare
them). A metric module subclasses `Metric` and declares:

* its dataset: the columns it reads (`numeric_columns`, `text_columns`, whether a
  member id may repeat) and `client_rows`, the plaintext values of each row;
* its rows: how many member ids a row carries (`n_ids`: 2 for LOT's adjacent pairs and
  sampled AUC pairs), its value `components` (fixed-point scale, bound, sign), an
  optional plaintext stratum per row (LOT's rank pair, a pool) and its resampling unit
  (`resampling`: the Tester's random row buckets, the Test-Client's units such as
  queries, or random groups);
* the Tester's side: `weight_bits` and `weights` (one column per weight kind);
* its cells (`plan`): which weight column, stratum, ciphertext and slots make each
  (Num, Den) cell, labelled as a group, a group pair or a curve point;
* its verdict rule (`verdict_rule`, see `common.stats.verdict`) and whether it needs HE.

Nothing here does I/O or cryptography; the sessions (`tester_service.protocol`,
`client_service.protocol`) run every metric through the same machinery.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from common.errors import EncodingOverflowError, InputError

#: the fixed-point scale of one probability (design §4.2): q_ij = round(2^32 p_ij), rows sum to 2^32
PROBABILITY_BITS = 32
#: the key in a metric's parsed parameters that says this audit's release gives its
#: interval from second moments (`common.stats.moments`): set by the Tester for a noisy
#: release of a metric with `Metric.moment_interval`, and by the Test-Client from the
#: Hello (`Hello.second_moments`); never a user's parameter. With it the rows carry the
#: squares of `Metric.moment_squares` and the Test-Client states the facts of
#: `Metric.stated_facts`; without it neither (design §8.4, §9.1)
SECOND_MOMENTS = "second_moments"
#: the key in a metric's parsed parameters that says this audit's release carries noise
#: (the Tester's release controls are on), for a metric aggregated under encryption only
#: then (`Metric.he_under_noise`): set by the Tester, and by the Test-Client from the
#: Hello (`Hello.release_noise`); never a user's parameter (design §5.8)
RELEASE_NOISE = "release_noise"
#: `Cell.den_slot` of a count cell: no denominator, the cell is its noised aggregate
NO_DENOMINATOR = -1
#: room a slot keeps for the release controls' noise (at most 8 sd of σ ≤ 2^20 times a
#: member's largest contribution, which `item_bits` already bounds)
NOISE_HEADROOM_BITS = 24


# ----------------------------------------------------------------------------------
# Parameters an operator may set (besides the metric option)
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A metric parameter, travelling as text from the operator to both parties."""

    name: str
    help: str
    parse: Callable[[str], Any]
    default: Any = None

    def value(self, text: str | None) -> Any:
        if text is None or text == "":
            return self.default
        try:
            return self.parse(text)
        except InputError:
            raise
        except (ValueError, TypeError) as exc:
            raise InputError(f"cannot be read: {exc}", parameter=self.name) from None


def positive_int(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not 1 <= value <= limit:
            raise ValueError(f"must be a whole number from 1 to {limit}")
        return value
    return parse


def float_list(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError("must be a comma-separated list of finite numbers")
    return values


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError("must be strictly between 0 and 1")
    return value


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("must be true or false")
    return value in ("true", "1", "yes")


# ----------------------------------------------------------------------------------
# Declared value bounds (design §8.3: what the release noise is sized from)
# ----------------------------------------------------------------------------------
#: what the Test-Client does with a value beyond its declared bound
OUT_OF_RANGE_ACTIONS = ("clip", "refuse")
#: the largest magnitude a declared bound may take (the fixed-point slots' limit)
MAX_DECLARED = 1e9


def value_range(text: str) -> tuple[float, float]:
    """'LO:HI' -> (LO, HI), finite, LO < HI, |LO|, |HI| <= MAX_DECLARED."""
    lo_text, sep, hi_text = text.partition(":")
    if not sep:
        raise ValueError("must be LO:HI, e.g. 0:1")
    lo, hi = float(lo_text), float(hi_text)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("must be LO:HI with finite LO < HI")
    if max(abs(lo), abs(hi)) > MAX_DECLARED:
        raise ValueError(f"must lie within ±{MAX_DECLARED:g}")
    return lo, hi


def out_of_range_action(text: str) -> str:
    value = text.strip().lower()
    if value not in OUT_OF_RANGE_ACTIONS:
        raise ValueError(f"must be one of {', '.join(OUT_OF_RANGE_ACTIONS)}")
    return value


#: the parameter every bounded metric shares: clip a value beyond its bound, or refuse the dataset
OUT_OF_RANGE_PARAM = Param("out_of_range", "a value outside its declared bound: clip (default; the rows "
                           "clipped are counted in the result) or refuse", out_of_range_action, "clip")


def bounded_column(values: np.ndarray, lo: float, hi: float, params: dict[str, Any], info: dict[str, Any], *,
                   file: str, column: str, bound: str) -> np.ndarray:
    """`values` inside [lo, hi], as the Test-Client must encode them before encryption
    (the noise is sized from the bound, design §8.3): clipped, counting the rows clipped in
    `info["rows_clipped"]` out of the rows checked, `info["rows_checked"]` (the share the
    verdict reads, `common.stats.declared_range`; the Tester knows the table's size
    anyway), or, with `out_of_range=refuse`, an InputError naming the first row outside
    and the parameter `bound` that declares it."""
    from common.tables import first_row
    outside = (values < lo) | (values > hi)
    if outside.any() and params.get("out_of_range", "clip") == "refuse":
        raise InputError(f"outside the declared range [{lo:g}, {hi:g}] (declare the range with "
                         f"--{bound.replace('_', '-')} LO:HI, or pass --out-of-range clip)",
                         file=file, column=column, row=first_row(outside))
    info["rows_clipped"] = int(info.get("rows_clipped", 0)) + int(outside.sum())
    info["rows_checked"] = int(info.get("rows_checked", 0)) + len(values)
    return np.clip(values, lo, hi)


# ----------------------------------------------------------------------------------
# Rows, components, layout
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Component:
    """One value a row carries, encrypted: integer = round(value · 2^scale_bits), |integer| <= bound."""

    name: str
    scale_bits: int
    bound: int

    def quantize(self, values: np.ndarray) -> np.ndarray:
        scaled = np.rint(np.asarray(values, dtype=np.float64) * float(1 << self.scale_bits))
        if scaled.size and not np.all(np.abs(scaled) <= self.bound):
            raise EncodingOverflowError(f"the {self.name} values exceed the metric's bound "
                                        f"({self.bound / (1 << self.scale_bits):g})")
        return scaled.astype(np.int64) if self.bound < (1 << 62) else np.array(
            [int(v) for v in scaled], dtype=object)


@dataclass
class ClientRows:
    """The Test-Client's plaintext rows, before encryption (no probabilities: it has none)."""

    ids: tuple[np.ndarray, ...]             # n_ids arrays of member ids, one per id slot
    values: np.ndarray | None               # (n, components) float64; None when no HE
    units: np.ndarray | None = None         # (n,) int64 resampling unit (query, ...), or None
    strata: np.ndarray | None = None        # (n,) int64 plaintext stratum (rank pair, pool, order)
    strata_labels: tuple[str, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)  # dataset facts for the result (aggregates only)

    @property
    def n_rows(self) -> int:
        return len(self.ids[0])


@dataclass(frozen=True)
class Layout:
    """How row values are packed: `slots` signed slots of `slot_bits` per ciphertext.

    `first_alone`: the first component has a ciphertext of its own (ciphertext 0), the
    others fill the next ones, so that a weight column aggregated over ciphertext 0 alone
    (`Metric.column_ciphertexts`) sums that component and nothing else. `release_bits`:
    the released items' slot width where it differs from the rows' (0: the same), for a
    metric whose released items are formed from its aggregates after a round trip
    (`Metric.needs_squares`) rather than being them."""

    slot_bits: int
    slots: int
    n_components: int
    release_bits: int = 0
    first_alone: bool = False

    @property
    def release_slot_bits(self) -> int:
        """The slot width of the released items (the AggregatesHeader's `slot_bits`)."""
        return self.release_bits or self.slot_bits

    @property
    def n_ciphertexts(self) -> int:
        if self.first_alone and self.n_components:
            return 1 + -(-(self.n_components - 1) // self.slots)
        return -(-self.n_components // self.slots) if self.n_components else 0

    def position(self, component: int) -> tuple[int, int]:
        """(ciphertext, slot) of a component."""
        if self.first_alone:
            if component == 0:
                return 0, 0
            ct, slot = divmod(component - 1, self.slots)
            return ct + 1, slot
        return divmod(component, self.slots)

    def pack(self, values: np.ndarray) -> list[int]:
        """(n, components) integers -> n·n_ciphertexts packed plaintexts, row-major; a
        plaintext is negative when its top slot is (encode it mod n before encrypting).
        Built a column at a time (one pass per slot over Python ints: a hot path)."""
        cols = [values[:, c].tolist() for c in range(self.n_components)]
        lead = 1 if self.first_alone else 0
        groups = [cols[:lead]] if lead else []
        groups += [cols[lead + ct * self.slots:lead + (ct + 1) * self.slots]
                   for ct in range(self.n_ciphertexts - lead)]
        per_ct = []
        for part in groups:
            packed = [int(v) for v in part[0]]
            for s, col in enumerate(part[1:], start=1):
                shift = s * self.slot_bits
                packed = [a + (int(b) << shift) for a, b in zip(packed, col)]
            per_ct.append(packed)
        if len(per_ct) == 1:
            return per_ct[0]
        return [v for row in zip(*per_ct) for v in row]


def bits(x: int) -> int:
    return max(1, int(x).bit_length())


def choose_layout(item_bits: int, mask_bits: int, n_components: int, modulus_bits: int) -> Layout:
    """Slots wide enough for any masked cell value; as many per ciphertext as fit below a
    third of the plaintext space modulo p (decryption works modulo p, design §4.3)."""
    slot_bits = max(64, item_bits + mask_bits + 2)
    p_bits = modulus_bits // 2 - 2
    fit = p_bits // slot_bits
    if fit < 2:
        raise EncodingOverflowError(f"a masked cell may need {slot_bits} bits; the key's plaintext space "
                                    f"holds {p_bits} (use fewer rows or a larger key)")
    slots = fit - fit % 2 if n_components > 1 else 1
    return Layout(slot_bits, max(1, min(slots, n_components + n_components % 2)), n_components)


# ----------------------------------------------------------------------------------
# Cells and items
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One reported ratio. kind: "group" (a group or "overall"), "pair" (higher group,
    lower group, rank pair or None for pooled), "curve" (group at a reference score) or
    "count" (a group's aggregate in a stratum named by `other`, with no denominator:
    `den_slot` is `NO_DENOMINATOR`, released only as a noised aggregate, never as a
    masked ratio)."""

    kind: str
    group: str
    other: str = ""
    rank_pair: str | None = None
    score: float | None = None
    item: int = 0
    num_slot: int = 0
    den_slot: int = 1
    scale_shift: int = 0  # ratio = num / den · 2^scale_shift (den scale − num scale)
    #: added to the ratio: a metric that encodes its values relative to a declared range
    #: (v − offset, so that |v − offset| and with it the noise is smaller) adds it back
    offset: float = 0.0


@dataclass(frozen=True)
class Item:
    """A masked ciphertext per replicate: weight column × row ciphertext × stratum (None: all)."""

    weight: int
    ciphertext: int
    stratum: int | None = None


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...]
    items: tuple[Item, ...]
    item_slots: int

    def cell_values(self, item_slots: Sequence[Sequence[int]],
                    ratio: Callable[[int, int], float | None], *, plain_rows: int = 0,
                    noise_sd: Sequence[float] = (), pseudo_values: bool = False) -> np.ndarray:
        """(replicates, cells) ratios from the decoded slots of every item, row-major
        (replicate, item). Replicates from `plain_rows` on are masked: `ratio(num, den)`
        (None where a cell has no denominator, then NaN). The first `plain_rows` hold the
        cells' aggregates themselves (noised by the release controls: `noise_sd` holds the
        noise's standard deviation per slot k = item · item_slots + slot, the estimate's
        and then the groups', as `AggregatesHeader.noise_sd` carries them): Num/Den,
        or NaN where Den is not above 3 sd of its noise (0 without noise), so that a
        denominator the noise could have made is never divided by.

        `pseudo_values` (release noise on a metric whose rows are split into G disjoint
        random groups, rows 1..G, that add up to the estimate): each group's value is the
        linearised pseudo-value R + G·(Num_g − R·Den_g)/Σ_g Den_g of the estimate's ratio R,
        instead of the group's own ratio, so that a group's small noised denominator is
        never divided by; their t interval is the random-groups interval of a ratio
        estimator. Both parties' finish (decrypted values at the Test-Client, unpadded
        ones at the Tester) goes through here."""
        n_items = len(self.items)
        replicates = len(item_slots) // n_items
        values = np.full((replicates, len(self.cells)), np.nan)
        half = len(noise_sd) // 2
        for b in range(replicates):
            sd = (noise_sd[:half] if b == 0 else noise_sd[half:]) if half else ()
            for c, cell in enumerate(self.cells):
                slots = item_slots[b * n_items + cell.item]
                if cell.den_slot == NO_DENOMINATOR:  # a count: its noised aggregate, never a ratio
                    if b < plain_rows:
                        values[b, c] = float(slots[cell.num_slot]) * 2.0 ** cell.scale_shift + cell.offset
                    continue
                num, den = slots[cell.num_slot], slots[cell.den_slot]
                if b < plain_rows:
                    floor = 3.0 * sd[cell.item * self.item_slots + cell.den_slot] if sd else 0.0
                    r = float(Fraction(num, den)) if den > floor else None
                else:
                    r = ratio(num, den)
                if r is not None:
                    values[b, c] = r * 2.0 ** cell.scale_shift + cell.offset
        if pseudo_values and replicates > 1 and plain_rows == replicates:
            groups = replicates - 1
            for c, cell in enumerate(self.cells):
                rows = [item_slots[b * n_items + cell.item] for b in range(1, replicates)]
                total = sum(row[cell.den_slot] for row in rows)
                if np.isnan(values[0, c]) or total <= 0:
                    values[1:, c] = np.nan
                    continue
                r = (values[0, c] - cell.offset) / 2.0 ** cell.scale_shift
                values[1:, c] = [(r + groups * (row[cell.num_slot] - r * row[cell.den_slot]) / total)
                                 * 2.0 ** cell.scale_shift + cell.offset for row in rows]
        return values

    def suppress(self, values: np.ndarray, items: Sequence[int]) -> np.ndarray:
        """`values` with every cell of a withheld item NaN in every replicate (the Tester
        sent random values in their place: `tester_service.release`)."""
        withheld = set(items)
        cols = [c for c, cell in enumerate(self.cells) if cell.item in withheld]
        if cols:
            values = values.copy()
            values[:, cols] = np.nan
        return values

    def labels_of(self, items: Sequence[int]) -> list[str]:
        """How a report names the cells of `items` (withheld ones), in the plan's order."""
        chosen = set(items)
        return [self.cell_label(c) for c in self.cells if c.item in chosen]

    def cell_label(self, cell: Cell) -> str:
        """How a report names a cell (release notes, suppression)."""
        if cell.kind == "pair":
            return f"{cell.group}/{cell.other}" + (f" at {cell.rank_pair}" if cell.rank_pair else "")
        if cell.kind == "curve":
            return f"{cell.group} at {cell.score:g}"
        if cell.kind == "count":
            return f"{cell.other}/{cell.group}"
        return cell.group


def composite_items(items: Sequence[Item], weights: Sequence[Any], *, strata: int = 0) -> dict[int, list[int]]:
    """The items the Tester forms from others, item -> its parts (their product under
    encryption, the sum of their values): an item whose weight column is a sum of other
    columns ("overall"), and, for a metric with `strata` kept apart (`strata_cells`), a
    pooled item (stratum None) from its strata's items. They carry no noise of their own
    (post-processing of the noised parts); every other item is noised (design §8)."""
    position = {(it.weight, it.ciphertext, it.stratum): i for i, it in enumerate(items)}
    parts_of: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        col = weights[it.weight]
        if isinstance(col, tuple):
            parts = [position.get((w, it.ciphertext, it.stratum)) for w in col]
            if all(p is not None and not isinstance(weights[items[p].weight], tuple) for p in parts):
                parts_of[i] = parts
        elif strata and it.stratum is None:
            parts = [position.get((it.weight, it.ciphertext, s)) for s in range(strata)]
            if all(p is not None for p in parts):
                parts_of[i] = parts
    return parts_of


def sensitivity_rows(members: np.ndarray, strata: np.ndarray | None = None) -> float:
    """The Tester's count of one member's rows that `Metric.slot_sensitivity` multiplies
    a component's bound by: `members` (rows, n_ids) member codes, `strata` each row's
    stratum for a metric whose cells are kept apart per stratum (else None). Without
    strata, the most rows a member is in (the triangle inequality over its rows); with,
    sqrt(max_i Σ_s n_is²): the member's rows in stratum s move only stratum s's cells,
    so the L2 norm over strata adds up in squares."""
    members = np.asarray(members).reshape(len(members), -1)
    flat = members.ravel().astype(np.int64)
    if strata is None:
        return float(np.bincount(flat).max())
    n_strata = int(np.max(strata)) + 1
    per = np.bincount(flat * n_strata + np.repeat(np.asarray(strata, dtype=np.int64), members.shape[1]))
    by_member = np.bincount(np.arange(len(per)) // n_strata, weights=per.astype(np.float64) ** 2)
    return math.sqrt(float(by_member.max()))


#: a weight column: per-row integers; an int = the same weight for every row; a tuple of
#: column indices = the sum of those columns (the Tester multiplies their aggregates)
WeightColumn = Any


@dataclass(frozen=True)
class Derivation:
    """A weight column that equals, row by row, `total` (a column's index, or with
    `constant` that constant for every row) minus the sum of the columns `minus`. The
    Tester forms its aggregates from theirs, Enc(Σ total·v) · Π Enc(Σ minus·v)^−1,
    instead of one exponentiation per row (design §4.2): the same ciphertexts, for far
    less work. It checks the identity on the values first and aggregates a column whose
    values break it directly (`tester_service.aggregation.verified_derivations`)."""

    minus: tuple[int, ...]
    total: int | None = None
    constant: int = 0


class Metric:
    """Defaults for a single-id ratio metric reported per group and overall."""

    name = ""
    description = ""
    options: tuple[str, ...] = ("default",)
    option_help = ""
    params: tuple[Param, ...] = ()
    numeric_columns: tuple[str, ...] = ()
    text_columns: tuple[str, ...] = ()
    optional_columns: tuple[str, ...] = ()
    unique_ids = True
    n_ids = 1
    needs_he = True
    #: aggregated under encryption when the release carries noise (`RELEASE_NOISE`), and
    #: by the Tester from the joined rows without it (the probabilistic count: its exact
    #: statistic is not linear, its noised one is): see `encrypted`
    he_under_noise = False
    #: "row": the Tester's random buckets; "unit": the Test-Client's units (queries), which
    #: it maps to random buckets itself; "random_groups": the Tester's random partition of
    #: the rows (MQOS-AUC exact); "client_groups": the Test-Client's random groups 0..G−1
    #: and G for rows in no group, which count only in the estimate (MQOS-AUC sampled)
    resampling = "row"
    #: the aggregates are kept apart per stratum (LOT's rank pairs)
    strata_cells = False
    #: "percentile" (bootstrap) or "random_groups" (t interval over random groups)
    interval = "percentile"
    #: see common.stats.verdict: "range", "below_overall", "negative_cells", "nonzero_pairs", "inclusion"
    verdict_rule = "range"
    #: whether the squares round trip is needed (MQOS-AUC exact)
    needs_squares = False
    #: whether rows carry a plaintext stratum (LOT's rank pair, a pool, a score rank)
    uses_strata = False
    #: random groups G (resampling "random_groups")
    random_groups = 0
    #: per-group ratio cells on weight column j for group j, so that the attenuation
    #: correction (`common.stats.correction`) applies: M's items join the plan
    corrects = False
    #: under release noise the interval comes from released second moments
    #: (`common.stats.moments`) instead of random groups: for per-group ratio cells (f, d) whose
    #: pair items' sums are the second moments, either because the components are 0/1
    #: with f ≤ d (f² = f, f·d = f, d² = d: ERO), or because d = 1 and the rows carry f²
    #: as one more component (`moment_squares`: the output metric); or for cells that
    #: are no ratio of sums over rows, whose covariance the metric reads off its pair
    #: items itself (`common.stats.correction.CorrectionPlan.covariance`: MQOS-AUC exact)
    moment_interval = False
    #: under the second-moments release the rows carry the square f² of the numerator's
    #: component as a last component (`moment_components`), released in the pair items
    #: and at the second moments' noise only (`tester_service.release`)
    moment_squares = False
    #: the keys of the dataset facts (`ClientRows.info`) that the Test-Client states about
    #: its whole table for the interval under release noise alone (a spread, cross-moments,
    #: placement variances): sent only when the Hello says the interval comes from second
    #: moments (`SECOND_MOMENTS`), required then and refused otherwise
    #: (`common.protocol.validation`), since nothing else reads them
    stated_facts: tuple[str, ...] = ()
    #: the range every per-group value lies in (rates: (0, 1)), a constraint of the
    #: corrected estimator's solve (`common.stats.correction.bounded_solve`); None: unbounded
    estimate_range: tuple[float, float] | None = None

    def encrypted(self, params: dict[str, Any]) -> bool:
        """Whether this audit's rows carry encrypted values that the Tester aggregates
        (steps 5-7), or only ids (and strata) from which it computes the result itself
        (`local_result`): `needs_he`, or with `he_under_noise` whether the release
        carries noise (`RELEASE_NOISE` in the parsed parameters)."""
        return self.needs_he or (self.he_under_noise and bool(params.get(RELEASE_NOISE)))

    def withheld_by_size(self, plan: "Plan", row: Sequence[Sequence[int]], min_size: float,
                         params: dict[str, Any]) -> list[int]:
        """The items the finishing party withholds because their noised size (in `row`, the
        released estimate's decoded items) is below the controls' `min_size`, where the
        Tester knew no size to decide on (`tester_blind`). Default: none (the Tester decided)."""
        return []

    def member_rows_cap(self, params: dict[str, Any]) -> int | None:
        """The most rows of the Test-Client's table one member may be in, declared by the
        Tester's audit spec (a parameter, like the value bounds: design §8.3), from which
        the release noise and the suppression noise are sized (m, and for cells kept apart
        per stratum the L2 count too: a member's c rows can all fall in one stratum), never
        from what the Test-Client states nor from its data. The Test-Client keeps its rows
        within it; where the Tester sees the rows it counts them and refuses a member above
        it (`ProtocolError`); where it does not (`tester_blind`) a Test-Client above it is
        out of model, as one beyond its value bounds is (docs/threat-model.md). None: no
        cap, the Tester sizes the noise from its own count over all the Test-Client's rows
        (`sensitivity_rows`). Default: 1 for a metric whose member ids are unique per row."""
        return 1 if self.unique_ids and self.n_ids == 1 else None

    #: how a refusal names the cap of `member_rows_cap` (its parameter, or the rule)
    member_rows_cap_name = "one row per member"

    def tester_blind(self, params: dict[str, Any]) -> bool:
        """Whether this audit aggregates without the Tester seeing any row (LOT under the
        release controls: `common.metrics.lot`, "The Tester blind to the pairs")."""
        return False

    def row_strata(self, params: dict[str, Any]) -> bool:
        """Whether this audit's rows carry a plaintext stratum (`uses_strata`), which
        the Tester reads: never for a metric whose strata go into the encrypted values
        (`he_under_noise`, encrypted)."""
        return self.uses_strata and not (self.he_under_noise and self.encrypted(params))

    def cell_report(self, plan: "Plan", values: np.ndarray, *, option: str, params: dict[str, Any],
                    info: dict[str, Any], confidence: float, tau: float, min_size: float):
        """The result of a metric whose cells are counts (`NO_DENOMINATOR`), from their
        noised values (row 0; NaN where withheld), or None: the cells are ratios and
        `common.stats.results.finish` reports them (the default)."""
        return None

    def for_option(self, option: str) -> "Metric":
        """The metric as the option makes it (MQOS-AUC's option picks its algorithm)."""
        return self

    def for_release(self, params: dict[str, Any]) -> "Metric":
        """The metric as the release makes it, once both parties know whether the release
        carries noise (`SECOND_MOMENTS`, `RELEASE_NOISE` in the parsed parameters):
        MQOS-AUC exact carries its score order inside the ciphertexts under the release
        controls (design §5.6). Default: itself."""
        return self

    def column_ciphertexts(self, k: int, n_weights: int, layout: "Layout") -> dict[int, tuple[int, ...]]:
        """Of the `n_weights` weight columns for `k` groups, those aggregated over some of a
        row's ciphertexts only (column ->
        those ciphertexts); every other column is aggregated over all of them. A column's
        sum over a ciphertext it skips is Enc(0) (1), never read. Default: none."""
        return {}

    # ------------------------------------------------------------- parameters
    def parse_params(self, given: dict[str, str]) -> dict[str, Any]:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            names = ", ".join(known) or "none"
            raise InputError(f"'{unknown[0]}' is not a parameter of {self.name} (known: {names})",
                             parameter="metric parameter")
        return {name: p.value(given.get(name)) for name, p in known.items()}

    def check_option(self, option: str) -> str:
        option = option or self.options[0]
        if option not in self.options:
            raise InputError(f"'{option}' is not an option of {self.name} ({', '.join(self.options)})",
                             parameter="metric option")
        return option

    # ------------------------------------------------------------- the Test-Client
    def read(self, path: str, columns: dict[str, str] | None = None) -> pd.DataFrame:
        """The dataset's columns; `columns`: the column mapping (`common.tables`)."""
        from common.tables import read_table
        return read_table(path, self.numeric_columns, text=self.text_columns, optional=self.optional_columns,
                          unique_ids=self.unique_ids, columns=columns)

    def client_rows(self, frame: pd.DataFrame, file: str, option: str, params: dict[str, Any],
                    rng: np.random.Generator) -> ClientRows:
        raise NotImplementedError

    def components(self, option: str, params: dict[str, Any], info: dict[str, Any]) -> tuple[Component, ...]:
        raise NotImplementedError

    def check_info(self, info: dict[str, Any], strata_labels: Sequence[str]) -> None:
        """The Tester's check of the dataset facts the Test-Client announced (raise ValueError)."""

    # ------------------------------------------------------------- declared bounds
    def value_bounds(self, option: str, params: dict[str, Any]) -> dict[str, float]:
        """The declared bounds on what one row can carry, from the operator's parameters
        and the metric alone (never from data): what the components' bounds, and so the
        release noise, are sized from. Both parties derive them and exchange them in the
        handshake (`Hello.value_bounds`, `HelloAck.value_bounds`), each refusing a peer
        whose bounds differ from its own. Default: none (the metric's values are bounded
        by construction)."""
        return {}

    def sensitivity_components(self, option: str, params: dict[str, Any], info: dict[str, Any]) -> float:
        """β = the most Σ_c (v_c / bound_c)² any one row can reach over the estimate's
        components: the release of C components with noise σ·bound_c per slot is
        β/σ²-zCDP (`tester_service.release`), so the noise multiplier is sized for β
        components. Default C (every component at its bound at once; the second
        moments' own components, `moment_components`, are not the estimate's); a metric
        whose components cannot all be at their bounds in one row (POT's kernels at
        distant reference scores) proves a smaller β."""
        comps = self.components(option, params, info)
        return float(len(comps) - self.moment_components(option, params))

    def moment_shape(self, option: str, params: dict[str, Any], info: dict[str, Any],
                     layout: Layout) -> dict[str, Any]:
        """`common.stats.correction.extend`'s keywords for this metric's pair items: the
        denominator component's fixed-point scale (`unit`), the width of the values'
        range (`span`, for the noise threshold) and, with `moment_components`, where the
        rows' f² sits (`square`: ciphertext, slot)."""
        comps = self.components(option, params, info)
        shape: dict[str, Any] = {"unit": float(1 << comps[1].scale_bits)}
        declared = self.value_range(option, params)
        if declared is not None:
            shape["span"] = float(declared[1] - declared[0])
        squares = self.moment_components(option, params)
        if squares:
            shape["square"] = layout.position(len(comps) - squares)
        return shape

    def moment_plan(self, plan: Plan, groups: Sequence[str], option: str, params: dict[str, Any],
                    info: dict[str, Any], layout: Layout):
        """`plan` with the second moments' items appended, and where they are (a
        `common.stats.correction.CorrectionPlan`; both parties derive it). Default: one item per
        pair of groups a ≤ b on the pair weights q_a·q_b (`common.stats.correction.extend`),
        which are also the correction's M."""
        from common.stats import correction
        return correction.extend(plan, groups, **self.moment_shape(option, params, info, layout))

    def moment_weights(self, q: Sequence[np.ndarray], groups: Sequence[str], option: str,
                       params: dict[str, Any]) -> list[WeightColumn]:
        """The weight columns of `moment_plan`'s items, after `weights`' columns (the
        Tester's): by default ``round(q_a·q_b / 2^32)`` per pair a ≤ b."""
        from common.stats import correction
        return correction.pair_weights(q[0])

    def moment_components(self, option: str, params: dict[str, Any]) -> int:
        """How many of the last components exist for the second moments alone (the
        squares of `moment_squares`, present when the release gives its interval from
        second moments: `SECOND_MOMENTS` in the parameters)."""
        return 1 if self.moment_squares and params.get(SECOND_MOMENTS) else 0

    def value_range(self, option: str, params: dict[str, Any]) -> tuple[float, float] | None:
        """The range of one row's value, which every group's (or curve point's) estimate
        lies in, and a pair cell (a difference of two values) in [lo − hi, hi − lo]: for
        post-processing noised values into it (`common.stats.intervals.value_range`). None:
        none declared."""
        return None

    # ------------------------------------------------------------- sizes
    def weight_bits(self, n_rows: int) -> int:
        return PROBABILITY_BITS * self.n_ids

    def item_bits(self, n_rows: int, n_units: int, components: Sequence[Component]) -> int:
        """Bits of the largest unmasked cell value any replicate can reach."""
        value = max(bits(c.bound) for c in components)
        return bits(n_rows * n_units) + self.weight_bits(n_rows) + value + NOISE_HEADROOM_BITS

    def layout(self, option: str, params: dict[str, Any], info: dict[str, Any], *, n_rows: int, n_units: int,
               recipient: str, modulus_bits: int) -> Layout:
        """The slot plan both parties derive (design §4.4): from the metric, the Test-Client's row
        count, the resampling units, the mask the result recipient implies and the key."""
        from common.crypto.masking import mask_bits
        comps = self.components(option, params, info)
        return choose_layout(self.item_bits(n_rows, n_units, comps), mask_bits(recipient), len(comps), modulus_bits)

    # ------------------------------------------------------------- the Tester
    def weights(self, q: Sequence[np.ndarray], strata: np.ndarray | None, units: np.ndarray,
                groups: Sequence[str], option: str, params: dict[str, Any]) -> list[WeightColumn]:
        """Per-row integer weights, one column per weight kind; `q` holds each id slot's
        quantised probabilities (n, k), `units` each row's resampling unit. Default: one
        column per group (q_ij), then "overall" as the sum of them (Σ_j q_ij = 2^32)."""
        (q1,) = q
        k = len(groups)
        return [q1[:, j] for j in range(k)] + [tuple(range(k))]

    def weight_derivations(self, k: int) -> dict[int, Derivation]:
        """The columns of `weights` the Tester may form from others (`Derivation`): by
        default the last group's, q_k−1 = 2^32 − Σ_{j<k−1} q_j (a row's quantised
        probabilities sum to 2^32, design §4.2). A metric with weights of its own gets
        none unless it declares its own (every column exponentiated)."""
        if type(self).weights is not Metric.weights or k < 2:
            return {}
        return {k - 1: Derivation(tuple(range(k - 1)), constant=1 << PROBABILITY_BITS)}

    def moment_derivations(self, k: int, first: int) -> dict[int, Derivation]:
        """The columns of `moment_weights` (from `first` on among all the weights) the
        Tester may form from others: the pairs with the last group
        (`common.stats.correction.pair_derivations`), from the groups' columns of
        `weights` at 0..k−1: none for a metric with weights or second moments of its own."""
        from common.stats import correction
        if type(self).weights is not Metric.weights or type(self).moment_weights is not Metric.moment_weights:
            return {}
        return {c: Derivation(minus, total=total) for c, (total, minus) in
                correction.pair_derivations(k, first).items()}

    def size_weight(self, item: Item) -> int:
        """The weight column whose sum over an item's rows is its cells' effective size."""
        return item.weight

    def slot_sensitivity(self, item: Item, layout: Layout, components: Sequence[Component],
                         multiplicity: int) -> list[int]:
        """Per slot of an item of a race-dependent weight column: the most one member's
        probability vector can move it, in the slot's fixed-point units, per unit of
        ||Δp||₂ (`tester_service.release`): the component's bound times the weight scale
        (a probability, or a product of two, at 2^32 each) times `multiplicity`, the rows
        one member may be in: the cap of `member_rows_cap`, or without one the Tester's
        count (for metrics whose cells are kept apart per stratum, the L2 count
        sqrt(max_i Σ_s n_is²): a member's rows in different strata move different
        cells; `sensitivity_rows`). The component's bound is the metric's
        declared bound (`value_bounds`) in fixed point. Slots past the last component are 0."""
        weight_scale = 1 << (PROBABILITY_BITS * self.n_ids)
        out = []
        for s in range(layout.slots):
            c = item.ciphertext * layout.slots + s
            out.append(math.ceil(components[c].bound * weight_scale * multiplicity) if c < len(components) else 0)
        return out

    def tester_facts(self, q: Sequence[np.ndarray], strata: np.ndarray | None, units: np.ndarray,
                     row_bound: int | None = None) -> Any:
        """Plaintext facts of the Tester's own weights a metric needs later (MQOS-AUC: S_j).
        `row_bound`: the rows of the Test-Client's table, a bound on the joined rows that
        says nothing of who joined (what the Test-Client receives is sized from it)."""
        return None

    def local_result(self, probabilities, strata, strata_labels, groups, option, params, info, *,
                     confidence: float, tau: float):
        """The result of a metric without HE, computed by the Tester from the joined rows."""
        raise NotImplementedError

    def plan(self, groups: Sequence[str], strata_labels: Sequence[str], layout: Layout, option: str,
             params: dict[str, Any], info: dict[str, Any]) -> Plan:
        """Default: cells per group and overall from one (numerator, denominator) pair of
        components, 0 and 1."""
        comps = self.components(option, params, info)
        ct, num_slot = layout.position(0)
        _, den_slot = layout.position(1)
        shift = comps[1].scale_bits - comps[0].scale_bits
        names = list(groups) + ["overall"]
        items = tuple(Item(w, ct) for w in range(len(names)))
        cells = tuple(Cell("group", g, item=w, num_slot=num_slot, den_slot=den_slot, scale_shift=shift)
                      for w, g in enumerate(names))
        return Plan(cells, items, layout.slots)

    def derived(self, cells: Sequence[Cell], values: np.ndarray,
                params: dict[str, Any], info: dict[str, Any]) -> tuple[list[Cell], np.ndarray]:
        """Further reported quantities computed from the cells' values per replicate (POT's DTI)."""
        return [], np.empty((values.shape[0], 0))


def finite_column(frame: pd.DataFrame, column: str, file: str, *, limit: float | None = None) -> np.ndarray:
    """A numeric column whose values are finite (and |v| <= limit): InputError naming the row."""
    from common.tables import first_row
    values = frame[column].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise InputError("must be a finite number", file=file, column=column, row=first_row(bad))
    if limit is not None:
        big = np.abs(values) > limit
        if big.any():
            raise InputError(f"magnitude above the supported {limit:g}", file=file, column=column,
                             row=first_row(big))
    return values
