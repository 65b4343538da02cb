"""Step 6 of the Tester's session as values (design §3.6, release controls §8).

From the joined rows, opened, to what is sent: the weights and the plan's items, the
small cells withheld, the bucket sums, the items formed directly and from others, their
noise, the replicates (or random groups), the budget charged and the masked table, with
what the report and the header say about the release. Each step is a function of
explicit inputs that returns a value; none of them sees the session
(`tester_service.protocol.TesterSession`), which calls them in order and keeps what
they return:

* `audit_plan`: the metric's plan, built once (with M's items for the correction or a
  release of second moments, `Metric.moment_plan`);
* `sum_buckets`: from the opened rows (`order_rows`) to the bucket sums (`BucketSums`),
  through the resampling units, the weights (`weigh`) and the suppression of small
  cells (`suppress_small`);
* `release`: from the bucket sums to the masked items (`ReleasedItems`), through the
  direct items, their noise, the replicates and the masks (`mask_items`); MQOS-AUC exact
  goes through the Test-Client's squares first (`square_requests`, `release_squares`);
  LOT's blind path enters at `release` with the items it formed from masked totals.

The per-row and per-replicate work runs on the executor (`Work`), as chunk functions
of `tester_service.aggregation`.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping

import gmpy2
import numpy as np

from common.crypto import encoding, paillier
from common.crypto.masking import AdditiveMask, RatioMask
from common.execution import parallel
from common.metrics.base import Layout, composite_items
from common.protocol.session import PhaseClock, chunk_ticks
from common.stats import correction, moments
from common.stats.left_out import MIN_EFFECTIVE_SIZE, small_for_verdict
from proto import ppre_pb2 as pb
from tester_service import aggregation
from tester_service.audit_spec import AuditSpec
from tester_service.release import RELEASE_GROUPS, REPORT_DELTA, ReleasePolicy, gaussian, gaussian_slots, rho_to_epsilon


# ------------------------------------------------------------------ what step 6 reads
@dataclass(frozen=True)
class ReleaseForm:
    """How the estimate and its interval are released (design §8.4): `interval`, the
    report's method; `moments`, a release of second moments (`common.stats.moments`);
    `replicates`, B (bootstrap replicates, or parametric draws), the number of random
    groups where the interval comes from random groups, 0 for an exact interval;
    `groups_instead`, a bootstrap metric's interval from disjoint random groups under
    release noise."""

    interval: str
    moments: bool
    replicates: int
    groups_instead: bool

    @property
    def estimate_only(self) -> bool:
        """The estimate released alone: second moments, or an exact interval."""
        return self.moments or self.interval == "exact"

    @property
    def released_rows(self) -> int:
        """Rows of items in the AGGREGATES table: the estimate alone, else the estimate
        and every replicate."""
        return 1 if self.estimate_only else self.replicates + 1

    @property
    def header_interval(self) -> str:
        """The header's interval: `common.stats.moments.FORM` for a release of second
        moments (one row of aggregates; the finishing party draws the replicates), else
        the report's method."""
        return moments.FORM if self.moments else self.interval


def release_form(metric, release: ReleasePolicy, bootstrap: int) -> ReleaseForm:
    """Design §8.4: with release noise a bootstrap's replicates would reuse every member,
    so noise that keeps each of them private would swamp their spread
    (`tester_service.release`): a metric with second moments (`Metric.moment_interval`)
    gets percentile intervals of parametric draws from its released aggregates and
    second moments, any other bootstrap metric random groups."""
    with_moments = release.noisy and metric.moment_interval
    if with_moments:
        interval = "percentile"
    elif metric.interval == "percentile" and release.noisy:
        interval = "random_groups"
    else:
        interval = metric.interval
    if interval == "exact":  # the estimate alone (the probabilistic count)
        replicates = 0
    elif interval != "random_groups":
        replicates = bootstrap
    else:
        replicates = metric.random_groups or RELEASE_GROUPS
    return ReleaseForm(interval, with_moments, replicates,
                       groups_instead=interval == "random_groups" and metric.interval == "percentile")


@dataclass(frozen=True)
class Draws:
    """The release's random draws (design §8.3, `tester_service.release`): one Gaussian
    value of sd σ, and Gaussian values of given sds packed into slots."""

    gaussian: Callable[[float], float] = gaussian
    gaussian_slots: Callable[[list, int], int] = gaussian_slots


