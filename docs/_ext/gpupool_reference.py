"""Reference pages generated from the code at build time, so they cannot drift from it.

Each ``*_md()`` function reads one source of truth and returns a Markdown page body:

* ``options_md``: the traitlets options ``gpupool options`` prints (``hub_ext.cli.option_rows``);
* ``rest_md``: every operation of ``hub_ext/api/openapi.yaml``;
* ``cli_md``: the argparse parsers of every console command;
* ``helm_md``: ``chart/values.schema.json`` with the defaults of ``chart/values.yaml``;
* ``metrics_md``: every Prometheus metric constructed in the Python packages (read with ``ast``);
* ``native_env_md``: every ``getenv("GPUPOOL_...")`` of ``native/src`` with the comment that
  documents it (a variable without one fails the build).

``setup`` writes them to ``docs/reference/_generated/`` when the build starts; the reference
pages include them. ``tests/test_docs.py`` checks the same functions against their sources.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import socket
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "reference" / "_generated"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _cell(text) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------------------ options
def options_md() -> str:
    from hub_ext.cli import option_rows

    out = ["Set in `gpupool_config.py` (`c.CLASS.NAME = value`); `gpupool options` prints the same list.", ""]
    for cls, name, default, help_text in option_rows():
        default = default.replace(str(ROOT) + "/", "")  # paths inside the tree, as the tree names them
        out += [f"## `c.{cls}.{name}`", "", f"Default: `{default}`", "", help_text.strip(), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- REST API
HTTP_METHODS = ("get", "put", "post", "patch", "delete")


def openapi() -> dict:
    return yaml.safe_load((ROOT / "hub_ext" / "api" / "openapi.yaml").read_text())


def operations(spec: dict) -> list[tuple[str, str, dict, list]]:
    """(METHOD, path, operation, parameters) for every operation, in the document's order."""
    ops = []
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in HTTP_METHODS:
            if method in item:
                op = item[method]
                ops.append((method.upper(), path, op, shared + op.get("parameters", [])))
    return ops


def _schema_type(schema: dict, spec: dict) -> str:
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[-1]}](#schema-{schema['$ref'].rsplit('/', 1)[-1].lower()})"
    t = schema.get("type", "object" if "properties" in schema else "any")
    if t == "any" and schema.get("enum"):
        t = "string" if all(isinstance(v, str) for v in schema["enum"]) else "any"
    if isinstance(t, list):
        t = " or ".join(t)
    if t == "array" and "items" in schema:
        return f"array of {_schema_type(schema['items'], spec)}"
    if "enum" in schema:
        return f"{t}: " + ", ".join(f"`{v}`" for v in schema["enum"])
    alternatives = schema.get("oneOf") or schema.get("anyOf")
    if alternatives:
        parts = [_schema_type(s, spec) if ("type" in s or "$ref" in s) else _limits(s) for s in alternatives]
        return (t + ": " if t != "any" else "") + " or ".join(dict.fromkeys(p for p in parts if p))
    return t


def _limits(schema: dict) -> str:
    parts = []
    for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                      ("exclusiveMaximum", "<"), ("minLength", "length >="), ("maxLength", "length <="),
                      ("pattern", "pattern"), ("default", "default")):
        if key in schema:
            parts.append(f"{word} `{schema[key]}`")
    return ", ".join(parts)


def _merged(schema: dict, spec: dict) -> dict:
    """An ``allOf`` schema as one object schema (its parts' properties and required fields)."""
    if "allOf" not in schema:
        return schema
    merged: dict = {"type": "object", "properties": {}, "required": []}
    for part in schema["allOf"]:
        if "$ref" in part:
            part = spec["components"]["schemas"][part["$ref"].rsplit("/", 1)[-1]]
        part = _merged(part, spec)
        merged["properties"].update(part.get("properties", {}))
        merged["required"] += part.get("required", [])
    return merged


def _fields_table(schema: dict, spec: dict) -> list[str]:
    schema = _merged(schema, spec)
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return [f"Body: [{name}](#schema-{name.lower()})", ""]
    props = schema.get("properties")
    if not props:
        return [f"Body: {_schema_type(schema, spec)}", ""]
    required = set(schema.get("required", ()))
    rows = ["| field | type | required | limits | description |", "| --- | --- | --- | --- | --- |"]
    for name, sub in props.items():
        rows.append(f"| `{name}` | {_cell(_schema_type(sub, spec))} | {'yes' if name in required else ''} "
                    f"| {_cell(_limits(sub))} | {_cell(sub.get('description', ''))} |")
    return rows + [""]


