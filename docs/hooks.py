"""mkdocs hook: the site's home page is README.md, so the text a newcomer reads first is written once.

README links to the pages as ``docs/<page>.md``; on the site the home page sits beside them, so those links
lose their ``docs/`` and the strict build checks them like any other page's links.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text(encoding="utf-8").replace("](docs/", "](")
