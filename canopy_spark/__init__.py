"""PySpark data source for canopy: `spark.read/readStream/write/writeStream.format("canopy")`
with the schema and options of Spark's Kafka source. Call `register(spark)` once per session."""
from __future__ import annotations

__all__ = ["register", "CanopyDataSource"]


def register(spark) -> None:
    from .source import CanopyDataSource

    spark.dataSource.register(CanopyDataSource)


def __getattr__(name):
    if name == "CanopyDataSource":
        from .source import CanopyDataSource

        return CanopyDataSource
    raise AttributeError(name)
