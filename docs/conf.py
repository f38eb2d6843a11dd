"""Sphinx configuration of gpupool's docs (MyST Markdown, pydata theme: JupyterHub's stack).

``make docs`` builds with -n -W --keep-going: every warning fails, and with
``myst_heading_anchors`` every internal link (page or heading) is resolved at build time, so
a broken one fails too. External links are not checked (the build runs offline)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "gpupool"
copyright = "gpupool contributors, Apache-2.0"
extensions = ["myst_parser", "gpupool_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "reference/_generated", "_snippets", ".DS_Store"]
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
nitpicky = True

html_theme = "pydata_sphinx_theme"
html_title = "gpupool"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []
