"""Fixtures for the file loader: folders in the states the tests need, and real PDF bytes."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import docx
import pytest

MANIFEST = """\
rules:
  - glob: "finance/**"
    tenant: acme
    acl: {allow: ["group:finance"], deny: ["user:mallory"]}
    labels: [finance]
    classification: confidential
  - glob: "**/*.md"
    tenant: acme
    acl: {allow: [everyone]}
    classification: public
"""


def _pdf(*pages: str) -> bytes:
    """A minimal valid PDF, one Helvetica text object per page, with a correct xref table."""
    count = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode()]
    font = 3 + 2 * count
    for i, text in enumerate(pages):
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


@pytest.fixture
def make_pdf() -> Callable[..., bytes]:
    """Build a real PDF whose pages hold the given texts."""
    return _pdf


@pytest.fixture
def write_files() -> Callable[[Path, dict[str, str | bytes]], Path]:
    """Write ``{relative path: text or bytes}`` under a folder and return the folder."""

    def write(root: Path, files: dict[str, str | bytes]) -> Path:
        for relative, content in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        return root

    return write


@pytest.fixture
def folder_with_manifest(tmp_path: Path, write_files: Callable[..., Path]) -> Path:
    """A folder holding ``manifest.yaml``: one file matched by two rules, one by the second
    rule only, one two levels below ``finance/``, one matched by no rule."""
    return write_files(
        tmp_path / "docs",
        {
            "manifest.yaml": MANIFEST,
            "finance/q1.md": "# Q1\nrevenue up",
            "finance/deep/q2.txt": "q2 numbers",
            "guide.md": "how to use it",
            "misc/notes.txt": "ungoverned notes",
        },
    )


@pytest.fixture
def folder_with_sidecar(folder_with_manifest: Path) -> Path:
    """The manifest folder, where ``finance/q1.md`` also has a sidecar naming other governance."""
    (folder_with_manifest / "finance/q1.md.acl.yaml").write_text(
        "tenant: globex\nacl: {allow: ['user:alice']}\nclassification: restricted\n", encoding="utf-8"
    )
    return folder_with_manifest


@pytest.fixture
def folder_of_every_format(tmp_path: Path, write_files: Callable[..., Path]) -> Path:
    """One file of each supported type, all governed by one catch-all manifest rule."""
    return write_files(
        tmp_path / "formats",
        {
            "manifest.yaml": "rules:\n  - glob: '**'\n    tenant: acme\n    acl: {allow: [everyone]}\n"
            "    classification: internal\n",
            "a.txt": "plain text",
            "b.md": "# Title\n\nmarkdown *body*",
            "c.html": "<html><head><style>p {color: red}</style><script>var secret = 1;</script></head>"
            "<body><h1>Heading</h1>\n\n\n\n<p>Paragraph one</p><p>Paragraph two</p></body></html>",
            "d.pdf": _pdf("Hello from a PDF"),
            "e.markdown": "long suffix",
            "f.htm": "<p>short suffix</p>",
            "g.rst": "Title\n=====\n\nrestructured text",
            "h.csv": "name,band\nalice,4",
            "i.json": '{"note": "json text"}',
            "LICENSE": "Permission is hereby granted",
            "j.docx": _docx("A Word paragraph", [["cell a", "cell b"]]),
        },
    )


def _docx(paragraph: str, rows: list[list[str]]) -> bytes:
    """A Word document holding ``paragraph`` and one table of ``rows``, made with python-docx."""
    document = docx.Document()
    document.add_paragraph(paragraph)
    table = document.add_table(rows=len(rows), cols=len(rows[0]))
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture
def ungoverned_folder(tmp_path: Path, write_files: Callable[..., Path]) -> Path:
    """Documents with neither sidecar nor manifest."""
    return write_files(tmp_path / "plain", {"one.txt": "one", "two.md": "two"})
