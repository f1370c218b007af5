"""Example pipelines for the fabric Spark connector (see docs/SPARK.md)."""
