"""What the spawn form's panel says comes from the request rules themselves
(hub_ext.requests.capacity.answer, ``POST /capacity``): Start's own refusal, and what a share of a GPU
means on the GPUs the request may land on. No hub needed: the starter organisation and the
declared inventory in a database."""

import re
from pathlib import Path

import pytest

from hub_ext.config import Gpupool
from hub_ext.db.tables import NodeRow
from hub_ext.org import projects as org
from hub_ext.requests import capacity
from hub_ext.requests.limits import limits_for
from hub_ext.requests.rules import FieldError, parse_request
from hub_ext.schema import make_sessionmaker

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def s(tmp_path):
    with make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")() as s:
        org.load_starter(s, ROOT / "hub_ext" / "starter_org.yaml")
        s.add(NodeRow(name="local", gpus=[{"index": i, "model": H100, "memory_mib": 81559, "uuid": f"GPU-{i}"}
                                          for i in range(4)], cpu_milli=16000, memory_mib=131072))
        s.commit()
        yield s


def form(**fields) -> dict:
    """Fields as the spawn form sends them: lists of strings."""
    return {"project": ["nlp"], "gpu_mode": ["fraction"], "gpu_fraction": ["0.25"], "gpu_memory_gib": ["8"],
            "gpus": ["1"], "cpu": ["1"], "memory_gib": ["4"], **{k: [v] for k, v in fields.items()}}


@pytest.mark.parametrize("fraction, message", [
    ("0", "gpu_fraction: must be from 0.05 to 1, got '0'"),
    ("1.5", "gpu_fraction: must be from 0.05 to 1, got '1.5'"),
    ("abc", "gpu_fraction: must be a number from 0.05 to 1, got 'abc'"),
])
def test_a_bad_fraction_gets_starts_own_refusal(s, fraction, message):
    limits = limits_for(s, Gpupool(), "alice")
    with pytest.raises(FieldError) as start:
        parse_request(form(gpu_fraction=fraction), limits)  # what Start answers
    assert capacity.answer(s, limits, form(gpu_fraction=fraction)) == \
        {"ok": False, "field": "gpu_fraction", "message": str(start.value)}
    assert str(start.value) == message


@pytest.mark.parametrize("fields, gpus, share", [
    ({"gpu_fraction": "0.25"}, 0.25, f"0.25 of an {H100}: 19.9 GiB of GPU memory and a 25% compute share."),
    ({"gpu_fraction": "0.05"}, 0.05, f"0.05 of an {H100}: 4 GiB of GPU memory and a 5% compute share."),
    ({"gpu_mode": "memory", "gpu_memory_gib": "20"}, 0.252,
     f"20 GiB of GPU memory on an {H100}: 0.252 of it, a 26% compute share."),
    ({"gpu_mode": "whole", "gpus": "2", "preemptible": "true"}, 2,
     f"2 whole {H100} GPUs: 79.6 GiB of GPU memory and all of its compute each."),
    ({"gpu_mode": "none"}, 0, "No GPU: CPUs and memory only."),
])
def test_the_answer_counts_the_gpus_and_says_what_the_share_is(s, fields, gpus, share):
    a = capacity.answer(s, limits_for(s, Gpupool(), "alice"), form(**fields))
    assert a["ok"] and a["gpus"] == gpus and a["share"] == share, a


def test_the_gpu_memory_bound_is_the_largest_gpus_rounded_down(s):
    """79.6 GiB, not 79.6474609375: the rules hold a request to the bound the form shows."""
    limits = limits_for(s, Gpupool(), "alice")
    assert limits.gpu_memory_max_gib == 79.6
    assert parse_request(form(gpu_mode="memory", gpu_memory_gib="79.6"), limits).gpu_memory_gib == 79.6
    with pytest.raises(FieldError) as e:
        parse_request(form(gpu_mode="memory", gpu_memory_gib="79.64"), limits)
    assert str(e.value) == "gpu_memory_gib: must be from 0.5 to 79.6 GiB, got '79.64'"


def test_the_first_workspace_tutorial_asks_for_what_waits_and_quotes_what_is_refused(s):
    """docs/tutorials/first-workspace.md, step 4: bob asks for whole GPUs in nlp (quota 1)
    while alice's quarter runs there. What the page has him ask for is accepted (and waits for
    the quota: test_browser.py runs it); the larger request it quotes is refused in those words."""
    page = (ROOT / "docs" / "tutorials" / "first-workspace.md").read_text()
    step = page.split("## 4.")[1].split("\n## ")[0]
    asked = re.search(r"ask for `(\d+)` whole GPU", step)
    refused = re.search(r"asked for `(\d+)` whole GPUs? instead.*?\*Cannot run: ([^*]+)\*", step, re.S)
    assert asked and refused, step
    limits = limits_for(s, Gpupool(), "bob")
    quota = next(p["gpus"] for p in org.list_projects(s) if p["name"] == "nlp")
    ok = capacity.answer(s, limits, form(gpu_mode="whole", gpus=asked[1]))
    assert ok["ok"] and ok["gpus"] <= quota < ok["gpus"] + 0.25, ok  # fits the quota, not beside alice's
    no = capacity.answer(s, limits, form(gpu_mode="whole", gpus=refused[1]))
    assert not no["ok"] and no["message"] == " ".join(refused[2].split()), no
