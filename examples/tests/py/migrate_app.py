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

import contextlib
import os

from fastapi import FastAPI
from pinned import PinnedAPI, PinnedHost, PinnedWorker, route
from pinned.durability.postgres import PostgresStateStore

from jobs_objects import Runner

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
