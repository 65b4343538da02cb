"""What the operator asks of an audit, checked before any work (design §3, §9.1): the
metric and its option and parameters, the Test-Client's dataset, the interval's
settings, who learns the result, and the correction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.errors import InputError
from common.metrics import correcting_metrics, get_metric
from common.protocol import validation
from common.stats import bootstrap as boot
from common.stats import correction
from common.stats.results import DEFAULT_TAU

MAX_REPLICATES = 100_000
RECIPIENTS = ("client", "tester")


@dataclass(frozen=True)
class AuditSpec:
    """What the operator asked for (validated before any work)."""

    metric: str
    client_dataset: str
    bootstrap: int = boot.DEFAULT_REPLICATES
    confidence: float = boot.DEFAULT_CONFIDENCE
    seed: int | None = None
    result_recipient: str = "client"
    metric_option: str = ""
    tau: float = DEFAULT_TAU
    #: the metric's parameters as the operator gave them (text)
    params: dict[str, str] = field(default_factory=dict)
    #: "none" or "calibration": attenuation-corrected estimates beside the weighted ones
    correction: str = "none"

    def validated(self) -> "AuditSpec":
        metric = get_metric(self.metric)
        option = metric.check_option(self.metric_option)
        metric.parse_params(self.params)
        if not self.client_dataset:
            raise InputError("no client dataset named", parameter="client dataset")
        # what the Test-Client accepts in a Hello (common.protocol.validation): refused here as the operator's input
        if len(self.client_dataset) > validation.MAX_NAME_CHARS:
            raise InputError(f"at most {validation.MAX_NAME_CHARS} characters", parameter="client dataset")
        if sum(len(k) + len(v) for k, v in self.params.items()) > validation.MAX_PARAM_CHARS:
            raise InputError(f"at most {validation.MAX_PARAM_CHARS} characters in all", parameter="metric parameter")
        if not 1 <= self.bootstrap <= MAX_REPLICATES:
            raise InputError(f"must be between 1 and {MAX_REPLICATES}", parameter="bootstrap")
        if not 0.0 < self.confidence < 1.0:
            raise InputError("must be strictly between 0 and 1", parameter="confidence")
        if self.result_recipient not in RECIPIENTS:
            raise InputError(f"must be one of {', '.join(RECIPIENTS)}", parameter="result recipient")
        if not self.tau > 0:
            raise InputError("must be positive", parameter="tau")
        correction_method = correction.check_method(self.correction)
        if correction_method != "none" and not metric.corrects:
            raise InputError(f"{self.metric} has no attenuation correction (metrics with one: "
                             f"{', '.join(correcting_metrics())})", parameter="correction")
        return dataclasses.replace(self, metric_option=option, params=dict(self.params), correction=correction_method)
