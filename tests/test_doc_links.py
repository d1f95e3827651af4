"""Every link in the repository's documentation leads somewhere inside the repository: a file, and its section.

A link to a file outside the repository (a sibling checkout, a design note on the developers' machines) is dead for
everyone who clones it; a link to a renamed section is dead for everyone who follows it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
         *sorted((ROOT / "examples").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """The section anchors of a page, as GitHub makes them from its headings."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 1
        while anchor in found:
            anchor, n = f"{slug}-{n}", n + 1
        found.add(anchor)
    return found


def _problems(page: Path, root: Path = ROOT) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    problems = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        name = f"{page.relative_to(root)}: ({target})"
        if not where.is_relative_to(root):
            problems.append(f"{name} leads outside the repository")
        elif not where.exists():
            problems.append(f"{name} leads to nothing")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            problems.append(f"{name}: {where.name} has no section #{anchor}")
    return problems


def test_every_doc_link_resolves_inside_the_repository() -> None:
    problems = [p for page in PAGES for p in _problems(page)]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_dead_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "agents.md").write_text("# Agents\n## Per tool\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Top\n[a](nothing.md) [b](../../outside.md) [c](agents.md#no-such-section) [d](#top) "
                    "[e](agents.md#per-tool) [f](https://example.com/x)\n")
    assert [p.split(": ", 1)[1] for p in _problems(page, tmp_path)] == [
        "(nothing.md) leads to nothing", "(../../outside.md) leads outside the repository",
        "(agents.md#no-such-section): agents.md has no section #no-such-section"]
