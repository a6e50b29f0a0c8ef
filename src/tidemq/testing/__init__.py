"""Helpers shipped for tests: an in-process cluster on free ports. Imported by tests only."""

from tidemq.testing.cluster import LocalCluster, local_cluster
from tidemq.testing.wait import eventually

__all__ = ["LocalCluster", "eventually", "local_cluster"]
