"""The CLI's list, describe and delete of workspaces, trainings and inference services come
from one table of resources (hub_ext.cli.RESOURCES): each lists from its REST path, a header
line then one line per item, and deletes at its path with its own words."""

import pytest

from hub_ext import cli

ITEMS = {
    "workspace": {"name": "ws-a", "owner": "a", "project": "p", "state": "running", "gpu_allocated": 0.5},
    "training": {"name": "t", "project": "p", "status": "Running", "gpu": "0.5 GPU", "reason": "",
                 "created": 0},
    "inference": {"name": "s", "project": "p", "ready": 1, "desired": 1, "url": "/u/", "spec": {"gpu": 0.25}},
}
LISTS = {"workspace": ("GET", "/workloads?kind=workspace"), "training": ("GET", "/trainings"),
         "inference": ("GET", "/inferences")}
DELETES = {"workspace": ("stop", "/workloads/x", "x: stopping"), "training": ("delete", "/trainings/x", "x: deleting"),
           "inference": ("delete", "/inferences/x", "x: deleted (replicas drain and stop)")}


def run(argv, answer, monkeypatch):
    calls = []

    def api(args, method, path, body=None):
        calls.append((method, path))
        return answer

    monkeypatch.setattr(cli, "_api", api)
    p = cli.parser()
    for noun in ("training", "inference"):  # registered with the real API: again with the fake
        sub = next(a for a in p._actions if a.dest == "cmd")
        sub.choices.pop(noun)
        (cli.training_cli if noun == "training" else cli.inference_cli).add_parser(sub, api)
    args = p.parse_args(argv)
    args.fn(args)
    return calls


@pytest.mark.parametrize("noun", sorted(cli.RESOURCES))
def test_every_noun_lists_and_deletes_through_the_table(noun, monkeypatch, capsys):
    assert run([noun, "list"], {"items": [ITEMS[noun]]}, monkeypatch) == [LISTS[noun]]
    header, line = capsys.readouterr().out.splitlines()
    assert header.startswith("NAME") and "GPU" in header and line.startswith(ITEMS[noun]["name"])
    action, path, words = DELETES[noun]
    assert ("DELETE", path) in run([noun, action, "x"], {"state": "running"}, monkeypatch)
    assert capsys.readouterr().out.strip() == words


@pytest.mark.parametrize("noun", ("training", "inference"))
def test_describe_json_is_the_api_s_answer(noun, monkeypatch, capsys):
    path = {"training": "/trainings/x", "inference": "/inferences/x"}[noun]
    assert run([noun, "describe", "x", "--json"], {"name": "x"}, monkeypatch) == [("GET", path)]
    assert '"name": "x"' in capsys.readouterr().out
