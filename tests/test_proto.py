"""The generated gRPC code is in sync with proto/ppre.proto, whatever patch release of
grpcio-tools the install brings.

The generator stamps its own version into the code it writes (`GRPC_GENERATED_VERSION`,
the `Protobuf Python Version` comment and the runtime check's arguments). Those stamps are
not the schema: a patch release of grpcio-tools changes them and nothing else. So the
comparison masks them, and a second test checks what they do matter for: the runtime
each stamp requires is no newer than the floor `pyproject.toml` declares for it, so that
every install the project allows can import the checked-in code.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GENERATED = ("ppre_pb2.py", "ppre_pb2_grpc.py", "ppre_pb2.pyi")

# (pattern, replacement): each version stamp a generator writes, and nothing else
STAMPS = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = '<version>'"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: <version>"),
    (re.compile(r"(_runtime_version\.Domain\.PUBLIC,\n)\s*\d+,\n\s*\d+,\n\s*\d+,\n\s*'[^']*',\n", re.M),
     r"\1    <version>\n"),
)


def without_stamps(text: str) -> str:
    for pattern, replacement in STAMPS:
        text = pattern.sub(replacement, text)
    return text


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _floor(requirement_name: str) -> tuple[int, ...]:
    """The `>=` floor pyproject.toml declares for a runtime dependency."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        match = re.fullmatch(rf"{re.escape(requirement_name)}>=([\d.]+)", requirement.replace(" ", ""))
        if match:
            return _version(match.group(1))
    raise AssertionError(f"pyproject.toml declares no '{requirement_name}>=' floor")


def test_the_stamp_mask_changes_only_version_stamps():
    """The mask hides a different version and nothing more: the same file with another
    generator's stamps compares equal, one with another field does not."""
    pb2 = (REPO / "proto" / "ppre_pb2.py").read_text()
    grpc = (REPO / "proto" / "ppre_pb2_grpc.py").read_text()
    restamped = re.sub(r"Version: [\d.]+", "Version: 99.98.97", pb2)
    restamped = re.sub(r"(Domain\.PUBLIC,\n\s*)\d+", r"\g<1>99", restamped)
    assert restamped != pb2 and without_stamps(restamped) == without_stamps(pb2)
    regrpc = re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = '9.9.9'", grpc)
    assert regrpc != grpc and without_stamps(regrpc) == without_stamps(grpc)
    assert without_stamps(pb2.replace("ListRunsRequest", "ListRunRequest")) != without_stamps(pb2)


def test_generated_code_matches_the_proto(tmp_path):
    (tmp_path / "proto").mkdir()
    shutil.copy(REPO / "proto" / "ppre.proto", tmp_path / "proto" / "ppre.proto")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.",
                    "--grpc_python_out=.", "proto/ppre.proto"], cwd=tmp_path, check=True)
    for name in GENERATED:
        fresh = without_stamps((tmp_path / "proto" / name).read_text())
        assert fresh == without_stamps((REPO / "proto" / name).read_text()), \
            f"proto/{name} is stale: regenerate with grpc_tools.protoc (docs/development.md)"


def test_the_generated_codes_runtime_needs_are_within_the_declared_floors():
    """The checked-in code refuses to import under a runtime older than the one that
    generated it: that generator must be no newer than pyproject.toml's floors."""
    grpc = (REPO / "proto" / "ppre_pb2_grpc.py").read_text()
    grpc_stamp = _version(re.search(r"^GRPC_GENERATED_VERSION = '([^']*)'$", grpc, re.M).group(1))
    assert grpc_stamp <= _floor("grpcio"), f"proto/ppre_pb2_grpc.py needs grpcio {grpc_stamp}, above the floor"
    pb2 = (REPO / "proto" / "ppre_pb2.py").read_text()
    pb2_stamp = _version(re.search(r"^# Protobuf Python Version: ([\d.]+)$", pb2, re.M).group(1))
    assert pb2_stamp <= _floor("protobuf"), f"proto/ppre_pb2.py needs protobuf {pb2_stamp}, above the floor"
