"""The install path's shell blocks as ``e2e/test_docs_install.py`` runs them (``e2e/docs_blocks.py``): every section
is found, the blocks not run here are few and named, and the markers mean what the extractor says."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "e2e"))
import docs_blocks  # noqa: E402

#: Blocks of the install path not run against the test cluster, by name (file:line of the fence) -> why.
#: Empty today: every step runs here. A new skip must be added here too, so it is a decision, not a drift.
EXPECTED_SKIPPED: dict[str, str] = {}


def test_every_section_of_the_install_path_has_blocks() -> None:
    blocks = docs_blocks.install_path()
    for doc, heading in docs_blocks.INSTALL_PATH:
        assert any(b.doc == doc and b.section == heading for b in blocks), f"{doc}: {heading!r} has no bash block"


def test_the_skipped_blocks_are_few_and_named() -> None:
    skipped = {b.name: b.skip for b in docs_blocks.install_path() if b.skip}
    assert skipped == EXPECTED_SKIPPED
    assert len(skipped) <= docs_blocks.MAX_SKIPPED


def test_the_readme_quickstart_is_short_and_ends_succeeded() -> None:
    (block,) = docs_blocks.blocks("README.md", "Cluster quickstart")
    commands = [line for line in block.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) <= 10
    assert "helm install" in block.text and "=Succeeded" in block.text


def test_markers_fences_and_section_bounds(tmp_path: pathlib.Path) -> None:
    (tmp_path / "d.md").write_text("\n".join([
        "# Doc", "## Steps", "text",
        "```bash", "# a comment, not a heading", "echo one", "```",
        "<!-- docs-test: skip: needs a cloud account -->", "```bash", "cloud login", "```",
        "<!-- docs-test: expect-error: denied -->", "```bash", "false", "```",
        "```yaml", "a: 1", "```",
        "### Sub", "```bash", "echo sub", "```",
        "## Next", "```bash", "echo next", "```", ""]))
    got = docs_blocks.blocks("d.md", "Steps", root=tmp_path)
    assert [b.text for b in got] == ["# a comment, not a heading\necho one\n", "cloud login\n", "false\n", "echo sub\n"]
    assert [(b.skip, b.expect_error) for b in got] == [("", ""), ("needs a cloud account", ""), ("", "denied"),
                                                        ("", "")]
    assert got[0].name == "d.md:4"
    with pytest.raises(KeyError, match="Missing"):
        docs_blocks.blocks("d.md", "Missing", root=tmp_path)
