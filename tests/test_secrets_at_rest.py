"""Keys never at rest (design §7): no key, mask or member-level value in logs
(DEBUG included), exception messages, tracebacks, repr/str of key objects or sessions,
temporary files or pickles; Paillier decryption on worker processes gets a narrow task
(`PrivateKey.decrypt_task()`: p and h_p), never the private key.

In process, every key a session draws is captured as it is generated (Paillier p, q,
lambda, phi; both X25519 scalars; the AES key; the RO salt; the mask factors and pads),
and everything observable is searched for it in decimal, hex, base64 and byte form. As
OS processes (`tests.processes`, services at -vv), everything the services wrote (logs,
working directory = TMPDIR = HOME, audit log) is searched for every member id and
probability, through a finished audit, a bad dataset, a Test-Client that refuses its
input and an audit cancelled midway.
"""
from __future__ import annotations

import base64
import copy
import json
import logging
import math
import os
import pickle
import re
import signal
import tempfile
import traceback
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from client_service import protocol as client_protocol
from client_service.datasets import DatasetRegistry
from common.execution import parallel
from common.crypto import commutative, paillier, symmetric
from common.errors import PPREError
from common.crypto.masking import AdditiveMask, RatioMask
from common.races import RACES
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.demographics import randomized_response
from tester_service.demographics.preparation import PreparationConfig
from tester_service.inputs import read_probability_table
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.release import ReleasePolicy
from tester_service.server import run_audit
from tests.helpers import TEST_BITS, make_inputs, run_sessions, wait_until, write_inputs


# --------------------------------------------------------------------------- what to search for

def _int_forms(x: int) -> list[str]:
    return [str(x), format(x, "x"), format(x, "X")]


def _bytes_forms(b: bytes) -> list[str]:
    return [b.hex(), b.hex().upper(), base64.b64encode(b).decode().rstrip("="),
            base64.urlsafe_b64encode(b).decode().rstrip("="), repr(b)[2:-1],
            str(int.from_bytes(b, "big")), str(int.from_bytes(b, "little"))]


def _int_bytes(x: int) -> list[bytes]:
    size = (x.bit_length() + 7) // 8
    return [x.to_bytes(size, "big"), x.to_bytes(size, "little")]


@dataclass
class Captured:
    """Every secret the sessions of one test drew, recorded as it was generated."""

    paillier: list = field(default_factory=list)
    com: list = field(default_factory=list)
    sealers: list = field(default_factory=list)
    aes: list = field(default_factory=list)
    salts: list = field(default_factory=list)
    ratio: list = field(default_factory=list)
    additive: list = field(default_factory=list)

    def key_ints(self) -> dict[str, int]:
        out = {}
        for i, k in enumerate(self.paillier):
            p, q = k.p, k.q
            out.update({f"p{i}": p, f"q{i}": q, f"lambda{i}": math.lcm(p - 1, q - 1), f"phi{i}": (p - 1) * (q - 1),
                        f"h_p{i}": int(pow((p - 1) * q % p, -1, p))})
        return out

    def key_bytes(self) -> dict[str, bytes]:
        out = {f"x25519-{i}": k._key.private_bytes_raw() for i, k in enumerate(self.com)}
        out.update({f"aes-{i}": k for i, k in enumerate(self.aes)})
        out.update({f"salt-{i}": bytes(s) for i, s in enumerate(self.salts)})
        return out

    def mask_ints(self) -> dict[str, int]:
        out = {f"r{i}": m.r for i, m in enumerate(self.ratio)}
        out.update({f"pad{i}.{j}": p for i, m in enumerate(self.additive) for j, p in enumerate(m.pads)})
        return out

    def key_text(self) -> dict[str, str]:
        """name -> a textual form of a key (not masks: the Tester keeps pads as plain ints by design)."""
        out = {f"{name} ({form})": text for name, x in self.key_ints().items()
               for form, text in zip(("dec", "hex", "HEX"), _int_forms(x))}
        out.update({f"{name} #{j}": text for name, b in self.key_bytes().items()
                    for j, text in enumerate(_bytes_forms(b))})
        return out

    def all_text(self) -> dict[str, str]:
        out = self.key_text()
        out.update({f"{name} ({form})": text for name, x in self.mask_ints().items()
                    for form, text in zip(("dec", "hex", "HEX"), _int_forms(x))})
        return out

    def secret_objects(self) -> list:
        return [*self.paillier, *self.com, *self.sealers, *self.salts, *self.ratio, *self.additive]


