"""The guides the pages name (docs/own-code.md, docs/pipelines.md, docs/arrays.md), served from
the checkout's docs/ as their Markdown source, so a link on a form works wherever the platform
runs, with no docs site and no third-party file."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def docs_dir() -> Path:
    return Path(settings.BASE_DIR) / "docs"


def guide_path(name: str) -> Path | None:
    """docs/<name>.md, or the one of that name in a folder under docs/ (where a docs site
    keeps its guides); None for no such guide."""
    if not NAME.fullmatch(name):
        return None
    root = docs_dir().resolve()
    found = sorted(root.rglob(f"{name}.md"), key=lambda p: (len(p.parts), str(p)))
    for path in found:
        if path.resolve().is_relative_to(root) and path.is_file():
            return path
    return None


@login_required
def guide(request, name: str):
    path = guide_path(name)
    if path is None:
        raise Http404(f"no guide {name}")
    text = path.read_text(encoding="utf-8", errors="replace")
    return render(request, "web/doc.html", {"name": name, "text": text})
