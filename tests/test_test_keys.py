"""The test-key setting (`PPRE_TEST_KEY_BITS`, `common.crypto.paillier.test_key_bits`): the
one way a test makes the services and the commands run on smaller Paillier keys. It is
read where keys are made, refused when it is not a test key size, said wherever it is in
force, and without it every key is a production one.

The suite itself runs with it set (tests/conftest.py); the tests here set and unset it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.crypto import paillier
from common.errors import InputError
from ppre.cli import main as ppre_main
from tests.helpers import write_inputs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value", ["512", "1023", "2048", "4096", "big", "10e2", "-1024"])
def test_a_value_that_is_no_test_key_size_is_refused_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv(paillier.TEST_KEY_ENV, value)
    with pytest.raises(InputError, match=rf"parameter 'PPRE_TEST_KEY_BITS': expected a test key size in bits "
                                         rf"from 1024 to 2047, got '{value}' \(unset it for production keys\)"):
        paillier.test_key_bits()


def test_unset_or_empty_means_production_keys_and_no_label(monkeypatch):
    monkeypatch.delenv(paillier.TEST_KEY_ENV, raising=False)
    assert paillier.test_key_bits() is None and paillier.test_keys_label() is None
    monkeypatch.setenv(paillier.TEST_KEY_ENV, " ")
    assert paillier.test_key_bits() is None
    monkeypatch.setenv(paillier.TEST_KEY_ENV, "1536")
    assert paillier.test_key_bits() == 1536
    assert paillier.test_keys_label() == ("TEST KEYS: PPRE_TEST_KEY_BITS=1536, every Paillier key is 1536 bits "
                                          "(insecure: for tests only)")


def _made_key_sizes(monkeypatch) -> list[int]:
    """The modulus sizes of the Paillier keys this process makes (the real generator, watched)."""
    made: list[int] = []
    real = paillier.generate_keypair

    def watched(bits=paillier.MIN_MODULUS_BITS, **kw):
        key = real(bits, **kw)
        made.append(key.public.n.bit_length())
        return key
    monkeypatch.setattr(paillier, "generate_keypair", watched)
    return made


def _local_audit(tmp_path: Path, capsys) -> tuple[int, str, str]:
    tmp_path.mkdir()
    _, _, probabilities, outputs = write_inputs(tmp_path, 300, 300, seed=3)
    code = ppre_main(["audit", "--local", "--json", "--metric", "ero", "--metric-option", "fpr",
                      "--tester-probabilities", str(probabilities),
                      "--client-data", str(outputs), "--bootstrap", "20", "--seed", "1",
                      "--no-release-controls", "--insecure", "--history", "none"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_a_local_audit_makes_test_keys_only_where_the_variable_says_so_and_says_so(tmp_path, monkeypatch, capsys):
    made = _made_key_sizes(monkeypatch)
    monkeypatch.setenv(paillier.TEST_KEY_ENV, "1024")
    code, out, err = _local_audit(tmp_path / "test", capsys)
    assert code == 0, err
    assert "TEST KEYS: PPRE_TEST_KEY_BITS=1024" in err
    assert made and set(made) == {1024}
    made.clear()
    monkeypatch.delenv(paillier.TEST_KEY_ENV)
    code, out, err = _local_audit(tmp_path / "production", capsys)
    assert code == 0, err
    assert "TEST KEYS" not in err
    assert made and set(made) == {2048}


def test_a_command_refuses_a_bad_test_key_size_before_any_service_starts(tmp_path):
    _, _, probabilities, outputs = write_inputs(tmp_path, 50, 50, seed=3)
    env = dict(os.environ, PPRE_TEST_KEY_BITS="256")
    proc = subprocess.run([sys.executable, "-m", "ppre.cli", "audit", "--local", "--metric", "ero",
                           "--tester-probabilities", str(probabilities), "--client-data", str(outputs),
                           "--insecure"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "ppre audit: error: parameter 'PPRE_TEST_KEY_BITS': expected a test key size" in proc.stderr
    assert "audit id" not in proc.stderr and proc.stdout == ""
