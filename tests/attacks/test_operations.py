"""Operations attacks (docs/operations.md): what an attacker gets from the machines and files
around an audit rather than from its results.

- **Core dump.** A local audit (`ppre audit --local`: both parties' tables and keys in one
  process) that crashes must not write its memory to disk: the process is not dumpable and
  its core-size limit is 0 (`common.execution.memory.protect_process`), even where the shell allowed
  cores (`ulimit -c unlimited`).
- **Ledger reset.** A Test-Client that spent its privacy budget must not get it back when
  the Tester restarts: `ppre tester serve` with release noise refuses to start without a
  ledger file (or an explicit `--ephemeral-budget`), and with the ledger a third audit is
  still refused after a restart.
- **Audit-log truncation and re-chaining.** Whoever can write the audit log must not be
  able to remove its last records or rewrite one and re-chain the rest unnoticed: records
  carry an HMAC under a key kept elsewhere, and the head exported beside the key anchors
  the tail (tester_service.audit_log).

Each attack is shown to succeed with its defence removed.
"""
from __future__ import annotations

import json
import resource
import secrets
from pathlib import Path

import pytest

from common.errors import InputError
from ppre.cli import build_parser
from ppre.cli import main as ppre_main
from tester_service import audit_log as al
from tester_service.release import BudgetExhausted
from tests.helpers import write_inputs
from tests.protection import HOOK, run_protected

#: population seed of these tests' datasets (the attack harness uses others)
SEED = 37


# --------------------------------------------------------------------------- core dump
CRASH = r'''
import json, os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))  # the operator's shell: `ulimit -c unlimited`
import tester_service.inputs as inputs
_read = inputs.read_probability_table
def read_then_crash(*args, **kwargs):
    table = _read(*args, **kwargs)  # the members' probabilities are in memory now
    _note("crash")
    print("PROTECTION " + json.dumps(_notes), file=sys.stderr, flush=True)
    os.abort()
inputs.read_probability_table = read_then_crash
from ppre.cli import main
sys.exit(main(sys.argv[1:]))
'''


def _cores_are_files() -> bool:
    """Whether this machine writes a crashed process's core as a file in its working
    directory (`core_pattern` not a pipe) and lets a child raise its core-size limit."""
    try:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return False
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    return bool(pattern) and not pattern.startswith("|") and "/" not in pattern and hard != 0


def _crash_local_audit(tmp_path: Path, *, unprotected: bool):
    work = tmp_path / ("unprotected" if unprotected else "protected")
    work.mkdir()
    _, _, tp, cp = write_inputs(work, 150, 120, seed=SEED)
    run = run_protected(CRASH, ["audit", "--local", "--metric", "ero", "--tester-probabilities", str(tp),
                                "--client-data", str(cp), "--no-release-controls", "--insecure",
                                "--history", "none", "--executor", "inline"],
                        cwd=work, unprotected=unprotected, timeout=300)
    cores = [p for p in work.iterdir() if p.name.startswith("core")]
    member = b"m000007"  # a member id of the Tester's table (tests.helpers.make_inputs)
    leaked = any(member in p.read_bytes() for p in cores)
    for p in cores:
        p.unlink()  # a core holds every member id: never leave it behind
    return run, cores, leaked


@pytest.mark.slow
def test_a_crashed_local_audit_writes_no_core(tmp_path):
    run, cores, _ = _crash_local_audit(tmp_path, unprotected=False)
    assert run.returncode != 0 and run.notes and run.notes[-1]["where"] == "crash", run.stderr
    crash = run.notes[-1]
    assert crash["dumpable"] == 0 and crash["core"] == [0, 0], crash
    assert cores == []


@pytest.mark.slow
def test_without_the_protection_a_crash_dumps_the_members(tmp_path):
    run, cores, leaked = _crash_local_audit(tmp_path, unprotected=True)
    crash = run.notes[-1]
    assert crash["where"] == "crash" and crash["dumpable"] == 1, run.notes  # the defence, removed
    if _cores_are_files():  # where the kernel writes cores as files, the attack's prize is on disk
        assert cores and leaked, run.stderr[-2000:]


# --------------------------------------------------------------------------- ledger reset
def _serve_args(*flags: str):
    """`ppre tester serve FLAGS` parsed, over a probability table of its own (the
    population its budget is charged to is read from the file)."""
    import tempfile
    table = Path(tempfile.mkdtemp(prefix="ppre-operations-")) / "p.csv"
    table.write_text("member_id,white,black\nm1,0.5,0.5\n", encoding="utf-8")
    return build_parser().parse_args(["tester", "serve", "--probabilities", str(table), *flags])


