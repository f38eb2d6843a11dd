"""The activator, autoscaler and embedded backend end to end, with a real model server
(tests/inference/model_server.py) started as replica processes. No timing is asserted:
the waits only bound a hung test."""

from __future__ import annotations

import asyncio
import json
import os
import signal

from inference.service import RState

from .harness import stack, until


def run(coro):
    return asyncio.run(coro)


async def client_loop(st, svc: str, client: int, n: int, results: list, ms: float = 0):
    for seq in range(n):
        async with st.http.get(f"{st.url}/{svc}/predict", params={
                "client": str(client), "seq": str(seq), "ms": str(ms)}) as r:
            results.append((client, seq, r.status, await r.read()))


def test_200_clients_at_zero_all_served_in_order_after_one_cold_start():
    async def main():
        async with stack() as st:
            st.put(name="cold", max_replicas=1, scale_to_zero_after_s=60)
            assert st.replicas_in_scheduler("cold") == {}  # starts at zero
            results: list = []
            await asyncio.gather(*(client_loop(st, "cold", c, 3, results) for c in range(200)))
            assert [r for r in results if r[2] != 200] == []
            assert len(results) == 600
            per_client: dict = {}
            for client, seq, _status, body in results:
                data = json.loads(body)
                assert (data["client"], data["seq"]) == (str(client), str(seq))
                per_client.setdefault(client, []).append(seq)
            assert all(seqs == [0, 1, 2] for seqs in per_client.values())
            placed = [w for kind, w in st.sched.store.events if kind == "placed"]
            assert len(placed) == 1  # one cold start served everyone
            assert len({json.loads(b)["pid"] for *_, b in results}) == 1

    run(main())


def test_scales_with_load_then_back_down_to_zero_and_frees_the_gpu_share():
    async def main():
        async with stack() as st:
            svc = st.put(name="auto", max_replicas=4, target=2, stable_window_s=2.0,
                         scale_to_zero_after_s=1.0)
            stop = asyncio.Event()
            results: list = []

            async def busy(c):
                seq = 0
                while not stop.is_set():
                    await client_loop(st, "auto", c, 1, results, ms=100)
                    seq += 1

            load = [asyncio.ensure_future(busy(c)) for c in range(8)]  # ~8 in flight
            await until(lambda: len(svc.ready()) == 4, what="4 ready replicas under load")
            assert len(st.replicas_in_scheduler("auto")) == 4
            assert st.allocated_milli() == 4 * 250
            stop.set()
            await asyncio.gather(*load)
            assert {r[2] for r in results} == {200}
            await until(lambda: len(svc.live()) < 4, what="scale down after the window")
            await until(lambda: not svc.replicas, what="zero replicas after idling")
            assert st.replicas_in_scheduler("auto") == {}
            assert st.allocated_milli() == 0  # the GPU share is free in the scheduler
            assert svc.status()["replicas"] == 0

    run(main())


def test_killing_a_replica_mid_load_loses_no_unsent_request():
    async def main():
        async with stack() as st:
            svc = st.put(name="kill", min_replicas=2, max_replicas=2)
            await until(lambda: len(svc.ready()) == 2, what="2 ready replicas")
            stop = asyncio.Event()
            results: list = []

            async def busy(c):
                while not stop.is_set():
                    await client_loop(st, "kill", c, 1, results, ms=30)

            clients = 10
            load = [asyncio.ensure_future(busy(c)) for c in range(clients)]
            await until(lambda: len(results) > 50, what="load running")
            victim = svc.ready()[0]
            os.killpg(victim.handle.proc.pid, signal.SIGKILL)
            before = len(results)
            await until(lambda: len(results) > before + 100, what="load after the kill")
            stop.set()
            await asyncio.gather(*load)
            failed = [r for r in results if r[2] != 200]
            # Only requests the killed replica was given may fail, each with a clear 502
            # naming it: those it held, and those sent to it before it was seen dead, at
            # most one per client (the first failure takes it out of the rotation).
            assert len(failed) <= clients
            assert all(r[2] == 502 and f"replica {victim.name} of 'kill' failed".encode() in r[3] for r in failed)
            assert len({r[0] for r in failed}) == len(failed)
            assert victim.state == RState.FAILED and "killed by SIGKILL" in victim.reason
            await until(lambda: len(svc.ready()) == 2, what="a replacement replica")

    run(main())


