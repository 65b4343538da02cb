"""Step 6 of the Tester's session as values (`tester_service.release_items`): each step
from explicit inputs to a value, and the pipeline kept apart from the session."""
from __future__ import annotations

import dataclasses
import functools
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from common.crypto.encoding import PROBABILITY_BITS
from common.metrics import get_metric
from common.metrics.base import Cell, Item, Plan
from tester_service import release_items as ri
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import RELEASE_GROUPS, ReleasePolicy

GROUPS = ("a", "b")
NOISY = ReleasePolicy(rho=1.0, budget=1.0)
#: a bootstrap metric without second moments (its interval under noise: random groups)
BOOTSTRAP = SimpleNamespace(name="boot", interval="percentile", moment_interval=False, random_groups=0, n_ids=1,
                            strata_cells=False, size_weight=lambda item: item.weight)


def audit(*, release: ReleasePolicy = ReleasePolicy.off(), metric=None, spec: AuditSpec | None = None,
          **fields) -> ri.Audit:
    """An `Audit` of two groups without a key or a layout (the steps below read neither)."""
    spec = spec or AuditSpec(metric="ero", client_dataset="d", bootstrap=50, seed=1)
    metric = metric or get_metric(spec.metric)
    return ri.Audit(spec=spec, metric=metric, params={}, groups=GROUPS, strata_labels=(), info={},
                    layout=None, pub=None, release=release,
                    form=ri.release_form(metric, release, spec.bootstrap), **fields)


# ---------------------------------------------------------------- the release's form
def test_the_form_without_noise_is_the_metrics_own_interval_with_b_replicates():
    form = ri.release_form(get_metric("ero"), ReleasePolicy.off(), 200)
    assert (form.interval, form.moments, form.replicates, form.groups_instead) == ("percentile", False, 200, False)
    assert not form.estimate_only and form.released_rows == 201 and form.header_interval == "percentile"


def test_under_noise_a_bootstrap_metric_takes_random_groups_and_a_moments_metric_its_second_moments():
    groups = ri.release_form(BOOTSTRAP, NOISY, 200)
    assert (groups.interval, groups.replicates, groups.groups_instead) == ("random_groups", RELEASE_GROUPS, True)
    lot = ri.release_form(get_metric("lot"), NOISY, 200)
    assert lot.moments and lot.estimate_only and lot.released_rows == 1
    assert (lot.interval, lot.header_interval) == ("percentile", "parametric")


def test_an_exact_interval_releases_the_estimate_alone():
    metric = SimpleNamespace(interval="exact", moment_interval=False, random_groups=0)
    form = ri.release_form(metric, ReleasePolicy.off(), 200)
    assert form.replicates == 0 and form.estimate_only and form.released_rows == 1


# ---------------------------------------------------------------- the opened rows
def test_the_opened_rows_are_quantised_and_put_in_the_canonical_order():
    probs = [np.array([[0.9, 0.1], [0.2, 0.8], [0.9, 0.1]])]
    rows = ri.order_rows(probs, np.array([5, 6, 7]), np.array([0, 1, 2]), b"cts")
    assert rows.n == 3 and rows.ciphertexts == b"cts"
    assert rows.canonical.tolist() == [1, 0, 2]  # by vector; ties keep their order
    assert rows.units.tolist() == [6, 5, 7] and rows.strata.tolist() == [1, 0, 2]
    assert rows.q[0].dtype.kind == "i" and rows.q[0][0, 0] < rows.q[0][1, 0]


# ---------------------------------------------------------------- small cells
def _sized_plan() -> tuple[ri.AuditPlan, SimpleNamespace]:
    """Two group cells over weight columns 0 and 1, and "overall" as their sum (column 2)."""
    cells = (Cell("group", "a", item=0), Cell("group", "b", item=1), Cell("group", "overall", item=2))
    plan = Plan(cells, (Item(0, 0), Item(1, 0), Item(2, 0)), 2)
    return ri.AuditPlan(plan), BOOTSTRAP


def test_without_noise_a_cell_below_the_minimum_size_is_withheld_and_its_group_left_out():
    plans, metric = _sized_plan()
    one = 1 << PROBABILITY_BITS  # a row's whole weight
    weights = [np.array([one] * 40), np.array([one] * 3), (0, 1)]
    policy = dataclasses.replace(ReleasePolicy.off(), min_effective_size=10.0)
    out = ri.suppress_small(audit(metric=metric, release=policy), plans, weights, None, 43, ["x"])
    assert out.items == [1] and out.small_groups == ["b", "x"]
    assert out.info == {"effective_sizes": {"a": 40.0, "b": 3.0}, "suppressed": ["b"]}


def test_with_noise_the_sizes_decided_on_are_the_noised_ones():
    plans, metric = _sized_plan()
    one = 1 << PROBABILITY_BITS
    weights = [np.array([one] * 40), np.array([one] * 40), (0, 1)]
    noisy = dataclasses.replace(NOISY, min_effective_size=10.0)
    shifted = audit(metric=metric, release=noisy, draws=ri.Draws(gaussian=lambda sigma: -35.0))
    out = ri.suppress_small(shifted, plans, weights, None, 40, [])
    assert out.items == [0, 1] and out.info["effective_sizes"] == {"a": 5.0, "b": 5.0}  # overall: 45
    assert out.small_groups == ["a", "b"]


