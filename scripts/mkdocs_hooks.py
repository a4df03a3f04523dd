"""MkDocs hooks (mkdocs.yml `hooks:`): measured numbers from the result files, and the executed
notebooks as pages of the site.

Numbers: a page quotes a measurement as a macro, `{{ result("stage05_decode_b1_graphs_h200",
"decode_step_ms") }}`, which `on_page_markdown` replaces by the number read from
benchmarks/results (scripts/docs_numbers.py says what a macro may contain). A macro that names a
missing result, metric or profile stops the build with the page, its line and what exists. We
keep this in the hooks rather than use mkdocs-macros-plugin: that plugin runs Jinja over every
page, where the chat templates and Python that the chapters quote would need escaping, and its
errors name a template, not the result file that is missing; ours touches only `{{ f(...) }}` of
our own functions, evaluates them without `eval`, and shares its code with the test that scans
the pages for numbers typed by hand (tests/tooling/test_docs_numbers.py).

Notebooks: their source is the jupytext scripts `docs/notebooks/NN_*.py`. `make test` (and
`make notebooks-run`) converts each to `build/notebooks/NN_*.ipynb` and executes it once with
nbmake (`--overwrite` keeps the outputs); the site shows those executed copies, rendered by the
mkdocs-jupyter plugin, at `notebooks/NN_*.html`: the same run that tested a notebook is the one a
reader sees, and nothing executes twice. A notebook that has not been executed, or whose source
changed since, is still rendered (from its source, without outputs) with a warning, which a
strict build turns into a failure.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files, InclusionLevel

from scripts import docs_numbers

ROOT = Path(__file__).resolve().parents[1]

EXECUTED = ROOT / "build" / "notebooks"  # build/notebooks/NN_name.ipynb, executed by make test
UNEXECUTED = ROOT / "build" / "notebooks-unexecuted"
NAV_SECTION = "Notebooks"
log = logging.getLogger("mkdocs.hooks.notebooks")


def sources(docs_dir: str) -> list[Path]:
    return sorted((Path(docs_dir) / "notebooks").glob("[0-9][0-9]_*.py"))


def title(source: Path) -> str:
    """The notebook's first heading, shortened: `# Stage 03 in a notebook: the radix prefix cache`
    -> `03 · the radix prefix cache`."""
    heading = next(
        (m.group(1) for m in re.finditer(r"^# # (.+)$", source.read_text(encoding="utf-8"), re.M)), ""
    )
    words = (
        heading.split(":", 1)[-1].strip() if ":" in heading else heading or source.stem[3:].replace("_", " ")
    )
    return f"{source.stem[:2]} · {words}"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Every `{{ f(...) }}` macro of the page replaced by the number it names."""
    if not docs_numbers.macros(markdown):
        return markdown
    try:
        return docs_numbers.expand(markdown, docs_numbers.Numbers.load(ROOT), page.file.src_uri)
    except docs_numbers.NumbersError as exc:
        raise PluginError(f"a measured number could not be read: {exc}") from None


def on_config(config):
    """Every notebook gets an entry in the nav's Notebooks section, so a new stage's notebook
    appears on the site without editing mkdocs.yml."""
    section = next(
        (item for item in config["nav"] or [] if isinstance(item, dict) and NAV_SECTION in item), None
    )
    if section is None:
        return config
    entries = section[NAV_SECTION]
    listed = {path for entry in entries for path in entry.values()}
    for source in sources(config["docs_dir"]):
        uri = f"notebooks/{source.stem}.ipynb"
        if uri not in listed:
            entries.append({title(source): uri})
    return config


def executed_copy(source: Path) -> Path | None:
    """The executed notebook of a jupytext source, if it is there, newer than the source, and ran."""
    notebook = EXECUTED / f"{source.stem}.ipynb"
    if not notebook.is_file() or notebook.stat().st_mtime < source.stat().st_mtime:
        return None
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    ran = any(cell.get("outputs") for cell in cells if cell.get("cell_type") == "code")
    return notebook if ran else None


def unexecuted_copy(source: Path) -> Path:
    """The notebook of a jupytext source, without outputs, for a build that has no executed one."""
    import jupytext

    target = UNEXECUTED / "notebooks" / f"{source.stem}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(jupytext.read(source), target)
    return target


# Before mkdocs-jupyter's own on_files (priority 0), which turns these files into pages.
@event_priority(100)
def on_files(files: Files, config) -> Files:
    for source in sources(config["docs_dir"]):
        notebook = executed_copy(source)
        if notebook is None:
            log.warning(
                "notebook %s has no executed copy in build/notebooks newer than its source: rendered "
                "without outputs (run make notebooks-run)",
                source.name,
            )
            notebook = unexecuted_copy(source)
        # A real file whose folder plays the docs folder: mkdocs-jupyter wraps it, and its wrapper
        # needs a file on disk below `src_dir`. A copy in docs/notebooks (Jupyter's, from
        # `make lab`) never stands in for it.
        uri = f"notebooks/{source.stem}.ipynb"
        stale = files.get_file_from_path(uri)
        if stale is not None:
            files.remove(stale)
        files.append(
            File(uri, src_dir=str(notebook.parent.parent), dest_dir=config["site_dir"],
                 use_directory_urls=config["use_directory_urls"], inclusion=InclusionLevel.INCLUDED)
        )  # fmt: skip
    return files
