#!/usr/bin/env bash
# Install everything, then run the whole test suite (unit, integration, fault, spark, interop).
# Pass pytest arguments to narrow it, e.g. scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
FABRIC_EXTRAS="spark,dev" scripts/install.sh
export PYSPARK_PYTHON="$(command -v python3)"
exec python3 -m pytest -q "$@"
