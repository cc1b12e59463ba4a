"""The pool manager (`gpuremote pool`): daemons register their devices, clients lease whole
devices or shares of them, and each lease carries grants signed for the daemons to enforce.

model.py (records), placement.py (pure placement), store.py (durable state), server.py (gRPC).
"""
