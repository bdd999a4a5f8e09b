"""Drives the Python reference's PostgresStateStore for pinned-store's cross-language tests.

Usage: xlang.py DSN SCRIPT_JSON. SCRIPT_JSON is {"env": str, "hostname": str, "ops": [op...]};
each op is {"op": "set"|"delete"|"get"|"list"|"batch", ...} with the StateStore's arguments.
Prints one JSON array: per op {"ok": result} or {"error": class name, "message", "key", "epoch"}.
"""

import asyncio
import json
import sys

from pinned.durability import FenceLost
from pinned.durability.postgres import PostgresStateStore


async def run(dsn: str, script: dict) -> list:
    store = PostgresStateStore(
        dsn=dsn, env=script.get("env", "*"), hostname=script.get("hostname", "*")
    )
    await store.setup()
    out = []
    for op in script["ops"]:
        kind = op["op"]
        try:
            if kind == "set":
                await store.set_tray(op["ns"], op["id"], op["tray_ns"], op["tray_id"],
                                     op["marked"], op["doc"], op["epoch"])
                result = None
            elif kind == "delete":
                await store.delete_tray(op["ns"], op["id"], op["tray_ns"], op["tray_id"],
                                        op["epoch"])
                result = None
            elif kind == "get":
                row = await store.get_tray(op["ns"], op["id"], op["tray_ns"], op["tray_id"],
                                           op["epoch"])
                result = None if row is None else {"marked": row[0], "doc": row[1]}
            elif kind == "list":
                rows = await store.list(op["ns"], op["id"], op["epoch"],
                                        tray_ns=op.get("tray_ns"), marked=op.get("marked"))
                result = [{"tray_ns": r[0], "tray_id": r[1], "marked": r[2], "doc": r[3]}
                          for r in rows]
            elif kind == "batch":
                ops = [("tray", o[0], o[1], o[2], o[3]) for o in op["ops"]]
                await store.apply_batch(op["ns"], op["id"], ops, op["epoch"])
                result = None
            else:
                raise ValueError(f"unknown op {kind}")
            out.append({"ok": result})
        except FenceLost as exc:
            out.append({"error": "FenceLost", "message": str(exc), "key": exc.key,
                        "epoch": exc.epoch})
        except Exception as exc:  # reported, the Rust side decides
            out.append({"error": type(exc).__name__, "message": str(exc)})
    return out


def main() -> None:
    dsn, script = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(asyncio.run(run(dsn, script))))


if __name__ == "__main__":
    main()
