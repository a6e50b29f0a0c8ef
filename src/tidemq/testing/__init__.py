"""Helpers shipped for tests: an in-process cluster on free ports, real server processes
(`tidemq.testing.processes`), and waiting for conditions. Imported by tests only."""

from tidemq.testing.cluster import LocalCluster, local_cluster
from tidemq.testing.wait import eventually, eventually_async

__all__ = ["LocalCluster", "eventually", "eventually_async", "local_cluster"]