@dataclass(frozen=True)
class Audit:
    """What step 6 reads of the audit: the operator's spec (`tester_service.audit_spec`),
    the metric for its option and release with its parameters, the groups, what the
    HelloAck announced (strata, dataset facts, the Test-Client's key and slot layout),
    the release controls and form, and the rows per member that size the noise
    (`multiplicity`: the most rows a member may be in, the metric's cap or without one the
    Tester's count, `Metric.member_rows_cap`; `sensitivity_rows`: the row count the
    slots' noise is sized by); `draws`, where the noise comes from."""

    spec: AuditSpec
    metric: Any
    params: Mapping[str, Any]
    groups: tuple[str, ...]
    strata_labels: tuple[str, ...]
    info: Mapping[str, Any]
    layout: Layout
    pub: paillier.PublicKey
    release: ReleasePolicy
    form: ReleaseForm
    multiplicity: int = 1
    sensitivity_rows: float = 1.0
    client_rows: int = 0
    #: the resampling buckets the Hello announced
    n_buckets: int = 0
    draws: Draws = Draws()

    @property
    def option(self) -> str:
        return self.spec.metric_option

    @property
    def with_moments(self) -> bool:
        """Whether the plan carries M's items (the correction, or a release of second moments)."""
        return self.spec.correction != "none" or self.form.moments

    @property
    def n_strata(self) -> int:
        """Design §3.6: the strata kept apart in the buckets: all of them for a metric
        with `strata_cells`, else one."""
        return len(self.strata_labels) if self.metric.strata_cells else 1


@dataclass(frozen=True)
class Work:
    """Where step 6's per-row work runs and what it reports: the executor
    (`common.execution.parallel`), the session's clock, its owner's progress callback
    (`progress(phase, message, done, total)`) and checkpoint."""

    executor: parallel.Executor
    clock: PhaseClock
    progress: Callable[..., None]
    checkpoint: Callable[[], None] | None = None

    def tick(self, phase: str, done: int, total: int) -> None:
        self.progress(phase, "", done, total)
        if self.checkpoint is not None:
            self.checkpoint()

    def ticks(self, phase: str, total: int) -> Callable[[], None]:
        return chunk_ticks(total, partial(self.tick, phase))


@dataclass(frozen=True)
class AuditPlan:
    """The metric's plan of items and cells (`common.metrics.base.Plan`) and, where the
    plan carries M's items, its correction plan (`common.stats.correction.CorrectionPlan`)."""

    plan: Any
    correction: correction.CorrectionPlan | None = None

    @property
    def first_moment_item(self) -> int:
        """Where M's items begin among the plan's (after every item without them)."""
        return self.correction.first_item if self.correction is not None else len(self.plan.items)


def audit_plan(audit: Audit) -> AuditPlan:
    """The metric's plan of items and cells (design §3.6), with, for the correction or a
    release of second moments, M's items (`Metric.moment_plan`)."""
    metric = audit.metric
    plan = metric.plan(audit.groups, audit.strata_labels, audit.layout, audit.option, audit.params, audit.info)
    if not audit.with_moments:
        return AuditPlan(plan)
    return AuditPlan(*metric.moment_plan(plan, audit.groups, audit.option, audit.params, audit.info, audit.layout))


# ------------------------------------------------------------------ from the rows to the bucket sums
@dataclass(frozen=True)
class OpenedRows:
    """The joined rows, opened (design §3.6): per id slot the quantised probability
    vectors, units and strata, in our canonical order (`canonical`: each row's place as
    it arrived); the rows' ciphertexts packed in their order of arrival."""

    q: list[np.ndarray]
    units: np.ndarray | None
    strata: np.ndarray | None
    canonical: np.ndarray
    ciphertexts: bytes

    @property
    def n(self) -> int:
        return len(self.canonical)


def order_rows(probs: list[np.ndarray], units: np.ndarray | None, strata: np.ndarray | None,
               ciphertexts: bytes) -> OpenedRows:
    """Design §3.6: quantise the opened probabilities and put rows, units and strata in
    our canonical order. The Test-Client sends its rows in a random order; an order of
    our own (by probability vectors) lets --seed fix the buckets and the resampling
    (rows with identical vectors keep their random order among themselves)."""
    q = [encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS) for p in probs]
    canonical = aggregation.canonical_order(q)
    return OpenedRows([qs[canonical] for qs in q], units[canonical] if units is not None else None,
                      strata[canonical] if strata is not None else None, canonical, ciphertexts)


@dataclass(frozen=True)
class Weights:
    """The metric's facts and weight columns (with M's, `Metric.moment_weights`), the
    columns formed from others (`Metric.weight_derivations`), the groups left out of the
    verdict by their exact Kish size (without release noise), and the groups whose
    corrected values are withheld (`unidentifiable_groups`)."""

    facts: Any
    columns: list
    derivations: dict
    small_groups: list[str] = field(default_factory=list)
    unidentifiable: list[str] = field(default_factory=list)


