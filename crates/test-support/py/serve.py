"""Serves an ASGI app for the test suites on a port the kernel picks.

Usage: python serve.py <app-dir> <module:attribute>

Binds 127.0.0.1:0 itself, sets ADVERTISE_URL from the bound port before the
app is imported (the reference worker reads it at import), prints
`python worker listening on <url>` for the harness, and hands the socket to
uvicorn. Nothing picks a port for the child, so parallel tests never race
for one.
"""

import os
import socket
import sys

app_dir, app = sys.argv[1], sys.argv[2]

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(("127.0.0.1", 0))
# Listening before the app is imported: a connection made as soon as the
# address is printed waits in the backlog instead of being refused.
sock.listen(2048)
url = f"http://127.0.0.1:{sock.getsockname()[1]}"
os.environ["ADVERTISE_URL"] = url
print(f"python worker listening on {url}", flush=True)

sys.path.insert(0, app_dir)
import uvicorn  # noqa: E402  (after the socket: the address comes first)

uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
