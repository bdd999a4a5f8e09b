"""The trays seed's Runner/Jobs app on the Python reference (pinned
0.16.0), over Postgres: the counterpart of `examples/jobs.rs` for the
cross-language takeover tests. Each job waits JOBS_WORK_MS before it is
recorded. Serve it with `uvicorn jobs_app:app`; DATABASE_URL names the
database."""

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
worker = PinnedWorker(state_store=store)
host = PinnedHost(Runner, worker=worker, namespace="/runners")


@contextlib.asynccontextmanager
async def lifespan(_app):
    await store.setup()
    yield


app = FastAPI(lifespan=lifespan)
app.include_router(worker)
app.include_router(host)
