"""Metrics export shared by the broker and the name server (issue 17): the Prometheus HTTP
endpoint (`http.py`), the event-loop lag monitor (`loop_lag.py`), the GC pause timing and tuning
(`gc_pauses.py`) and the metric families both servers build from their own counters at scrape
time (`families.py`).

Counting stays in plain ints owned by each server (broker/stats.py, remoting's RpcLatency);
this package only turns them into Prometheus metric families when scraped, on the event-loop
thread, so a scrape sees whole updates and costs nothing between scrapes. It imports remoting
and protocol, never broker, namesrv, store or client: both servers import it.
"""
