"""The docs site's generated reference pages against their sources, and the project's words.

The reference pages are written by ``docs/_ext/gpupool_reference.py`` when Sphinx starts;
these tests call the same functions and compare them with what they document, read
independently: the options ``gpupool options`` prints, every operation of ``openapi.yaml``,
every console command, every metric the Grafana dashboard queries.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _reference():
    spec = importlib.util.spec_from_file_location("gpupool_reference", ROOT / "docs" / "_ext" / "gpupool_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _reference()


def test_options_page_lists_exactly_what_gpupool_options_prints():
    out = subprocess.run([sys.executable, "-m", "hub_ext.cli", "options"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    printed = re.findall(r"^c\.(\w+)\.(\w+) = ", out, re.M)
    page = re.findall(r"^## `c\.(\w+)\.(\w+)`$", REF.options_md(), re.M)
    assert printed, "gpupool options printed no option"
    assert page == printed


def test_options_page_carries_each_options_help():
    out = subprocess.run([sys.executable, "-m", "hub_ext.cli", "options"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    page = REF.options_md()
    for block in out.strip().split("\n\n"):
        head, _, help_text = block.partition("\n")
        assert " ".join(help_text.split()) in " ".join(page.split()), head


def test_rest_reference_covers_every_operation_of_openapi():
    spec = yaml.safe_load((ROOT / "hub_ext" / "api" / "openapi.yaml").read_text())
    methods = {"get", "put", "post", "patch", "delete", "head", "options", "trace"}
    wanted = [f"{m.upper()} {path}" for path, item in spec["paths"].items() for m in item if m in methods]
    page = re.findall(r"^### `([A-Z]+ \S+)`$", REF.rest_md(), re.M)
    assert len(wanted) > 40
    assert page == wanted


def test_rest_reference_lists_every_request_field():
    spec = yaml.safe_load((ROOT / "hub_ext" / "api" / "openapi.yaml").read_text())
    page = REF.rest_md()
    for name, schema in spec["components"]["schemas"].items():
        for field in REF._merged(schema, spec).get("properties", {}):
            assert f"| `{field}` |" in page, f"{name}.{field}"


def test_cli_reference_covers_every_console_command_and_subcommand():
    pyproject = (ROOT / "pyproject.toml").read_text()
    scripts_table = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = re.findall(r"^([\w-]+) = ", scripts_table, re.M)
    page = REF.cli_md()
    progs = set(re.findall(r"^#+ `([^`]+)`$", page, re.M))
    assert set(scripts) <= {p.split()[0] for p in progs}
    for parser in REF.parsers():
        for name, _help, sub in REF._subparsers(parser):
            assert sub.prog in progs, name
    assert "gpupool training submit" in progs and "gpupool-sim replay" in progs


def test_metrics_reference_holds_every_metric_the_dashboard_queries():
    names = {m[0] for m in REF.metrics()}
    dashboard = (ROOT / "chart" / "dashboards" / "gpupool.json").read_text()
    queried = set(re.findall(r"\b(gpupool_[a-z_]+?)(?:_bucket|_sum|_count)?\b", dashboard))
    assert queried
    assert queried <= names, sorted(queried - names)


def test_helm_reference_lists_every_schema_value():
    schema = json.loads((ROOT / "chart" / "values.schema.json").read_text())
    page = REF.helm_md()

    def leaves(node, path=""):
        props = node.get("properties")
        if props and node.get("type", "object") == "object":
            for key, sub in props.items():
                yield from leaves(sub, f"{path}.{key}" if path else key)
        else:
            yield path

    for leaf in leaves(schema):
        assert f"| `{leaf}` |" in page, leaf


def test_interception_reference_documents_every_variable_the_library_reads():
    read = set()
    for path in (ROOT / "native" / "src").glob("*.[ch]"):
        read |= set(re.findall(r'getenv\("(GPUPOOL_\w+)"\)', path.read_text()))
    assert {name for name, _meaning, _file in REF.native_env()} == read
    assert all(meaning.strip() for _name, meaning, _file in REF.native_env())


def test_an_undocumented_library_variable_fails_the_build(tmp_path, monkeypatch):
    src = tmp_path / "native" / "src"
    src.mkdir(parents=True)
    (src / "x.c").write_text('/* env GPUPOOL_A: documented */\nconst char *a = getenv("GPUPOOL_A");\n'
                             'const char *b = getenv("GPUPOOL_B");\n')
    monkeypatch.setattr(REF, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="GPUPOOL_B"):
        REF.native_env()


# ------------------------------------------------------------------- the project's words
# "session" is a word of the product where it means a login, HTTP, database or process
# session; it must never tell the story of who worked on the project, or when.
DIARY = re.compile(
    r"\b(?:this|that|earlier|previous|next|last|final|whole|all|same|each|every|"
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\s+sessions?\b"
    r"|\bsessions?'s?\s+(?:tree|figures?|changes?|runs?|account|code|record|work|end)\b"
    r"|\bsessions'",
    re.I)
# In the README and the docs every "session" must be one of these.
PRODUCT_SESSION = re.compile(
    r"login sessions?|end-session|HTTP sessions?|database sessions?|SQLAlchemy sessions?|"
    r"ClientSession|sessionmaker|sessions? of their own|audit\.record\(session", re.I)
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".def", ".yaml", ".yml", ".json", ".toml", ".sh", ".tpl",
                 ".txt", ".cfg", ".html", ".go", ".map", ""}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and path.suffix in TEXT_SUFFIXES and path != Path(__file__).resolve():
            try:
                files.append((path, path.read_text()))
            except UnicodeDecodeError:
                continue
    return files


def test_no_diary_sessions_in_the_tree():
    found = []
    for path, text in _tracked_text_files():
        for n, line in enumerate(text.splitlines(), 1):
            if DIARY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_readme_and_docs_speak_of_sessions_only_as_product_words():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for path in pages:
        if "_build" in path.parts or "_generated" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            rest = PRODUCT_SESSION.sub("", line)
            if re.search(r"session", rest, re.I):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_diary_check_catches_diary_words():
    for line in ("the seventh session's figures", "Before this session's change", "earlier sessions",
                 "on this session's final tree", "the sessions' accounts"):
        assert DIARY.search(line), line
    for line in ("with Session() as session:", "aiohttp.ClientSession()", '@pytest.fixture(scope="session")',
                 "servers run in sessions of their own"):
        assert not DIARY.search(line), line
