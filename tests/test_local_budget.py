"""The privacy budget of local audits (tester_service/release.py: `local_identity`,
`local_accountant`; ppre/commands/audit.py; ppre/api.py). In `ppre audit --local` the
user holds both datasets: the noise stays (results look as in production), and the
budget is kept per pair of input files, so a third audit of one pair is refused while
another pair is not. Every refusal names where the spent budget is kept and the flag
that changes it. The Python API spends and records exactly as the CLI does."""
from __future__ import annotations

import json

import pytest

from ppre import AuditFailed, audit_local
from ppre.cli import main as ppre_main
from tester_service.history import RunHistory, local_history_path
from tester_service.release import (LOCAL_IDENTITY_PREFIX, BudgetExhausted, PrivacyAccountant, local_identity,
                                    local_ledger_path)
from tests.helpers import make_inputs


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """HOME and XDG_DATA_HOME of a fresh user: where the ledger and the history go."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path


def _pair(root, seed: int):
    """A probability table and a probabilistic-count dataset (no HE: a fast audit)."""
    tester, client = make_inputs(300, 300, 300, seed=seed)
    tp, cp = root / f"p{seed}.csv", root / f"c{seed}.csv"
    tester.to_csv(tp, index=False)
    client[["member_id"]].to_csv(cp, index=False)
    return tp, cp


def _cli(capsys, tp, cp, *extra) -> dict:
    code = ppre_main(["audit", "--local", "--json", "--insecure", "--metric", "prob-count",
                      "--tester-probabilities", str(tp), "--client-data", str(cp), *extra])
    out = json.loads(capsys.readouterr().out)
    assert (code == 0) == ("error" not in out)
    return out


def test_the_local_ledger_is_per_pair_of_input_files(user_home, capsys):
    a, b = _pair(user_home, 1), _pair(user_home, 2)
    assert "error" not in _cli(capsys, *a, "--history", "none")
    assert "error" not in _cli(capsys, *a, "--history", "none")
    refused = _cli(capsys, *a, "--history", "none")["error"]
    ledger = local_ledger_path()
    assert refused["code"] == "privacy_budget_exhausted"
    assert str(ledger) in refused["message"]
    assert "--privacy-budget" in refused["message"] and "--privacy-ledger" in refused["message"]
    # another pair of inputs has its own budget; a copy of pair a's files shares a's
    assert "error" not in _cli(capsys, *b, "--history", "none")
    copy = user_home / "copy"
    copy.mkdir()
    for path in a:
        (copy / path.name).write_bytes(path.read_bytes())
    assert _cli(capsys, copy / a[0].name, copy / a[1].name, "--history", "none")["error"]["code"] == \
        "privacy_budget_exhausted"
    # the ledger holds a digest per pair and the rho spent: no member id, no path
    spent = json.loads(ledger.read_text())
    assert spent == {local_identity((a[0], None), a[1]): pytest.approx(0.4),
                     local_identity((b[0], None), b[1]): pytest.approx(0.2)}
    assert all(k.startswith(LOCAL_IDENTITY_PREFIX) for k in spent) and "m000" not in ledger.read_text()


def test_an_explicit_ledger_file_is_named_in_the_refusal(user_home, capsys):
    tp, cp = _pair(user_home, 3)
    ledger = user_home / "elsewhere" / "ledger.json"
    flags = ("--privacy-ledger", str(ledger), "--noise-rho", "0.4", "--history", "none")
    assert "error" not in _cli(capsys, tp, cp, *flags)
    refused = _cli(capsys, tp, cp, *flags)["error"]
    assert refused["code"] == "privacy_budget_exhausted" and str(ledger) in refused["message"]
    assert not local_ledger_path().exists()


def test_one_privacy_identity_shares_a_budget_across_pairs(user_home, capsys):
    """--privacy-identity charges every local audit to one identity, as a Tester charges
    a Test-Client's certificate identity whatever it submits (the attack harness runs so)."""
    a, b, c = _pair(user_home, 4), _pair(user_home, 5), _pair(user_home, 6)
    flags = ("--privacy-identity", "rehearsal", "--history", "none")
    assert "error" not in _cli(capsys, *a, *flags)
    assert "error" not in _cli(capsys, *b, *flags)
    refused = _cli(capsys, *c, *flags)["error"]
    assert refused["code"] == "privacy_budget_exhausted" and "--privacy-identity" in refused["message"]
    assert json.loads(local_ledger_path().read_text()) == {"rehearsal": pytest.approx(0.4)}
    # without it, the third pair has its own budget
    assert "error" not in _cli(capsys, *c, "--history", "none")


def test_a_service_refusal_says_the_budget_is_in_memory():
    accountant = PrivacyAccountant(0.2)
    accountant.charge("client.example", 0.2)
    with pytest.raises(BudgetExhausted) as refused:
        accountant.charge("client.example", 0.2)
    assert "in memory" in str(refused.value) and "--privacy-budget" in str(refused.value) \
        and "--privacy-ledger" in str(refused.value)


def test_the_api_spends_the_budget_and_keeps_the_history_as_the_cli_does(user_home, capsys):
    """`audit_local` on files charges the same ledger entry as `ppre audit --local` on
    them (two audits at the defaults, then refused, whichever of the two asks), and
    keeps each result in the same run history."""
    tp, cp = _pair(user_home, 4)
    first = audit_local(cp, probabilities=tp, metric="prob-count")
    assert first.release["rho"] == pytest.approx(0.2) and first.release["budget_left"] == pytest.approx(0.2)
    assert "error" not in _cli(capsys, tp, cp)  # the CLI's audit: the pair's second
    with pytest.raises(AuditFailed) as refused:
        audit_local(cp, probabilities=tp, metric="prob-count")
    assert refused.value.code == "privacy_budget_exhausted"
    assert str(local_ledger_path()) in refused.value.message and "privacy_budget=" in refused.value.message
    assert json.loads(local_ledger_path().read_text()) == {local_identity((tp, None), cp): pytest.approx(0.4)}
    runs = RunHistory(local_history_path()).list()
    assert len(runs) == 2 and {r.metric for r in runs} == {"prob-count"}
    # without controls nothing is spent; history=False keeps nothing
    audit_local(cp, probabilities=tp, metric="prob-count", release_controls=False, history=False)
    assert len(RunHistory(local_history_path()).list()) == 2


