"""Release controls: what the Tester lets out of an audit (design §8).

The cryptography hides every input, but the Test-Client chooses its own "model
outputs": with one member as the only false positive among decoys, or two audits
that differ in one member, the released per-group ratios would give away that
member's probability vector (Hamman, Chen and Dutta 2023; design §8.1, §10). The
Tester therefore releases nothing but

* audits whose intersection holds at least `min_intersection` distinct members (an
  empty or smaller one gets one fixed answer, `INTERSECTION_REFUSAL`, with no count).
  Under noise the minimum is checked on a noised count (`intersection_answered`,
  `intersection_sigma`): on the exact count an audit of members the Test-Client knows
  are in the Tester's table, one short of the minimum, plus one probe would be answered
  exactly when the probe is a member. The noised decision is worth ρ_i =
  `intersection_share`·ρ (below); each refusal counts against the Test-Client identity
  (after `max_refusals` every audit of that identity is refused) and against the
  population (after `PrivacyAccountant.max_population_refusals`, whoever asks, local
  audits too), since each one still answers a noisy yes/no question about the Tester's
  members;
* cells whose effective size, Σ p_ij over the joined rows that enter the cell (its
  group's or group pair's weights over its stratum), is at least `min_effective_size`;
  the size is compared with Gaussian noise on it (`threshold_sigma`), since an exact
  comparison would let a Test-Client park a group just under the minimum and learn from
  its release whether the target pushed it over. Smaller cells are suppressed: their
  ciphertexts are replaced before masking, and the report says so (without noise, cells
  of size 0 are suppressed whatever the policy: nothing to divide by);
* aggregates carrying Gaussian noise that the Tester adds under the Test-Client's key
  before masking (`sigmas`), so neither party ever sees a noiseless aggregate;
* while the Test-Client's identity has privacy budget left (`PrivacyAccountant`).

Accounting is zero-concentrated differential privacy (zCDP, Bun & Steinke 2016) for
one member's race-probability vector (replaced by any other; ||Δp||₂ ≤ √2), with the
Test-Client's values, rows and choice of members adversarial. A cell value is
Σ_rows w(row)·v_c(row): every weight a member's row carries is that member's
probability (or, for pair metrics, that probability times the other member's, whose
vector has norm ≤ 1), and |v_c| ≤ bound_c. With `m` the most rows any joined member
appears in, changing one member moves slot c of the released cells by an L2 norm of
at most √2·m·bound_c over all groups and strata. Noise with standard deviation
σ·m·bound_c (in the slot's fixed-point units) on every slot of C components makes one
release ρ = C/σ²-zCDP. bound_c is the metric's declared bound (`Metric.value_bounds`:
an outcome range, queries per viewer, ...), which the Test-Client clips its values to
before encryption; m is the metric's cap on rows per member that the Tester's audit
spec declares (`Metric.member_rows_cap`: LOT's `rows_per_member`, also its L2 count
over rank pairs; one row per member for MQOS-NDCG and the metrics with unique ids),
never a count the Test-Client states, and which the Test-Client keeps to (the Tester
refuses a member above it where it sees the rows), or, for a metric without a cap, the
Tester's count over all the Test-Client's rows (`common.metrics.base.sensitivity_rows`:
for cells kept apart per stratum, sqrt(max_i Σ_s n_is²)); the noisy sizes of item 3
below are sized by the same m; and a metric whose components
cannot all reach their bounds in one row sizes σ for β < C (`Metric.sensitivity_components`:
ρ = β/σ²). A bootstrap would reuse every member in every replicate: noise
that kept B replicates private would swamp their spread, so with noise the interval
comes from one of two further releases. An audit makes three releases:

1. the estimate (σ₀);
2. for the interval, either
   (a) *second moments* (`moment_sigmas`, metrics with `Metric.moment_interval`: ERO,
   output, POT, MQOS-NDCG, LOT, MQOS-AUC exact; for MQOS-AUC exact the pair items hold
   ``Σ p_a·p_b·y`` and ``Σ p_a·p_b·(1 − y)``, of which a row moves one, so β = 1
   (`pair_components`, `common.metrics.mqos_auc`); for LOT the "groups" are each rank pair's cells and the
   weights w_c·w_c' products of its cells' weights, whose outer product moves by the
   same 2·||Δw||, `common.metrics.lot`): the pair items ``S^f_ab = Σ p_a·p_b·f``, ``S^d_ab = Σ p_a·p_b·d`` for a ≤ b
   (`common.stats.moments`; their d slots are also the correction's M), and for the output
   metric ``S^ff_ab = Σ p_a·p_b·f²`` from the squares its rows carry under this form
   (`Metric.moment_squares`; the group items' f² slots, where they share a ciphertext,
   are released at σ_m too). Sensitivity: the weights p_a·p_b form the matrix p·pᵀ,
   and ||p·pᵀ − p'·p'ᵀ||_F ≤ (||p|| + ||p'||)·||p − p'|| ≤ 2·||Δp||, so slot c moves by
   at most 2·√2·m·bound_c over all pairs: PAIR_FACTOR = 4 times the group items'
   squared sensitivity, and C components and S squares with σ_m cost
   (4·(C + S) + S)/σ_m². The finishing party draws the interval's replicates from these
   (post-processing, no further cost); or
   (b) the same cells over G = 10 disjoint *random groups* of the rows (`sigmas`'
   σ_b; MQOS-AUC sampled): a member's at most m rows
   fall in one group or, for unit resampling, several, which the same L2 bound
   covers, so the groups together are one release;
3. the noisy effective sizes that decide suppression (`threshold_sigma`).

The decision to answer at all (design §8.2) is a fourth output: the number of distinct
joined members, which one member present or absent in the Tester's table moves by 1
(and a member's vector replaced, not at all), compared with the minimum after Gaussian
noise of σ_i = sqrt(1/(2·ρ_i)) members: ρ_i-zCDP for membership, ρ_i = ρ ·
`INTERSECTION_SHARE`. An answered audit's ρ covers it without a share of its own:
with a member absent rather than present, every weight it carried goes to 0, so each
released item moves by at most ||p|| ≤ 1 where a replaced vector moves it by up to
||Δp|| ≤ √2 (the pair items by ||p||² ≤ 1 against 2·√2): every release above costs at
most ρ/2 for membership, and ρ/2 + ρ_i ≤ ρ while `intersection_share` ≤ 1/2. A refused
audit releases the decision alone, ρ_i for membership, and is counted as a refusal
(`PrivacyAccountant.refuse`): per identity and per population, a refusal bound of R is
a membership budget of R·ρ_i beside the ρ budgets.

Their shares of the audit's ρ: (a) 0.8 / 0.1 / 0.1 (`MOMENT_SHARE`), (b) 0.7 / 0.2 /
0.1 (`REPLICATE_SHARE`); `THRESHOLD_SHARE` 0.1 either way. With the correction
(`--correction calibration`) form (a) releases exactly the same items with the same
noise: M is the d slots of the pair items, so the weighted estimate keeps its σ₀ and
the correction costs nothing more; under form (b) M's items join the estimate's
release, whose C components then count 5·C (`common.stats.correction.SENSITIVITY_FACTOR`).
Under noise, which groups the correction can identify is decided on the released M
in both forms (`common.stats.correction.finish_corrected`): the Tester releases no
identifying sizes of its own (one member can move them without a useful bound).
Without noise the Tester decides it on its own probabilities. Repeated audits add their ρ
(composition); the accountant keeps the sum per Test-Client
identity, across dataset names, and refuses an audit that would exceed the budget. A
local audit (`ppre audit --local`, `ppre.audit_local`), whose user holds both
datasets, keeps the noise but is charged per pair of inputs (`local_identity`).
`rho_to_epsilon` gives the (ε, δ)-DP equivalent.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from common.errors import InputError, PPREError

#: defaults (docs/threat-model.md, "Why these defaults", says how they were chosen)
DEFAULT_MIN_INTERSECTION = 100
DEFAULT_MIN_EFFECTIVE_SIZE = 30.0
DEFAULT_RHO_PER_AUDIT = 0.2
DEFAULT_BUDGET = 0.4
#: the ρ all Test-Client identities together may spend on one population (the Tester's
#: members: `population_key`), beside each identity's own budget: five audits at the
#: default ρ, two and a half identities' budgets (docs/privacy-ledger.md, "The
#: population's budget", says how to choose it)
DEFAULT_POPULATION_BUDGET = 1.0
#: how a population is named in the ledger: this prefix and a digest of the Tester's inputs
POPULATION_PREFIX = "population "
#: refused audits (an intersection empty or below the minimum) per Test-Client identity,
#: after which every audit of that identity is refused (`PrivacyAccountant.check_refusals`)
DEFAULT_MAX_REFUSALS = 3
#: refused audits of one population by all Test-Client identities together (local audits
#: too: each client file is an identity of its own), after which every audit of it is
#: refused: ten refusals are worth, for membership, 10·ρ_i = one audit's ρ at the defaults
#: (docs/privacy-ledger.md, "Refused audits")
DEFAULT_MAX_POPULATION_REFUSALS = 10
#: the share of an audit's ρ that the noisy intersection count is worth for membership
#: (σ_i = 5 members at the default ρ; within the ρ/2 that the aggregates leave free for
#: membership, so an answered audit costs ρ as before)
INTERSECTION_SHARE = 0.1
#: the shares of an audit's ρ spent on the interval's random groups and on the noisy
#: effective sizes that decide suppression; the rest goes to the estimate
REPLICATE_SHARE = 0.2
THRESHOLD_SHARE = 0.1
#: the share of the second moments, where they give the interval instead of random
#: groups (`common.stats.moments`); the estimate keeps 1 − MOMENT_SHARE − THRESHOLD_SHARE
MOMENT_SHARE = 0.1
#: the squared sensitivity of the pair items (weights p_a·p_b) relative to the group
#: items': ||p·pᵀ − p'·p'ᵀ||_F ≤ (||p|| + ||p'||)·||p − p'|| ≤ 2·||p − p'||
PAIR_FACTOR = 4.0
#: with noise, every interval comes from this many disjoint random groups
RELEASE_GROUPS = 10
#: Gaussian draws are cut at this many standard deviations (slot headroom)
NOISE_TAIL_SD = 8.0
#: the largest noise multiplier a slot has room for (common.metrics.base.NOISE_HEADROOM_BITS)
MAX_SIGMA = float(1 << 20)
#: δ of the (ε, δ) figure the reports quote
REPORT_DELTA = 1e-6


#: how a user changes the budget and its ledger, quoted by every refusal
SERVICE_SETTINGS = "--privacy-budget sets the budget, --privacy-ledger FILE keeps it in a file"
LOCAL_SETTINGS = ("--privacy-budget sets the budget, --privacy-ledger FILE keeps it in another file; each pair "
                  "of input files has its own budget")
#: how an operator allows an identity more refused audits, quoted by `RefusalLimitReached`
REFUSAL_SETTINGS = ("--max-refusals sets the limit; removing the identity's entry under \"refusals\" in the "
                    "--privacy-ledger file resets its count: docs/privacy-ledger.md, \"Refused audits\"")
#: how an operator allows a population more refused audits, quoted by `RefusalLimitReached`
POPULATION_REFUSAL_SETTINGS = ("removing the population's entry under \"population_refusals\" in the privacy "
                               "ledger resets its count: docs/privacy-ledger.md, \"Refused audits\"")
#: the identity of a local audit: this prefix and a digest of its inputs (`local_identity`)
LOCAL_IDENTITY_PREFIX = "local inputs "


class ReleaseRefused(PPREError):
    """An audit the release controls refuse (its reason says which control)."""

    code = "release_refused"


class BudgetExhausted(ReleaseRefused):
    code = "privacy_budget_exhausted"


#: the one answer to an intersection that is empty or below the minimum (design §8.2):
#: fixed text, no count, so that a refusal says nothing beyond "refused"
INTERSECTION_REFUSAL = ("the audit is refused: the client dataset's intersection with the Tester's members is "
                        "empty or below the Tester's minimum (--min-intersection); nothing was released")


class IntersectionRefused(ReleaseRefused):
    """An intersection empty or below the minimum: always `INTERSECTION_REFUSAL`, whatever
    the size; each one counts against the Test-Client identity's refusals
    (`PrivacyAccountant.refuse`)."""

    def __init__(self, message: str = INTERSECTION_REFUSAL) -> None:
        super().__init__(message)


class RefusalLimitReached(ReleaseRefused):
    """A Test-Client identity that has had `ReleasePolicy.max_refusals` audits refused, or
    a population that has had `PrivacyAccountant.max_population_refusals` (the message
    says which)."""

    code = "refusal_limit_reached"


@dataclass(frozen=True)
class ReleasePolicy:
    """The Tester's release controls. `rho` = 0 adds no noise; `budget` = inf never refuses."""

    min_intersection: int = DEFAULT_MIN_INTERSECTION
    min_effective_size: float = DEFAULT_MIN_EFFECTIVE_SIZE
    rho: float = DEFAULT_RHO_PER_AUDIT
    budget: float = DEFAULT_BUDGET
    replicate_share: float = REPLICATE_SHARE
    threshold_share: float = THRESHOLD_SHARE
    moment_share: float = MOMENT_SHARE
    #: refused audits per Test-Client identity before every later one is refused (None: no limit)
    max_refusals: int | None = DEFAULT_MAX_REFUSALS
    #: the share of ρ the noisy intersection count is worth for membership (`intersection_sigma`)
    intersection_share: float = INTERSECTION_SHARE

    def __post_init__(self) -> None:
        if self.max_refusals is not None and not (isinstance(self.max_refusals, int) and self.max_refusals >= 0):
            raise InputError("must be a whole number >= 0", parameter="max refusals")
        if self.min_intersection < 1:
            raise InputError("must be at least 1", parameter="min intersection")
        if not (self.min_effective_size >= 0 and math.isfinite(self.min_effective_size)):
            raise InputError("must be a finite number >= 0", parameter="min effective size")
        if not (self.rho >= 0 and math.isfinite(self.rho)):
            raise InputError("must be a finite number >= 0 (0: no noise)", parameter="noise rho")
        if not self.budget >= 0 or math.isnan(self.budget):
            raise InputError("must be >= 0 ('inf': unlimited)", parameter="privacy budget")
        if not (0.0 < self.replicate_share and 0.0 < self.threshold_share
                and self.replicate_share + self.threshold_share < 1.0):
            raise InputError("must be positive and leave a share for the estimate", parameter="replicate share")
        if not 0.0 < self.intersection_share <= 0.5:
            raise InputError("must be in (0, 0.5]: an answered audit's rho covers the intersection's count only "
                             "within the half its releases leave free for membership", parameter="intersection share")
        if not (0.0 < self.moment_share and self.moment_share + self.threshold_share < 1.0):
            raise InputError("must be positive and leave a share for the estimate", parameter="moment share")
        if self.rho > self.budget:
            raise InputError(f"one audit's rho ({self.rho:g}) exceeds the whole budget ({self.budget:g})",
                             parameter="noise rho")

    @classmethod
    def off(cls) -> "ReleasePolicy":
        """No release control at all (`--no-release-controls`): for exact comparisons and
        for showing what the controls prevent. Empty cells are still suppressed."""
        return cls(min_intersection=1, min_effective_size=0.0, rho=0.0, budget=math.inf, max_refusals=None)

    @property
    def noisy(self) -> bool:
        return self.rho > 0

    def sigmas(self, n_components: int) -> tuple[float, float]:
        """(σ₀, σ_b): the noise multipliers of the estimate and of the buckets for a release
        of `n_components` value components, in units of one member's largest contribution."""
        if not self.noisy:
            return 0.0, 0.0
        c = max(1, n_components)
        sigmas = (math.sqrt(c / (self.rho * (1.0 - self.replicate_share - self.threshold_share))),
                  math.sqrt(c / (self.rho * self.replicate_share)))
        if max(sigmas) > MAX_SIGMA:
            raise InputError(f"rho {self.rho:g} would need noise beyond the slots' headroom "
                             f"(sigma {max(sigmas):.3g} > {MAX_SIGMA:g}); use a larger rho", parameter="noise rho")
        return sigmas

    def moment_sigmas(self, n_components: float, *, squares: int = 0,
                      pair_components: float | None = None) -> tuple[float, float]:
        """(σ₀, σ_m): the noise multipliers of the estimate's group items and of the second
        moments' pair items (`common.stats.moments`), in units of one member's largest
        contribution to a group item. The pair items' sensitivity is 2× the group items'
        (PAIR_FACTOR = 4 on the square), so C components cost C/σ₀² + 4·C/σ_m²; their
        shares are 1 − `moment_share` − `threshold_share` and `moment_share`. `squares`:
        components the rows carry for the second moments alone (`Metric.moment_squares`:
        f²), in the pair items (4 each) and, at σ_m too, in the group items (1 each):
        the second moments cost (4·(C + S) + S)/σ_m². The estimate's σ₀ is the same
        with and without the correction: M is these same pair items (their d slots),
        released for the interval anyway. `pair_components`: β of the pair items where it
        differs from the estimate's (MQOS-AUC exact: the estimate's two slots V and D both
        move with one member, its pair items' S1 and S0 never together, β = 1)."""
        if not self.noisy:
            return 0.0, 0.0
        c = max(1, n_components)
        pc = c if pair_components is None else max(1, pair_components)
        sigmas = (math.sqrt(c / (self.rho * (1.0 - self.moment_share - self.threshold_share))),
                  math.sqrt((PAIR_FACTOR * (pc + squares) + squares) / (self.rho * self.moment_share)))
        if max(sigmas) > MAX_SIGMA:
            raise InputError(f"rho {self.rho:g} would need noise beyond the slots' headroom "
                             f"(sigma {max(sigmas):.3g} > {MAX_SIGMA:g}); use a larger rho", parameter="noise rho")
        return sigmas

    def single_sigma(self, n_components: int) -> float:
        """σ of a release with no replicates (all but the threshold's share on the estimate)."""
        return math.sqrt(max(1, n_components) / (self.rho * (1.0 - self.threshold_share))) if self.noisy else 0.0

    def intersection_rho(self) -> float:
        """ρ_i: what the decision to answer an audit is worth for membership (a member
        present or absent in the Tester's table); 0 without noise, where the minimum is
        exact and only the refusal limits bound it."""
        return self.rho * self.intersection_share if self.noisy else 0.0

    def intersection_sigma(self) -> float:
        """σ_i of the noise on the count of distinct joined members that the minimum is
        checked on (in members): one member moves the count by 1, so N(0, σ_i²) with
        σ_i² = 1/(2·ρ_i) is ρ_i-zCDP (5 members at the defaults)."""
        return math.sqrt(1.0 / (2.0 * self.intersection_rho())) if self.noisy else 0.0

    def intersection_answered(self, distinct: int, draw=None) -> bool:
        """Whether an intersection of `distinct` joined members is answered (design §8.2):
        an empty one never (nothing to release: with the default minimum the noise's
        cut, NOISE_TAIL_SD·σ_i = 40 members, never brings 0 to 100 anyway); under noise
        when `distinct` plus one Gaussian draw of σ_i from the operating system's CSPRNG
        (`gaussian`; `draw` replaces it in tests) reaches the minimum, so that one member
        changes the answer with probability at most 2·Φ(1/(2σ_i)) − 1 (0.080 at the
        defaults); without noise on the exact count."""
        if distinct <= 0:
            return False
        if not self.noisy:
            return distinct >= self.min_intersection
        return distinct + (draw or gaussian)(self.intersection_sigma()) >= self.min_intersection

    def threshold_sigma(self) -> float:
        """σ of the noise on the effective sizes that decide suppression (in members, per
        row a member is in): deciding on the exact sizes would let a Test-Client put a
        group just under the minimum and learn from its release whether the target
        pushed it over."""
        return math.sqrt(1.0 / (self.rho * self.threshold_share)) if self.noisy else 0.0


