"""Release controls: what the Tester lets out of an audit (SPEC.md section 8).

The cryptography hides every input, but the Test-Client chooses its own "model
outputs": with one member as the only false positive among decoys, or two audits
that differ in one member, the released per-group ratios would give away that
member's probability vector (`papers/fairness-queries-leak-attributes.txt`). The
Tester therefore releases nothing but

* audits whose intersection holds at least `min_intersection` distinct members;
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
release ρ = C/σ²-zCDP. An audit makes three releases: the estimate (σ₀), the same
cells over G = 10 disjoint random groups of the rows, from which the interval comes
(σ_b; a member's at most m rows fall in one group or, for unit resampling, several,
which the same L2 bound covers, so the groups together are one release), and the noisy effective sizes that decide suppression; their
shares of the audit's ρ are 0.7, 0.2 and 0.1. A bootstrap would reuse every member in
every replicate: noise that kept B replicates private would swamp their spread, so with
noise every metric's interval comes from random groups. Repeated audits add their ρ
(composition); the accountant keeps the sum per Test-Client
identity, across dataset names, and refuses an audit that would exceed the budget.
`rho_to_epsilon` gives the (ε, δ)-DP equivalent.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from common.errors import InputError, PPREError

#: defaults (see README "Threat model and release controls" for how they were chosen)
DEFAULT_MIN_INTERSECTION = 100
DEFAULT_MIN_EFFECTIVE_SIZE = 30.0
DEFAULT_RHO_PER_AUDIT = 0.2
DEFAULT_BUDGET = 0.4
#: the shares of an audit's ρ spent on the interval's random groups and on the noisy
#: effective sizes that decide suppression; the rest goes to the estimate
REPLICATE_SHARE = 0.2
THRESHOLD_SHARE = 0.1
#: with noise, every interval comes from this many disjoint random groups
RELEASE_GROUPS = 10
#: Gaussian draws are cut at this many standard deviations (slot headroom)
NOISE_TAIL_SD = 8.0
#: the largest noise multiplier a slot has room for (common.metrics.base.NOISE_HEADROOM_BITS)
MAX_SIGMA = float(1 << 20)
#: δ of the (ε, δ) figure the reports quote
REPORT_DELTA = 1e-6


class ReleaseRefused(PPREError):
    """An audit the release controls refuse (its reason says which control)."""

    code = "release_refused"


class BudgetExhausted(ReleaseRefused):
    code = "privacy_budget_exhausted"


@dataclass(frozen=True)
class ReleasePolicy:
    """The Tester's release controls. `rho` = 0 adds no noise; `budget` = inf never refuses."""

    min_intersection: int = DEFAULT_MIN_INTERSECTION
    min_effective_size: float = DEFAULT_MIN_EFFECTIVE_SIZE
    rho: float = DEFAULT_RHO_PER_AUDIT
    budget: float = DEFAULT_BUDGET
    replicate_share: float = REPLICATE_SHARE
    threshold_share: float = THRESHOLD_SHARE

    def __post_init__(self) -> None:
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
        if self.rho > self.budget:
            raise InputError(f"one audit's rho ({self.rho:g}) exceeds the whole budget ({self.budget:g})",
                             parameter="noise rho")

    @classmethod
    def off(cls) -> "ReleasePolicy":
        """No release control at all (`--no-release-controls`): for exact comparisons and
        for showing what the controls prevent. Empty cells are still suppressed."""
        return cls(min_intersection=1, min_effective_size=0.0, rho=0.0, budget=math.inf)

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

    def single_sigma(self, n_components: int) -> float:
        """σ of a release with no replicates (all but the threshold's share on the estimate)."""
        return math.sqrt(max(1, n_components) / (self.rho * (1.0 - self.threshold_share))) if self.noisy else 0.0

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
    """ρ spent per Test-Client identity, across audits and dataset names.

    In memory, or kept in `ledger` (a JSON object identity -> ρ spent; no member-level
    data), rewritten atomically after every charge so that a restart does not reset a
    budget. Thread-safe: concurrent audits of one identity cannot overspend."""

    def __init__(self, budget: float, ledger: str | Path | None = None, *, identity: str | None = None) -> None:
        """`identity`: count every audit for this one identity, whatever the link says
        (`ppre audit --local`: all local audits of this user are one Test-Client)."""
        self.budget = budget
        self._fixed = identity
        self._path = Path(ledger) if ledger else None
        self._lock = threading.Lock()
        self._spent: dict[str, float] = {}
        if self._path is not None and self._path.exists():
            try:
                data = json.loads(self._path.read_text(encoding="utf-8"))
                if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and v >= 0
                                                         for v in data.values()):
                    raise ValueError("not an object of identity: spent rho")
            except (OSError, ValueError) as exc:
                raise InputError(f"cannot be read as a privacy ledger ({exc})", file=str(self._path)) from None
            self._spent = {str(k): float(v) for k, v in data.items()}

    def spent(self, identity: str) -> float:
        identity = self._fixed or identity
        with self._lock:
            return self._spent.get(identity, 0.0)

    def remaining(self, identity: str) -> float:
        return self.budget - self.spent(identity)

    def check(self, identity: str, rho: float) -> None:
        """Refuse now an audit that could not be released (before any work is done)."""
        left = self.remaining(identity)
        if rho > left + 1e-12:
            raise BudgetExhausted(self._refusal(identity, rho, left))

    def charge(self, identity: str, rho: float) -> float:
        """Spend `rho` for `identity` (raises BudgetExhausted, spending nothing, when it
        would exceed the budget); returns what is left."""
        identity = self._fixed or identity
        with self._lock:
            spent = self._spent.get(identity, 0.0)
            if spent + rho > self.budget + 1e-12:
                raise BudgetExhausted(self._refusal(identity, rho, self.budget - spent))
            self._spent[identity] = spent + rho
            self._save()
            return self.budget - self._spent[identity]

    def _refusal(self, identity: str, rho: float, left: float) -> str:
        identity = self._fixed or identity
        return (f"the privacy budget of Test-Client '{identity}' is spent: this audit needs rho {rho:g}, "
                f"{max(0.0, left):g} of {self.budget:g} is left (the Tester's --privacy-budget)")

    def _save(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".ledger-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self._spent, out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


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
    """Where `ppre audit --local` keeps its privacy ledger: the user's data directory
    ($XDG_DATA_HOME/ppre, else ~/.local/share/ppre), so that a budget survives the run."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ppre" / "privacy-ledger.json"
