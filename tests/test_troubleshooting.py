"""docs/troubleshooting.md quotes the messages `ppre` really prints.

Each case runs the CLI as a user would (a process, in a fresh folder, with its own data
directory) on a bad input, and checks that a fragment of the message it prints is also
quoted in docs/troubleshooting.md: when a message changes, the page must change with
it. The cases that need no audit are fast; those that run one are slow.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tester_service.release import INTERSECTION_REFUSAL
from tests.helpers import free_loopback_port

PAGE = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"

MEMBERS = "member_id,surname,zip\nm1,Smith,60614\nm2,Garcia,90012\nm3,Nguyen,02134\n"
SURVEY = "member_id,race\nm1,white\nm2,hispanic\n"
OUTPUTS = "Member ID,y_true,prediction\nm1,0,1\nm2,0,0\nm3,1,1\n"


def _ppre(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_DATA_HOME": str(cwd / "xdg")}
    return subprocess.run([sys.executable, "-m", "ppre.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _check(done: subprocess.CompletedProcess, fragment: str) -> None:
    printed = done.stdout + done.stderr
    assert done.returncode != 0, printed[-2000:]
    assert fragment in printed, f"the CLI no longer prints {fragment!r}:\n{printed[-2000:]}"
    assert fragment in PAGE.read_text(encoding="utf-8"), f"docs/troubleshooting.md does not quote {fragment!r}"


@pytest.fixture()
def files(tmp_path) -> Path:
    (tmp_path / "members.csv").write_text(MEMBERS, encoding="utf-8")
    (tmp_path / "crm.csv").write_text(MEMBERS.replace("member_id", "Member ID", 1), encoding="utf-8")
    (tmp_path / "survey.csv").write_text(SURVEY, encoding="utf-8")
    (tmp_path / "badrace.csv").write_text(SURVEY + "m3,asian\n", encoding="utf-8")
    (tmp_path / "outputs.csv").write_text(OUTPUTS, encoding="utf-8")
    return tmp_path


LOCAL = ["audit", "--local", "--insecure", "--metric", "ero"]


def test_a_missing_column(files):
    done = _ppre([*LOCAL, "--tester-members", "crm.csv", "--client-data", "outputs.csv"], files)
    _check(done, "column 'member_id': required column is missing")
    _check(done, "map it: --tester-id-column NAME")  # the flag of this command, not the service's


def test_a_misspelt_metric(files):
    done = _ppre([*LOCAL, "--metric", "mqos-acu", "--tester-members", "members.csv", "--client-data", "outputs.csv"],
                 files)
    _check(done, "unknown metric 'mqos-acu' (did you mean 'mqos-auc'?)")


def test_a_mapping_to_a_column_the_file_lacks(files):
    done = _ppre(["client", "check-config", "--data-only", "--dataset", "ero=outputs.csv", "--id-column", "Member ID",
                  "--column", "y_pred=predicton"], files)
    _check(done, "column mapping: y_pred=predicton: no dataset has a column 'predicton'")


def test_an_unknown_race_label(files):
    done = _ppre([*LOCAL, "--tester-members", "members.csv", "--tester-self-id", "badrace.csv",
                  "--client-data", "outputs.csv"], files)
    _check(done, "unknown race label; expected one of white, black, api, aian, multiple, hispanic")


def test_no_certificates(files):
    done = _ppre(["audit", "--tester", f"127.0.0.1:{free_loopback_port()}", "--client-dataset", "ero",
                  "--metric", "ero"], files)
    _check(done, "no TLS certificates: give --tls-dir DIR")


def test_nothing_listening(files):
    done = _ppre(["audit", "--insecure", "--tester", f"127.0.0.1:{free_loopback_port()}", "--client-dataset", "ero",
                  "--metric", "ero", "--timeout", "20"], files)
    _check(done, "error (unavailable): Tester at 127.0.0.1:")
    _check(done, "cannot be reached or went away")


# --------------------------------------------------------------------------- cases that run audits

@pytest.fixture(scope="module")
def population(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("troubleshooting")
    done = _ppre(["synth", "--members", "1000", "--seed", "1", "--out", "pop"], cwd)
    assert done.returncode == 0, done.stderr
    ero = (cwd / "pop" / "client" / "ero.csv").read_text(encoding="utf-8").splitlines()
    (cwd / "small.csv").write_text("\n".join(ero[:51]) + "\n", encoding="utf-8")
    (cwd / "dup.csv").write_text("\n".join([*ero, ero[1]]) + "\n", encoding="utf-8")
    (cwd / "other_ids.csv").write_text("\n".join([ero[0], *("x" + row for row in ero[1:])]) + "\n", encoding="utf-8")
    label = ero[1].rsplit(",", 2)
    (cwd / "badlabel.csv").write_text("\n".join([ero[0], f"{label[0]},2,{label[2]}", *ero[2:]]) + "\n",
                                      encoding="utf-8")
    return cwd


def _audit(population: Path, data: str, *more: str) -> subprocess.CompletedProcess:
    return _ppre([*LOCAL, "--tester-members", "pop/members.csv", "--tester-self-id", "pop/self_id.csv",
                  "--client-data", data, "--bootstrap", "20", *more], population)


@pytest.mark.slow
def test_too_small_an_intersection(population):
    _check(_audit(population, "small.csv"), INTERSECTION_REFUSAL)


@pytest.mark.slow
def test_the_privacy_budget_spent(population):
    ledger = ["--privacy-ledger", str(population / "ledger.json")]
    for _ in range(2):
        assert _audit(population, "pop/client/ero.csv", *ledger).returncode == 0
    done = _audit(population, "pop/client/ero.csv", *ledger)
    _check(done, "error (privacy_budget_exhausted): the privacy budget of Test-Client 'local inputs ")
    _check(done, "(--privacy-budget sets the budget, --privacy-ledger FILE keeps it in another file")


@pytest.mark.slow
@pytest.mark.parametrize("data, fragment", [
    # a local run's operator holds both files: ids that match nothing are said so, before encrypting
    # (a service answers with the same words as a small intersection: test_services.py)
    ("other_ids.csv", "column 'member_id': no member id matched: none of its ids is among the members of"),
    ("dup.csv", "column 'member_id', data row 1001: duplicate member id (the same as data row 1)"),
    ("badlabel.csv", "label must be 0 or 1"),
])
def test_bad_model_outputs(population, data, fragment):
    _check(_audit(population, data, "--no-release-controls"), fragment)


# --------------------------------------------------------------------------- cases against running services

@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Test-Client and a Tester (no run history) as `ppre ... serve` processes over
    mutual TLS, with one dataset, `ero`."""
    from tests.processes import make_client, make_tester, write_dataset

    base = tmp_path_factory.mktemp("troubleshooting-services")
    dataset = write_dataset(base / "data", 200, 200, 200)
    client = make_client(base, dataset).start()
    tester = make_tester(base, dataset, client.address).start()
    try:
        client.wait_healthy()
        tester.wait_healthy()
        yield base, tester, client
    finally:
        tester.close()
        client.close()


