"""Regenerate gpuremote/v1/*_pb2*.py from protos/gpuremote/v1/*.proto.

Run after editing a .proto file:  python scripts/gen_protos.py
The generated files are committed; tests/test_wire_generated.py fails when they drift.
Needs grpcio-tools (in the `dev` extra).
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"


def generate(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "gpuremote" / "v1").glob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Messages-only files get an empty *_pb2_grpc.py: drop it, nothing imports it.
    for empty in (out_dir / "gpuremote" / "v1").glob("*_pb2_grpc.py"):
        if "class " not in empty.read_text():
            empty.unlink()


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
