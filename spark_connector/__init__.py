"""PySpark data source ``fabric``: batch and streaming reads and writes of Fabric topics.

    import spark_connector
    spark_connector.register(spark)
    df = (spark.readStream.format("fabric")
          .option("bootstrap", "zk://127.0.0.1:2181")
          .option("subscribe", "events")
          .load())

The options mirror Spark's Kafka connector; docs/SPARK.md lists them, with the
exactly-once design of the streaming sink.
"""

from __future__ import annotations

from typing import Any

from spark_connector._options import DataLossError, FabricOptionError
from spark_connector._source import FabricDataSource

FORMAT = "fabric"


def register(spark: Any) -> None:
    """Make ``format("fabric")`` available in this SparkSession (reads and writes)."""
    spark.dataSource.register(FabricDataSource)


__all__ = ["FORMAT", "DataLossError", "FabricDataSource", "FabricOptionError", "register"]
