"""The Python half of pinned-store's bench: set_tray throughput of the reference's
PostgresStateStore with many instances writing concurrently.

Usage: store_bench.py DSN NS INSTANCES OPS POOL. Prints {"ops": n, "seconds": s, "p50_ms", "p99_ms"}.
"""

import asyncio
import json
import sys
import time

from pinned.durability.postgres import PostgresStateStore


async def main(dsn: str, ns: str, instances: int, ops: int, pool: int) -> dict:
    store = PostgresStateStore(dsn=dsn, pool_size=pool)
    await store.setup()
    # Warm the pool the way the Rust side does: one concurrent op per slot, twice.
    await asyncio.gather(*(store.set_tray(ns, f"warm{i}", "bench", "~", False, {}, 1)
                           for i in range(pool * 2)))
    latencies: list[float] = []

    async def instance(i: int) -> None:
        for n in range(ops):
            t0 = time.perf_counter()
            await store.set_tray(ns, f"i{i}", "bench", "~", n + 1 < ops,
                                 {"n": n, "i": i, "pad": "x" * 64}, 1)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(instance(i) for i in range(instances)))
    seconds = time.perf_counter() - start
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
    return {"ops": instances * ops, "seconds": seconds, "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


if __name__ == "__main__":
    dsn, ns, instances, ops, pool = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    print(json.dumps(asyncio.run(main(dsn, ns, instances, ops, pool))))
