"""The design (docs/design/, one page per topic) is the design the code cites, and it describes code
that exists.

* Every ``docs/design.md §N[.M]`` citation in canary/, sandbox/, tests/, docs/, benchmarks/ and the
  README (and the named section in .importlinter) resolves to a numbered heading of one of the design
  pages; a ``docs/design/<page>.md §N`` citation to a heading of that page. docs/design.md maps the
  section numbers to the pages, and every top-level section is on the page it names.
* The index (docs/design/README.md) lists every page; each page is at most 15 KB.
* Nothing cites the design brief that lived outside the repository.
* Every module the design names — ``canary/...py``, ``sandbox/...py``, a dotted ``canary.x.y`` —
  exists; its links resolve; its usage example runs; the names its API table lists are exported.

Each check is a function over text, so the tests at the bottom can show that it catches what it is for.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT
from tests.deploy.test_docs import headings

DESIGN = ROOT / "docs" / "design.md"  # the map from section numbers to pages
DESIGN_DIR = ROOT / "docs" / "design"
INDEX = DESIGN_DIR / "README.md"
MAX_PAGE_BYTES = 15 * 1024
SECTION = "\u00a7"  # spelled out so this file's own patterns are not citations
QUOTE = '"'
MAP_NAME = "docs/design" + ".md"  # split so that this file's own code is not a named citation
CITING_TREES = ("canary", "sandbox", "tests", "docs", "benchmarks")
CITING_FILES = ("README.md", "CONTRIBUTING.md", ".importlinter", "Makefile", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".json", ".cfg", ".ini", ".sh", ".tpl"}
SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}

_NUMBER = rf"{SECTION}(\d+(?:\.\d+)*)"
_GAP = r"[\s#*>`)\]]*"  # line breaks, comment markers and Markdown between the file name and the section
_CITATION = re.compile(
    rf"docs/design(?:\.md|/([\w-]+\.md)){_GAP}({_NUMBER}(?:{_GAP}(?:,|and|/)?{_GAP}{_NUMBER})*)",
    flags=re.MULTILINE,
)
_NAMED_CITATION = re.compile(r'docs/design(?:\.md|/([\w-]+\.md)),?\s*"(\w[^"]*)"')
# The brief lived in a shared directory outside the repository (split so this line is not a hit).
_OUTSIDE = re.compile("|".join([rf"DESIGN(?:\.md)?\s*{SECTION}", "shared" + "/DESIGN"]))
_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s+(.+)$", flags=re.MULTILINE)
_PATH = re.compile(r"(?<![\w./-])((?:canary|sandbox|tests|benchmarks)/[\w/-]+\.py)(?!\w)")
_DOTTED = re.compile(r"(?<![\w./-])((?:canary|canary_sandbox|benchmarks)(?:\.[A-Za-z_]\w*)+)")


def citing_files(root: Path = ROOT) -> Iterator[Path]:
    for name in CITING_FILES:
        if (root / name).is_file():
            yield root / name
    for tree in CITING_TREES:
        for path in sorted((root / tree).rglob("*")):
            parts = set(path.relative_to(root).parts)
            if parts & SKIPPED_DIRS or any(part.endswith(".egg-info") for part in parts):
                continue
            if path.is_file() and path.suffix in TEXT_SUFFIXES:
                yield path


def without_code_blocks(markdown: str) -> str:
    return re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)


def index_pages(index: str) -> list[str]:
    """The pages the index lists, in its order: ``- **[Title](page.md)**`` lines."""
    return re.findall(r"^- \*\*\[[^\]]+\]\(([\w-]+\.md)\)\*\*", index, flags=re.MULTILINE)


def design_pages(root: Path = ROOT) -> dict[str, str]:
    """``{"kserve.md": text, ...}`` in the index's order."""
    directory = root / "docs" / "design"
    return {
        name: (directory / name).read_text() for name in index_pages((directory / "README.md").read_text())
    }


def numbered_headings(design: str) -> dict[str, str]:
    """``{"2.4": "Who changed the percentage", ...}`` for the numbered headings of the design."""
    return {number: title.strip() for number, title in _HEADING.findall(without_code_blocks(design))}


def page_citations(text: str) -> Iterator[tuple[str, str]]:
    """``(page, number)`` per cited section; page is "" for ``docs/design.md`` (any page)."""
    for match in _CITATION.finditer(text):
        for number in re.findall(_NUMBER, match.group(2)):
            yield match.group(1) or "", number


def citations(text: str) -> Iterator[str]:
    for _, number in page_citations(text):
        yield number


