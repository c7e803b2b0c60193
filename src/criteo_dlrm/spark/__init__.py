"""Apache Spark as the second preprocessing engine (``preprocessing.engine: spark``).

- ``session``: the Spark session from ``conf/base/spark.yml`` (PySpark and Java checked first, with the fix);
- ``tasks``: the local engine's per-file and per-day work (ingestion, encoding, the stored shuffle) run as Spark
  tasks, one task per item, retried by Spark when a task fails;
- ``metadata``: the vocabularies and dense statistics counted by Spark SQL aggregations (no row reaches the
  driver), summarised by the same code as the local engine's counts.

PySpark is imported only inside the functions, so importing this package needs no Spark.
"""
