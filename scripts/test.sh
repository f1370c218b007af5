#!/usr/bin/env bash
# Install everything, lint and type-check, then run the whole test suite
# (unit, integration, fault, spark, interop). Arguments go to pytest, e.g.
#   scripts/test.sh -m "not slow"        the quick set while developing
set -euo pipefail
cd "$(dirname "$0")/.."
FABRIC_EXTRAS="spark,dev,bench" scripts/install.sh
export PYSPARK_PYTHON="$(command -v python3)"
# Node processes and Spark workers import this checkout, whatever else is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m ruff check .
python3 -m mypy
exec python3 -m pytest -q "$@"
