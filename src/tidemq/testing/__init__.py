"""Helpers shipped for tests: an in-process cluster on free ports. Imported by tests only."""

from tidemq.testing.cluster import LocalCluster, local_cluster

__all__ = ["LocalCluster", "local_cluster"]
