"""Byte paths between client and daemon. Today: the gRPC stream (control, ops, chunked bulk bytes)."""
