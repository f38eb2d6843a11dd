"""Run code in a kernel, or a command in a terminal, of a user's JupyterLab server through
Jupyter's REST and websocket API (what a notebook and the Terminal tab do), to check the
environment inside the server."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


async def _run(base: str, server_path: str, token: str, code: str, timeout: float) -> str:
    headers = {"Authorization": f"token {token}"}
    api = base.rstrip("/") + server_path.rstrip("/") + "/api/kernels"
    r = await AsyncHTTPClient().fetch(api, method="POST", body="{}", headers=headers, request_timeout=timeout)
    kid = json.loads(r.body)["id"]
    ws_url = api.replace("http", "ws", 1) + f"/{kid}/channels"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=headers, connect_timeout=timeout))
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": uuid.uuid4().hex,
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }))
    out = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        raw = await asyncio.wait_for(ws.read_message(), deadline - loop.time())
        if raw is None:
            break
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    ws.close()
    await AsyncHTTPClient().fetch(f"{api}/{kid}", method="DELETE", headers=headers, raise_error=False)
    return "".join(out)


def run_code(base: str, server_path: str, token: str, code: str, timeout: float = 60) -> str:
    """Runs in its own thread: Playwright's sync API already runs a loop in this one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _run(base, server_path, token, code, timeout)).result()


async def _terminal(base: str, server_path: str, token: str, command: str, until: re.Pattern,
                    timeout: float) -> str:
    headers = {"Authorization": f"token {token}"}
    root = base.rstrip("/") + server_path.rstrip("/")
    r = await AsyncHTTPClient().fetch(root + "/api/terminals", method="POST", body="{}", headers=headers,
                                      request_timeout=timeout)
    name = json.loads(r.body)["name"]
    ws = await websocket_connect(HTTPRequest(root.replace("http", "ws", 1) + f"/terminals/websocket/{name}",
                                             headers=headers, connect_timeout=timeout))
    ws.write_message(json.dumps(["stdin", command + "\r"]))
    out = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while loop.time() < deadline and not until.search(out):
            raw = await asyncio.wait_for(ws.read_message(), deadline - loop.time())
            if raw is None:
                break
            msg = json.loads(raw)
            if msg[0] == "stdout":
                out += msg[1]
    finally:
        ws.close()
        await AsyncHTTPClient().fetch(f"{root}/api/terminals/{name}", method="DELETE", headers=headers,
                                      raise_error=False)
    return out


def run_in_terminal(base: str, server_path: str, token: str, command: str, until: str,
                    timeout: float = 60) -> str:
    """Type ``command`` into a new JupyterLab terminal (its REST and websocket API, what the
    Terminal tab does); what the terminal printed until the regex ``until`` matched it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _terminal(base, server_path, token, command, re.compile(until),
                                                  timeout)).result()