def dangling_citations(files: Iterable[Path], pages: dict[str, str], root: Path = ROOT) -> list[str]:
    by_page = {name: numbered_headings(text) for name, text in pages.items()}
    sections = {number: title for found in by_page.values() for number, title in found.items()}
    problems = []
    for path in files:
        text = path.read_text(errors="replace")
        for page, number in page_citations(text):
            cited = f"docs/design/{page}" if page else MAP_NAME
            if number not in (by_page.get(page, {}) if page else sections):
                problems.append(f"{path.relative_to(root)}: {cited} {SECTION}{number} has no heading")
        for page, name in _NAMED_CITATION.findall(text):
            cited = f"docs/design/{page}" if page else MAP_NAME
            titles = " | ".join((by_page.get(page, {}) if page else sections).values())
            if name not in titles:
                problems.append(f"{path.relative_to(root)}: {cited} {QUOTE}{name}{QUOTE} has no heading")
    return problems


def misplaced_sections(section_map: str, pages: dict[str, str]) -> list[str]:
    """docs/design.md's table rows (numbers, then a link to ``design/<page>.md``): every section a row names is on
    its page, and every top-level section has a row."""
    by_page = {name: numbered_headings(text) for name, text in pages.items()}
    problems, mapped = [], set()
    rows = re.findall(
        rf"^\|([^|]*{SECTION}[^|]*)\|\s*\[[^\]]*\]\(design/([\w-]+\.md)\)", section_map, flags=re.MULTILINE
    )
    for numbers, page in rows:
        for number in re.findall(_NUMBER, numbers):
            mapped.add(number)
            if number not in by_page.get(page, {}):
                problems.append(f"{SECTION}{number} is not on {page}")
    for found in by_page.values():
        for number in found:
            if "." not in number and number not in mapped:
                problems.append(f"{SECTION}{number} has no row")
    return problems


