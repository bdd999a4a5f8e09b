"""The Python reference (pinned 0.16.0) serving what `examples/worker.rs`
serves, for the migration test (`examples/tests/migrate_python.rs`): a
counter under /counter (POST /increment, GET /value) and the trays seed's
Runner/Jobs under /runners (POST /enqueue, GET /done), behind pinboard on
Postgres. Rust and Python workers running the two replace each other by a
drain, as in a deploy.

Environment: PINBOARD_URL, PINBOARD_TOKEN, ADVERTISE_URL, DATABASE_URL
(required); JOBS_WORK_MS (each job's work, default 0), HEARTBEAT_S and
LEASE_BUFFER_S (default 0.5 s), SWEEP_S (the hosts' sweep, default 1 s).
GET /drained answers whether both hosts drained and closed every instance.
"""

import asyncio
import contextlib
import os

from fastapi import FastAPI
from pinned import (
    PinnedAPI,
    PinnedHost,
    PinnedWorker,
    Tray,
    inbox,
    persistent,
    persistent_queue,
    route,
    tray,
)
from pinned.durability.postgres import PostgresStateStore

WORK = int(os.environ.get("JOBS_WORK_MS", "0")) / 1000
SWEEP = float(os.environ.get("SWEEP_S", "1"))


class Counter(PinnedAPI):
    async def lifespan(self):
        self.value = 0
        yield

    @route.post("/increment")
    async def increment(self) -> dict:
        self.value += 1
        return {"value": self.value}

    @route.get("/value")
    async def read(self) -> dict:
        return {"value": self.value}


class Jobs(Tray):
    queue = persistent_queue()
    done = persistent([])

    def items(self):
        while self.queue.value:
            yield self.queue.peek()
            self.queue.popleft()

    @inbox
    def add(self, job: dict) -> None:
        self.kick()
        self.queue.append(job)


class Runner(PinnedAPI):
    @tray(Jobs)
    async def jobs(self, job, ctx) -> None:
        if WORK:
            await asyncio.sleep(WORK)
        ctx.tray.done.value = [*ctx.tray.done.value, job["name"]]

    @route.post("/enqueue")
    async def enqueue(self, job: dict) -> dict:
        jobs = await self.jobs.get()
        await jobs.add(job)
        return {"admitted": job["name"]}

    @route.get("/done")
    async def done(self) -> dict:
        jobs = await self.jobs.get()
        return {"done": list(jobs.done.value)}


store = PostgresStateStore(dsn=os.environ["DATABASE_URL"])
worker = PinnedWorker(
    pinboard_url=os.environ["PINBOARD_URL"],
    token=os.environ["PINBOARD_TOKEN"],
    advertise_url=os.environ["ADVERTISE_URL"],
    state_store=store,
    heartbeat_interval=float(os.environ.get("HEARTBEAT_S", "0.5")),
    lease_buffer=float(os.environ.get("LEASE_BUFFER_S", "0.5")),
)
hosts = [
    PinnedHost(Counter, worker=worker, namespace="/counter", sweep_interval=SWEEP),
    PinnedHost(Runner, worker=worker, namespace="/runners", sweep_interval=SWEEP),
]


@contextlib.asynccontextmanager
async def lifespan(_app):
    await store.setup()
    yield


app = FastAPI(lifespan=lifespan)
app.include_router(worker)
for host in hosts:
    app.include_router(host)


@app.get("/drained")
async def drained() -> dict:
    return {"drained": all(host.drained for host in hosts)}