def rest_md() -> str:
    spec = openapi()
    base = (f"Base URL: `{spec['servers'][0]['url']}`. Generated from `hub_ext/api/openapi.yaml` "
            "(the hub serves it at `.../openapi.json`).")
    out = [_cell(spec["info"].get("description", "")), "", base, "", "## Operations", ""]
    for method, path, op, params in operations(spec):
        out += [f"### `{method} {path}`", "", _cell(op.get("summary", "")), ""]
        if op.get("description"):
            out += [_cell(op["description"]), ""]
        if op.get("x-gpupool-access"):
            out += [f"Who may: {_cell(op['x-gpupool-access'])}", ""]
        if params:
            out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
            for p in params:
                out.append(f"| `{p['name']}` | {p['in']} | {_cell(_schema_type(p.get('schema', {}), spec))} "
                           f"| {'yes' if p.get('required') else ''} | {_cell(p.get('description', ''))} |")
            out.append("")
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if body:
            out += _fields_table(body, spec)
        codes = ", ".join(f"`{code}` {_cell(r.get('description', ''))}" if "description" in r else f"`{code}`"
                          for code, r in op.get("responses", {}).items())
        out += [f"Responses: {codes}", ""]
    out += ["## Schemas", ""]
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out += [f"({'schema-' + name.lower()})=", f"### {name}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        out += _fields_table(schema, spec)
    return "\n".join(out)


# ---------------------------------------------------------------------------------- CLI
def parsers() -> list[argparse.ArgumentParser]:
    """Every console command's parser (pyproject's [project.scripts] and ``python -m hub_ext.serving``)."""
    from hub_ext import cli as hub_cli
    from hub_ext.serving import standalone
    from scheduler.kubernetes import cli as k8s_cli
    from scheduler.kubernetes import node_agent
    from scheduler.sim import cli as sim_cli

    return [hub_cli.parser(), sim_cli.parser(), k8s_cli.parser(), node_agent.parser(), standalone.parser()]


def _subparsers(p: argparse.ArgumentParser):
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _default(value) -> str:
    """A default as the reader's machine would see it: one taken from the build machine's
    environment or host name is named, not shown."""
    if isinstance(value, str) and value.startswith(socket.gethostname() + "_"):
        return "see meaning"
    if value == socket.gethostname():
        return "the host name"
    for name, env_value in os.environ.items():
        if value == env_value and len(str(value)) > 1:
            return f"`${name}`"
    return f"`{value}`"


def _parser_md(p: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{p.prog}`", ""]
    if p.description and level > 2:
        out += [_cell(p.description.strip().split("\n\n")[0]), ""]
    out += ["```text", p.format_usage().strip(), "```", ""]
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        name = ", ".join(a.option_strings) or a.dest
        if a.choices:
            name += " {" + ",".join(map(str, a.choices)) + "}"
        default = "" if a.default in (None, argparse.SUPPRESS, False, "") or not a.option_strings else _default(a.default)
        rows.append(f"| `{name}` | {_cell(a.help or '')} | {default} |")
    if rows:
        out += ["| argument | meaning | default |", "| --- | --- | --- |", *rows, ""]
    for _name, _help, sub in _subparsers(p):
        out += _parser_md(sub, level + 1)
    return out


def cli_md() -> str:
    out = []
    for p in parsers():
        out += _parser_md(p, 2)
    return "\n".join(out)


# ------------------------------------------------------------------------------ Helm values
KEY_RE = re.compile(r"^(\s*)([A-Za-z0-9_]+):(.*)$")


def values_comments(text: str) -> dict[str, str]:
    """Dotted path -> the comment above a key in values.yaml (same indent) and the one after it."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            pending = [] if set(body) <= set("- ") else [*pending, body]
            continue
        m = KEY_RE.match(line)
        if not m:
            pending = []
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        path = ".".join(k for _, k in stack)
        inline = rest.split("  #", 1)[1].strip() if "  #" in rest else ""
        found[path] = " ".join([*pending, inline]).strip()
        pending = []
    return found


def helm_md() -> str:
    schema = json.loads((ROOT / "chart" / "values.schema.json").read_text())
    values_text = (ROOT / "chart" / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    comments = values_comments(values_text)
    rows = ["| value | type | limits | default | description |", "| --- | --- | --- | --- | --- |"]

    def walk(node: dict, path: str, default) -> None:
        props = node.get("properties")
        if props and node.get("type", "object") == "object":
            for key, sub in props.items():
                sub_default = default.get(key) if isinstance(default, dict) else None
                walk(sub, f"{path}.{key}" if path else key, sub_default)
            return
        shown = "" if default is None else f"`{json.dumps(default)}`"
        limits = _limits(node)
        if "enum" in node:
            limits = ", ".join(filter(None, [limits, "one of " + ", ".join(f"`{v}`" for v in node["enum"])]))
        rows.append(f"| `{path}` | {_cell(_schema_type(node, {}).split(':')[0] if 'enum' in node else _schema_type(node, {}))} "
                    f"| {_cell(limits)} | {_cell(shown)} "
                    f"| {_cell(node.get('description') or comments.get(path, ''))} |")

    walk(schema, "", values)
    intro = ("Every value `chart/values.schema.json` allows (unknown keys are refused at install "
             "and upgrade), with its default from `chart/values.yaml`.")
    return "\n".join([intro, "", *rows, ""])


# --------------------------------------------------------------------------------- metrics
METRIC_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
                "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
                "HistogramMetricFamily": "histogram"}
METRIC_PACKAGES = ("scheduler", "inference", "hub_ext")


def metrics() -> list[tuple[str, str, str, list[str], str]]:
    """(name, type, help, labels, module) of every metric the packages construct."""
    found = []
    for pkg in METRIC_PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn not in METRIC_TYPES or len(node.args) < 2:
                    continue
                try:
                    name, help_text = ast.literal_eval(node.args[0]), ast.literal_eval(node.args[1])
                except ValueError:
                    continue
                labels: list[str] = []
                for arg in [*node.args[2:3], *(k.value for k in node.keywords if k.arg in ("labels", "labelnames"))]:
                    try:
                        labels = list(ast.literal_eval(arg))
                    except ValueError:
                        pass
                if fn == "Counter" or (fn == "CounterMetricFamily" and not name.endswith("_total")):
                    name += "" if name.endswith("_total") else "_total"
                found.append((name, METRIC_TYPES[fn], help_text, labels,
                              str(path.relative_to(ROOT))))
    return sorted(found)


def metrics_md() -> str:
    rows = ["| metric | type | labels | meaning | defined in |", "| --- | --- | --- | --- | --- |"]
    for name, kind, help_text, labels, module in metrics():
        rows.append(f"| `{name}` | {kind} | {_cell(', '.join(f'`{x}`' for x in labels))} | {_cell(help_text)} "
                    f"| `{module}` |")
    return "\n".join(rows + [""])


# ------------------------------------------------------------------- interception library
ENV_RE = re.compile(r'getenv\("(GPUPOOL_[A-Z0-9_]+)"\)')
DOC_RE = re.compile(r"/\*\s*env\s+(GPUPOOL_[A-Z0-9_]+):\s*(.*?)\*/", re.S)


def native_env() -> list[tuple[str, str, str]]:
    """(variable, meaning, file) for every GPUPOOL_* variable the library reads."""
    docs: dict[str, str] = {}
    read: dict[str, str] = {}
    for path in sorted((ROOT / "native" / "src").glob("*.[ch]")):
        text = path.read_text()
        for m in DOC_RE.finditer(text):
            docs[m.group(1)] = " ".join(line.strip().lstrip("*").strip() for line in m.group(2).splitlines())
        for m in ENV_RE.finditer(text):
            read.setdefault(m.group(1), path.name)
    missing = sorted(set(read) - set(docs))
    if missing:
        raise ValueError(f"native/src reads {', '.join(missing)} without an '/* env NAME: ... */' comment")
    return [(name, docs[name], read[name]) for name in sorted(read)]


def native_env_md() -> str:
    rows = ["| variable | meaning | read in |", "| --- | --- | --- |"]
    for name, meaning, file in native_env():
        rows.append(f"| `{name}` | {_cell(meaning)} | `native/src/{file}` |")
    return "\n".join(rows + [""])


PAGES = {"options": options_md, "rest-api": rest_md, "cli": cli_md, "helm-values": helm_md,
         "metrics": metrics_md, "interception-env": native_env_md}


def write_all(_app=None) -> None:
    GENERATED.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        target = GENERATED / f"{name}.md"
        text = make()
        if not target.exists() or target.read_text() != text:  # unchanged files keep Sphinx's cache
            target.write_text(text)


def setup(app):
    app.connect("builder-inited", write_all)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
