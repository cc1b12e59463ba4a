"""Generated protobuf and gRPC code for the wire contract in protos/gpuremote/v1/.

Do not edit: regenerate with `python scripts/gen_protos.py`.
"""
