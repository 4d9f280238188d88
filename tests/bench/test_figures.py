"""The figures the README and docs quote are rendered from recorded runs: a figure edited by hand,
or a record left unrendered, fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragwarden.bench import figures


def test_every_quoted_figure_equals_what_its_recorded_run_renders() -> None:
    for document in sorted({block.document for block in figures.BLOCKS.values()}):
        _, changed = figures.rendered(document)
        assert changed == [], f"{document}: {changed} differ from bench/results (run python -m ragwarden.bench.figures)"


def test_a_figure_edited_by_hand_is_caught_and_a_render_restores_it(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for document in ("README.md", "docs/deployment.md"):
        shutil.copy(figures.REPO / document, tmp_path / document)
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    edited = readme.replace("searches/s at one client", "searches/s (hand-tuned) at one client", 1)
    assert edited != readme
    (tmp_path / "README.md").write_text(edited, encoding="utf-8")
    restored, changed = figures.rendered("README.md", root=tmp_path)
    assert changed == ["performance"] and restored == readme


def test_a_block_whose_markers_are_gone_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    text = (figures.REPO / "docs/deployment.md").read_text(encoding="utf-8")
    (tmp_path / "docs/deployment.md").write_text(text.replace("<!-- figures:capacity -->\n", ""), encoding="utf-8")
    with pytest.raises(KeyError, match="missing their markers"):
        figures.rendered("docs/deployment.md", root=tmp_path)
