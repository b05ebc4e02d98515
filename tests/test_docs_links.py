"""The README and docs/ hold together: every relative link and every repository path written in
code resolves to a file or folder, every `#anchor` names a heading of its target, the README stays
a front door, its test command is the one CI runs, and the pages carry no dates (measurements with
dates belong in generated reports and commit messages)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from bench.report import PAGE_HEAD

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 350

TOP_FOLDERS = ("grpo", "environments", "tools", "launch", "bench", "configs", "tests", "docs", ".ci")
"""A path written in code counts as a repository path when it starts with one of these folders
(`outputs/...`, `.servers/...` and `~/.cache/...` are made by runs and installs, not shipped)."""
REPO_PATH = re.compile(rf"^(?:{'|'.join(re.escape(f) for f in TOP_FOLDERS)})/[\w.\-/]*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
DATED = re.compile(
    r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"
    r"|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?\s+(\d{1,2},?\s+)?(19|20)\d\d\b"
)


def _name(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else page.name


def code_paths(text: str) -> list[str]:
    """Repository paths written in code: inline code spans and fenced blocks, split into words.
    A path names a file (its last part has an extension) or a folder (it ends in '/'); other
    words under a top folder are names such as the metric `tools/calls`. A word in a glob or a
    placeholder (`*`, `{...}`, `<...>`) is not a path to check."""
    spans = FENCE.findall(text) + INLINE_CODE.findall(FENCE.sub("", text))
    found = []
    for span in spans:
        for word in span.split():
            word = word.strip("\"'(),;:[]").split("::")[0]  # tests/test_x.py::test_name
            word = word.rstrip(".")
            if REPO_PATH.match(word) and (word.endswith("/") or "." in word.rpartition("/")[2]):
                found.append(word)
    return found


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading: lower case, code marks and punctuation
    dropped (letters of any script, digits, '-' and '_' kept), spaces as '-'."""
    text = heading.strip().lower().replace("`", "")
    kept = "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code), a repeated heading getting -1, -2, ..."""
    names: set[str] = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = name = slug(match.group(1))
            repeat = 0
            while name in names:
                repeat += 1
                name = f"{base}-{repeat}"
            names.add(name)
    return names


def broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{_name(page)}: link {target!r}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{_name(page)}: link {target!r}: no heading with anchor #{anchor}")
    return problems


def test_every_relative_link_and_anchor_resolves():
    problems = [p for page in PAGES for p in broken_links(page)]
    assert problems == [], "\n".join(problems)


def test_every_repository_path_written_in_code_exists():
    missing = [f"{_name(page)}: {path}" for page in PAGES
               for path in code_paths(page.read_text(encoding="utf-8")) if not (REPO / path).exists()]
    assert missing == [], "paths that are not in the repository:\n" + "\n".join(missing)


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    readme_code = "\n".join(FENCE.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert ci == ["make test"]
    assert re.search(r"^make test\b", readme_code, re.MULTILINE)


def test_the_pages_carry_no_dates():
    found = [f"{_name(page)}:{n}: {line.strip()}" for page in PAGES
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if DATED.search(line)]
    assert found == [], "dates in the docs (git keeps history):\n" + "\n".join(found)


def test_no_table_cell_is_split_by_a_pipe_in_code():
    """In a Markdown table a `|` splits the cell even inside a code span, unless escaped."""
    split = [f"{_name(page)}:{n}: {span}" for page in PAGES
             for n, line in enumerate(FENCE.sub(lambda m: "\n" * m.group(0).count("\n"),
                                                page.read_text(encoding="utf-8")).splitlines(), 1)
             if line.startswith("|") for span in INLINE_CODE.findall(line) if re.search(r"(?<!\\)\|", span)]
    assert split == [], "write \\| inside code in a table row:\n" + "\n".join(split)


def test_the_performance_page_is_the_bench_s_own():
    page = REPO / "docs" / "performance.md"
    assert page.read_text(encoding="utf-8").startswith(PAGE_HEAD), (
        "docs/performance.md is generated by `make bench` (bench/report.py); do not edit it by hand")


@pytest.mark.parametrize("heading, anchor", [
    ("Three log-probs and the ratio", "three-log-probs-and-the-ratio"),
    ("vLLM servers (`rollout.engine: vllm_server`)", "vllm-servers-rolloutengine-vllm_server"),
    ("The step-0 gate", "the-step-0-gate"),
])
def test_anchors_follow_the_renderer(heading, anchor):
    assert slug(heading) == anchor


def test_the_checks_find_what_they_look_for(tmp_path):
    text = ("See `grpo/no_such.py` and `configs/cpu.yaml`, `outputs/x/`, `tools/calls`, `configs/*.yaml`.\n"
            "```bash\nmcp-grpo train --config configs/none.yaml\n```\n")
    assert code_paths(text) == ["configs/none.yaml", "grpo/no_such.py", "configs/cpu.yaml"]
    (tmp_path / "b.md").write_text("# B\n")
    (tmp_path / "a.md").write_text("# Title\n## Part one\n## Part one\n"
                                   "[x](b.md) [y](#part-one-1) [z](#nope) [w](c.md) [v](b.md#b) [u](b.md#c)\n")
    assert anchors(tmp_path / "a.md") == {"title", "part-one", "part-one-1"}
    assert broken_links(tmp_path / "a.md") == [
        "a.md: link '#nope': no heading with anchor #nope",
        "a.md: link 'c.md': no such file or folder",
        "a.md: link 'b.md#c': no heading with anchor #c",
    ]