def _spend_across_a_restart(flags: tuple[str, ...]) -> list[str]:
    """The Tester's release settings as `ppre tester serve FLAGS` builds them, twice (a
    restart between): the outcome of two audits, then one more after the restart."""
    from ppre.commands.tester import release_settings
    outcomes = []
    for audits in (2, 1):  # the service's first life, then its life after the restart
        policy, accountant = release_settings(_serve_args(*flags))
        for _ in range(audits):
            try:
                accountant.charge("client.ppre.local", policy.rho)
                outcomes.append("released")
            except BudgetExhausted:
                outcomes.append("refused")
    return outcomes


def test_a_service_with_noise_refuses_to_start_without_a_ledger(capsys):
    from ppre.commands.tester import release_settings
    with pytest.raises(InputError) as err:
        release_settings(_serve_args())
    assert "--privacy-ledger" in str(err.value) and "--ephemeral-budget" in str(err.value)
    # through the command: exit 2, one line naming both flags, nothing served
    assert ppre_main(["tester", "serve", "--port", "0", "--probabilities", "p.csv", "--insecure"]) == 2
    out = capsys.readouterr()
    assert "--privacy-ledger FILE" in out.err and "--ephemeral-budget" in out.err and "serving" not in out.out


def test_check_config_names_the_missing_ledger(tmp_path, capsys):
    _, _, tp, _ = write_inputs(tmp_path, 20, 10, seed=SEED)
    base = ["tester", "check-config", "--probabilities", str(tp), "--insecure", "--json"]
    ppre_main(base)
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("--privacy-ledger FILE" in p and "--ephemeral-budget" in p for p in problems), problems
    ppre_main(base + ["--privacy-ledger", str(tmp_path / "ledger.json")])
    assert not any("--ephemeral-budget" in p for p in json.loads(capsys.readouterr().out)["problems"])


def test_with_a_ledger_a_restart_keeps_the_budget(tmp_path):
    assert _spend_across_a_restart(("--privacy-ledger", str(tmp_path / "ledger.json"))) == \
        ["released", "released", "refused"]


def test_without_the_refusal_a_restart_resets_the_budget(monkeypatch, capsys):
    """The attack with the defence removed: a service that starts without a ledger
    answers a third audit after a restart (as `--ephemeral-budget` says out loud)."""
    assert _spend_across_a_restart(("--ephemeral-budget",)) == ["released", "released", "released"]
    assert "--ephemeral-budget" in capsys.readouterr().err  # the opt-in is announced
    monkeypatch.setattr("ppre.commands.tester.require_ledger", lambda args, policy: None)
    assert _spend_across_a_restart(()) == ["released", "released", "released"]


def test_no_noise_or_no_limit_needs_no_ledger():
    from ppre.commands.tester import release_settings
    for flags in (("--no-release-controls",), ("--noise-rho", "0"),
                  ("--privacy-budget", "inf", "--population-budget", "inf")):
        _, accountant = release_settings(_serve_args(*flags))
        assert accountant is not None


@pytest.mark.slow
def test_a_restarted_service_refuses_the_third_audit(tmp_path):
    """Through real services: two audits, a restart of the Tester (same ledger file), and
    the third audit is refused for its budget."""
    from proto import ppre_pb2 as pb
    from tester_service.server import run_audit
    from tests.processes import make_client, make_tester, write_dataset

    dataset = write_dataset(tmp_path / "data", 200, 200, 150, seed=SEED)
    ledger = tmp_path / "state" / "ledger.json"
    ledger.parent.mkdir()
    client = make_client(tmp_path, dataset)
    tester = make_tester(tmp_path, dataset, client.address, release_controls=True,
                         extra=["--privacy-ledger", str(ledger)])

    def audit():
        return run_audit(tester.address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10),
                         timeout=240, tls=tester.tls, server_name=tester.server_name)
    try:
        client.start().wait_healthy()
        tester.start().wait_healthy()
        first, second = audit(), audit()
        assert first.WhichOneof("event") == second.WhichOneof("event") == "result", (first, second)
        tester.close()
        tester.start().wait_healthy()
        third = audit()
        assert third.WhichOneof("event") == "error" and third.error.code == "privacy_budget_exhausted", third
    finally:
        tester.close()
        client.close()


