#!/usr/bin/env bash
# Install what Fabric needs on a fresh Debian machine (run as root): ZooKeeper, Java,
# the C client's build dependencies, fault-test tools, and the Python package.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/include/zmq.h ] || need_apt+=(libzmq3-dev)
[ -f /usr/include/lz4frame.h ] || need_apt+=(liblz4-dev)
[ -f /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc make)
command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)  # the network-partition fault test
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)  # peers benchmark
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || need_apt+=(python3-dev)  # headers for the compiled fast path below
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing with apt: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

extras="${FABRIC_EXTRAS:-spark,test,speed}"
python3 -m pip install -q --disable-pip-version-check -e ".[${extras}]" 2>&1 | grep -v -e "^WARNING: Running pip as" -e "is ignored: it is neither" || true

# The compiled fast paths (Cython from the `speed` extra): Producer.send's per-record work
# (sdk/_speedups.pyx) and the node's check of every produced batch's records
# (fabric/protocol/_columns.pyx). Optional: without them the pure-Python paths run, same
# behaviour, slower.
if python3 -c "import Cython" >/dev/null 2>&1; then
  # (from the repository root: sdk/ holds a queue.py that would shadow the standard library's)
  for pyx in sdk/_speedups.pyx fabric/protocol/_columns.pyx; do
    log="/tmp/fabric-$(basename "$pyx" .pyx)-build.log"
    if ! python3 -m Cython.Build.Cythonize -i -q -3 "$pyx" >"$log" 2>&1; then
      echo "warning: $pyx did not build (see $log): its pure-Python twin runs instead"
    fi
  done
fi
