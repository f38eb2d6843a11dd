"""The older spelling of the GPU ask (``gpu``) still submits, answered with a
``Deprecation`` header and a ``Warning`` per old field, which the CLI prints on stderr; the
one spelling gets neither."""

import asyncio
import json

from tornado.httpclient import AsyncHTTPClient

from .harness import Cluster
from .test_api import fake_login, serve  # noqa: F401 (fake_login: a fixture)

JOB = {"project": "research", "command": ["true"]}


def test_older_spelling_answers_a_deprecation_header(tmp_path, fake_login, capsys):  # noqa: F811
    from hub_ext import cli

    async def run():
        async with Cluster(tmp_path, gpus=1) as c:
            server, api = serve(c)
            try:
                answers = []
                for name, gpu in (("old", {"gpu": 0.5}), ("new", {"gpu_fraction": 0.5})):
                    r = await AsyncHTTPClient().fetch(
                        api.url + "/trainings", method="POST", headers={"X-User": "alice"},
                        body=json.dumps({"name": name, **JOB, **gpu}), raise_error=False)
                    answers.append((r.code, r.headers.get("Deprecation"), r.headers.get_list("Warning"),
                                    json.loads(r.body)["spec"]["gpu"]))
                base_url = api.url.split("/services/")[0]
                await asyncio.get_running_loop().run_in_executor(None, cli.main, [
                    "--url", base_url, "--token", "alice", "training", "submit", "cli-old",
                    "--project", "research", "--gpu", "0.5", "--", "true"])
                return answers
            finally:
                server.stop()

    old, new = asyncio.run(run())
    assert old[:2] == (201, "true") and old[3] == 0.5, old
    assert len(old[2]) == 1 and old[2][0].startswith('299 gpupool "gpu is deprecated: write gpu_mode'), old
    assert new == (201, None, [], 0.5)
    assert "gpupool: warning: gpu is deprecated: write gpu_mode with gpu_fraction or gpus" in capsys.readouterr().err
