"""What a new user meets starting the two services: a data directory that is a typo
(or holds nothing) is refused before the port opens, with one line naming it; both
services listen on 127.0.0.1 unless `--host` says otherwise, and their start-up line
says where; the compose file still has them listen on the container's interface.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_loopback_port
from tests.processes import child_env, ppre_argv

REPO = Path(__file__).resolve().parents[1]
RACES_HEADER = "member_id,white,black,api,aian,multiple,hispanic\n"


def ppre(*args: str, cwd: Path, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([*ppre_argv(), *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=cwd)


def first_line(argv: list[str], cwd: Path) -> str:
    """The start-up line of a service (its first line on stdout); the service is then stopped."""
    proc = subprocess.Popen([*ppre_argv(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(), cwd=cwd)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no start-up line"
        return line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("layout", ["missing", "empty", "other files"])
def test_a_client_with_nothing_to_serve_refuses_to_start(tmp_path, layout):
    data = tmp_path / "nodata" / "client"
    if layout != "missing":
        data.mkdir(parents=True)
    if layout == "other files":
        (data / "notes.txt").write_text("not a dataset\n")
    out = ppre("client", "serve", "--insecure", "--port", "0", "--data-dir", str(data), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if not x.startswith("WARNING: --insecure")]
    assert line.startswith("ppre client: error: parameter '--data-dir': ")
    assert "--data-dir" in line and str(data) in line and ("does not exist" if layout == "missing"
                                                           else "holds no NAME.csv or NAME.parquet") in line
    assert "serving" not in out.stdout and "Traceback" not in out.stderr


def test_a_named_dataset_that_is_not_there_is_refused(tmp_path):
    out = ppre("client", "serve", "--insecure", "--port", "0", "--dataset", "ero=model_outputs.csv", cwd=tmp_path)
    assert out.returncode == 2 and "--dataset" in out.stderr and "ero=model_outputs.csv: no such file" in out.stderr


@pytest.mark.parametrize("role", ["client", "tester"])
def test_both_services_listen_on_loopback_by_default_and_say_so(role, tmp_path):
    port = free_loopback_port()
    if role == "client":
        (tmp_path / "ero.csv").write_text("member_id,y_pred,y_true\na,1,0\n")
        inputs = ["--dataset", f"ero={tmp_path / 'ero.csv'}"]
    else:
        (tmp_path / "p.csv").write_text(RACES_HEADER + "a,1,0,0,0,0,0\n")
        inputs = ["--probabilities", str(tmp_path / "p.csv"), "--ephemeral-budget"]
    line = first_line([role, "serve", "--insecure", "--executor", "inline", "--port", str(port), *inputs], tmp_path)
    assert line.startswith(f"{role} serving on 127.0.0.1:{port} (this machine only; --host 0.0.0.0 "), line
    wide = first_line([role, "serve", "--insecure", "--executor", "inline", "--host", "0.0.0.0",
                       "--port", str(free_loopback_port()), *inputs], tmp_path)
    assert " (every interface);" in wide, wide
    helped = ppre(role, "serve", "--help", cwd=tmp_path).stdout
    assert "--host ADDRESS" in helped and "default 127.0.0.1" in helped


def test_in_their_containers_the_services_listen_on_every_interface():
    """Outside a container the default is loopback; in the compose file (and the image)
    each service is told 0.0.0.0, else Docker's published port would reach nothing."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert compose["tester"]["environment"]["PPRE_TESTER_HOST"] == "0.0.0.0"
    assert compose["client"]["environment"]["PPRE_CLIENT_HOST"] == "0.0.0.0"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ENV PPRE_TESTER_HOST=0.0.0.0 PPRE_CLIENT_HOST=0.0.0.0" in dockerfile


def test_the_test_clients_record_has_the_joined_count_noised(tmp_path):
    """The Test-Client's results file holds the joined count the Tester checked its
    minimum on (design §8.2, §9.2): noised (σ_i), never 0 for an audit that joined rows,
    and its page says it is noised; the exact count is on the receipt the operator got."""
    import json
    import math

    from client_service.datasets import DatasetRegistry
    from client_service.results import ResultStore
    from common.stats.results import AuditReport
    from ppre.local import local_services
    from proto import ppre_pb2 as pb
    from tester_service.inputs import read_probability_table
    from tester_service.release import ReleasePolicy
    from tester_service.server import forget_local_results, run_audit
    from tests.helpers import TEST_BITS, write_inputs

    _, _, tp, cp = write_inputs(tmp_path, 120, 90, seed=71)
    results = tmp_path / "results"
    results.mkdir()
    noisy = ReleasePolicy(min_intersection=1, min_effective_size=0.0, rho=100.0, budget=math.inf)
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=noisy,
                        results=ResultStore(results), tls=False) as svc:
        forget_local_results(svc.tester_address)  # as a Tester service's operator: the receipt
        event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10))
    got = AuditReport.from_json(event.result.report_json)
    assert got.is_receipt and got.n_matched == 90
    path = results / f"{got.audit_id}.json"
    kept = json.loads(path.read_text())
    sigma = noisy.intersection_sigma()
    assert abs(kept["n_matched"] - 90) <= 8 * sigma + 1 and kept["info"]["joined_members_sd"] == sigma
    out = subprocess.run([sys.executable, "-m", "ppre.report", str(path), str(tmp_path / "page")],
                         capture_output=True, text=True, timeout=60, env=child_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "page" / "report.html").read_text(encoding="utf-8")
    assert f"about {kept['n_matched']} members (noised count, sd {sigma:.3g})" in page
    assert "0 joined rows" not in page
    assert json.loads((tmp_path / "page" / "report.json").read_text())["n_matched"] == kept["n_matched"]
