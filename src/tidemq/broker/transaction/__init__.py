"""Transactional messages, built from the store's primitives (remoting.md §8).

`states` (the table), `half` (message rewrites), `resolution` (the exactly-once ledger and the
writes), `check_back` (the CheckBackService), `stats` (counters). The store knows nothing of it.
"""