@pytest.fixture()
def captured(monkeypatch) -> Captured:
    """Record every key, salt and mask the sessions generate (the generators are wrapped)."""
    cap = Captured()
    gen_paillier = paillier.generate_keypair
    gen_com = commutative.CommutativeKey.generate
    gen_sealer = symmetric.RowSealer.generate
    salt = commutative.session_salt
    draw_ratio, draw_additive = RatioMask.draw, AdditiveMask.draw

    def record(kind, value):
        getattr(cap, kind).append(value)
        return value

    class RecordingAESGCM:  # what RowSealer.generate calls: keep a copy of the key
        @staticmethod
        def generate_key(bit_length):
            return record("aes", AESGCM.generate_key(bit_length=bit_length))

        def __new__(cls, key):
            return AESGCM(key)

    monkeypatch.setattr(paillier, "generate_keypair", lambda *a, **kw: record("paillier", gen_paillier(*a, **kw)))
    monkeypatch.setattr(commutative.CommutativeKey, "generate", classmethod(lambda cls: record("com", gen_com())))
    monkeypatch.setattr(symmetric, "AESGCM", RecordingAESGCM)
    monkeypatch.setattr(symmetric.RowSealer, "generate", classmethod(lambda cls: record("sealers", gen_sealer())))
    monkeypatch.setattr(commutative, "session_salt", lambda *a: record("salts", salt(*a)))
    monkeypatch.setattr(RatioMask, "draw", classmethod(lambda cls: record("ratio", draw_ratio())))
    monkeypatch.setattr(AdditiveMask, "draw",
                        classmethod(lambda cls, n, bits: record("additive", draw_additive(n, bits))))
    return cap


@dataclass
class Workers:
    run_dir: Path
    executor: parallel.ProcessExecutor


@pytest.fixture()
def workers(monkeypatch, tmp_path):
    """Two worker processes (so the chunk functions really cross a process boundary), an
    empty working directory that is also TMPDIR and HOME; the pool is gone afterwards."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for var in ("TMPDIR", "HOME"):
        monkeypatch.setenv(var, str(run_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.chdir(run_dir)
    executor = parallel.ProcessExecutor(2)
    try:
        yield Workers(run_dir, executor)
    finally:
        executor.shutdown()


def _leaks(text: str, needles: dict[str, str]) -> list[str]:
    return [name for name, needle in needles.items() if needle and needle in text]


def _exception_text(exc: BaseException) -> str:
    """What a log line, a traceback or a peer's Abort could show of an exception."""
    return "".join(traceback.format_exception(exc)) + repr(exc.args) + str(exc)


# --------------------------------------------------------------------------- key objects

def test_key_objects_print_no_secret_and_refuse_pickling():
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    com = commutative.CommutativeKey.generate()
    sealer = symmetric.RowSealer.generate()
    salt = commutative.session_salt(os.urandom(32), os.urandom(32))
    ratio, additive = RatioMask.draw(), AdditiveMask.draw(3, 100)
    p, q = key.p, key.q
    secrets_text = [*_int_forms(p), *_int_forms(q), *_int_forms(math.lcm(p - 1, q - 1)),
                    *_bytes_forms(com._key.private_bytes_raw()), *_bytes_forms(bytes(salt)),
                    *_int_forms(ratio.r), *(t for pad in additive.pads for t in _int_forms(pad))]
    for obj in (key, com, sealer, salt, ratio, additive, key.decrypt_task(), key.decrypt_task(signed=True)):
        shown = [repr(obj), str(obj), f"{obj}", "%s %r" % (obj, obj), repr([obj]), repr({"k": obj})]
        assert all("secret" in s for s in shown[:3]), shown
        assert not [s for s in secrets_text if any(s in text for text in shown)], type(obj).__name__
    for obj in (key, com, sealer, salt, ratio, additive):
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError):
                how(obj)
    assert f"{key.public.n.bit_length()}-bit" in repr(key)
    # the salt is still the bytes both parties hash with
    assert len(salt) == 32 and salt == bytes(salt) and salt.hex() == bytes(salt).hex()
    assert commutative.hash_ids(salt, ["a"]) == commutative.hash_ids(bytes(salt), ["a"])


