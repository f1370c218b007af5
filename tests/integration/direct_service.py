"""A service instance as a real process, for the direct-plane integration tests.

    python3 -m tests.integration.direct_service ZK_HOSTS NAME LOG_PATH [--version V]

Payloads: ``run:<id>`` appends ``<id>`` to LOG_PATH (one line per handler run, flushed, so
the test can prove no request ran twice) and answers ``<id>@<pid>``; ``slow:<ms>:<id>``
does the same after sleeping; ``raise:<message>`` raises ValueError. SIGTERM stops
gracefully (deregister, drain, close); the line ``READY <address> <znode>`` on stdout
says the instance is registered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from sdk.direct import DirectClient, Request


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("zk")
    parser.add_argument("name")
    parser.add_argument("log_path")
    parser.add_argument("--version", default="1")
    args = parser.parse_args(argv)
    log = open(args.log_path, "a", buffering=1)  # noqa: SIM115 (line-buffered for the whole run)
    pid = os.getpid()

    async def handle(request: Request) -> bytes:
        text = request.payload.decode()
        kind, _, rest = text.partition(":")
        if kind == "raise":
            raise ValueError(rest)
        if kind == "slow":
            delay_ms, _, rest = rest.partition(":")
            await asyncio.sleep(int(delay_ms) / 1000)
        log.write(rest + "\n")
        return f"{rest}@{pid}".encode()

    client = await DirectClient.connect(args.zk)
    service = await client.serve(args.name, handle, concurrency=64, version=args.version, metadata={"pid": pid})
    print(f"READY {service.address} {service.znode}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await client.close(drain_timeout_ms=5_000)
    log.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
