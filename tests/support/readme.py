"""The README's examples, found by what they hold, to run as written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
README_SERVICE = "http://127.0.0.1:8000"
"""The service address the examples name; tests put a live one in its place."""


def readme_block(marker: str, language: str = "python") -> str:
    """The README's one ``language`` block that holds ``marker`` (dedented: a block may sit in a list)."""
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return textwrap.dedent(block)
