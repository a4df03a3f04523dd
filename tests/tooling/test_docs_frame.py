"""Every stage chapter has the book's frame (docs/reading.md, "The spine of a chapter"): exercises
tagged CPU, GPU or paper and pencil, each with a hint, the expected outcome and a collapsed solution
sketch; a "What you learned" box that ends with what comes next; further reading with linked
sources; and a link to its executed notebook on the site, when the stage has one. A chapter that
lands without a part of it fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import ROOT

CHAPTERS = sorted((ROOT / "docs" / "chapters").glob("[0-9][0-9]_*.md"))
EXERCISE = re.compile(r"^\*\*(\d+)\. [^\n]*?\*\* \*(?P<tag>[^*]+)\*", re.M)
TAGS = ("CPU", "GPU", "Paper and pencil")


def section(text: str, title: str) -> str:
    """The body of the `## title` section, up to the next `## `."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


def exercises(body: str) -> list[tuple[str, str]]:
    """(tag, text) of each numbered exercise of an Exercises section."""
    starts = list(EXERCISE.finditer(body))
    ends = [m.start() for m in starts[1:]] + [len(body)]
    return [(m["tag"], body[m.start() : end]) for m, end in zip(starts, ends, strict=True)]


def check_frame(text: str, notebook: str | None) -> list[str]:
    problems = []
    found = exercises(section(text, "Exercises"))
    if not found:
        problems.append("no numbered exercises (**1. Title.** *CPU.* ...)")
    for tag, body in found:
        number = body.split(".", 1)[0].strip("*")
        if not tag.startswith(TAGS):
            problems.append(f"exercise {number}: tag {tag!r} starts with none of {TAGS}")
        for part in ("- *Hint:*", "- *Expected:*", '??? success "Solution sketch"'):
            if part not in body:
                problems.append(f"exercise {number}: no {part}")
    learned = section(text, "What you learned")
    if '!!! abstract "What you learned"' not in learned or "**Next:**" not in learned:
        problems.append('"What you learned" needs an !!! abstract box that ends with **Next:**')
    if not re.search(r"\]\(https?://", section(text, "Further reading")):
        problems.append("Further reading links no source")
    if notebook and f"](../notebooks/{notebook}.ipynb)" not in text:
        problems.append(f"no link to the executed notebook ../notebooks/{notebook}.ipynb")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_chapter_has_the_books_frame(chapter: Path) -> None:
    notebook = chapter.stem if (ROOT / "docs" / "notebooks" / f"{chapter.stem}.py").is_file() else None
    problems = check_frame(chapter.read_text(encoding="utf-8"), notebook)
    assert not problems, f"{chapter.name}: " + "; ".join(problems)


GOOD = """## Exercises

**1. Try it.** *CPU.* Do this.

- *Hint:* look there.
- *Expected:* this happens.

??? success "Solution sketch"
    Like so.

**2. Think.** *Paper and pencil.* Why?

- *Hint:* because.
- *Expected:* an answer.

??? success "Solution sketch"
    Here.

## What you learned

!!! abstract "What you learned"
    - a thing.

    **Next:** the next chapter.

## Further reading

- [A paper](https://arxiv.org/abs/1234.5678).
[The notebook](../notebooks/09_x.ipynb)
"""


def test_the_checker_accepts_a_framed_chapter_and_names_each_missing_part() -> None:
    assert check_frame(GOOD, "09_x") == []
    broken = {
        "*CPU.* Do this": "*Someday.* Do this",
        "- *Hint:* because.\n": "",
        '??? success "Solution sketch"\n    Like so.': "Like so.",
        "    **Next:** the next chapter.": "",
        "https://arxiv.org/abs/1234.5678": "paper.pdf",
        "../notebooks/09_x.ipynb": "../notebooks/08_y.ipynb",
    }
    for old, new in broken.items():
        problems = check_frame(GOOD.replace(old, new), "09_x")
        assert len(problems) == 1, (old, problems)
