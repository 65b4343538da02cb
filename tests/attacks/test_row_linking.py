"""(B) The curious Tester's row linkers (`row_linking`): what the linked rows give it."""
from __future__ import annotations

import math

import pytest

from tests.attacks import row_linking
from tests.attacks.row_linking import Read, TesterView
from tester_service.release import ReleasePolicy
from tests.helpers import one_key_inline_chunks
from common.metrics.lot import Lot

@pytest.fixture(scope="module", autouse=True)
def fast_crypto():
    with one_key_inline_chunks():
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> row_linking.Setup:
    return row_linking.make_setup(tmp_path_factory.mktemp("row-linking-population"))


def assert_rows_carry_nothing(view: TesterView, read: Read) -> None:
    """The Test-Client's rows reach the Tester with ids and ciphertexts only, and what the
    linked rows give a label decoder is the blind guess."""
    print(read)
    assert view.row_columns == set(), f"plaintext per-row columns reached the Tester: {sorted(view.row_columns)}"
    assert view.plaintext() == {}, sorted(view.plaintext())
    assert read.recovered <= read.margin, read


def test_the_blob_linker_links_every_joined_row_and_values_link_most(setup):
    """Inherent to the design (the Tester opens its own vectors): a Tester that remembers
    its blobs links every joined row; one that only recomputes BISG links every joined
    member neither in Self-ID nor clipped. No link is wrong."""
    view, _ = row_linking.run(setup, "ero")
    blob, vector = row_linking.linking(setup, view, "blob"), row_linking.linking(setup, view, "vector")
    print(blob, vector, sep="\n")
    assert blob.joined == row_linking.JOINED and blob.linked == blob.joined and blob.wrong == 0
    assert blob.joined / 2 < vector.linked < vector.joined and vector.wrong == 0
    # every blob came back byte for byte: the shuffled table is the upload, reordered
    assert sorted(view.shuffled) == sorted(view.uploaded)


@pytest.mark.parametrize("metric", ["ero", "output", "mqos-ndcg", "pot"])
def test_linked_rows_carry_only_ciphertexts_under_the_defaults(setup, metric):
    view, frame = row_linking.run(setup, metric)
    read = row_linking.decode_labels(setup, view, row_linking.truth(metric, frame), metric)
    assert_rows_carry_nothing(view, read)
    assert read.recovered == read.blind  # no plaintext at all: the decoder's guess is the blind one


def test_a_label_sent_as_a_plaintext_stratum_is_caught(setup, monkeypatch):
    """The defence removed: ERO sends each row's y_true beside it as a plaintext stratum.
    The linker reads every label, and the check above fails."""
    row_linking.label_as_stratum(monkeypatch)
    view, frame = row_linking.run(setup, "ero")
    read = row_linking.decode_labels(setup, view, row_linking.truth("ero", frame), "ero, label as stratum")
    print(read)
    assert view.row_columns == {"strata"}
    assert read.recovered == read.total > read.margin, read
    with pytest.raises(AssertionError, match="strata"):
        assert_rows_carry_nothing(view, read)


def test_lot_linked_rows_give_no_rank_pairs(setup, monkeypatch):
    """Under the defaults no LOT row reaches the Tester (`common.metrics.lot`, "The Tester
    blind to the pairs"): the Test-Client's members arrive one at a time, with ciphertexts
    under the Tester's key and its own, no rank pair, no second member; the Tester links
    the members it holds (inherent) and reads no rank pair. With the defence removed
    (the rows as the plaintext path sends them: both members and the rank pair) every
    joined row gives both members and their ranks (measured: 240 of 240 rows, 60 lists of
    5; blind: the commonest rank pair, 60)."""
    view, frame = row_linking.run(setup, "lot")
    read = row_linking.read_lot(setup, view, frame)
    print(read)
    assert view.row_columns == set() and view.plaintext() == {}, (view.row_columns, sorted(view.plaintext()))
    assert len(view.blobs) == 1 and row_linking.linking(setup, view, "blob").linked == len(view.blobs[0])
    assert read.recovered <= read.margin, read
    monkeypatch.setattr(Lot, "blind_pairs", False)
    exposed_view, _ = row_linking.run(setup, "lot", frame=frame)
    exposed = row_linking.read_lot(setup, exposed_view, frame)
    print("defence removed:", exposed)
    assert "strata" in exposed_view.row_columns and exposed.recovered == exposed.total > exposed.margin, exposed


def test_exact_auc_linked_rows_give_no_score_order(setup):
    """Under the defaults each row's score bin travels inside its ciphertexts (design
    §5.6, "Score bins"): the rows reach the Tester with ids and ciphertexts only, and the
    order the Tester holds (the rows' arrival) says nothing of the scores. With the
    defence removed (the controls off: the rows carry their dense score rank) the linked
    members' ranks are their scores' order (measured: Spearman 1.0 over 240 members)."""
    view, frame = row_linking.run(setup, "mqos-auc")
    rho, n = row_linking.read_exact_auc(setup, view, frame)
    print(f"MQOS-AUC exact: Spearman {rho:.3f} of the score order over {n} linked members")
    assert view.row_columns == set() and view.plaintext() == {}, (view.row_columns, sorted(view.plaintext()))
    assert abs(rho) <= 3.0 / math.sqrt(n - 1), rho
    off, _ = row_linking.run(setup, "mqos-auc", release=ReleasePolicy.off(), frame=frame)
    exposed, _ = row_linking.read_exact_auc(setup, off, frame)
    print(f"controls off: Spearman {exposed:.3f}")
    assert off.row_columns == {"strata"} and exposed > 0.99, exposed


def test_prob_count_linked_rows_give_no_pools(setup):
    """Under the defaults the pools travel inside the encrypted values (each row's pool
    as a one-hot vector of encrypted 0/1 components, design §5.8): the rows reach the
    Tester with ids and ciphertexts only, and the pool reader gets nothing. With the
    defence removed (the controls off: the Tester computes the count from plaintext
    pools) it reads every linked member's pool (measured: 240 of 240; blind: the
    commonest pool, 198)."""
    view, frame = row_linking.run(setup, "prob-count")
    read = row_linking.read_pools(setup, view, frame)
    assert_rows_carry_nothing(view, read)
    assert read.recovered == 0
    off, _ = row_linking.run(setup, "prob-count", release=ReleasePolicy.off(), frame=frame)
    exposed = row_linking.read_pools(setup, off, frame)
    print(exposed)
    assert off.row_columns == {"strata"} and exposed.recovered == exposed.total > exposed.margin, exposed