# ---------------------------------------------------------------- noise, budget, header
def test_without_noise_the_note_has_no_sds_and_says_the_controls_are_off():
    noise_sd, info = ri.noise_note(audit(), 1, 0.0, 0.0, [[1, 1]])
    assert noise_sd == []
    assert list(info) == ["controls", "min_intersection", "min_effective_size", "rho", "epsilon", "delta",
                          "sigma_estimate", "components", "member_rows_max"]
    assert info["controls"] is False


def test_with_noise_the_sds_are_the_estimates_then_the_groups_and_scale_with_the_multiplicity():
    noise_sd, info = ri.noise_note(audit(release=NOISY, multiplicity=3), 2, 2.0, 5.0, [[1, 0], [2, 1]])
    assert noise_sd == [2.0, 0.0, 4.0, 2.0, 5.0, 0.0, 10.0, 5.0]
    assert info["sigma_estimate"] == 6.0 and info["member_rows_max"] == 3 and info["controls"] is True
    moments_sd, moments_info = ri.noise_note(audit(release=NOISY), 2, 2.0, 0.0, [[1], [1]], [2.0, 7.0])
    assert moments_sd == [2.0, 7.0, 0.0, 0.0] and list(moments_info)[:2] == ["interval_from", "sigma_moments"]


def test_the_budget_is_charged_once_and_only_under_noise():
    charged = []

    def charge(rho):
        charged.append(rho)
        return 0.25
    assert ri.spend_budget(ReleasePolicy.off(), charge) == {} and charged == []
    assert ri.spend_budget(NOISY, charge) == {"budget_left": 0.25} and charged == [1.0]
    assert ri.spend_budget(NOISY, None) == {}


def test_the_header_says_what_the_release_is():
    layout = SimpleNamespace(release_slot_bits=96)
    released = ri.Released(suppressed=[1], small_groups=["b"], unidentifiable=[], noise_sd=[0.5] * 4, info={},
                           replicates=8, mask="ratio", plain_rows=9, zero_tests=0, n_items=2, item_slots=1)
    header = ri.header(dataclasses.replace(audit(release=NOISY, metric=BOOTSTRAP), layout=layout), released)
    assert (list(header.groups), header.replicates, header.mask, header.items, header.slot_bits) == \
        (list(GROUPS), 8, "ratio", 2, 96)
    assert list(header.suppressed_items) == [1] and list(header.small_groups) == ["b"]
    assert header.interval == "random_groups" and header.plain_rows == 9


def test_a_slot_of_a_constant_or_summed_weight_has_no_sensitivity():
    a = dataclasses.replace(audit(), layout=SimpleNamespace(slots=3))
    assert ri.slot_scales(a, Item(0, 0), [7, (0, 1)], []) == [0, 0, 0]
    assert ri.slot_scales(a, Item(1, 0), [7, (0, 1)], []) == [0, 0, 0]


def test_squared_components_are_scaled_to_the_second_moments_noise():
    layout = SimpleNamespace(n_components=3, position=lambda c: (0, c))
    assert ri.square_scales(layout, Item(0, 0), [1, 1, 2], 2, 3.0) == [1, 1, 6.0]
    assert ri.square_scales(layout, Item(0, 1), [1, 1, 2], 2, 3.0) == [1, 1, 2]  # another ciphertext


# ---------------------------------------------------------------- apart from the session
def test_step_6_never_receives_the_session_nor_writes_to_it(monkeypatch):
    """Every step of `release_items` that an audit runs gets explicit values: no argument
    (nor a field of one) is the session or one of its methods, and no attribute of the
    session is set while a step runs."""
    from tests.helpers import local_audit, make_inputs

    def held(value, depth=0) -> bool:
        if isinstance(value, TesterSession) or isinstance(getattr(value, "__self__", None), TesterSession):
            return True
        if depth < 2 and dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(held(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
        return False

    running, seen = [], set()

    def watched(name, fn):
        @functools.wraps(fn)
        def step(*args, **kwargs):
            assert not any(held(v) for v in (*args, *kwargs.values())), f"{name} received the session"
            seen.add(name)
            running.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                running.pop()
        return step

    for name, fn in inspect.getmembers(ri, inspect.isfunction):
        if fn.__module__ == ri.__name__:
            monkeypatch.setattr(ri, name, watched(name, fn))
    real_setattr = TesterSession.__setattr__

    def guarded(self, name, value):
        assert not running, f"{running[-1]} set the session's {name}"
        real_setattr(self, name, value)
    monkeypatch.setattr(TesterSession, "__setattr__", guarded)
    tester, client = make_inputs(60, 60, 40)
    for release in (ReleasePolicy.off(), ReleasePolicy(rho=4.0, budget=4.0, min_intersection=1)):
        report, _, _ = local_audit(tester, client, release=release)
        assert report.groups
    assert {"audit_plan", "order_rows", "sum_buckets", "weigh", "suppress_small", "bucket_sums", "release",
            "item_noise", "mask_items", "header"} <= seen


def test_the_module_imports_no_session():
    import ast
    tree = ast.parse(inspect.getsource(ri))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "tester_service.protocol" not in imported and "tester_service.server" not in imported


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_the_plan_is_built_once_per_audit(monkeypatch, recipient):
    from tests.helpers import local_audit, make_inputs
    built = []
    real = ri.audit_plan
    monkeypatch.setattr(ri, "audit_plan", lambda a: built.append(1) or real(a))
    tester, client = make_inputs(60, 60, 40)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=1, result_recipient=recipient)
    local_audit(tester, client, spec=spec)
    assert built == [1]
