"""Everything the Test-Client receives, per metric, against a neighbouring Tester table
(design §8: every field is a release).

For each metric the audit runs through both sessions under the release controls, once on
a Tester table and once on a neighbour of it: one member's probability vector replaced,
or the member with the most rows in the Test-Client's table removed from the Tester's.
Every message the Test-Client receives is reduced to its *skeleton*: which messages, in
which order, and every field that is not a ciphertext, an encrypted point or a value the
release noise already covers. The skeletons must be equal: the noise scales, the counts,
the flags and the lists the Test-Client reads may depend on its own data and on the
settings, never on what the Tester holds about one member.

Left out of the skeleton, each for a stated reason:

* ciphertexts and curve points: encrypted (semantic security, design §4); the audit id,
  random per session;
* `AggregatesHeader.small_groups`, `suppressed_items`, `unidentifiable`: decided on
  noised sizes and the released (noised) M, drawn from the audit's budget (design §8.2);
  `tests/test_release.py` checks that suppression reads the noised sizes;
* `AggregatesHeader.joined_members`: the count of distinct joined members plus the
  minimum intersection's own Gaussian draw (σ_i, design §8.2; its sd,
  `joined_members_sd`, a setting, stays in); `tests/test_joined_count_release.py` checks
  that it is that draw;
* on the removal neighbour only, the Tester's own PSI table (its row count is the size
  of the Tester's table, which PSI discloses by design: docs/threat-model.md).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from common.races import RACES
from proto import ppre_pb2 as pb
from tester_service.protocol import AuditSpec
from tester_service.release import ReleasePolicy
from tests.helpers import local_audit, make_inputs, one_key_inline_chunks
from tests.metric_data import random_ranked_lists

#: the controls on, without the size thresholds these small tables would not pass
NOISY = ReleasePolicy(min_intersection=1, min_effective_size=0.0)
#: decided on noised values (module docstring), or noised: the joined members' count the
#: minimum intersection was checked on (design §8.2)
NOISED_FIELDS = {"small_groups", "suppressed_items", "unidentifiable", "joined_members"}
#: drawn afresh by every session, whatever the data: the audit's random id
SESSION_FIELDS = {"audit_id"}
N_TESTER = 240


@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


def _client_frame(metric: str, tester: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """A dataset of `metric` over the first 200 Tester members and 40 outsiders, with one
    member (the target: `m000000`) in more rows than anyone else where rows may repeat."""
    ids = list(tester.member_id[:200]) + [f"x{i:06d}" for i in range(40)]
    n = len(ids)
    if metric == "ero":
        return pd.DataFrame({"member_id": ids, "y_true": rng.integers(0, 2, n), "y_pred": rng.integers(0, 2, n)})
    if metric == "output":
        return pd.DataFrame({"member_id": ids, "outcome": rng.random(n).round(3)})
    if metric == "pot":
        return pd.DataFrame({"member_id": ids, "score": rng.random(n).round(3), "outcome": rng.integers(0, 2, n)})
    if metric.startswith("mqos-auc"):
        return pd.DataFrame({"member_id": ids, "y_true": rng.integers(0, 2, n), "score": rng.random(n).round(3)})
    if metric == "prob-count":
        return pd.DataFrame({"member_id": ids, "pool": rng.choice(["a", "b"], n)})
    if metric == "mqos-ndcg":  # viewer lists: the target issues the most queries
        lists = random_ranked_lists(60, rng, min_len=2, max_len=4, viewers=200)
        lists.loc[lists.query_id.isin([f"q{q:06d}" for q in range(8)]), "member_id"] = "m000000"
        return lists
    lists = random_ranked_lists(60, rng, min_len=2, max_len=4, n_members=200)  # lot
    top = lists.query_id.isin([f"q{q:06d}" for q in range(10)]) & (lists["rank"] == 1)
    lists.loc[top, "member_id"] = "m000000"
    return lists.drop_duplicates(["query_id", "member_id"])


def _spec(metric: str) -> AuditSpec:
    name, _, option = metric.partition(":")
    return AuditSpec(metric=name, client_dataset="d", bootstrap=10, seed=1, metric_option=option)


def _skeleton(message, *, skip_tester_table: bool) -> tuple | None:
    """The message's kind and its fields that are neither encrypted nor noised."""
    kind = message.WhichOneof("body")
    body = getattr(message, kind)
    if skip_tester_table and kind in ("chunk", "table_end") and body.table == pb.TESTER_ROWS:
        return None
    fields = []
    for field, value in body.ListFields():
        if field.type == F.TYPE_BYTES or field.name in NOISED_FIELDS | SESSION_FIELDS:
            continue
        if field.type == F.TYPE_MESSAGE:
            value = str(value)
        elif not isinstance(value, (str, int, float, bool)):
            value = tuple(value.items()) if hasattr(value, "items") else tuple(value)
        fields.append((field.name, value))
    return kind, tuple(fields)


def _received(metric: str, tester: pd.DataFrame, client: pd.DataFrame, *, skip_tester_table=False) -> list:
    seen: list = []

    def tap(direction, message):
        if direction == "to_client":
            seen.append(message)

    report, _, _ = local_audit(tester, client, spec=_spec(metric), tap=tap, release=NOISY, n_buckets=32)
    assert report is not None
    return [s for s in (_skeleton(m, skip_tester_table=skip_tester_table) for m in seen) if s is not None]


METRICS = ["ero", "output", "pot", "mqos-auc:exact", "mqos-auc:sampled", "mqos-ndcg", "lot", "prob-count"]


@pytest.mark.parametrize("metric", METRICS)
def test_what_the_test_client_receives_does_not_move_with_one_members_vector(metric):
    tester, _ = make_inputs(N_TESTER, 10, 0, seed=31)
    client = _client_frame(metric, tester, np.random.default_rng(32))
    neighbour = tester.copy()
    neighbour.loc[0, list(RACES)] = np.eye(len(RACES))[3]  # the target's vector, replaced
    assert _received(metric, tester, client) == _received(metric, neighbour, client)


@pytest.mark.parametrize("metric", ["lot", "mqos-ndcg", "mqos-auc:sampled"])
def test_the_noise_scales_do_not_tell_whether_the_busiest_member_joined(metric):
    """The target is the member with the most rows: counted on the joined rows alone, the
    noise scale (`noise_sd`) and the release's `member_rows_max` would tell whether the
    Tester holds it. They are counted over the Test-Client's whole table."""
    tester, _ = make_inputs(N_TESTER, 10, 0, seed=33)
    client = _client_frame(metric, tester, np.random.default_rng(34))
    without = tester.iloc[1:].reset_index(drop=True)
    with_target = _received(metric, tester, client, skip_tester_table=True)
    without_target = _received(metric, without, client, skip_tester_table=True)
    headers = [dict(f) for kind, f in with_target if kind == "aggregates_header"]
    assert headers and headers[0].get("noise_sd"), "the release carries its noise scales"
    assert with_target == without_target
