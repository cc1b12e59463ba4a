"""The client side: sessions with daemons, op batching, sync points, statistics."""