def _operator(argv: list[str], cwd: Path, certs: list[str] | None = None) -> subprocess.CompletedProcess:
    from tests.processes import dev_cert_dir
    return _ppre([*argv, *(certs if certs is not None else ["--tls-dir", str(dev_cert_dir())])], cwd)


@pytest.mark.slow
def test_tester_given_the_test_clients_address(services):
    base, _, client = services
    done = _operator(["audit", "--tester", client.address, "--client-dataset", "ero", "--metric", "ero"], base)
    _check(done, "is a Test-Client (its certificate names 'client.ppre.local'); --tester needs the address of the Tester")


@pytest.mark.slow
def test_a_certificate_not_on_the_allow_list(services):
    from tests.processes import dev_cert_dir
    base, tester, _ = services
    certs = dev_cert_dir()
    done = _operator(["audit", "--tester", tester.address, "--client-dataset", "ero", "--metric", "ero"], base,
                     ["--ca", str(certs / "ca.pem"), "--cert", str(certs / "client.pem"), "--key", str(certs / "client.key")])
    _check(done, "peer identity 'client.ppre.local' is not an allow-listed operator (--allow-operator)")


@pytest.mark.slow
def test_an_unknown_dataset_and_no_run_history(services):
    base, tester, _ = services
    done = _operator(["audit", "--tester", tester.address, "--client-dataset", "nosuch", "--metric", "ero"], base)
    _check(done, "Test-Client: parameter 'client dataset': unknown dataset '")
    done = _operator(["runs", "list", "--tester", tester.address], base)
    _check(done, "this Tester keeps no run history (start it with --history FILE)")


@pytest.mark.slow
def test_a_second_service_on_a_busy_port(services):
    from tests.processes import dev_cert_dir
    base, _, client = services
    host, port = client.address.rsplit(":", 1)
    done = _ppre(["client", "serve", "--host", host, "--port", port, "--data-dir", str(base / "data"),
                  "--tls-dir", str(dev_cert_dir())], base)
    _check(done, "another service already listens there; pick another --port (or --host), or stop the other service first")
