"""KV cache bookkeeping: block pool, prefix segments, reference counts (stdlib only)."""