def rho_to_epsilon(rho: float, delta: float = REPORT_DELTA) -> float:
    """ρ-zCDP implies (ρ + 2·sqrt(ρ·ln(1/δ)), δ)-DP (Bun & Steinke 2016, prop. 1.3)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)) if rho > 0 else 0.0


class PrivacyAccountant:
    """ρ spent, and audits refused for their intersection, per Test-Client identity,
    across audits and dataset names; and ρ spent and audits refused by all identities
    together on one population, the Tester's members (design §8.3, §8.5: what the
    members are protected by is the total over everyone who audits them, not one
    identity's share; a refusal is worth ρ_i for membership, `ReleasePolicy.intersection_rho`).

    In memory, or kept in `ledger` (a JSON object identity -> ρ spent, and once a
    refusal or a population is counted ``{"spent": {identity: ρ}, "refusals": {identity:
    count}, "populations": {population: ρ}, "population_refusals": {population:
    count}}``; no member-level data: a population is a digest of the Tester's inputs),
    rewritten atomically after every charge and every refusal so that a restart resets
    neither. Thread-safe: concurrent audits cannot overspend any bound."""

    def __init__(self, budget: float, ledger: str | Path | None = None, *, identity: str | None = None,
                 settings: str = SERVICE_SETTINGS, limit_refusals: bool | None = None,
                 population: str | None = None, population_budget: float = DEFAULT_POPULATION_BUDGET,
                 max_population_refusals: int | None = DEFAULT_MAX_POPULATION_REFUSALS) -> None:
        """`identity`: count every audit for this one identity, whatever the link says
        (`ppre audit --local`: one identity per pair of inputs, `local_identity`).
        `settings`: how the user changes the budget and the ledger, for refusals.
        `limit_refusals`: whether refused audits count against `ReleasePolicy.max_refusals`
        (default: for a service, not for a local audit with its fixed `identity`, whose
        user holds both datasets and would only be locked out of fixing an id column).
        `population`: the Tester's members these audits release about (`population_key`),
        charged every audit's ρ whoever asks, up to `population_budget` (None: no
        population bound, for an accountant that releases nothing), and counted every
        refused audit, whoever asks and whether or not the identity's refusals are
        limited, up to `max_population_refusals` (None: no limit)."""
        self.budget = budget
        self.population_budget = population_budget
        if max_population_refusals is not None and not (
                isinstance(max_population_refusals, int) and max_population_refusals >= 0):
            raise InputError("must be a whole number >= 0", parameter="max population refusals")
        self.max_population_refusals = max_population_refusals
        self._population = population
        self._populations: dict[str, float] = {}
        self._population_refusals: dict[str, int] = {}
        self._fixed = identity
        self._limit_refusals = identity is None if limit_refusals is None else limit_refusals
        self._settings = settings
        self._path = Path(ledger) if ledger else None
        self._lock = threading.Lock()
        self._spent: dict[str, float] = {}
        self._refusals: dict[str, int] = {}
        if self._path is not None and self._path.exists():
            try:
                self._spent, self._refusals, self._populations, self._population_refusals = \
                    _read_ledger(self._path)
            except (OSError, ValueError) as exc:
                raise InputError(f"cannot be read as a privacy ledger ({exc})", file=str(self._path)) from None

    def spent(self, identity: str) -> float:
        identity = self._fixed or identity
        with self._lock:
            return self._spent.get(identity, 0.0)

    def remaining(self, identity: str) -> float:
        return self.budget - self.spent(identity)

    def population_spent(self) -> float:
        """ρ all identities together have spent on this accountant's population."""
        with self._lock:
            return self._populations.get(self._population, 0.0) if self._population else 0.0

    def check(self, identity: str, rho: float) -> None:
        """Refuse now an audit that could not be released (before any work is done)."""
        left = self.remaining(identity)
        if rho > left + 1e-12:
            raise BudgetExhausted(self._refusal(identity, rho, left))
        if self._population is not None:
            left = self.population_budget - self.population_spent()
            if rho > left + 1e-12:
                raise BudgetExhausted(self._population_refusal(rho, left))

    def charge(self, identity: str, rho: float) -> float:
        """Spend `rho` for `identity` and for the population (raises BudgetExhausted,
        spending nothing, when it would exceed either budget, naming the one reached);
        returns what is left of the identity's."""
        identity = self._fixed or identity
        with self._lock:
            spent = self._spent.get(identity, 0.0)
            if spent + rho > self.budget + 1e-12:
                raise BudgetExhausted(self._refusal(identity, rho, self.budget - spent))
            if self._population is not None:
                together = self._populations.get(self._population, 0.0)
                if together + rho > self.population_budget + 1e-12:
                    raise BudgetExhausted(self._population_refusal(rho, self.population_budget - together))
                self._populations[self._population] = together + rho
            self._spent[identity] = spent + rho
            self._save()
            return self.budget - self._spent[identity]

    def refusals(self, identity: str) -> int:
        """How many of `identity`'s audits were refused for their intersection."""
        identity = self._fixed or identity
        with self._lock:
            return self._refusals.get(identity, 0)

    def population_refusals(self) -> int:
        """How many audits of this accountant's population were refused, all identities together."""
        with self._lock:
            return self._population_refusals.get(self._population, 0) if self._population else 0

    def check_refusals(self, identity: str, limit: int | None) -> None:
        """Refuse every audit of an identity that has had `limit` audits refused for their
        intersection (None: no limit), and every audit of a population that has had
        `max_population_refusals`, whoever asks: each refusal answers one noisy yes/no
        question about the Tester's members (ρ_i for membership), so their number is
        bounded like the budget (design §8.2). The message says which bound was reached."""
        if limit is not None and self._limit_refusals:
            count = self.refusals(identity)
            if count >= limit:
                raise RefusalLimitReached(
                    f"Test-Client '{self._fixed or identity}' has had {count} audits refused for their intersection "
                    f"(the limit is {limit}); no more audits are run for it. The count is kept {self.where()} "
                    f"({REFUSAL_SETTINGS})")
        bound = self.max_population_refusals
        if self._population is not None and bound is not None:
            count = self.population_refusals()
            if count >= bound:
                raise RefusalLimitReached(
                    f"the Tester's members ({self._population}) have had {count} audits refused for their "
                    f"intersection, all Test-Clients together (the limit is {bound}); no more audits of them are "
                    f"run. The count is kept {self.where()} ({POPULATION_REFUSAL_SETTINGS})")

    def refuse(self, identity: str) -> int:
        """Count one refused audit for `identity` and for the population (kept like the
        spent ρ); returns the identity's count (0, counting nothing for it, where its
        refusals are not limited: the population's is counted regardless)."""
        identity = self._fixed or identity
        with self._lock:
            if self._population is not None:
                self._population_refusals[self._population] = self._population_refusals.get(self._population, 0) + 1
            if self._limit_refusals:
                self._refusals[identity] = self._refusals.get(identity, 0) + 1
            if self._population is not None or self._limit_refusals:
                self._save()
            return self._refusals.get(identity, 0) if self._limit_refusals else 0

    @property
    def ledger(self) -> Path | None:
        return self._path

    def where(self) -> str:
        """Where the spent ρ is kept, in words."""
        if self._path is None:
            return "in memory (for this Tester service's lifetime: a restart resets it)"
        return f"in the ledger file {self._path}"

    def _refusal(self, identity: str, rho: float, left: float) -> str:
        identity = self._fixed or identity
        return (f"the privacy budget of Test-Client '{identity}' is spent: this audit needs rho {rho:g}, "
                f"{max(0.0, left):g} of {self.budget:g} is left; the spent rho is kept {self.where()} "
                f"({self._settings})")

    def _population_refusal(self, rho: float, left: float) -> str:
        return (f"the privacy budget of the Tester's members ({self._population}) is spent: all Test-Clients "
                f"together may spend rho {self.population_budget:g} on them, this audit needs {rho:g}, "
                f"{max(0.0, left):g} is left; the spent rho is kept {self.where()} (--population-budget sets "
                f"this bound; docs/privacy-ledger.md, \"The population's budget\")")

    def _ledger_object(self) -> dict:
        """The ledger's JSON: identity -> ρ spent, as it always was, until a refusal or a
        population is counted; then ``{"spent": ..., "refusals": ..., "populations": ...,
        "population_refusals": ...}`` (the last two once they hold anything)."""
        if not self._refusals and not self._populations and not self._population_refusals:
            return dict(self._spent)
        out = {"spent": dict(self._spent), "refusals": dict(self._refusals)}
        if self._populations:
            out["populations"] = dict(self._populations)
        if self._population_refusals:
            out["population_refusals"] = dict(self._population_refusals)
        return out

    def _save(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".ledger-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self._ledger_object(), out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _read_ledger(path: Path) -> tuple[dict[str, float], dict[str, int], dict[str, float], dict[str, int]]:
    """(spent ρ, refusals) per identity and (spent ρ, refusals) per population from a
    ledger file (`PrivacyAccountant`): a flat object (identity -> ρ) has no refusals and
    no population. Raises ValueError for anything else."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if isinstance(data.get("spent"), dict):
        spent, refusals, populations = data["spent"], data.get("refusals", {}), data.get("populations", {})
        population_refusals = data.get("population_refusals", {})
    else:
        spent, refusals, populations, population_refusals = data, {}, {}, {}
    if not isinstance(population_refusals, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in population_refusals.values()):
        raise ValueError("'population_refusals' is not an object of population: refused audits")
    if not isinstance(populations, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in populations.values()):
        raise ValueError("'populations' is not an object of population: spent rho")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in spent.values()):
        raise ValueError("'spent' is not an object of identity: spent rho")
    if not isinstance(refusals, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in refusals.values()):
        raise ValueError("'refusals' is not an object of identity: refused audits")
    return ({str(k): float(v) for k, v in spent.items()}, {str(k): int(v) for k, v in refusals.items()},
            {str(k): float(v) for k, v in populations.items()},
            {str(k): int(v) for k, v in population_refusals.items()})


_RANDOM = None


def _system_random():
    global _RANDOM
    if _RANDOM is None:
        import random
        _RANDOM = random.SystemRandom()
    return _RANDOM


def gaussian(sigma: float) -> float:
    """One draw of N(0, σ²), cut at ±NOISE_TAIL_SD σ, from the operating system's CSPRNG."""
    return sigma * max(-NOISE_TAIL_SD, min(NOISE_TAIL_SD, _system_random().gauss(0.0, 1.0)))


def gaussian_slots(scales: list[float], slot_bits: int) -> int:
    """One packed plaintext of Gaussian noise: slot s gets round(N(0, scales[s]²)), cut at
    ±NOISE_TAIL_SD standard deviations, in the slot's fixed-point units. Drawn from the
    operating system's CSPRNG (never the audit's --seed). The rounding to integer units
    of the fixed-point scale (2^-32 of one member's weight, or finer) is far below σ."""
    packed = 0
    for s, scale in enumerate(scales):
        if scale > 0:
            packed += int(round(gaussian(scale))) << (s * slot_bits)
    return packed


def local_ledger_path() -> Path:
    """Where `ppre audit --local` and `ppre.audit_local` keep their privacy ledger: the
    user's data directory ($XDG_DATA_HOME/ppre, else ~/.local/share/ppre), so that a
    budget survives the run. One file; each pair of inputs is one identity in it
    (`local_identity`)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ppre" / "privacy-ledger.json"


def local_identity(tester_inputs, client_data) -> str:
    """The identity a local audit is charged to: one per pair of inputs, so that a user's
    audits of one pair of datasets share a budget and another pair starts afresh (the
    user holds both datasets: the budget makes results look as they would in
    production, it protects nothing from them). `tester_inputs`: the Tester's files or
    DataFrames (members and Self-ID, or a probability table; None for an absent one);
    `client_data`: the Test-Client's. The key is a SHA-256 digest of the inputs'
    contents (not their paths or times: a copy of the same data shares the budget, a
    touched file keeps it), cut to 16 hex digits; a DataFrame's contents are its
    columns and pandas' row hashes, so a DataFrame and the file it came from are two
    pairs. The ledger holds only this digest and the ρ spent: no member-level data."""
    digest = hashlib.sha256()
    for item in (*tester_inputs, client_data):
        digest.update(_content_digest(item))
    return f"{LOCAL_IDENTITY_PREFIX}{digest.hexdigest()[:16]}"


def population_key(tester_inputs) -> str:
    """The population a Tester's audits release about, as the ledger names it: a SHA-256
    digest of its inputs' contents (the members and Self-ID files, or its probability
    table; as `local_identity` reads them), cut to 16 hex digits. New members files are a
    new population, with a budget of their own; the same files, wherever they lie, one."""
    digest = hashlib.sha256()
    for item in tester_inputs:
        digest.update(_content_digest(item))
    return f"{POPULATION_PREFIX}{digest.hexdigest()[:16]}"


def local_accountant(budget: float, tester_inputs, client_data, ledger: str | Path | None = None, *,
                     settings: str = LOCAL_SETTINGS,
                     population_budget: float = DEFAULT_POPULATION_BUDGET,
                     max_population_refusals: int | None = DEFAULT_MAX_POPULATION_REFUSALS) -> PrivacyAccountant:
    """The accountant of a local audit (`ppre audit --local`, `ppre.audit_local`):
    `ledger` (default `local_ledger_path()`), charged to `local_identity` of the inputs
    and to the population of the Tester's inputs (`population_key`), whatever the
    Test-Client's file; its refused audits count against the population alone (every
    client file is an identity of its own)."""
    return PrivacyAccountant(budget, ledger or local_ledger_path(),
                             identity=local_identity(tester_inputs, client_data), settings=settings,
                             population=population_key(tester_inputs), population_budget=population_budget,
                             max_population_refusals=max_population_refusals)


def _content_digest(item) -> bytes:
    """SHA-256 of one input: a file's bytes, a DataFrame's columns and row hashes, or
    a marker for an absent input."""
    digest = hashlib.sha256()
    if item is None:
        digest.update(b"absent")
        return digest.digest()
    import pandas as pd
    if isinstance(item, pd.DataFrame):
        digest.update(b"frame\0" + "\0".join(map(str, item.columns)).encode("utf-8"))
        digest.update(pd.util.hash_pandas_object(item, index=False).to_numpy().tobytes())
        return digest.digest()
    path = Path(item)
    try:
        with path.open("rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        raise InputError("file not found", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror or exc})", file=str(path)) from None
    return digest.digest()
