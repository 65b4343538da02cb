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
from tester_service.release import (DEFAULT_POPULATION_BUDGET, LOCAL_IDENTITY_PREFIX, POPULATION_PREFIX,
                                    BudgetExhausted, PrivacyAccountant, local_identity, local_ledger_path,
                                    population_key)
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


def _ledger(path=None) -> tuple[dict, dict]:
    """(ρ spent per identity, ρ spent per population) in a ledger file of either form."""
    data = json.loads((path or local_ledger_path()).read_text())
    if isinstance(data.get("spent"), dict):
        return data["spent"], data.get("populations", {})
    return data, {}


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
    # the ledger holds a digest per pair and per population and the rho spent: no member id, no path
    spent, populations = _ledger()
    assert spent == {local_identity((a[0], None), a[1]): pytest.approx(0.4),
                     local_identity((b[0], None), b[1]): pytest.approx(0.2)}
    assert populations == {population_key((a[0], None)): pytest.approx(0.4),
                           population_key((b[0], None)): pytest.approx(0.2)}
    assert all(k.startswith(LOCAL_IDENTITY_PREFIX) for k in spent) and "m000" not in ledger.read_text()
    assert all(k.startswith(POPULATION_PREFIX) for k in populations)


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
    assert _ledger()[0] == {"rehearsal": pytest.approx(0.4)}
    # without it, the third pair has its own budget
    assert "error" not in _cli(capsys, *c, "--history", "none")


def test_six_test_client_files_on_the_same_members_meet_the_populations_budget(user_home, capsys):
    """Every Test-Client file is an identity of its own with a fresh budget, but all of
    them together spend on one population, the Tester's members: under the defaults
    (ρ 0.2 an audit, 1.0 on a population) the sixth file's first audit is refused, the
    refusal naming the population's bound, not the file's."""
    tester, client = make_inputs(300, 300, 300, seed=7)
    tp = user_home / "members.csv"
    tester.to_csv(tp, index=False)
    outcomes = []
    for n in range(6):
        cp = user_home / f"client{n}.csv"
        client[["member_id"]].sample(frac=1.0, random_state=n).to_csv(cp, index=False)
        outcomes.append(_cli(capsys, tp, cp, "--history", "none"))
    refused = [o["error"] for o in outcomes if "error" in o]
    assert len(refused) == 1 and "error" in outcomes[5], outcomes
    assert refused[0]["code"] == "privacy_budget_exhausted"
    assert "the Tester's members" in refused[0]["message"] and "--population-budget" in refused[0]["message"]
    spent, populations = _ledger()
    assert len(spent) == 5 and populations == {population_key((tp, None)): pytest.approx(DEFAULT_POPULATION_BUDGET)}
    # a larger population budget lets the sixth through; its own identity's budget was untouched
    assert "error" not in _cli(capsys, tp, user_home / "client5.csv", "--history", "none",
                               "--population-budget", "1.2")


def test_the_population_bound_holds_across_identities_and_spends_nothing_when_refused(tmp_path):
    ledger = tmp_path / "ledger.json"
    accountant = PrivacyAccountant(0.4, ledger, population="population p", population_budget=0.5)
    accountant.charge("a", 0.2)
    accountant.charge("b", 0.2)
    with pytest.raises(BudgetExhausted, match=r"Tester's members \(population p\).*0\.5.*0\.1 is left"):
        accountant.check("c", 0.2)
    with pytest.raises(BudgetExhausted, match="--population-budget"):
        accountant.charge("c", 0.2)
    assert accountant.spent("c") == 0.0 and accountant.population_spent() == pytest.approx(0.4)
    accountant.charge("c", 0.1)  # what is left of the population's
    again = PrivacyAccountant(0.4, ledger, population="population p", population_budget=0.5)  # a restart keeps it
    assert again.population_spent() == pytest.approx(0.5)
    other = PrivacyAccountant(0.4, ledger, population="population q", population_budget=0.5)
    other.charge("a", 0.2)  # another population: its own bound (the identity's own still counts)
    with pytest.raises(BudgetExhausted, match="Test-Client 'a'"):
        other.charge("a", 0.2)


def test_a_service_is_charged_to_the_population_of_its_input_files(tmp_path):
    """`ppre tester serve`'s accountant counts every Test-Client's audits against the
    population of its --probabilities (or --members and --self-id) files."""
    from ppre.cli import build_parser
    from ppre.commands.tester import release_settings
    tester, _ = make_inputs(30, 30, 30, seed=8)
    tp = tmp_path / "p.csv"
    tester.to_csv(tp, index=False)
    args = build_parser().parse_args(["tester", "serve", "--probabilities", str(tp), "--ephemeral-budget",
                                      "--population-budget", "0.6"])
    _, accountant = release_settings(args)
    accountant.charge("a", 0.2)
    accountant.charge("b", 0.2)
    accountant.charge("c", 0.2)
    with pytest.raises(BudgetExhausted, match=population_key((tp, None))):
        accountant.charge("d", 0.2)


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
    assert _ledger()[0] == {local_identity((tp, None), cp): pytest.approx(0.4)}
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
    ('{"spent": {"a": 0.1}, "populations": {"p": -1}}', "'populations' is not an object of population: spent rho"),
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


@pytest.mark.parametrize("value", ["0", "-0.5", "nan"])
def test_a_population_budget_that_is_not_positive_is_refused_naming_the_flag(user_home, capsys, value):
    tp, cp = _pair(user_home, 9)
    code = ppre_main(["audit", "--local", "--metric", "prob-count", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--population-budget", value, "--history", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "--population-budget" in err and "must be above 0" in err
    assert not local_ledger_path().exists()  # nothing spent, nothing written


def test_a_negative_population_refusal_limit_is_refused_naming_the_flag(user_home, capsys):
    tp, cp = _pair(user_home, 9)
    code = ppre_main(["audit", "--local", "--metric", "prob-count", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--max-population-refusals", "-1", "--history", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "--max-population-refusals" in err and "whole number" in err
    assert not local_ledger_path().exists()


def test_the_population_refusal_limit_is_the_operators_on_the_command_line_and_in_the_api(user_home, capsys):
    """`--max-population-refusals 0`: the Tester's members have had as many refused audits as
    the operator allows, so the audit is refused before any work, naming the population's
    bound; the library call takes the same limit."""
    tp, cp = _pair(user_home, 9)
    code = ppre_main(["audit", "--local", "--metric", "prob-count", "--tester-probabilities", str(tp),
                      "--client-data", str(cp), "--max-population-refusals", "0", "--history", "none", "--json"])
    out = capsys.readouterr().out
    assert code != 0 and json.loads(out)["error"]["code"] == "refusal_limit_reached"
    with pytest.raises(AuditFailed) as failed:
        audit_local(cp, probabilities=tp, metric="prob-count", max_population_refusals=0, history=False)
    assert failed.value.code == "refusal_limit_reached" and "population" in str(failed.value)
    assert audit_local(cp, probabilities=tp, metric="prob-count", history=False).verdict.severity  # default: answered
