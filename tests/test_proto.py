"""The generated gRPC code is in sync with proto/ppre.proto."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_generated_code_matches_the_proto(tmp_path):
    (tmp_path / "proto").mkdir()
    shutil.copy(REPO / "proto" / "ppre.proto", tmp_path / "proto" / "ppre.proto")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.",
                    "--grpc_python_out=.", "proto/ppre.proto"], cwd=tmp_path, check=True)
    for name in ("ppre_pb2.py", "ppre_pb2_grpc.py", "ppre_pb2.pyi"):
        assert (tmp_path / "proto" / name).read_text() == (REPO / "proto" / name).read_text(), \
            f"proto/{name} is stale: regenerate with grpc_tools.protoc"