def test_the_api_on_dataframes_has_a_budget_per_pair_of_frames(user_home):
    tester, client = make_inputs(300, 300, 300, seed=5)
    pools = client[["member_id"]]
    for _ in range(2):
        audit_local(pools, probabilities=tester, metric="prob-count", history=False)
    with pytest.raises(AuditFailed, match="privacy_budget_exhausted"):
        audit_local(pools, probabilities=tester, metric="prob-count", history=False)
    other = pools.iloc[:250]
    assert audit_local(other, probabilities=tester, metric="prob-count", history=False).n_matched == 250
    ledger = user_home / "mine.json"
    assert audit_local(pools, probabilities=tester, metric="prob-count", history=False, privacy_ledger=ledger,
                       privacy_budget=1.0).release["budget_left"] == pytest.approx(0.8)


def test_the_local_ledger_lives_in_the_users_data_directory(tmp_path, monkeypatch):
    """$XDG_DATA_HOME/ppre/privacy-ledger.json, else ~/.local/share/ppre/privacy-ledger.json,
    the run history beside it (the suite's conftest points XDG_DATA_HOME at a temporary
    directory, so the fallback is checked here on its own: a mutation run found it unpinned)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert local_ledger_path() == tmp_path / "data" / "ppre" / "privacy-ledger.json"
    assert local_history_path() == tmp_path / "data" / "ppre" / "history.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local_ledger_path() == tmp_path / "home" / ".local" / "share" / "ppre" / "privacy-ledger.json"
    assert local_history_path() == tmp_path / "home" / ".local" / "share" / "ppre" / "history.sqlite"


@pytest.mark.parametrize("text, why", [
    ("[0.1]", "not a JSON object"),
    ('{"a": -0.1}', "'spent' is not an object of identity: spent rho"),
    ('{"spent": {"a": true}}', "'spent' is not an object of identity: spent rho"),
    ('{"spent": {"a": 0.1}, "refusals": {"a": 1.5}}', "'refusals' is not an object of identity: refused audits"),
    ("{not json", "Expecting property name"),
])
def test_a_ledger_that_is_not_one_is_refused_naming_the_file_and_why(tmp_path, text, why):
    """A privacy ledger that is not the accountant's is refused before any audit, the error
    naming the file and what is wrong with it (never read as a fresh, empty budget)."""
    from common.errors import InputError
    path = tmp_path / "ledger.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as refused:
        PrivacyAccountant(0.4, path)
    message = str(refused.value)
    assert str(path) in message and "cannot be read as a privacy ledger" in message and why in message
    assert path.read_text(encoding="utf-8") == text  # left as it was


def test_a_local_identity_is_the_prefix_and_16_hex_digits_of_the_inputs_digest():
    import re
    tester, client = make_inputs(30, 30, 30, seed=5)
    identity = local_identity([tester, None], client)
    assert re.fullmatch(re.escape(LOCAL_IDENTITY_PREFIX) + "[0-9a-f]{16}", identity), identity
    assert local_identity([tester, None], client) == identity
    assert local_identity([tester, None], client.iloc[1:]) != identity


@pytest.mark.parametrize("text, spent, refusals", [
    ('{"a": 0.0, "b": 0.2}', {"a": 0.0, "b": 0.2}, {}),                      # the flat form: no refusals
    ('{"spent": {"a": 0.1}}', {"a": 0.1}, {}),                                 # refusals absent: none
    ('{"spent": {"a": 0.1, "b": 0}, "refusals": {"b": 2}}', {"a": 0.1, "b": 0.0}, {"b": 2}),
    ('{"spent": {"a": 0.1}, "refusals": {"a": 0}}', {"a": 0.1}, {"a": 0}),
])
def test_a_ledger_in_either_form_is_read_as_written(tmp_path, text, spent, refusals):
    path = tmp_path / "ledger.json"
    path.write_text(text, encoding="utf-8")
    accountant = PrivacyAccountant(0.4, path)
    assert {k: accountant.spent(k) for k in spent} == spent
    assert {k: accountant.refusals(k) for k in spent} == {k: refusals.get(k, 0) for k in spent}


def test_the_ledger_is_saved_beside_itself_not_in_the_system_temp_directory(tmp_path, monkeypatch):
    """The accountant writes the ledger to a temporary file in the ledger's own directory
    and renames it into place (a rename is atomic only within one filesystem): with the
    system's temporary directory gone, a charge still saves, and nothing else is left."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    path = tmp_path / "ledgers" / "ledger.json"
    path.parent.mkdir()
    accountant = PrivacyAccountant(0.4, path)
    accountant.charge("client-a", 0.2)
    assert PrivacyAccountant(0.4, path).spent("client-a") == pytest.approx(0.2)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.json"]


def test_a_ledger_save_that_fails_says_why_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """When the rename into place fails (a full disk, a read-only directory), the charge
    fails with that error and the half-written temporary file is removed."""
    import os
    path = tmp_path / "ledger.json"
    accountant = PrivacyAccountant(0.4, path)

    def no_space(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space left on device"):
        accountant.charge("client-a", 0.2)
    assert list(tmp_path.iterdir()) == []
