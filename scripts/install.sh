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
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing with apt: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

extras="${FABRIC_EXTRAS:-spark,test,speed}"
python3 -m pip install -q --disable-pip-version-check -e ".[${extras}]" 2>&1 | grep -v -e "^WARNING: Running pip as" -e "is ignored: it is neither" || true