def outside_pointers(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if _OUTSIDE.search(line):
                problems.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return problems


def _module_file(dotted: str, root: Path) -> Path | None:
    parts = dotted.split(".")
    base = root / "sandbox" if parts[0] == "canary_sandbox" else root
    path = base.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted_exists(dotted: str, root: Path) -> bool:
    """A module, or attributes reachable from the longest module prefix (``canary.kserve.view.observe``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _module_file(module, root) is None:
            continue
        if cut == len(parts):
            return True
        found: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def missing_modules(design: str, root: Path = ROOT) -> list[str]:
    problems = [
        f"no file {path}" for path in sorted(set(_PATH.findall(design))) if not (root / path).is_file()
    ]
    problems += [
        f"no module {name}" for name in sorted(set(_DOTTED.findall(design))) if not _dotted_exists(name, root)
    ]
    return problems


def section(design: str, number: str) -> str:
    start = re.search(rf"^## {re.escape(number)}\. .*$", design, flags=re.MULTILINE)
    assert start, f"no section {number}"
    end = re.search(r"^## \d+\. ", design[start.end() :], flags=re.MULTILINE)
    return design[start.start() : start.end() + end.start()] if end else design[start.start() :]


def api_table_names(design: str) -> list[str]:
    """The identifiers in the first column of the public-API table (``decide(...)`` -> ``decide``)."""
    names = []
    for line in section(design, "9").splitlines():
        if line.startswith("| `"):
            first = line[1:].split(" | ", 1)[0]
            names += re.findall(r"`(\w+)", first)
    return names


# -- the repository ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    assert DESIGN.is_file(), "docs/design.md is cited by the code: it must exist (the section map)"
    return design_pages()


@pytest.fixture(scope="module")
def design(pages: dict[str, str]) -> str:
    """Every page, in the index's order."""
    return "\n".join(pages.values())


def test_the_index_lists_every_page_and_each_is_small(pages: dict[str, str]) -> None:
    on_disk = sorted(path.name for path in DESIGN_DIR.glob("*.md") if path.name != "README.md")
    assert sorted(pages) == on_disk, "docs/design/README.md lists every page, once"
    for path in [INDEX, *(DESIGN_DIR / name for name in pages)]:
        assert len(path.read_bytes()) <= MAX_PAGE_BYTES, f"{path.name}: split it, or move history out"


def test_the_section_map_names_each_sections_page(pages: dict[str, str]) -> None:
    assert misplaced_sections(DESIGN.read_text(), pages) == []


def test_the_brief_sections_are_there(design: str) -> None:
    sections = numbered_headings(design)
    for number in ("1", "2", "2.1", "2.2", "2.3", "2.4", "3", "4", "5", "6", "7", "8", "9", "10", "11"):
        assert number in sections, number
    top = [number for number in sections if "." not in number]
    assert top == sorted(top, key=int), "top-level sections out of order"


def test_every_citation_resolves(pages: dict[str, str]) -> None:
    files = list(citing_files())
    found = [number for path in files for number in citations(path.read_text(errors="replace"))]
    assert len(found) >= 20 and "2.4" in found, "the citation pattern no longer finds the code's citations"
    assert dangling_citations(files, pages) == []


def test_nothing_cites_the_brief_outside_the_repository() -> None:
    assert outside_pointers(citing_files()) == []


def test_every_module_named_exists(design: str) -> None:
    assert len(_PATH.findall(design)) >= 10 and len(_DOTTED.findall(design)) >= 10
    assert missing_modules(design) == []


def test_links_resolve(pages: dict[str, str]) -> None:
    for path in [DESIGN, INDEX, *(DESIGN_DIR / name for name in pages)]:
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code_blocks(path.read_text())):
            if re.match(r"https?://", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            assert resolved.exists(), f"{path.name}: {target}"
            if anchor:
                assert anchor in headings(resolved), f"{path.name}: no heading for {target}"


def test_the_usage_example_runs(design: str, capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", design, flags=re.DOTALL)
    exec(compile(example, str(DESIGN_DIR / "layers-and-api.md"), "exec"), {"__name__": "design_example"})
    assert "CanarySucceeded" in capsys.readouterr().out


def test_the_api_table_lists_exported_names(design: str) -> None:
    import canary.rollout

    names = api_table_names(design)
    assert {"decide", "evidence_request", "apply_command", "RolloutState", "Timeline"} <= set(names)
    assert [name for name in names if name not in canary.rollout.__all__] == []


# -- the checks catch what they are for --------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return list(citing_files(tmp_path))


def test_a_dangling_citation_is_caught(tmp_path: Path) -> None:
    pages = {
        "facts.md": "# Design: facts\n## 2. Facts\n### 2.4 Who\n",
        "layers.md": "# Design: layers\n## 8. Layers and packages\n```\n## 9. in code\n```\n",
    }
    files = _tree(
        tmp_path,
        {
            "canary/a.py": f'"""Rules (docs/design.md {SECTION}2.4, {SECTION}9)."""\n',
            "tests/b.py": f"# see docs/design.md\n# {SECTION}2 and {SECTION}2.5\n",
            "README.md": f"[design](docs/design.md) {SECTION}8's layers\n",
            ".importlinter": f"; docs/design.md, {QUOTE}Layers{QUOTE}, explains\n; docs/design.md, {QUOTE}Gone{QUOTE}\n",
            "canary/c.py": f"# docs/design/facts.md {SECTION}2.4, docs/design/layers.md {SECTION}2.4\n",
            "canary/d.py": f"# docs/design/layers.md, {QUOTE}Layers{QUOTE}; docs/design/facts.md, {QUOTE}Layers{QUOTE}\n",
        },
    )
    assert sorted(dangling_citations(files, pages, tmp_path)) == [
        f".importlinter: docs/design.md {QUOTE}Gone{QUOTE} has no heading",
        f"canary/a.py: docs/design.md {SECTION}9 has no heading",
        f"canary/c.py: docs/design/layers.md {SECTION}2.4 has no heading",
        f"canary/d.py: docs/design/facts.md {QUOTE}Layers{QUOTE} has no heading",
        f"tests/b.py: docs/design.md {SECTION}2.5 has no heading",
    ]


def test_a_misplaced_section_is_caught() -> None:
    pages = {"facts.md": "## 1. Job\n## 2. Facts\n### 2.4 Who\n", "layers.md": "## 8. Layers\n"}
    section_map = (
        "| sections | page |\n|---|---|\n"
        f"| {SECTION}1, {SECTION}2.4 | [Facts](design/facts.md) |\n"
        f"| {SECTION}2 | [Layers](design/layers.md) |\n"
    )
    assert misplaced_sections(section_map, pages) == [
        f"{SECTION}2 is not on layers.md",
        f"{SECTION}8 has no row",
    ]
    assert index_pages("- **[Facts](facts.md)**\n  - x [y](facts.md#y)\n- **[L](layers.md)**\n") == [
        "facts.md",
        "layers.md",
    ]


def test_a_pointer_outside_the_repository_is_caught(tmp_path: Path) -> None:
    files = _tree(
        tmp_path,
        {
            "canary/a.py": f"# DESIGN {SECTION}4\n",
            "docs/b.md": f"see DESIGN.md {SECTION}2.1\n",
            "benchmarks/c.py": "# ../shared/" + "DESIGN.md\n",
            "canary/fine.py": f"# docs/design.md {SECTION}4 and a design {SECTION}4\n",
            "canary/__pycache__/a.md": f"DESIGN {SECTION}4\n",
        },
    )
    assert sorted(problem.split(":")[0] for problem in outside_pointers(files, tmp_path)) == [
        "benchmarks/c.py",
        "canary/a.py",
        "docs/b.md",
    ]


def test_a_missing_module_is_caught() -> None:
    design = (
        "`canary/rollout/state.py`, `canary/rollout/gone.py`, `sandbox/canary_sandbox/stack.py`, "
        "`canary.rollout`, `canary.kserve.view.observe`, `canary.rollout.nothing_here`, "
        "`canary_sandbox.emulator`, `canary_sandbox.nowhere`, `kserve-canary.dev/v1alpha1`, "
        "`benchmarks.queries`."
    )
    assert missing_modules(design) == [
        "no file canary/rollout/gone.py",
        "no module canary.rollout.nothing_here",
        "no module canary_sandbox.nowhere",
    ]
