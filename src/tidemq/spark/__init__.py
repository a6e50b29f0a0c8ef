"""TideMQ's Spark connector: the `tidemq` format of the PySpark Python Data Source API.

    from tidemq.spark import TideMQDataSource
    spark.dataSource.register(TideMQDataSource)
    df = spark.read.format("tidemq").option("nameServer", "127.0.0.1:9876") \\
        .option("topic", "Orders").load()

Needs the `[spark]` extra (pyspark>=4.2,<5 and pyarrow) on the driver and the executors; the
data source is imported on first use, so the pure modules (options, offsets) load without it.
The package imports only `tidemq.client`, `tidemq.protocol` and the TLS settings of
`tidemq.security` (import-linter checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import TideMQDataSource

__all__ = ["TideMQDataSource"]


def __getattr__(name: str) -> Any:
    if name == "TideMQDataSource":
        from .source import TideMQDataSource

        return TideMQDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