def test_the_randomized_response_epoch_secret_prints_as_secret_and_refuses_pickling():
    """The Tester's randomized-response secret (design §2.3) is a key object like the others."""
    epoch = randomized_response.ResponseEpoch.new()
    secret_text = _bytes_forms(bytes(epoch._secret))
    shown = [repr(epoch), str(epoch), f"{epoch}", "%s %r" % (epoch, epoch), repr([epoch]),
             repr(PreparationConfig(epoch=epoch))]
    assert all("<secret>" in s for s in shown[:4]), shown
    assert not [s for s in secret_text if any(s in text for text in shown)]
    for how in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError):
            how(epoch)
    with pytest.raises(TypeError):
        pickle.dumps(PreparationConfig(epoch=epoch))


def test_no_randomized_response_secret_in_debug_logs_output_or_files(monkeypatch, tmp_path, caplog, capfd,
                                                                     workers):
    """A Tester preparing from members and a Self-ID survey (`TesterConfig.from_members`, as
    `ppre tester serve` does), both services in this process at DEBUG, two finished audits
    and a rotation: every epoch secret made is captured, and neither the logs, stdout/stderr
    nor any file under the working directory/TMPDIR/HOME holds it in any form; the epochs'
    fingerprints are logged (so the search looked at the lines that name them)."""
    from ppre.synth import SynthConfig, synthesize
    from tester_service.demographics import preparation
    from tester_service.server import TesterConfig
    caplog.set_level(logging.DEBUG)
    made: list = []  # (secret, fingerprint) of every epoch, as it is made
    new = randomized_response.ResponseEpoch.new

    def recording_new(cls):
        epoch = new()
        made.append((bytes(epoch._secret), epoch.fingerprint))
        return epoch
    monkeypatch.setattr(randomized_response.ResponseEpoch, "new", classmethod(recording_new))
    monkeypatch.setattr(preparation, "_epoch", None)  # this test's own process epoch
    data = synthesize(SynthConfig(members=400, seed=17, self_id_share=0.5))
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    data.members.to_csv(inputs / "members.csv", index=False)
    data.self_id.to_csv(inputs / "self_id.csv", index=False)
    data.ero.to_csv(inputs / "ero.csv", index=False)
    config = TesterConfig.from_members("unused", inputs / "members.csv", inputs / "self_id.csv",
                                       PreparationConfig())
    with local_services(config.load_probabilities, DatasetRegistry(named={"ero": inputs / "ero.csv"}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=ReleasePolicy(budget=math.inf),
                        executor=workers.executor) as svc:
        for rotate in (False, True):
            if rotate:
                preparation.rotate_epoch()
            event = _audit(svc.tester_address)
            assert event.WhichOneof("event") == "result", event
    assert len(made) == 2 and made[0][0] != made[1][0]
    out, err = capfd.readouterr()
    logs = caplog.text
    needles = {f"epoch {i} #{j}": text for i, (secret, _) in enumerate(made)
               for j, text in enumerate(_bytes_forms(secret))}
    assert all(fingerprint in logs for _, fingerprint in made)
    assert not _leaks(logs, needles)
    assert not _leaks(out + err, needles)
    assert [p for p in workers.run_dir.rglob("*")] == []
    assert _leaks(f"x {made[0][0].hex()} y", needles)  # the search would see one


def test_the_decryption_task_is_narrow_and_decrypts_like_the_key():
    """`decrypt_task()` carries p and h_p only: its pickle holds neither q, lambda nor phi,
    nor a PrivateKey; it decrypts (and decodes signed values) exactly as the key does."""
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public
    values = [0, 1, 12345, 2**200, -7, -(2**150)]
    cts = paillier.encrypt_chunk(pub.n, pub.h, [v % pub.n for v in values])
    task = key.decrypt_task()
    assert task(cts) == key.decrypt_mod_p(cts) == [v % key.p for v in values]
    signed = pickle.loads(pickle.dumps(key.decrypt_task(signed=True)))
    assert signed(cts) == values
    blob = pickle.dumps(task)
    p, q = key.p, key.q
    for name, x in (("q", q), ("lambda", math.lcm(p - 1, q - 1)), ("phi", (p - 1) * (q - 1)), ("n", pub.n)):
        assert not any(form in blob for form in _int_bytes(x)), name
        assert not any(form.encode() in blob for form in _int_forms(x)), name
    assert b"PrivateKey" not in blob and b"PublicKey" not in blob
    # an overflow (the middle third of Z_p) is reported without the value
    middle = paillier.encrypt_chunk(pub.n, pub.h, [key.p // 2])
    with pytest.raises(OverflowError) as info:
        signed(middle)
    assert str(key.p // 2) not in _exception_text(info.value)


def _walk(obj):
    yield obj
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _walk(item)


#: which narrow task may carry which secret to a worker (common.execution.parallel): the task made
#: for that one operation, never another, never a key object
TASK_SECRETS = {"p": (paillier.ModPDecryption, paillier.OwnerEncryption), "q": (paillier.OwnerEncryption,),
                "x25519": (commutative.ScalarMultiplication,), "salt": (commutative.HashToCurve,), "aes": ()}


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_worker_tasks_carry_no_private_key(monkeypatch, captured, workers, recipient):
    """Every chunk of an audit sent to a worker (both parties, two worker processes)
    pickles to bytes holding no lambda, phi or AES key, and no key object at all; p and q,
    an X25519 scalar or the salt travel only inside the one narrow task made for their
    operation (`TASK_SECRETS`)."""
    calls = []
    executor = workers.executor
    real = executor.submit

    def spy(fn, *args):  # every chunk that crosses to a worker goes through submit
        calls.append((fn, args, pickle.dumps((fn, args))))
        return real(fn, *args)
    monkeypatch.setattr(executor, "submit", spy)
    tester, client = make_inputs(150, 130, 120, seed=17)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=1, result_recipient=recipient)
    t = TesterSession(spec, tester, min_modulus_bits=TEST_BITS, executor=executor)
    c = client_protocol.ClientSession(lambda name, metric: client.copy(), modulus_bits=TEST_BITS,
                                      allow_insecure=True, executor=executor)
    try:
        run_sessions(t, c)
    finally:
        t.close()
        c.close()
    assert t.result is not None
    assert executor.started  # the chunks really went to worker processes
    assert len(captured.paillier) == 1 and calls
    kinds = {type(obj).__name__ for fn, args, _ in calls for obj in _walk((fn, *args))}
    # the per-row work really went there: both PSI steps, the encryption, the decryption
    assert {"ScalarMultiplication", "HashToCurve", "OwnerEncryption", "ModPDecryption"} <= kinds, kinds
    ints = captured.key_ints()
    never = {k: v for k, v in ints.items() if k.startswith(("lambda", "phi"))}
    assert len(never) == 2
    for fn, args, blob in calls:
        objects = list(_walk((fn, *args)))
        for obj in objects:
            assert not isinstance(obj, (paillier.PrivateKey, commutative.CommutativeKey, symmetric.RowSealer))
        for name, x in never.items():
            assert not any(form in blob for form in _int_bytes(x)), (name, fn)
        secrets_here = {f"{kind}0": x for kind, x in (("p", ints["p0"]), ("q", ints["q0"]))}
        for name, x in secrets_here.items():
            if any(form in blob for form in _int_bytes(x)):
                allowed = TASK_SECRETS[name[:-1]]
                assert any(isinstance(obj, allowed) for obj in objects), (name, fn)
        for name, b in captured.key_bytes().items():
            if b in blob:
                allowed = TASK_SECRETS[name.split("-")[0]]
                assert any(isinstance(obj, allowed) for obj in objects), (name, fn)


# --------------------------------------------------------------------------- logs, files, tracebacks

def _audit(address: str, dataset: str = "ero", **kw) -> pb.AuditEvent:
    return run_audit(address, pb.AuditRequest(metric=kw.pop("metric", "ero"), client_dataset=dataset,
                                              bootstrap=kw.pop("bootstrap", 15), has_seed=True, seed=2, **kw),
                     timeout=120)


def test_no_key_material_in_debug_logs_output_files_or_reprs(monkeypatch, tmp_path, captured, workers, caplog,
                                                              capfd):
    """Both services in this process (real gRPC, their servicers' logging) at DEBUG, on two
    worker processes: a finished audit for each result recipient, an unknown dataset, and
    an audit whose Test-Client fails internally midway (after decrypting: its traceback is
    logged). Logs, stdout/stderr (workers' included), tracebacks, files written under the
    working directory/TMPDIR/HOME, and repr/str of both sessions while they hold their keys
    contain no key, salt or mask."""
    caplog.set_level(logging.DEBUG)
    data = tmp_path / "data"
    data.mkdir()
    tester, client, tp, cp = write_inputs(data, 130, 120, seed=8)
    snapshots: list[str] = []
    sessions: list = []
    real_finish = client_protocol.ClientSession._finish

    def finish(self):  # both sessions while they hold every key (the Client decrypts next)
        for session in (self, sessions[-1]):
            snapshots.extend([repr(session), str(session), repr(vars(session))])
        return real_finish(self)

    def snapshot_tester(*a, **kw):
        session = real_tester(*a, **kw)
        sessions.append(session)
        return session
    import tester_service.server as tester_server
    real_tester = tester_server.TesterSession
    monkeypatch.setattr(tester_server, "TesterSession", snapshot_tester)
    monkeypatch.setattr(client_protocol.ClientSession, "_finish", finish)
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True,
                        release=ReleasePolicy(budget=math.inf), executor=workers.executor) as svc:
        def idle():
            return svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == []
        for recipient in ("client", "tester"):
            event = _audit(svc.tester_address, result_recipient=recipient)
            assert event.WhichOneof("event") == "result", event
            assert wait_until(idle)
        event = _audit(svc.tester_address, "no-such-dataset")
        assert event.error.code == "bad_input", event
        errors = [event.error.message]

        def broken(*a, **kw):
            raise RuntimeError("the finishing step failed")
        monkeypatch.setattr(client_protocol, "finish", broken)
        event = _audit(svc.tester_address)
        assert event.error.code == "internal", event
        errors.append(event.error.message)
        assert wait_until(idle)
    out, err = capfd.readouterr()
    logs = caplog.text
    assert "DEBUG" in logs and "the finishing step failed" in logs  # the traceback was logged
    # the captures saw every session: 3 reached the Test-Client's keys, 4 the Tester's
    assert len(captured.paillier) == 3 and len(captured.com) >= 7 and len(captured.aes) >= 4
    assert len(captured.salts) == 6 and (captured.ratio or captured.additive)
    needles = captured.all_text()
    assert not _leaks(logs, needles)
    assert not _leaks(out + err, needles)
    assert not _leaks("\n".join(errors), needles)
    assert [p for p in workers.run_dir.rglob("*")] == []
    assert not _leaks("\n".join(snapshots), captured.key_text())
    # the search would see them: a factor in hex, a scalar in base64, a salt as bytes
    assert _leaks(f"x {captured.paillier[0].q:x} y", needles)
    assert _leaks(base64.b64encode(captured.com[0]._key.private_bytes_raw()).decode(), needles)
    assert _leaks(repr(bytes(captured.salts[0])), needles)
    for member in set(tester.member_id) | set(client.member_id):
        assert member not in logs and member not in out + err


def test_protocol_errors_carry_no_secret_and_no_member_data(captured, workers):
    """Errors raised mid-protocol while every key is in use (an aggregate that decrypts to
    the overflow third at the Test-Client, on a worker; a sealed row that fails
    authentication at the Tester; a point off the curve) carry no key, plaintext, member
    id or probability in their message, args or traceback."""
    tester, client = make_inputs(140, 130, 120, seed=23)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=20, seed=3)

    def run(tamper) -> PPREError:
        t = TesterSession(spec, tester, min_modulus_bits=TEST_BITS, executor=workers.executor)
        c = client_protocol.ClientSession(lambda name, metric: client.copy(), modulus_bits=TEST_BITS,
                                          allow_insecure=True, executor=workers.executor)
        try:
            with pytest.raises(PPREError) as info:
                run_sessions(t, c, tap=lambda direction, msg: tamper(msg))
        finally:
            t.close()
            c.close()
        return info.value

    def overflow(msg):  # the first aggregate replaced by Enc(p // 2): decrypts into the middle third
        if msg.HasField("chunk") and msg.chunk.table == pb.AGGREGATES and not overflow.done:
            key = captured.paillier[-1]
            width = key.public.ciphertext_bytes
            n, n2 = key.public.n, key.public.n2
            ct = (1 + (key.p // 2) * n) % n2
            msg.chunk.ciphertexts = ct.to_bytes(width, "big") + msg.chunk.ciphertexts[width:]
            overflow.done = True
    overflow.done = False

    def sealed(msg):  # one bit of every sealed row (the Tester opens only the matched ones)
        if msg.HasField("chunk") and msg.chunk.table == pb.SHUFFLED_ROWS and msg.chunk.sealed:
            raw = bytearray(msg.chunk.sealed)
            width = len(raw) // msg.chunk.rows
            for start in range(0, len(raw), width):
                raw[start + 20] ^= 1
            msg.chunk.sealed = bytes(raw)

    def off_curve(msg):
        if msg.HasField("chunk") and msg.chunk.table == pb.TESTER_ROWS:
            twist = next(u for u in range(2, 1000) if not commutative._on_curve(u))
            msg.chunk.points = twist.to_bytes(32, "little") + msg.chunk.points[32:]

    texts = []
    for tamper, expected in ((overflow, "overflow"), (sealed, "authentication"), (off_curve, "not on Curve25519")):
        exc = run(tamper)
        text = _exception_text(exc)
        assert expected in str(exc), text
        texts.append(text)
    text = "\n".join(texts)
    assert not _leaks(text, captured.all_text())
    assert str(captured.paillier[0].p // 2) not in text
    for member in set(tester.member_id) | set(client.member_id):
        assert member not in text
    for value in tester[list(RACES)].to_numpy().ravel():
        assert repr(float(value)) not in text


# --------------------------------------------------------------------------- as OS processes

def _probability_patterns(table: pd.DataFrame) -> list[re.Pattern]:
    """Each probability as it would be printed: repr, str of numpy, %.6f, %g, %.4f ... with
    digit boundaries (a 6-decimal value inside a longer number is not that value)."""
    forms = set()
    for value in table[list(RACES)].to_numpy().ravel():
        v = float(value)
        for text in (repr(v), str(np.float64(v)), f"{v:.6f}", f"{v:g}", f"{v:.8f}", f"{v:.10g}"):
            if len(text.replace("0", "").replace(".", "")) >= 4:  # enough digits to mean something
                forms.add(text)
    return [re.compile(rf"(?<![\d.]){re.escape(f)}(?!\d)".encode()) for f in sorted(forms)]


@pytest.mark.slow
def test_services_as_processes_write_no_member_data_and_no_key_anywhere(tmp_path):
    """Both services as OS processes at -vv (DEBUG), each in an empty working directory that
    is also its TMPDIR and HOME, the Tester with an audit log: a finished audit, an unknown
    dataset, a dataset the Test-Client refuses (a row's label), and an audit the operator
    cancels midway (both parties hold all their keys then). Nothing is written in the run
    directories; the logs and the audit log hold no member id, no probability, no line of a
    TLS private key and nothing the size of a key."""
    from tests.processes import OperatorAudit, dev_cert_dir, make_client, make_tester, write_dataset

    dataset = write_dataset(tmp_path / "data", 200, 160, 130, seed=21)
    tester_df = pd.read_csv(dataset.probabilities, dtype={"member_id": str})
    client_df = pd.read_csv(dataset.client_dir / "ero.csv", dtype={"member_id": str})
    broken = client_df.copy()
    broken.loc[7, "y_true"] = 2
    broken.to_csv(dataset.client_dir / "broken.csv", index=False)
    audit_log = tmp_path / "state" / "audit.log"
    audit_log.parent.mkdir()
    audit_log_key = tmp_path / "keys" / "audit-log.key"  # outside the log's directory
    env = {"PPRE_WORKERS": "2"}
    client = make_client(tmp_path, dataset, env=env)
    client.argv_tail = ["-v", *client.argv_tail]  # `ppre -v -v`: DEBUG
    tester = None
    operators: list[OperatorAudit] = []
    try:
        client.start()
        client.wait_healthy()
        tester = make_tester(tmp_path, dataset, client.address, env=env,
                             extra=["--audit-log", str(audit_log), "--audit-log-key", str(audit_log_key),
                                    "--privacy-budget", "inf", "--population-budget", "inf"])
        tester.argv_tail = ["-v", *tester.argv_tail]
        tester.start()
        tester.wait_healthy()

        def audit(name, **kw):
            operators.append(OperatorAudit(tester.address, name, timeout=240, **kw))
            return operators[-1]

        ok = audit("ero", as_json=True, bootstrap=20).wait()
        assert ok.rc == 0 and ok.json and ok.json.get("n_matched") == 130, ok.describe()
        unknown = audit("nope", as_json=True).wait()
        assert unknown.error and unknown.error[0] == "bad_input", unknown.describe()
        refused = audit("broken", as_json=True).wait()
        assert refused.error and refused.error[0] == "bad_input" and "row" in refused.error[1], refused.describe()

        cancelled: list = []

        def cancel(progress):  # the operator goes away once the Tester joins the tables
            if progress.phase in ("psi_shuffled", "join", "aggregation", "bootstrap") and not cancelled:
                cancelled.append(progress.phase)
                os.killpg(operators[-1].proc.pid, signal.SIGKILL)
        midway = audit("ero", as_json=False, bootstrap=1000, on_progress=cancel).wait()
        assert cancelled and midway.rc != 0, midway.describe()
        outcomes = [ok, unknown, refused, midway]
        assert tester.wait_sessions(0, 60) and client.wait_sessions(0, 60), tester.log_tail() + client.log_tail()
    finally:
        for op in operators:
            op.kill()
        if tester is not None:
            tester.close()
        client.close()

    logs = {"tester log": tester.log_bytes(current=False), "client log": client.log_bytes(current=False),
            "audit log": audit_log.read_bytes()}
    assert b"DEBUG" in logs["tester log"] and b"DEBUG" in logs["client log"]
    assert b"audit cancelled by the operator" in logs["tester log"]  # the midway failure happened
    assert json.loads(audit_log.read_text().splitlines()[0])["record"]["outcome"]["status"] == "result"
    for service in (tester, client):
        written = service.written_files()
        assert written == [], written
    operator_text = "".join(o.stdout + o.stderr for o in outcomes).encode()
    members = [m.encode() for m in set(tester_df.member_id) | set(client_df.member_id)]
    for name, text in {**logs, "operator output": operator_text}.items():
        assert not [m for m in members if m in text], name
    patterns = _probability_patterns(tester_df)
    for name, text in logs.items():
        assert not [p.pattern for p in patterns if p.search(text)], name
    # nothing the size of a key: a Paillier factor is 309+ decimal digits (1024 bits), an
    # X25519 scalar or AES-256 key 64 hex digits; the audit log's own SHA-256 chain aside
    records = []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        entry.pop("mac"), entry.pop("prev")  # the log's own keyed chain
        entry["record"].get("outcome", {}).pop("result_sha256", None)
        records.append(json.dumps(entry))
    logs["audit log"] = "\n".join(records).encode()
    for name, text in logs.items():
        assert not re.search(rb"\d{64}", text), name
        assert not re.search(rb"[0-9a-fA-F]{64}", text), name
    # nor the services' TLS private keys (read from files outside their run directories)
    pem_lines = {line.encode() for key in dev_cert_dir().glob("*.key") for line in key.read_text().splitlines()
                 if len(line) >= 40 and not line.startswith("-----")}
    assert pem_lines
    for name, text in {**logs, "operator output": operator_text}.items():
        assert not [line for line in pem_lines if line in text], name


def test_logged_tracebacks_withhold_the_message_of_a_library_exception():
    """`ppre`'s log format keeps a traceback's frames but not the message of an exception
    that is not ours: a library's KeyError on a member id would otherwise log the id."""
    import io
    import logging

    from common.errors import InputError
    from ppre.cli import _WithheldMessages

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_WithheldMessages("%(message)s"))
    log = logging.getLogger("ppre.test.withheld")
    log.addHandler(handler)
    try:
        try:
            member = "M" + "000777"  # the source line a traceback shows must not spell it
            {}.__getitem__(member)
        except KeyError:
            log.exception("internal error")
        try:
            raise InputError("must be positive", parameter="tau")
        except InputError:
            log.exception("input")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "M000777" not in text and "KeyError (message withheld" in text
    assert "InputError: parameter 'tau': must be positive" in text  # ours are kept


# --------------------------------------------------------------------------- salt shares and peer payloads

def _payload_needles(shares: list[bytes], payloads: list[bytes]) -> dict[str, str]:
    """Textual forms of both salt shares and of a piece of every peer message's payload
    (the first 16 bytes of each bytes field: points, sealed rows, ciphertexts, keys),
    including protobuf's own text form of bytes (what logging a message would print)."""
    from google.protobuf import text_encoding
    out = {}
    for kind, items in (("share", shares), ("payload", payloads)):
        for i, b in enumerate(items):
            piece = b[:16]
            forms = _bytes_forms(piece) + [text_encoding.CEscape(piece, as_utf8=False)]
            out.update({f"{kind} {i} #{j}": text for j, text in enumerate(forms) if len(text) >= 12})
    return out


def _message_bytes(msg: pb.PeerMessage) -> list[bytes]:
    kind = msg.WhichOneof("body")
    body = getattr(msg, kind) if kind else None
    if body is None:
        return []
    return [value for field, value in body.ListFields() if isinstance(value, bytes) and len(value) >= 16]


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING])
def test_no_salt_share_or_peer_payload_in_the_logs_at_any_level(monkeypatch, tmp_path, caplog, capfd, level):
    """Both services in this process (real gRPC, their servicers' logging) at `level`: a
    finished audit's logs, stdout and stderr hold neither salt share (the RO salt's
    inputs) nor any piece of a peer message's payload."""
    from tester_service.protocol import TesterSession as RealTester
    monkeypatch.setenv("PPRE_WORKERS", "1")
    caplog.set_level(level)
    shares: list[bytes] = []
    payloads: list[bytes] = []
    salt = commutative.session_salt

    def recording_salt(tester_share, client_share):
        shares.extend([bytes(tester_share), bytes(client_share)])
        return salt(tester_share, client_share)

    def recording(receive):
        def spy(self, msg):
            payloads.extend(_message_bytes(msg))
            return receive(self, msg)
        return spy
    monkeypatch.setattr(commutative, "session_salt", recording_salt)
    monkeypatch.setattr(RealTester, "receive", recording(RealTester.receive))
    monkeypatch.setattr(client_protocol.ClientSession, "receive", recording(client_protocol.ClientSession.receive))
    data = tmp_path / "data"
    data.mkdir()
    _, _, tp, cp = write_inputs(data, 130, 120, seed=18)
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True,
                        release=ReleasePolicy(budget=math.inf)) as svc:
        event = _audit(svc.tester_address, result_recipient="client")
        assert event.WhichOneof("event") == "result", event
    out, err = capfd.readouterr()
    assert len(shares) == 4 and len(payloads) > 10  # both parties' salts; every table's chunks
    if level <= logging.INFO:  # the services' logs were captured
        assert "audit" in caplog.text
    needles = _payload_needles(shares, payloads)
    assert not _leaks(caplog.text, needles)
    assert not _leaks(out + err, needles)
    # the search would see them: a share in hex, a chunk as protobuf prints it
    assert _leaks(f"x {shares[0].hex()} y", needles)
    assert _leaks(str(pb.TableChunk(points=payloads[-1])), needles) or _leaks(repr(payloads[-1]), needles)
