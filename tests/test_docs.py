"""The README stays short and the documentation holds together, without building the site.

- README.md has at most 250 lines, and its "Tests" section shows the command CI runs
  (`.ci/run` runs that very line).
- Every relative link and image in README.md and in every page under docs/ names a file that
  exists (anchors are left to `mkdocs build --strict`, which CI runs); every page under docs/ is
  in mkdocs.yml's nav, and every nav entry is a page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
TEST_COMMAND = "python3 -m pytest -q"
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", flags=re.S)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (a link shown as code is no link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def relative_targets(text: str) -> list[str]:
    """The file part of every relative link and image target (no URL, no bare anchor)."""
    out = []
    for target in LINK.findall(prose(text)):
        if not target or target.startswith("#") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # an anchor on the same page, or a URL (https:, mailto:)
        out.append(target.split("#", 1)[0].split("?", 1)[0])
    return out


def broken_links(page: Path) -> list[str]:
    return [t for t in relative_targets(page.read_text()) if not (page.parent / t).exists()]


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def nav_pages(node) -> list[str]:
    """Every page path named in mkdocs.yml's nav (nested sections included)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    return []


def section(text: str, title: str) -> str:
    """The body of the `## <title>` section, up to the next heading of level two or one."""
    m = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^#{{1,2}} |\Z)", text, flags=re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move detail into docs/"


def test_the_readme_shows_the_test_command_ci_runs():
    code = "\n".join(m.group(0) for m in FENCE.finditer(section(README.read_text(), "Tests")))
    assert re.search(rf"^{re.escape(TEST_COMMAND)}(\s|$)", code, flags=re.M), f"the README's Tests section shows no `{TEST_COMMAND}` line"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in [line.strip() for line in ci], f".ci/run does not run `{TEST_COMMAND}`"


def test_ci_builds_the_site_strictly():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^[^#\n]*mkdocs build --strict", ci, flags=re.M), ".ci/run does not run `mkdocs build --strict`"


@pytest.mark.parametrize("page", [README, *pages()], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file(page):
    assert broken_links(page) == [], f"{page.relative_to(REPO)} links to files that do not exist"


def test_the_readme_links_into_the_docs():
    targets = relative_targets(README.read_text())
    assert any(t.startswith("docs/") and t.endswith(".md") for t in targets), targets


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in pages()}
    assert sorted(on_disk - set(nav)) == [], "pages under docs/ that mkdocs.yml's nav leaves out"
    assert sorted(set(nav) - on_disk) == [], "nav entries with no page under docs/"


def test_the_link_check_finds_what_is_broken(tmp_path):
    """The checker itself: links in prose count, links shown as code do not, anchors and URLs are
    not files."""
    (tmp_path / "there.md").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pic.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok too](there.md#part) ![pic](sub/pic.png) [web](https://example.org/x.md)\n"
        "[here](#anchor) [gone](missing.md) ![gone too](sub/none.png \"title\")\n"
        "`[code](not-a-link.md)` and\n```\n[block](neither.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md", "sub/none.png"]
