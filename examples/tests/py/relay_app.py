"""The relay/sink pair of the reference's crash workload
(`pinned.sim.workload.SweepLane`) on the Python reference (pinned 0.16.0),
over Postgres, in local mode: the counterpart of `examples/relay.rs` for
the cross-language takeover tests of dispatching trays. The relay's
handler stops for good after its dispatch, before its ack, when RELAY_HOLD
is 1 (its item stays mid-dispatch for a test to kill the process in). Serve it
with `uvicorn relay_app:app`; DATABASE_URL names the database."""

import asyncio
import contextlib
import os

from fastapi import FastAPI
from pinned import PinnedAPI, PinnedHost, PinnedWorker, route, tray
from pinned.durability.postgres import PostgresStateStore
from pinned.sim.workload import PipeTray

HOLD = os.environ.get("RELAY_HOLD") == "1"


class Relay(PinnedAPI):
    @tray(PipeTray)
    async def relay(self, item: dict, ctx) -> None:
        sink = await self.sink.get()
        outcome = await ctx.dispatch(["r", item["n"]], sink.add, {"n": item["n"]})
        relayed = ctx.tray.storage.get("relayed", {})
        ctx.tray.storage.set("relayed", {**relayed, str(item["n"]): outcome})
        await self.frontier.wait()
        if HOLD:
            await asyncio.Event().wait()

    @tray(PipeTray)
    async def sink(self, item: dict, ctx) -> None:
        seq = ctx.tray.done.value + 1
        log = ctx.tray.storage.get("log", [])
        ctx.tray.storage.set(
            "log", [*log[: seq - 1], {"n": item["n"], "attempts": ctx.attempts}]
        )
        ctx.tray.done.value = seq
        await self.frontier.wait()

    @route.post("/relay")
    async def admit(self, item: dict) -> dict:
        relay = await self.relay.get()
        await relay.add({"n": item["n"]})
        return {"admitted": item["n"]}


store = PostgresStateStore(dsn=os.environ["DATABASE_URL"])
worker = PinnedWorker(state_store=store)
host = PinnedHost(Relay, worker=worker, namespace="/relays")


@contextlib.asynccontextmanager
async def lifespan(_app):
    await store.setup()
    yield


app = FastAPI(lifespan=lifespan)
app.include_router(worker)
app.include_router(host)
