"""The trays seed's Runner/Jobs on the Python reference (pinned 0.16.0):
the counterpart of `examples/jobs.rs`, shared by the test apps that host it
(`jobs_app.py`, `migrate_app.py`). Each job waits JOBS_WORK_MS before it
is recorded."""

import asyncio
import os

from pinned import PinnedAPI, Tray, inbox, persistent, persistent_queue, route, tray

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