def test_responses_stream_through_unbuffered():
    async def main():
        async with stack() as st:
            st.put(name="sse", scale_to_zero_after_s=60)
            async with st.http.get(f"{st.url}/sse/stream", params={"n": "3", "ms": "300"}) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                first = await r.content.readuntil(b"\n\n")
                assert json.loads(first[len(b"data: "):])["i"] == 0
                rest = await r.read()
            assert rest.count(b"data: ") == 2
            async with st.http.get(f"{st.url}/sse/big", params={"kb": "2048"}) as r:
                assert len(await r.read()) == 2048 * 1024

    run(main())


def test_bad_input_gets_clear_errors():
    async def main():
        async with stack(quota=0.5) as st:
            st.put(name="small", max_body_bytes=1000, scale_to_zero_after_s=60)
            async with st.http.get(f"{st.url}/BAD_name/x") as r:
                err = (await r.json())["error"]
                assert r.status == 404 and "lowercase" in err["message"]
            async with st.http.get(f"{st.url}/nope/predict") as r:
                err = (await r.json())["error"]
                assert r.status == 404 and err["field"] == "service" and "nope" in err["message"]
            async with st.http.post(f"{st.url}/small/predict", data=b"x" * 5000) as r:
                err = (await r.json())["error"]
                assert r.status == 413 and err["field"] == "body" and "1000" in err["message"]
            async with st.http.post(f"{st.url}/small/predict", data=b"x" * 10) as r:
                assert r.status == 200 and json.loads(await r.read())["body_len"] == 10

            # whole GPU in a project with 0.5 GPUs of quota: never placed, the reason shows
            big = st.put(name="big", gpu=1, request_timeout_s=0.5, queue_limit=1)
            first = asyncio.ensure_future(st.http.get(f"{st.url}/big/predict"))
            await until(lambda: len(big.held) == 1, what="a held request")
            async with st.http.get(st.url.removesuffix("/serve") + "/metrics") as m:
                text = await m.text()
            assert 'gpupool_activator_held_requests{service="big"} 1.0' in text
            assert 'gpupool_activator_replicas{service="big"} 1.0' in text  # pending
            async with st.http.get(f"{st.url}/big/predict") as r:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
                assert "queue_limit" in (await r.json())["error"]["message"]
            r = await first
            assert r.status == 503 and "Retry-After" in r.headers
            assert "request_timeout_s" in (await r.json())["error"]["message"]
            r.release()
            rep = big.status()["replica_list"][0]
            assert rep["state"] == "pending" and "quota" in rep["reason"]

    run(main())


async def raw_http(port: int, data: bytes) -> bytes:
    """Send bytes as they are and read until the activator closes or goes quiet."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    out = b""
    try:
        while chunk := await asyncio.wait_for(r.read(65536), 2.0):
            out += chunk
    except asyncio.TimeoutError:
        pass
    w.close()
    return out


def test_http_details_pass_through_the_activator():
    """HEAD (no body, connection not reused), HTTP/1.0 with a streamed body (ends at the
    close), a chunked request body, Expect: 100-continue, pipelined requests answered in
    order, and a clear 400 for a request that is not HTTP."""
    async def main():
        async with stack() as st:
            svc = st.put(name="http", min_replicas=1, scale_to_zero_after_s=60)
            await until(lambda: svc.ready(), what="a ready replica")
            port = int(st.url.rsplit(":", 1)[1].split("/")[0])
            base = "/serve/http"
            out = await raw_http(port, f"HEAD {base}/health HTTP/1.1\r\nHost: x\r\n\r\n"
                                       f"GET {base}/health HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head, _, rest = out.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 405") and rest.startswith(b"HTTP/1.1 200")
            assert rest.endswith(b"\r\n\r\nok")
            out = await raw_http(port, f"GET {base}/stream?n=2&ms=10 HTTP/1.0\r\n\r\n".encode())
            assert out.startswith(b"HTTP/1.1 200") and b"Connection: close" in out
            assert out.count(b"data: ") == 2 and b"Transfer-Encoding" not in out
            out = await raw_http(port, f"POST {base}/predict HTTP/1.1\r\nHost: x\r\n"
                                       "Transfer-Encoding: chunked\r\n\r\n"
                                       "5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n".encode())
            assert json.loads(out.partition(b"\r\n\r\n")[2])["body_len"] == 8
            out = await raw_http(port, f"POST {base}/predict HTTP/1.1\r\nHost: x\r\nContent-Length"
                                       ": 3\r\nExpect: 100-continue\r\n\r\nabc".encode())
            assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200")
            out = await raw_http(port, b"".join(
                f"GET {base}/predict?seq={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(3)))
            assert [json.loads(b.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1")[0])["seq"]
                    for b in out.split(b"HTTP/1.1 200")[1:]] == ["0", "1", "2"]
            out = await raw_http(port, b"NOT HTTP\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in out

    run(main())


async def exchange(port: int, data: bytes) -> tuple[bytes, bytes, bool]:
    """One request on a new connection: (head, body, whether the activator then closed it).
    The response must have a Content-Length."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    body = await asyncio.wait_for(r.readexactly(length), 30)
    try:
        closed = await asyncio.wait_for(r.read(1), 0.5) == b""
    except asyncio.TimeoutError:
        closed = False
    w.close()
    return head, body, closed


