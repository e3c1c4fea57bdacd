"""The shell blocks of the install path, as the docs show them: what ``e2e/test_docs_install.py`` runs verbatim.

Role: pure extraction (no I/O beyond reading the docs). ``INSTALL_PATH`` names the sections (file, heading) a user
follows from nothing to a Succeeded RLJob on their cluster; every fenced ```` ```bash ```` block in them is a step.
An HTML comment on the line right before a fence qualifies it:

- ``<!-- docs-test: skip: <why> -->``: not run here (e.g. needs a cloud); the test names every skipped block and
  keeps their number small (``MAX_SKIPPED``);
- ``<!-- docs-test: expect-error: <text> -->``: a command shown failing on purpose (the webhook refusing a job): the
  block must exit non-zero and print ``<text>``.

Neighbours: ``tests/test_docs_blocks.py`` checks the extraction against the docs (fast tier); the e2e test runs the
blocks. Invariant: a block's text is exactly what the reader sees (nothing added, nothing removed).
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: (file, heading text without the #s), in the order a user follows them.
INSTALL_PATH: tuple[tuple[str, str], ...] = (
    ("README.md", "Cluster quickstart"),
    ("docs/install.md", "Install"),
    ("docs/install.md", "Upgrade and uninstall"),
    ("docs/guide.md", "2. Install with Helm: the values that matter"),
    ("docs/guide.md", "5. Volumes per role"),
    ("docs/guide.md", "6. The manifest (CPU)"),
    ("docs/guide.md", "8. Watching progress"),
    ("docs/guide.md", "9. Getting the exported model out"),
)
MAX_SKIPPED = 2
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(skip|expect-error):\s*(.+?)\s*-->$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    doc: str              # file, relative to the repo root
    section: str          # its heading
    line: int             # 1-based line of the opening fence
    text: str             # the block's lines, verbatim
    skip: str = ""        # why it is not run here ("" = run)
    expect_error: str = ""   # text the failing block must print ("" = must succeed)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def section_lines(text: str, heading: str) -> tuple[int, list[str]]:
    """(0-based index of the first line after ``heading``, the lines up to the next heading of its level or
    above); ``KeyError`` when the doc has no such heading."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2) == heading:
            level, body = len(m.group(1)), []
            for following in lines[i + 1:]:
                n = _HEADING.match(following)
                if n and len(n.group(1)) <= level and not _in_fence(body):
                    break
                body.append(following)
            return i + 1, body
    raise KeyError(f"no heading {heading!r}")


def _in_fence(lines: list[str]) -> bool:
    return sum(1 for line in lines if line.startswith("```")) % 2 == 1


def blocks(doc: str, heading: str, *, root: pathlib.Path = ROOT) -> list[Block]:
    """The ```` ```bash ```` blocks of one section, with their markers."""
    start, lines = section_lines((root / doc).read_text(), heading)
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = _MARKER.match(lines[i - 1].strip()) if i > 0 else None
        kind, why = (marker.group(1), marker.group(2)) if marker else ("", "")
        out.append(Block(doc=doc, section=heading, line=start + i + 1, text="\n".join(lines[i + 1:end]) + "\n",
                         skip=why if kind == "skip" else "", expect_error=why if kind == "expect-error" else ""))
        i = end + 1
    return out


def install_path(root: pathlib.Path = ROOT) -> list[Block]:
    """Every block of ``INSTALL_PATH``, in order."""
    return [b for doc, heading in INSTALL_PATH for b in blocks(doc, heading, root=root)]