# --------------------------------------------------------------------------- audit log
def _keyed_log(tmp_path: Path, records: int = 4):
    """A keyed log in one directory, its key (and exported head) in another."""
    log_path, key_path = tmp_path / "state" / "audit.log", tmp_path / "keys" / "audit-log.key"
    log_path.parent.mkdir()
    log = al.AuditLog.keyed(log_path, key_path)
    for i in range(records):
        log.append({"metric": "ero", "n": i})
    return log_path, key_path


def _drop_last(path: Path) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")


def _rechain(path: Path, forge) -> None:
    """Change record 2 and re-link every record from there on: `forge(prev, entry)` sets
    the entry's link and returns it (the attacker's best: it has no key)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[1]["record"]["n"] = 99
    prev = entries[0].get("mac", entries[0].get("hash"))
    for entry in entries[1:]:
        entry["prev"] = prev
        prev = forge(prev, entry)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


def _plain_link(prev, entry) -> str:
    """The unkeyed format's link, which needs no key."""
    entry.pop("mac", None)
    entry["hash"] = al.record_hash(prev, entry["seq"], entry["time"], entry["record"])
    return entry["hash"]


def _verify_cli(log_path: Path, key_path: Path | None, capsys) -> tuple[int, str]:
    argv = ["log", "verify", str(log_path)] + (["--key", str(key_path)] if key_path else [])
    code = ppre_main(argv)
    return code, capsys.readouterr().out


def test_a_truncated_tail_is_detected(tmp_path, capsys):
    log_path, key_path = _keyed_log(tmp_path)
    assert _verify_cli(log_path, key_path, capsys)[0] == 0
    _drop_last(log_path)
    code, out = _verify_cli(log_path, key_path, capsys)  # the head beside the key is read by default
    assert code == 1 and "truncated" in out and "3 records" in out, out
    # the head exported elsewhere by hand (`ppre log head`) catches it too
    result = al.verify(log_path, al.load_key(key_path), (4, al.parse_head(str(al.head_path(key_path)))[1]))
    assert not result.ok and "truncated" in result.reason


def test_without_the_anchor_a_truncated_tail_passes(tmp_path):
    """The attack with the defence removed: a keyed chain alone (no head), or the older
    unkeyed chain, is still intact after its last record is dropped."""
    log_path, key_path = _keyed_log(tmp_path)
    _drop_last(log_path)
    assert al.verify(log_path, al.load_key(key_path)).ok
    plain = tmp_path / "plain.log"
    for i in range(4):
        al.AuditLog(plain).append({"n": i})
    _drop_last(plain)
    assert al.verify(plain).ok


@pytest.mark.parametrize("forgery", ["plain hashes", "another key"])
def test_an_edited_and_rechained_log_is_detected(tmp_path, capsys, forgery):
    log_path, key_path = _keyed_log(tmp_path)
    guess = secrets.token_bytes(al.KEY_BYTES)

    def another_key(prev, entry):
        entry["mac"] = al.record_mac(guess, prev, entry["seq"], entry["time"], entry["record"])
        return entry["mac"]
    _rechain(log_path, _plain_link if forgery == "plain hashes" else another_key)
    code, out = _verify_cli(log_path, key_path, capsys)
    assert code == 1 and "BROKEN at record at line 2" in out, out


def test_an_anchored_unkeyed_chain_detects_rechaining_too(tmp_path):
    """The head alone catches a rewrite: the last record is no longer the one it names."""
    plain = tmp_path / "plain.log"
    for i in range(4):
        al.AuditLog(plain).append({"n": i})
    head = (4, al.verify(plain).last)
    _rechain(plain, _plain_link)
    assert al.verify(plain).ok  # the chain alone is intact ...
    result = al.verify(plain, None, head)
    assert not result.ok and result.broken_line == 4 and "rewritten" in result.reason, result


def test_without_the_key_an_edited_and_rechained_log_passes(tmp_path, capsys):
    """The attack with the defence removed: the older plain hash chain, rewritten from
    record 2 on, verifies as intact."""
    plain = tmp_path / "plain.log"
    for i in range(4):
        al.AuditLog(plain).append({"n": i})
    _rechain(plain, _plain_link)
    code, out = _verify_cli(plain, None, capsys)
    assert code == 0 and "chain intact" in out and '"n": 99' in plain.read_text()
