"""The chaos suite (issue 14): a broker group, etcd and clients in network namespaces, under
seeded faults, and a checker of what the clients saw. Only tests and `make chaos` import it.

    netns.py     namespaces, bridges, veths; partitions       nodes.py    server processes
    faults.py    seeded schedule, injection                   workload.py client processes
    checker.py   the verdict (pure) and its table             runner.py   one run's phases
    python -m tidemq.testing.chaos --seed N --faults K --run-dir D [--short]
"""
