"""mkdocs hooks for runrow's site.

Docstrings write cross-references as Sphinx roles (``:class:`InvalidInput```), which the
docstring parser leaves as text. This turns each into a link to the API reference entry
it names (through mkdocs-autorefs: an unknown name stays plain code, never a broken link).
"""

from __future__ import annotations

import re
from typing import Any

import runrow

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj):<code>~?\.?([\w.]+)</code>")
_PUBLIC = set(runrow.__all__)


def _identifier(name: str) -> str:
    """``InvalidInput`` -> ``runrow.InvalidInput``; ``Dispatcher.stop`` ->
    ``runrow.Dispatcher.stop``; ``runrow.metrics.X`` stays as written."""
    if name.startswith("runrow."):
        return name
    head = name.split(".")[0]
    return f"runrow.{name}" if head in _PUBLIC else name


def _link(match: re.Match[str]) -> str:
    name = match.group(1)
    title = name.removeprefix("runrow.")
    return f'<autoref identifier="{_identifier(name)}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    """Sphinx roles in rendered docstrings become cross-reference links."""
    return _ROLE.sub(_link, html)