def names(head: bytes) -> set[bytes]:
    return {line.split(b":")[0].lower() for line in head.split(b"\r\n")[1:] if line}


def test_headers_on_the_way_to_the_replica_and_back():
    """The replica gets the client's headers less hop-by-hop ones and credentials, its own
    Host and an extended X-Forwarded-For. A plain response head (HTTP/1.1, Content-Length,
    nothing hop-by-hop) reaches a keep-alive client byte for byte as the replica sent it;
    one with hop-by-hop headers, or for a client that asked to close, is rebuilt."""
    async def main():
        async with stack() as st:
            svc = st.put(name="hdr", min_replicas=1, scale_to_zero_after_s=60)
            await until(lambda: svc.ready(), what="a ready replica")
            port = int(st.url.rsplit(":", 1)[1].split("/")[0])
            replica = svc.ready()[0]
            sent = (b"GET /serve/hdr/headers?x=1 HTTP/1.1\r\nHost: front.example\r\n"
                    b"Authorization: token secret\r\nCookie: s=1\r\nX-Forwarded-For: 10.1.2.3\r\n"
                    b"Keep-Alive: 300\r\nTE: trailers\r\nConnection: keep-alive\r\n"
                    b"X-Request-Id: abc\r\nAccept: */*\r\n\r\n")
            head, body, closed = await exchange(port, sent)
            seen = {k.lower(): v for k, v in json.loads(body).items()}
            assert seen["host"] == f"{replica.host}:{replica.port}"
            assert seen["x-forwarded-for"] == "10.1.2.3, 127.0.0.1"
            assert seen["x-request-id"] == "abc" and seen["accept"] == "*/*"
            for gone in ("authorization", "cookie", "keep-alive", "te", "connection"):
                assert gone not in seen, gone
            assert not closed

            # a plain response: through the activator, the head the replica sends directly,
            # byte for byte but the date (it was passed on as it came)
            get = "GET {}predict?ms=0&client=c HTTP/1.1\r\nHost: x\r\n\r\n"
            head, body, _ = await exchange(port, get.format("/serve/hdr/").encode())
            direct, direct_body, _ = await exchange(replica.port, get.format("/").encode())
            strip = lambda h: [x for x in h.split(b"\r\n") if not x.startswith(b"Date:")]  # noqa: E731
            assert strip(head) == strip(direct) and body == direct_body
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"etag" in names(head)

            # hop-by-hop headers from the replica are not passed on; the rest are
            head, body, closed = await exchange(port, (
                b"GET /serve/hdr/headers?set=Keep-Alive:timeout%3D5&set=X-Model:m1 HTTP/1.1\r\n"
                b"Host: x\r\n\r\n"))
            assert b"keep-alive" not in names(head) and b"X-Model: m1\r\n" in head
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and not closed

            # a client that closes gets Connection: close, and the close
            head, body, closed = await exchange(port, b"GET /serve/hdr/headers HTTP/1.1\r\n"
                                                      b"Host: x\r\nConnection: close\r\n\r\n")
            assert b"Connection: close\r\n" in head and closed
            assert json.loads(body)["Host"] == f"{replica.host}:{replica.port}"

    run(main())
