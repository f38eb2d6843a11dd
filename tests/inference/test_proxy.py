"""proxy.Upstream over real sockets, against a server that answers with bytes the test
chooses: which response heads pass to the client as they came (``on_raw_head``) and which
are taken apart and rebuilt (``on_head``), and that both carry the whole body."""

from __future__ import annotations

import asyncio

import pytest

from inference.proxy import Pool

PLAIN = (b"HTTP/1.1 200 OK\r\nServer: m\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"\r\nhello")


class Recorder:
    """A proxy.Sink that writes down what it is given."""

    def __init__(self, plain: bool = True):
        self.plain = plain
        self.raw_head = None
        self.head = None
        self.body = b""
        self.done = asyncio.get_running_loop().create_future()

    def on_raw_head(self, code, head):
        self.raw_head = (code, head)

    def on_head(self, code, reason, headers, length, bodyless):
        self.head = (code, reason, headers, length, bodyless)

    def on_body(self, data):
        self.body += data

    def flush(self):
        pass

    def on_done(self):
        self.done.set_result(True)

    def on_error(self, exc):
        self.done.set_exception(exc)


async def through(response: bytes, plain: bool = True, split: int = 0) -> Recorder:
    """Send one GET through an Upstream to a server that answers ``response`` (in two
    writes at ``split`` when given)."""
    async def answer(r, w):
        await r.readuntil(b"\r\n\r\n")
        if split:
            w.write(response[:split])
            await w.drain()
            await asyncio.sleep(0.05)
        w.write(response[split:])
        await w.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pool = Pool("127.0.0.1", port)
        up = await pool.connect()
        sink = Recorder(plain)
        up.send(sink, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"", reused=False)
        await asyncio.wait_for(sink.done, 10)
        up.transport.close()
        return sink
    finally:
        server.close()


@pytest.mark.parametrize("split", [0, 20, len(PLAIN) - 2])
def test_a_plain_head_passes_as_it_came(split):
    sink = asyncio.run(through(PLAIN, split=split))
    code, head = sink.raw_head
    assert code == 200 and sink.head is None
    assert head + sink.body == PLAIN  # the head as it came, then the body (or all at once)
    assert head == (PLAIN if split < len(PLAIN) - 5 else PLAIN[:-5])  # with the head, or not


def test_header_names_in_any_case():
    resp = PLAIN.replace(b"Content-Length", b"content-length")
    sink = asyncio.run(through(resp))
    assert sink.raw_head == (200, resp)


@pytest.mark.parametrize("response, why", [
    (PLAIN.replace(b"Server: m", b"Connection: keep-alive"), "hop-by-hop header"),
    (PLAIN.replace(b"Server: m", b"keep-alive: timeout=5"), "hop-by-hop header, lower case"),
    (PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"), "HTTP/1.0"),
    ((b"HTTP/1.1 201 Created\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n"), "chunked"),
])
def test_other_heads_are_rebuilt_without_hop_by_hop_headers(response, why):
    sink = asyncio.run(through(response))
    assert sink.raw_head is None, why
    code, _, headers, _, bodyless = sink.head
    names = {k.lower() for k, _ in headers}
    assert not names & {b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}
    assert sink.body == b"hello" and not bodyless


def test_a_client_that_cannot_take_it_as_it_is_gets_it_rebuilt():
    sink = asyncio.run(through(PLAIN, plain=False))
    assert sink.raw_head is None
    code, reason, headers, length, bodyless = sink.head
    assert (code, reason, length) == (200, b"OK", b"5")
    assert headers == [(b"Server", b"m"), (b"Content-Type", b"text/plain")]
