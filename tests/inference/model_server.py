"""A small real model server for the inference tests and the benchmark.

    python model_server.py [--port N | $PORT | --socket PATH] [--startup-s 0.3] [--delay-ms 0]

Sleeps ``--startup-s`` before it listens (a model load). Routes:
``/health``; ``/predict?client=C&seq=S&ms=M`` answers JSON with its pid after M ms
(default ``--delay-ms``); ``/stream?n=N&ms=M`` sends N server-sent events M ms apart;
``/big?kb=K`` answers K KiB; ``/headers?set=Name:Value`` answers the request's headers as
JSON, with the response headers named in ``set``. Bodies sent to ``/predict`` are counted
in ``body_len``.
"""

import argparse
import asyncio
import json
import os
import time

from tornado import httpserver, netutil, web


class Health(web.RequestHandler):
    def get(self):
        self.write("ok")


class Predict(web.RequestHandler):
    async def get(self):
        ms = float(self.get_argument("ms", str(self.settings["delay_ms"])))
        if ms:
            await asyncio.sleep(ms / 1000)
        self.write(json.dumps({
            "pid": os.getpid(), "client": self.get_argument("client", ""),
            "seq": self.get_argument("seq", ""), "body_len": len(self.request.body),
        }))

    post = get


class Stream(web.RequestHandler):
    async def get(self):
        n, ms = int(self.get_argument("n", "5")), float(self.get_argument("ms", "20"))
        self.set_header("Content-Type", "text/event-stream")
        for i in range(n):
            self.write(f"data: {json.dumps({'i': i, 't': time.time()})}\n\n")
            await self.flush()
            await asyncio.sleep(ms / 1000)


class Big(web.RequestHandler):
    def get(self):
        self.write(b"x" * (1024 * int(self.get_argument("kb", "1024"))))


class Headers(web.RequestHandler):
    def get(self):
        for item in self.get_arguments("set"):
            name, _, value = item.partition(":")
            self.set_header(name, value)
        self.write(json.dumps(dict(self.request.headers.get_all())))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    p.add_argument("--startup-s", type=float, default=0.3)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--socket", default="", help="listen on this unix socket instead of a port")
    a = p.parse_args()
    time.sleep(a.startup_s)

    async def run():
        app = web.Application([("/health", Health), ("/predict", Predict), ("/stream", Stream),
                               ("/big", Big), ("/headers", Headers)], delay_ms=a.delay_ms)
        if a.socket:
            httpserver.HTTPServer(app).add_socket(netutil.bind_unix_socket(a.socket, mode=0o600))
        else:
            app.listen(a.port, "127.0.0.1")
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
