"""mkdocs hooks: README.md and the examples' READMEs are pages of the site; Sphinx roles in docstrings read as code.

The site's home page is README.md, so the text a newcomer reads first is written once. README links to the pages
as ``docs/<page>.md``; on the site the home page sits beside them, so those links lose their ``docs/`` and the
strict build checks them like any other page's. The examples' READMEs are included as they are.

The figures stay in assets/ (their scripts write them there): pages show them as ``../assets/<name>.png``,
which GitHub renders from docs/, and the site serves them as ``assets/<name>.png``.

The docstrings name objects Sphinx's way (``:class:`~agentboost.types.Termination```); mkdocstrings renders
them as Markdown, where the role and the ``~`` would show: they are dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
PAGES = {
    "index.md": "README.md",
    **{f"examples/{name}.md": f"examples/{name}/README.md" for name in ("math", "deepcoder", "tau2", "rag")},
}
"""Pages of the site that are files of the repository (each page's own text says so, for readers of docs/)."""
SPHINX_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):<code>~?")


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    for figure in sorted((ROOT / "assets").glob("*.png")):
        files.append(File.generated(config, f"assets/{figure.name}", abs_src_path=str(figure)))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    source = PAGES.get(page.file.src_uri)
    if source is not None:
        markdown = (ROOT / source).read_text(encoding="utf-8")
        if source == "README.md":
            markdown = markdown.replace("](docs/", "](")
    return markdown.replace("](../assets/", "](assets/")


def on_page_content(html: str, **kwargs: Any) -> str:
    return SPHINX_ROLE.sub("<code>", html)