def weigh(audit: Audit, plan, q: list[np.ndarray], strata: np.ndarray | None,
          units: np.ndarray | None) -> Weights:
    """Design §3.6, §8.4: the groups left out of the verdict, the metric's facts and
    weight columns, and, where the plan has M's items, their weights."""
    metric, groups = audit.metric, audit.groups
    # groups left out of the verdict (common.stats.results, "Left out"): without release noise
    # by their exact Kish size among the joined rows (first member of a row); with it
    # by the noised sizes only (`suppress_small`), never by exact ones
    small = [] if audit.release.noisy else small_for_verdict(
        q[0], groups, metric.name, float(1 << encoding.PROBABILITY_BITS))
    facts = metric.tester_facts(q, strata, units, row_bound=audit.client_rows)
    weights = metric.weights(q, strata, units, groups, audit.option, audit.params)
    derivations = metric.weight_derivations(len(groups))
    unidentifiable: list[str] = []
    if audit.with_moments:
        # M's items, which are also the second moments of the interval (`common.stats.moments`)
        derivations.update(metric.moment_derivations(len(groups), len(weights)))
        weights = list(weights) + metric.moment_weights(q, groups, audit.option, audit.params)
        assert max(item.weight for item in plan.items) < len(weights)
        if audit.spec.correction != "none" and not audit.release.noisy:
            unidentifiable = unidentifiable_groups(q[0], groups)  # with noise: on the released M
    return Weights(facts, weights, derivations, small, unidentifiable)


def unidentifiable_groups(q: np.ndarray, groups: tuple[str, ...]) -> list[str]:
    """Without release noise: the groups whose identifying size (`common.stats.correction`),
    measured on our own probabilities over the joined rows, is below the minimum:
    their corrected values are withheld. With noise nothing of the sort is released:
    both parties decide it on the released, noised M (`correction.finish_corrected`),
    since an identifying size's sensitivity to one member has no useful bound (an
    ill-conditioned M amplifies one row)."""
    p = q / float(1 << encoding.PROBABILITY_BITS)
    sizes = correction.identifying_sizes(correction.plain_matrix(p))
    return [g for g, size in zip(groups, sizes) if not size >= correction.MIN_IDENTIFYING_SIZE]


@dataclass(frozen=True)
class Suppression:
    """The items withheld for their small effective size, the groups left out of the
    verdict, and what the report says of them (`info`: the effective sizes decided on,
    and the withheld cells' labels)."""

    items: list[int] = field(default_factory=list)
    small_groups: list[str] = field(default_factory=list)
    info: Mapping[str, Any] = field(default_factory=dict)


def suppress_small(audit: Audit, plans: AuditPlan, weights: list, strata: np.ndarray | None,
                   n: int, small_groups: list[str]) -> Suppression:
    """Design §8.4: the items (and so cells) whose effective size, Σ of the size weight
    over the rows that enter them, is below the policy's minimum: with release noise,
    the size plus Gaussian noise (an exact comparison would be an oracle); without, the
    exact size, and a size of 0 whatever the policy (the mask cannot show a zero)."""
    metric, release, plan = audit.metric, audit.release, plans.plan
    scale = float(1 << (encoding.PROBABILITY_BITS * metric.n_ids))
    sizes: dict[tuple[int, int | None], float] = {}

    def size(w: int, stratum: int | None) -> float:
        if (w, stratum) not in sizes:
            col = weights[w]
            if isinstance(col, tuple):
                sizes[(w, stratum)] = sum(size(x, stratum) for x in col)
            else:
                rows = (strata == stratum) if (stratum is not None and strata is not None
                                               and metric.strata_cells) else slice(None)
                if isinstance(col, int):
                    count = int(np.count_nonzero(rows)) if not isinstance(rows, slice) else n
                    sizes[(w, stratum)] = col * count / scale
                else:
                    sizes[(w, stratum)] = float(aggregation.exact_sum(np.asarray(col)[rows])) / scale
        return sizes[(w, stratum)]

    minimum = release.min_effective_size
    # M's items (the correction) are not cells: a small entry of M is no cell to
    # withhold, and the noise below covers them
    keys = [(metric.size_weight(item), item.stratum) for item in plan.items[:plans.first_moment_item]]
    if release.noisy:  # decided on noisy sizes (one draw per weight and stratum)
        sigma = release.threshold_sigma() * audit.multiplicity
        measured = {key: size(*key) + audit.draws.gaussian(sigma) for key in set(keys)}
        suppressed = [i for i, key in enumerate(keys) if not measured[key] >= minimum]
    else:
        measured = {key: size(*key) for key in set(keys)}
        suppressed = [i for i, key in enumerate(keys) if not (measured[key] >= minimum and measured[key] > 0)]
    # the groups' effective sizes as decided on (noised under the controls: releasing
    # the same draws costs nothing more), for the report; cut, not rounded, to 0.1, so
    # that a size shown as 30.0 was never one decided as below 30
    effective = {cell.group: math.floor(float(measured[keys[cell.item]]) * 10.0) / 10.0 for cell in plan.cells
                 if cell.kind in ("group", "curve") and cell.group in audit.groups
                 and plan.items[cell.item].stratum is None}
    info: dict[str, Any] = {"effective_sizes": effective}
    small = small_groups
    if release.noisy:  # left out of the verdict on the same noised sizes (common.stats.results)
        small = sorted({g for g, v in effective.items() if not v >= MIN_EFFECTIVE_SIZE})
    if suppressed:
        hidden = set(suppressed)
        info["suppressed"] = plan.labels_of(suppressed)
        groups = {c.group for c in plan.cells if c.item in hidden and c.kind == "group" and c.group in audit.groups}
        small = sorted(set(small) | groups)
    return Suppression(suppressed, small, info)


