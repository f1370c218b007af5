"""PySpark data source ``fabric`` (see its issue); empty until then."""
