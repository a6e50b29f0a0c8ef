"""TideMQ side by side with the durable brokers a Python team could run instead (issue 6).

`benchmarks/run_suite.py` is the entry point (`make bench`). The package is split by reason to
change:

    common.py        options, percentiles, medians, CPU accounting from /proc/stat
    servers.py       start/stop Redis, NATS (one node or a 3-node cluster), RabbitMQ, `tidemq dev`
                     and TideMQ broker groups (master + slaves) on 127.0.0.1 in temp dirs
    drivers.py       one class per broker, each through its usual Python client
    cases.py         the measured cases (produce, consume, latency, transactions, sizes, RSS)
    machine.py       the machine's limits: sequential write, fdatasync rate, loopback TCP
    capacity.py      server capacity: raw-frame load generator processes, redis-benchmark
    cpp_producer.py  the official C++ client (PyPI rocketmq 0.4.4) as a subprocess
    report.py        the Markdown table appended to benchmarks/RESULTS.md
    rss.py           the broker RSS case alone, with a backlog of any size
    replication.py   issue 13's side-by-side rows: SYNC_MASTER pairs, one broker, NATS R3
                     (`benchmarks/bench_replication.py` is its entry point, with lag and catch-up)
"""
