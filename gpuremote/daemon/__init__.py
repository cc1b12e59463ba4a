"""The daemon: serves sessions over gRPC and runs their ops on a device backend."""
