"""Escaping for markup: `esc`, the text of anything from a result made safe to put into
the report's HTML and its inline SVG alike (`html.escape`, quotes included). Both `plots`
and `html` escape through it, so one function decides what "escaped" means for the page.
It imports nothing of ours.
"""
from __future__ import annotations

import html
from typing import Any


def esc(value: Any) -> str:
    """Escaped text of anything from the result."""
    return html.escape(str(value), quote=True)
