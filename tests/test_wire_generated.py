"""The committed generated code must match what protoc makes of protos/ today."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_code_is_current(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "gpuremote" / "v1").glob("*_pb2*"))
    assert generated, "protoc produced nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is generated but not committed: run python scripts/gen_protos.py"
        assert committed.read_text() == (tmp_path / rel).read_text(), \
            f"{rel} is stale: run python scripts/gen_protos.py and commit the result"


def test_protocol_version_is_in_sync():
    from gpuremote._config import PROTOCOL_VERSION
    assert "gpuremote/v1/" in (ROOT / "protos" / "gpuremote" / "v1" / "daemon.proto").read_text()
    assert PROTOCOL_VERSION == 1