def bucket_sums(audit: Audit, work: Work, weights: Weights, units: np.ndarray, strata: np.ndarray | None,
                canonical: np.ndarray, ciphertexts: bytes) -> dict[int, list[list[int]]]:
    """Design §3.6: agg[key][w][t], Enc(Σ w·v) per (unit, stratum) bucket, weight
    column and row ciphertext, summed by the executor (`aggregation.bucket_sums_packed`).
    `ciphertexts`: the joined rows' as they arrived (packed); a bucket's rows are picked
    by their place in that order (`canonical`), so the table is never copied whole."""
    metric, pub, executor = audit.metric, audit.pub, work.executor
    columns = weights.columns
    n = len(canonical)
    n_cts = audit.layout.n_ciphertexts
    groups_idx, keys = aggregation.bucket_rows(units, strata, audit.n_strata, metric.strata_cells)
    n_parts = executor.chunk_count(parallel.CHECKPOINT_CHUNKS)
    # a bucket larger than a part's share of the rows is summed in pieces on every worker
    pieces, owner = aggregation.split_buckets(groups_idx, -(-n // n_parts))
    # columns formed from others' sums (`Metric.weight_derivations`), where the values bear it out
    derived = aggregation.verified_derivations(columns, weights.derivations)
    explicit, _ = aggregation.weight_kinds(columns, derived)
    need_ones = aggregation.needs_ones(columns, derived)
    only = metric.column_ciphertexts(len(audit.groups), len(columns), audit.layout)
    per_ct = aggregation.columns_per_ciphertext(explicit, only, n_cts)
    width = pub.ciphertext_bytes
    cts = np.frombuffer(ciphertexts, dtype=f"V{width}").reshape(n, n_cts)
    columns_of = [np.asarray(columns[w]) for w in explicit]

    def task(part) -> tuple:
        jobs = []
        for idx in part:
            picked = [col[idx] for col in columns_of]  # arrays: made lists by the worker
            ones = [np.ones(len(idx), dtype=np.int64)] if need_ones else []
            rows = canonical[idx]
            jobs += [(cts[rows, t].tobytes(), [picked[e] for e in per_ct[t]] + ones) for t in range(n_cts)]
        return pub.n, width, jobs

    parts = parallel.split(pieces, n_parts)
    # built as the workers take them: a few tasks' copies of the rows at a time
    sums = [s for part in executor.stream(aggregation.bucket_sums_packed, (task(p) for p in parts),
                                          checkpoint=work.ticks("aggregation", len(parts))) for s in part]
    del cts, columns_of
    sums = aggregation.merge_piece_sums(sums, owner, len(groups_idx), n_cts, pub.n2)
    agg = aggregation.combine_bucket_sums(sums, keys, columns, pub.n, pub.n2, n_cts, derived, per_ct)
    work.clock.lap("aggregation")
    work.progress("aggregation", f"aggregated {n} rows into {len(keys)} buckets x {len(columns)} weights")
    return agg


@dataclass(frozen=True)
class BucketSums:
    """Step 6 up to the bucket sums: agg[key][w][t] (`bucket_sums`), the units' number,
    the weights, and the small cells withheld."""

    agg: dict
    n_units: int
    weights: Weights
    suppression: Suppression


def sum_buckets(audit: Audit, work: Work, plans: AuditPlan, rows: OpenedRows,
                rng: np.random.Generator) -> BucketSums:
    """Design §3.6, §4.8, §8.4: every row's resampling unit (`aggregation.resampling_units`),
    the weights and the plan's sizes (`weigh`, `suppress_small`), then the bucket sums."""
    metric = audit.metric
    units, n_units = aggregation.resampling_units(
        metric.resampling, rows.units, rows.n, rng, estimate_only=audit.form.estimate_only,
        groups_instead=audit.form.groups_instead, random_groups=metric.random_groups,
        n_buckets=audit.n_buckets)
    weights = weigh(audit, plans.plan, rows.q, rows.strata, units)
    suppression = suppress_small(audit, plans, weights.columns, rows.strata, rows.n, weights.small_groups)
    work.clock.lap("open_probabilities")
    agg = bucket_sums(audit, work, weights, units, rows.strata, rows.canonical, rows.ciphertexts)
    return BucketSums(agg, n_units, weights, suppression)


# ------------------------------------------------------------------ from the bucket sums to the items
def count_rows(audit: Audit, n_units: int, rng: np.random.Generator) -> list[list[int]]:
    """Design §4.8, §8.4: each released row's count of every unit (`aggregation.count_rows`)."""
    groups = audit.metric.resampling == "client_groups" or audit.form.groups_instead
    return aggregation.count_rows(n_units, audit.form.replicates if groups else 0, audit.spec.bootstrap, rng,
                                  estimate_only=audit.form.estimate_only, groups=groups)


def direct_items(audit: Audit, plan, agg: dict, weights: list, n_units: int) -> tuple[dict, list[int], list[list[int]]]:
    """Design §3.6: the items formed from others (item -> its parts), the direct items,
    and each direct item's ciphertext per unit (`aggregation.direct_columns`). An item
    whose weight is a sum of other columns (e.g. "overall") is, in every replicate, the
    product of those columns' items: no multi-exponentiation of its own."""
    metric, n_strata = audit.metric, audit.n_strata
    plan_items = list(plan.items)
    parts_of = composite_items(plan_items, weights, strata=n_strata if metric.strata_cells else 0)
    direct = [i for i in range(len(plan_items)) if i not in parts_of]
    columns = aggregation.direct_columns(plan_items, direct, agg, n_units, n_strata, metric.strata_cells,
                                         audit.pub.n2)
    return parts_of, direct, columns


@dataclass(frozen=True)
class ItemNoise:
    """Design §8.3, §8.4: σ₀ (the estimate's), σ_b (each random group's), σ per item
    (σ_m for the second moments' items), each direct item's slot scales, and the
    sensitivity's components β."""

    sigma0: float
    sigma_b: float
    item_sigma: list[float]
    scales: list
    beta: float


def slot_scales(audit: Audit, item, weights: list, components) -> list[int]:
    """Per slot of `item`: its sensitivity to one member (0 for weights that do not
    depend on the members' race: constants, and "overall" as the sum of all groups)."""
    if isinstance(weights[item.weight], (int, tuple)):
        return [0] * audit.layout.slots
    return audit.metric.slot_sensitivity(item, audit.layout, components, audit.sensitivity_rows)


def square_scales(layout: Layout, item, scales: list, first_square: int, factor: float) -> list:
    """`scales` of a group item with the slots of the squared components (those from
    `first_square` on, `Metric.moment_squares`) times `factor` = σ_m/σ₀: they are
    released at the second moments' noise (`ReleasePolicy.moment_sigmas`)."""
    out = list(scales)
    for c in range(first_square, layout.n_components):
        ct, slot = layout.position(c)
        if ct == item.ciphertext:
            out[slot] = out[slot] * factor
    return out


def item_noise(audit: Audit, plans: AuditPlan, direct: list[int], weights: list) -> ItemNoise:
    """Design §8.3, §8.4. Release noise: the estimate is the sum of the noiseless units
    plus its own noise (σ₀); every replicate is formed from units that each carry noise
    (σ_b): with noise, the units are disjoint random groups and each replicate is one of them."""
    metric, release, option, params = audit.metric, audit.release, audit.option, audit.params
    plan_items, first_moment_item = list(plans.plan.items), plans.first_moment_item
    comps = metric.components(option, params, audit.info)
    beta = metric.sensitivity_components(option, params, audit.info)
    squares = metric.moment_components(option, params)
    if audit.form.moments:  # σ₀ on the group items, σ_m on the pair items (`ReleasePolicy.moment_sigmas`)
        sigma0, sigma_m = release.moment_sigmas(beta, squares=squares)
        sigma_b = 0.0
        item_sigma = [sigma_m if i >= first_moment_item else sigma0 for i in range(len(plan_items))]
    elif audit.form.interval == "exact":  # the estimate alone: no groups to share ρ with
        sigma0, sigma_b = release.single_sigma(beta), 0.0
        item_sigma = [sigma0] * len(plan_items)
    else:
        sigma0, sigma_b = release.sigmas(beta * (correction.SENSITIVITY_FACTOR if plans.correction else 1))
        item_sigma = [sigma0] * len(plan_items)
    scales = [slot_scales(audit, plan_items[i], weights, comps) for i in direct]
    if squares:  # a group item's squares belong to the second moments: σ_m, not σ₀
        scales = [square_scales(audit.layout, plan_items[i], scale, len(comps) - squares, sigma_m / sigma0)
                  if i < first_moment_item else scale for i, scale in zip(direct, scales)]
    return ItemNoise(sigma0, sigma_b, item_sigma, scales, beta)


def add_noise(audit: Audit, ciphertext: int, scales: list, sigma: float) -> int:
    """Design §8.3: Gaussian noise of sd σ·scale in each slot, added under encryption."""
    if sigma <= 0 or not any(scales):
        return ciphertext
    return paillier.add_plain(audit.pub.n, ciphertext,
                              audit.draws.gaussian_slots([sigma * x for x in scales], audit.layout.release_slot_bits))


def noised_point_and_groups(audit: Audit, columns: list[list[int]], direct: list[int],
                            noise: ItemNoise) -> tuple[list[int], list[list[int]]]:
    """Design §8.3, §8.4: the estimate's row (each direct item's product over the units, noised
    with its σ), then every unit noised with σ_b where the replicates are random groups."""
    n2 = audit.pub.n2
    point = []
    for d, col in enumerate(columns):
        c = gmpy2.mpz(1)
        for x in col:
            c = c * x % n2
        point.append(add_noise(audit, int(c), noise.scales[d], noise.item_sigma[direct[d]]))
    if noise.sigma_b > 0:
        columns = [[add_noise(audit, x, noise.scales[d], noise.sigma_b) for x in col] for d, col in enumerate(columns)]
    return point, columns


def replicate_rows(audit: Audit, work: Work, columns: list[list[int]], counts: list[list[int]]) -> list[int]:
    """Design §3.6: every replicate's (or random group's) direct items, Π_u C[u]^count,
    by the executor (`aggregation.replicate_chunk`); row 0 (the estimate) is not among them."""
    executor = work.executor
    tasks = [(audit.pub.n, columns, part) for part in
             parallel.split(counts[1:], executor.chunk_count(parallel.CHECKPOINT_CHUNKS))]
    return [c for part in executor.run_chunks(aggregation.replicate_chunk, tasks,
                                              checkpoint=work.ticks("bootstrap", len(tasks))) for c in part]


def noise_note(audit: Audit, n_components: float, sigma0: float, sigma_b: float, scales: list,
               item_sigmas: list[float] | None = None) -> tuple[list[float], dict[str, Any]]:
    """What the report says about the noise (σ₀ in members, per unit of sensitivity),
    and, for the header, the noise's sd per item slot: the estimate's, then the
    groups' (`scales`: each item's slot sensitivities; none without release noise).
    `item_sigmas`: the release of second moments (`common.stats.moments`), one
    multiplier per item and no groups (zeros)."""
    release, m = audit.release, audit.multiplicity
    noise_sd: list[float] = []
    info: dict[str, Any] = {}
    if release.noisy and item_sigmas is not None:
        noise_sd = [sig * float(x) for sig, row in zip(item_sigmas, scales) for x in row]
        noise_sd += [0.0] * len(noise_sd)
        info.update({"interval_from": "second moments (parametric bootstrap)", "sigma_moments": max(item_sigmas) * m})
    elif release.noisy:
        noise_sd = [sig * float(x) for sig in (sigma0, sigma_b) for row in scales for x in row]
    info["controls"] = release != ReleasePolicy.off()
    info.update({"min_intersection": release.min_intersection, "min_effective_size": release.min_effective_size,
                 "rho": release.rho, "epsilon": rho_to_epsilon(release.rho), "delta": REPORT_DELTA,
                 "sigma_estimate": sigma0 * m, "components": n_components, "member_rows_max": m})
    return noise_sd, info


def spend_budget(release: ReleasePolicy, charge: Callable[[float], float] | None) -> dict[str, Any]:
    """Charge this audit's ρ to the Test-Client's budget: the last step before release
    (design §8.5); the budget left, for the report."""
    if release.noisy and charge is not None:
        return {"budget_left": round(charge(release.rho), 12)}
    return {}


@dataclass(frozen=True)
class Released:
    """What the header and the report say of a release (design §3.6, §8): the items
    withheld, the groups left out of the verdict and those without a corrected value,
    the noise's sd per item slot, the report's release information, B, the mask
    ("ratio" or "additive"), the rows released as noised aggregates, the zero tests,
    and the plan's items and slots per item."""

    suppressed: list[int]
    small_groups: list[str]
    unidentifiable: list[str]
    noise_sd: list[float]
    info: Mapping[str, Any]
    replicates: int
    mask: str
    plain_rows: int
    zero_tests: int
    n_items: int
    item_slots: int


@dataclass(frozen=True)
class ReleasedItems:
    """Step 6's result: the masked, rerandomised items, row-major (replicate, item), then
    a zero test per item where there are any; the additive masks to remove from what the
    Test-Client returns (result recipient `tester`); and what is said of the release."""

    ciphertexts: list[int]
    pads: list[AdditiveMask] | None
    release: Released


def mask_items(audit: Audit, work: Work, plans: AuditPlan, items: list[int], suppression: Suppression,
               noise_sd: list[float], unidentifiable: list[str], info: Mapping[str, Any]) -> ReleasedItems:
    """Withhold suppressed items, mask every item of every replicate, rerandomise (step
    6's end, design §4.7).

    With release noise, every row is released as its noised aggregates: they are what
    the release controls protect, and their denominators tell the Test-Client which
    cells the noise swamps (`Plan.cell_values`). Without noise, every row is a masked
    ratio, and the estimate's items get a zero test each, Enc(ρ·X) with ρ uniform in
    Z_n: 0 when the item is empty (a denominator of 0: the cell is undefined), else a
    uniform value (nothing else about X)."""
    pub, layout, form, plan = audit.pub, audit.layout, audit.form, plans.plan
    replicates, recipient = form.replicates, audit.spec.result_recipient
    n_items = len(plan.items)
    suppressed = suppression.items
    if suppressed:
        items = list(items)
        for r in range(len(items) // n_items):
            for i in suppressed:
                items[r * n_items + i] = 1  # Enc(0), rerandomised below: nothing of the cell leaves
    noisy = audit.release.noisy
    plain_rows = form.released_rows if noisy else 0
    zero_tests = 0
    if not noisy and recipient == "client":
        items = items + [paillier.scalar_pow(pub.n, items[i], 1 + secrets.randbelow(pub.n - 1))
                         for i in range(n_items)]
        zero_tests = n_items
    shift = layout.release_slot_bits
    slots = plan.item_slots
    pads = draws = ratio = None
    if recipient == "client":
        ratio = []
        # the correction solves systems that mix a replicate's cells: one factor per
        # replicate (each slot keeps its own noise); otherwise one per item
        common_factor: dict[int, int] = {}
        for idx, _ in enumerate(items):
            if idx < plain_rows * n_items or idx >= (replicates + 1) * n_items:
                ratio.append((1, 0))  # released as it is (rerandomised)
                continue
            if plans.correction is None:
                r = RatioMask.draw().r
            else:
                r = common_factor.setdefault(idx // n_items, RatioMask.draw().r)
            noise = sum(RatioMask.noise(r) << (s * shift) for s in range(slots))
            ratio.append((r, noise))
    else:
        pad_bits = layout.release_slot_bits - AdditiveMask.max_bits(0) - 1
        draws = [AdditiveMask.draw(slots, pad_bits) for _ in items]
        pads = [sum(p << (s * shift) for s, p in enumerate(d.pads)) for d in draws]
    h = paillier.randomizer_base(pub.n)  # our own base, never the Test-Client's h
    executor = work.executor
    parts = parallel.split(list(range(len(items))), executor.chunk_count(parallel.CHECKPOINT_CHUNKS))
    tasks = [(pub.n, h, [items[i] for i in part], [ratio[i] for i in part] if ratio else None,
              [pads[i] for i in part] if pads else None) for part in parts]
    out = [c for part in executor.run_chunks(aggregation.mask_chunk, tasks,
                                             checkpoint=work.ticks("bootstrap", len(tasks))) for c in part]
    work.clock.lap("bootstrap_and_mask")
    work.progress("bootstrap", (f"{replicates} replicates masked" if replicates else "the estimate noised")
                  + "; sending to the Test-Client")
    released = Released(suppressed, suppression.small_groups, unidentifiable, noise_sd, info, replicates,
                        "ratio" if ratio else "additive", plain_rows if ratio else 0, zero_tests, n_items, slots)
    return ReleasedItems(out, draws, released)


def release(audit: Audit, work: Work, plans: AuditPlan, agg: dict, weights: list, n_units: int,
            rng: np.random.Generator, suppression: Suppression, unidentifiable: list[str],
            charge: Callable[[float], float] | None) -> ReleasedItems:
    """Design §3.6, §8: from the bucket sums to what is sent: the replicates' counts,
    the direct items, their noise, the estimate and the replicates, the budget charged,
    and the masked items."""
    counts = count_rows(audit, n_units, rng)
    parts_of, direct, columns = direct_items(audit, plans.plan, agg, weights, n_units)
    noise = item_noise(audit, plans, direct, weights)
    point, columns = noised_point_and_groups(audit, columns, direct, noise)
    computed = point + replicate_rows(audit, work, columns, counts)
    n_items = len(plans.plan.items)
    noise_sd, noted = noise_note(audit, round(noise.beta, 3), noise.sigma0, noise.sigma_b,
                                 aggregation.composite_scales(noise.scales, direct, parts_of, n_items),
                                 noise.item_sigma if audit.form.moments else None)
    items = aggregation.compose_items(computed, len(counts), direct, parts_of, n_items, audit.pub.n2)
    info = {**suppression.info, **noted}
    info.update(spend_budget(audit.release, charge))
    return mask_items(audit, work, plans, items, suppression, noise_sd, unidentifiable, info)


# ------------------------------------------------------------------ MQOS-AUC exact: the squares' round trip
@dataclass(frozen=True)
class SquareRequests:
    """Design §5.6: what the Test-Client is asked to square (`Metric.square_requests`),
    the state that combines its answers, and the small cells withheld."""

    requests: list[int]
    state: Any
    suppression: Suppression
    unidentifiable: list[str]


def square_requests(audit: Audit, sums: BucketSums) -> SquareRequests:
    """Design §5.6, MQOS-AUC exact: the additively masked sums to be squared."""
    state, requests = audit.metric.square_requests(sums.agg, sums.n_units, audit.pub, sums.weights.facts,
                                                   audit.layout)
    return SquareRequests(requests, state, sums.suppression, sums.weights.unidentifiable)


def release_squares(audit: Audit, work: Work, plans: AuditPlan, asked: SquareRequests, squares: list[int],
                    charge: Callable[[float], float] | None) -> ReleasedItems:
    """MQOS-AUC exact: the squares are back; form the released (V, D) of every cell in
    the full sample and each random group, each noised before packing: the estimate
    with σ₀, each random group with σ_b (the groups are disjoint, so a member is in one
    of them). The noise scales come from the metric's declared form and the row count
    (`ExactAuc.squares_sensitivity`), never from a group's size."""
    metric, release_policy = audit.metric, audit.release
    scales = metric.squares_sensitivity(asked.state, audit.multiplicity)
    slots = plans.plan.item_slots
    if audit.form.moments:  # the estimate at σ₀, the pair items (S1, S0) at σ_m: β 2 and 1
        sigma0, sigma_m = release_policy.moment_sigmas(2, pair_components=1)
        pair = metric.pair_sensitivity(audit.multiplicity)
        levels = [(scales[0], sigma0), (scales[1], sigma0), (pair, sigma_m), (pair, sigma_m)]
        sigma_b = 0.0
    else:
        sigma0, sigma_b = release_policy.sigmas(2)
        levels = None

    def noise(ciphertext: int, component: int, replicate: int) -> int:
        one = [0] * slots
        if levels is not None:
            one[0], sigma = levels[component]
        else:
            one[0], sigma = scales[component], (sigma0 if replicate == 0 else sigma_b)
        return add_noise(audit, ciphertext, one, sigma)
    items = metric.combine(asked.state, squares, audit.pub, audit.layout, noise)
    cells = len(asked.state["facts"]["S"])
    if levels is not None:
        n_pairs = len(items) - cells
        noise_sd, noted = noise_note(audit, 2, sigma0, 0.0,
                                     [metric.slot_noise(scales)] * cells + [[float(pair)] * 2] * n_pairs,
                                     [sigma0] * cells + [sigma_m] * n_pairs)
    else:
        noise_sd, noted = noise_note(audit, 2, sigma0, sigma_b, [metric.slot_noise(scales)] * cells)
    work.clock.lap("squares")
    info = {**asked.suppression.info, **noted}
    info.update(spend_budget(release_policy, charge))
    return mask_items(audit, work, plans, items, asked.suppression, noise_sd, asked.unidentifiable, info)


# ------------------------------------------------------------------ what is sent
def header(audit: Audit, released: Released) -> pb.AggregatesHeader:
    """The AggregatesHeader before the masked table (design §3.6): the groups, the
    interval's form and parameters, the slot plan, and the release's fields."""
    spec = audit.spec
    return pb.AggregatesHeader(
        groups=list(audit.groups), replicates=released.replicates, confidence=spec.confidence,
        slot_bits=audit.layout.release_slot_bits, mask=released.mask, items=released.n_items,
        item_slots=released.item_slots, tau=spec.tau, small_groups=released.small_groups,
        suppressed_items=released.suppressed, interval=audit.form.header_interval, plain_rows=released.plain_rows,
        noise_sd=released.noise_sd, zero_tests=released.zero_tests, unidentifiable=released.unidentifiable,
        min_effective_size=audit.release.min_effective_size)
