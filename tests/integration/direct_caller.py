"""A caller as a real process, for the direct-plane heartbeat tests.

    python3 -m tests.integration.direct_caller ZK_HOSTS NAME COUNT

Sends COUNT requests (``0`` .. ``COUNT-1``, not idempotent) to NAME at once, with a long
timeout, prints ``SENT``, waits for the replies and prints ``DONE ok=N failures=[...]``;
the test SIGSTOPs it meanwhile.
"""

from __future__ import annotations

import asyncio
import sys

from sdk.direct import DirectClient


async def main(zk: str, name: str, count: int) -> None:
    client = await DirectClient.connect(zk)
    try:
        calls = [asyncio.ensure_future(client.request(name, str(n), timeout_ms=60_000)) for n in range(count)]
        await asyncio.sleep(0.2)
        print("SENT", flush=True)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        failures = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
        print(f"DONE ok={len(outcomes) - len(failures)} failures={failures}", flush=True)
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
