"""The trays seed's Runner/Jobs app on the Python reference (pinned
0.16.0), over Postgres, in local mode: the counterpart of
`examples/jobs.rs` for the cross-language takeover tests. Each job waits
JOBS_WORK_MS before it is recorded. Serve it with `uvicorn jobs_app:app`;
DATABASE_URL names the database."""

import contextlib
import os

from fastapi import FastAPI
from pinned import PinnedHost, PinnedWorker
from pinned.durability.postgres import PostgresStateStore

from jobs_objects import Runner

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
