"""Test app for pinboard's interop suite: the Python reference worker in
control-plane mode hosting a counter object under /counter.

Environment: PINBOARD_URL, PINBOARD_TOKEN, ADVERTISE_URL (required);
HEARTBEAT_S and LEASE_BUFFER_S (defaults 0.5 s) keep short test leases healthy;
PINNED_HOSTNAME, PINNED_ENV, PINNED_EPOCH and PINNED_TAKEOVER set the deployment identity.
"""

import asyncio
import os
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse

from pinned import Attestation, PinnedAPI, PinnedHost, PinnedWorker, attestation, route

# One token per process: tests see which process answered.
PROCESS = os.urandom(8).hex()

worker = PinnedWorker(
    pinboard_url=os.environ["PINBOARD_URL"],
    token=os.environ["PINBOARD_TOKEN"],
    advertise_url=os.environ["ADVERTISE_URL"],
    heartbeat_interval=float(os.environ.get("HEARTBEAT_S", "0.5")),
    lease_buffer=float(os.environ.get("LEASE_BUFFER_S", "0.5")),
    hostname=os.environ.get("PINNED_HOSTNAME"),
    env=os.environ.get("PINNED_ENV"),
    epoch=int(os.environ.get("PINNED_EPOCH", "0")),
    takeover=os.environ.get("PINNED_TAKEOVER"),
)


class Counter(PinnedAPI):
    async def lifespan(self):
        self.count = 0
        # One token per instance: tests see whether state is fresh.
        self.instance = os.urandom(8).hex()
        yield

    def _state(self):
        return {
            "id": self.id,
            "count": self.count,
            "instance": self.instance,
            "process": PROCESS,
        }

    @route.get("/hit")
    async def hit(self):
        self.count += 1
        return self._state()

    @route.get("/peek")
    async def peek(self):
        return self._state()

    @route.get("/slow")
    async def slow(self, ms: int = 1000):
        await asyncio.sleep(ms / 1000)
        return self._state()

    @route.post("/echo")
    async def echo(self, request: Request):
        body = await request.body()
        return {"len": len(body), "body": body.decode(errors="replace")}

    @route.get("/headers")
    async def headers(self, request: Request):
        return {"headers": dict(request.headers), "query": request.url.query}

    @route.get("/whoami")
    async def whoami(self, request: Request):
        who = attestation(request)
        caller = None
        if isinstance(who, Attestation.Instance):
            caller = {"ns": who.ns, "id": who.id, "depth": who.depth}
        return {"caller": caller, "process": PROCESS, "id": self.id}

    @route.get("/call/{target}")
    async def call(self, target: str):
        res = await self.cluster.get(f"/counter/{target}/whoami")
        return {"status": res.status_code, "target": res.json()}

    @route.get("/stream")
    async def stream(self, n: int = 5):
        async def chunks():
            for i in range(n):
                yield f"chunk-{i}\n".encode()
                await asyncio.sleep(0.05)

        return StreamingResponse(chunks(), media_type="text/plain")

    @route.websocket("/ws")
    async def ws(self, websocket: WebSocket):
        await websocket.accept()
        while True:
            text = await websocket.receive_text()
            await websocket.send_text(f"echo:{text}")


host = PinnedHost(Counter, worker=worker, namespace="/counter")

# include_router installs the host's lifespan (which starts registration).
app = FastAPI()
app.include_router(worker)
app.include_router(host)


@app.get("/process")
async def process():
    # `draining`: whether the host took a drain (an operator's, echoed by
    # pinboard on a heartbeat), for tests that wait for it.
    return {"process": PROCESS, "draining": host.draining}
