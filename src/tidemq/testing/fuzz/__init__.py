"""Structure-aware fuzzing of TideMQ's decoders (issue 15).

    strategies.py  valid structures, built by the product's own encoders, with where their
                   length fields lie
    mutations.py   edits of those bytes: extreme ints in length fields, flips, inserts,
                   deletes, truncation, invalid UTF-8
    targets.py     one target per decoder: a strategy of cases and the check of one case
    requests.py    mutated (and, for ACL, signed or mis-signed) requests of every served code,
                   for tests/fuzz/test_network_fuzz.py
    __main__.py    `python -m tidemq.testing.fuzz --budget-seconds N`: the long run of `make fuzz`

tests/fuzz runs every target for a bounded number of examples in `make test`.
"""
