"""The utility bar at 100,000 members, every metric, as a user runs it (docs/metrics/README.md),
and what 1,000 members say under the defaults (inconclusive, never a green finding).

On `ppre synth --members 100000 --seed 1` data each metric is audited as
`bench/bench_utility.py` audits it (`ppre audit --local --json`, the same arguments, a process
per audit, here through `ppre.cli.main` so that the key size can be set): once without the release controls (the
noiseless estimate) and once with the defaults (ρ 0.2 per audit, in a fresh data
directory, so the local ledger never refuses). The test holds the defaults' result to
the bar:

* every group with an effective size of at least 2,000 (a curve point: its group's; a
  pair cell: the smaller group's) and every LOT cell is within 0.01 of its noiseless
  estimate (the output metric: 1% of its declared outcome range), and defined where the
  noiseless one is;
* no reported value lies outside its metric's range, and no effective size is negative;
* the verdict agrees with its own table: the compared entry's estimate is the table's
  entry of the same name, and its band lies on the side of 0 the verdict says.

The defaults' release noise is drawn from a seeded generator in the audit's process
(`NOISE_SEED`, set by this test's audit script alone; the product draws from the operating
system's CSPRNG and has no such setting), so that a CI run is reproducible: the noise
is the product's, at the product's scale, only its draws are fixed. Over the draws the
bar holds with high but not certain probability (bench/RESULTS.md, "POT's default
bandwidths": in 0.5% of pairs of audits one of api's 18 curve points lies beyond 0.01),
so an unseeded run would fail now and then with nothing wrong; a noise scale that grew,
or an estimate that drifted, still fails it.

Sizes: the README's size, 100,000 members, is the `long` tier's (one audit pair per
metric takes 1-14 minutes on two cores; each is its own work unit, tests/conftest.py). The
suite runs the same bar on `SUITE_MEMBERS` (`ppre synth --members 20000 --seed 1`) with its
two numbers scaled as the release noise scales: the noise on an estimate is its
sensitivity over the effective size, so at a fifth of the members the bar applies from a
fifth of the effective size (400) with five times the tolerance (0.05), and holds with the
same margin (`Bar`). A noise scale that grew, or an estimate that drifted, fails in every
run, not only in the long tier.

Cost: the noiseless audit runs with `--bootstrap 10` (only its estimates are compared;
the defaults' audit is run exactly as a user runs it), and with 1024-bit Paillier keys
(`PPRE_TEST_KEY_BITS`, `tests.helpers.TEST_BITS`): the encodings, noise and finishing are
those of 2048-bit keys, only the modulus differs (the 2048-bit table is the benchmark's,
bench/RESULTS.md). MQOS-AUC exact at 100,000 rows needs two 258-bit masked cells in a
plaintext (`ExactAuc.layout`), more than a 1024-bit key holds, so it runs with the
smallest key that holds them (1088 bits), not a production one.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_utility as bar  # noqa: E402
from tests.helpers import TEST_BITS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

#: the README's size (the long tier) and the suite's
MEMBERS = 100_000
SUITE_MEMBERS = 20_000
#: the noiseless audit's replicates: only its estimates are compared
NOISELESS_BOOTSTRAP = 10
#: metrics whose masked cells at MEMBERS rows need more than TEST_BITS: the key size that holds them
KEY_BITS = {"mqos-auc": 1088}


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    """`ppre synth --members N --seed 1`, made once per module and size (made again where a
    worker comes back to this module after another's unit: 3 s at 100,000)."""
    made: dict[int, Path] = {}

    def of(members: int) -> Path:
        if members not in made:
            made[members] = tmp_path_factory.mktemp(f"utility_population_{members}")
            bar.synth(members, 1, made[members])
        return made[members]
    return of


#: one audit in a fresh process (as bench_utility runs it), with keys of the size it is given
AUDIT_SCRIPT = """
import json, random, sys
import tester_service.release
from ppre import cli
tester_service.release._RANDOM = random.Random(int(sys.argv[2]))
sys.exit(cli.main(json.loads(sys.argv[1])))
"""
#: the seed of the release noise's draws in the audit's process (module docstring)
NOISE_SEED = 1


def audit(metric: str, folder: Path, home: Path, *, controls: bool) -> dict:
    """One of bench_utility's `ppre audit --local --json` runs, in its own process (module
    docstring): nothing of one audit's process state (remembered dials, the data directory)
    reaches another."""
    dataset, extra, _ = bar.METRICS[metric]
    home.mkdir()
    argv = ["audit", "--local", "--metric", metric, *extra, "--tester-members", str(folder / "members.csv"),
            "--tester-self-id", str(folder / "self_id.csv"), "--client-data", str(folder / "client" / dataset),
            "--json", "--insecure", "--history", "none"]
    if not controls:
        argv += ["--no-release-controls", "--bootstrap", str(NOISELESS_BOOTSTRAP), "--seed", "1"]
    bits = KEY_BITS.get(metric, TEST_BITS)
    # a fresh data directory (its own ledger); a fixed hash seed, so that the noise's draws meet the
    # cells in one order (the noisy sizes are drawn over a set)
    env = dict(os.environ, XDG_DATA_HOME=str(home), HOME=str(home), PYTHONHASHSEED="0",
               PPRE_TEST_KEY_BITS=str(bits))
    proc = subprocess.run([sys.executable, "-c", AUDIT_SCRIPT, json.dumps(argv), str(NOISE_SEED)], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout[-800:], proc.stderr[-800:])
    return json.loads(proc.stdout)


def verdict_disagreements(report: dict) -> list[str]:
    """Where the verdict's compared entry differs from the table, or its band from its words."""
    verdict = report.get("verdict") or {}
    compared = verdict.get("compared") or {}
    label = compared.get("label")
    table = bar.quantities(report)
    wrong = []
    if label in table and compared.get("estimate") is not None and table[label][0] is not None \
            and not math.isclose(compared["estimate"], table[label][0], rel_tol=1e-9, abs_tol=1e-12):
        wrong.append(f"compared {label} {compared['estimate']} but the table says {table[label][0]}")
    low, high = compared.get("band_low"), compared.get("band_high")
    if verdict.get("significant") and low is not None and high is not None and low <= 0 <= high:
        wrong.append(f"significant, yet {label}'s band [{low}, {high}] includes 0")
    message = verdict.get("message", "")
    if low is not None and high is not None and (low > 0 or high < 0) and "that includes 0" in message:
        wrong.append(f"{label}'s band [{low}, {high}] excludes 0, the message says it includes it")
    if "nan" in message.lower():
        wrong.append("a NaN in the message")
    return wrong


#: seconds one metric's audit pair takes on the 2-core machine (`--durations`), its `cost` mark
PAIR_SECONDS = {"lot": 750, "pot": 380, "mqos-auc": 355, "output": 115, "mqos-ndcg": 95, "ero": 90,
                "prob-count": 80}


#: the same at SUITE_MEMBERS
SUITE_PAIR_SECONDS = {"lot": 85, "mqos-auc": 27, "pot": 23, "ero": 15}


@dataclass(frozen=True)
class Bar:
    """The bar at a population size: the README's (`bench_utility`'s tolerance, from its
    effective size) at `MEMBERS`; at fewer members, the effective size from which it applies
    shrinks with the members and the tolerance grows inversely, as the noise does."""

    members: int

    @property
    def tolerance(self) -> float:
        return bar.TOLERANCE * MEMBERS / self.members

    @property
    def min_size(self) -> float:
        return bar.MIN_SIZE_FOR_BAR * self.members / MEMBERS


def audit_pairs() -> list:
    """(members, metric): the long tier's at the README's size, each pair a work unit of its
    own (tests/conftest.py, `OWN_UNITS`: one worker running all of them would take longer
    than the rest of the suite), and the suite's at `SUITE_MEMBERS`."""
    return [pytest.param(MEMBERS, metric, marks=[pytest.mark.long, pytest.mark.cost(PAIR_SECONDS.get(metric, 0))],
                         id=f"{metric}-100k") for metric in bar.METRICS] + \
        [pytest.param(SUITE_MEMBERS, metric, marks=pytest.mark.cost(SUITE_PAIR_SECONDS.get(metric, 0)),
                      id=f"{metric}-20k") for metric in bar.METRICS]


@pytest.mark.parametrize("members,metric", audit_pairs())
def test_the_defaults_keep_every_large_group_within_001_of_the_noiseless_estimate(members, metric, population,
                                                                                  tmp_path):
    exact = audit(metric, population(members), tmp_path / "noiseless", controls=False)
    noisy = audit(metric, population(members), tmp_path / "defaults", controls=True)
    assert noisy["release"]["controls"] and not exact["release"]["controls"]
    at = Bar(members)
    tolerance = at.tolerance * bar.scale(metric, noisy)
    sizes = noisy["release"].get("effective_sizes") or {}
    reference = bar.quantities(exact)
    held, misses = 0, []
    for label, (estimate, _) in bar.quantities(noisy).items():
        size = bar.effective_size(label, sizes, metric)
        if size is not None and size < at.min_size:
            continue
        noiseless = reference.get(label, (None, None))[0]
        if noiseless is None:
            continue
        held += 1
        if estimate is None or abs(estimate - noiseless) > tolerance:
            misses.append(f"{label}: {estimate} against {noiseless}")
    assert held > 0, "no quantity the bar applies to"
    assert not misses, misses
    assert bar.out_of_range(metric, exact) == [] and bar.out_of_range(metric, noisy) == []
    assert verdict_disagreements(exact) == [] and verdict_disagreements(noisy) == []


#: the size at which no metric can be informative under the defaults (the bar's third point)
FEW_MEMBERS = 1_000
#: words by which an inconclusive verdict names what would make it conclusive
CONCLUSIVE_WITH = ("conclusive with ", "would make them conclusive")


@pytest.fixture(scope="module")
def few_members(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("utility_few")
    bar.synth(FEW_MEMBERS, 1, folder)
    return folder


@pytest.mark.parametrize("metric", list(bar.METRICS))
def test_at_1000_members_no_metric_shows_a_green_finding_it_could_not_have_seen(metric, few_members, tmp_path):
    """At 1,000 members under the defaults the audit cannot detect a gap of tau: a verdict
    is "none" (green) only with a detectable gap at most tau, which these sizes never give,
    so it is inconclusive (naming what would make it conclusive: more members, fewer
    groups, a larger budget or larger pools) or a finding whose band excludes 0; its
    values stay in range and its words agree with its table."""
    report = audit(metric, few_members, tmp_path / "defaults", controls=True)
    assert report["release"]["controls"]
    verdict = report["verdict"]
    mdd = verdict.get("mdd")
    assert verdict["severity"] != "none" or (mdd is not None and mdd <= verdict["tau"]), verdict["message"]
    assert verdict["severity"] != "insufficient data", verdict["message"]
    if verdict["severity"] == "inconclusive":
        assert any(words in verdict["message"] for words in CONCLUSIVE_WITH), verdict["message"]
    assert bar.out_of_range(metric, report) == []
    assert verdict_disagreements(report) == []
