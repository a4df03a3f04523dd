"""The built site, read the way a reader reads it: in a browser, with no network.

The site (`SITE_DIR`, which `make test` sets to the strict build in build/site; else a build made
here) is served on loopback, and every page is opened in headless Chromium from Debian's packages
(driven by Playwright, which downloads no browser of its own). On every page: no console error,
no uncaught exception, no failed or 4xx request, no request that leaves loopback (each is
blocked and reported: the book must read offline), every image loaded, every internal link
pointing at a file of the site; no text that shows the build machine (a path under /root/,
/home/, /work/, a site-packages folder or a virtualenv's absolute path anywhere, a /tmp/ folder in
the prose or a notebook's output, where commands the book gives may name one), no formula left
as raw TeX and no diagram left as Mermaid source (in their elements, or as TeX or Mermaid text in
the prose), no image wider than its column, and every plot and profile figure as wide as its
column (scaled down to half, its labels are unreadable). Then the things that break first offline:
formulas typeset by the shipped MathJax, diagrams drawn by the shipped Mermaid, search finding
"radix" (over HTTP and from file://, as the README's "open build/site/index.html" does).
Screenshots of the home page, chapters 04 to 07, the Performance page and the results page go to
build/screenshots/ for a person to look at.

Needs Chromium (`make browser` installs it with apt-get); skips, saying so, where there is none.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from tests import ROOT

SCREENSHOTS = ROOT / "build" / "screenshots"
LOOPBACK = {"127.0.0.1", "localhost"}
pytestmark = pytest.mark.browser


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SITE_DIR")
    if given:
        site = (ROOT / given).resolve()
        assert (site / "index.html").is_file(), f"SITE_DIR={given} holds no built site"
        return site
    # A build made here ships the vendored MathJax and Mermaid only once `make docs-assets` has
    # fetched them (`make test`, and so CI, always does, and passes SITE_DIR): without them the
    # formula and diagram checks could only time out.
    if not (ROOT / "docs" / "javascripts" / "vendor").is_dir():
        pytest.skip("the site's MathJax and Mermaid are not fetched: run `make docs-assets` first")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--no-strict", "-q", "-d", str(site)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return site


@pytest.fixture(scope="module")
def base_url(site_dir: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site_dir))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:
        pytest.skip("needs Chromium from Debian's packages: `make browser` (apt-get install chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs the playwright package (pip install playwright)"
    )
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


class PageWatch:
    """Everything a page did that a reader would call broken."""

    def __init__(self, context, base_url: str):
        self.problems: list[str] = []
        self.base = urlsplit(base_url)
        context.route("**/*", self._route)

    def _route(self, route) -> None:
        url = urlsplit(route.request.url)
        if url.scheme in ("http", "https") and url.hostname not in LOOPBACK:
            self.problems.append(f"request left loopback: {route.request.url}")
            route.abort()
        else:
            route.continue_()

    def _failed(self, request) -> None:
        if not any(request.url in p for p in self.problems):  # a blocked request is reported once
            if "ERR_ABORTED" in (request.failure or "") and urlsplit(request.url).hostname in LOOPBACK:
                # The browser cancelled a local load when the test moved on (a late favicon, say):
                # not a broken resource. Missing files show up as HTTP 404 and in the link check.
                return
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def attach(self, page) -> None:
        page.on(
            "console", lambda msg: msg.type == "error" and self.problems.append(f"console error: {msg.text}")
        )
        page.on("pageerror", lambda exc: self.problems.append(f"uncaught exception: {exc}"))
        page.on("requestfailed", self._failed)
        page.on(
            "response",
            lambda resp: resp.status >= 400 and self.problems.append(f"HTTP {resp.status}: {resp.url}"),
        )


def site_pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")


def internal_target(site: Path, page: str, href: str) -> Path | None:
    """The file an internal link points at, or None for an external link or an anchor."""
    url = urlsplit(href)
    if url.scheme or url.netloc or href.startswith(("#", "mailto:", "javascript:", "data:")):
        return None
    resolved = urlsplit(urljoin(f"http://site/{page}", href)).path
    return site / unquote(resolved.lstrip("/"))


def open_page(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")


# Paths of the build machine, anywhere on a page: a home, a work tree, a virtualenv by its absolute
# path (`/x/.venv/lib/...`; the docs' `. .venv/bin/activate` is relative), an installed package.
MACHINE_PATHS = ("/root/", "/home/", "/work/", "site-packages", "/.venv/")
# Paths a page may show in a command the book gives (`--out /tmp/tp`), but never in its prose or in
# a notebook's output, where they are the build machine's (a temporary folder it printed).
PROSE_PATHS = ("/tmp/",)
# Text that MathJax or Mermaid should have drawn, found in a page's prose: TeX's delimiters and
# commands, and the first words of a Mermaid diagram.
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\(?:frac|cdot|times|mathrm|text|sum|approx|le|ge)\b")
RAW_MERMAID = re.compile(
    r"^\s*(?:flowchart|graph) (?:TB|TD|BT|LR|RL)\b|^\s*(?:sequenceDiagram|gantt|classDiagram)\b", re.M
)
# A page's prose: its text without the code the book shows (kept: a notebook's outputs, which the
# build machine wrote), without scripts, styles and what MathJax drew.
PROSE_JS = """() => {
    const copy = document.body.cloneNode(true);
    copy.querySelectorAll('script, style, mjx-container, svg').forEach(e => e.remove());
    copy.querySelectorAll('pre, code').forEach(e => { if (!e.closest('.jp-OutputArea')) e.remove(); });
    copy.querySelectorAll('.jp-InputArea').forEach(e => e.remove());
    return copy.textContent;
}"""


def wait_for_typesetting(page) -> None:
    """MathJax and Mermaid draw after the load: wait for both, where the page has any."""
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0", timeout=20_000)


def reader_problems(page, name: str) -> list[str]:
    """What a reader would see that the book must not show, on the page now open."""
    problems = []
    text = page.inner_text("body")
    for path in MACHINE_PATHS:
        if path in text:
            at = text.index(path)
            problems.append(
                f"{name}: shows a path of the build machine: ...{text[max(0, at - 60) : at + 60]!r}..."
            )
    prose = page.evaluate(PROSE_JS)
    for path in PROSE_PATHS:
        if path in prose:
            at = prose.index(path)
            problems.append(
                f"{name}: shows a path of the build machine: ...{' '.join(prose[max(0, at - 60) : at + 60].split())!r}..."
            )
    for pattern, what in ((RAW_TEX, "raw TeX"), (RAW_MERMAID, "Mermaid source")):
        for match in pattern.finditer(prose):
            context = " ".join(prose[max(0, match.start() - 40) : match.end() + 40].split())
            problems.append(f"{name}: {what} in the text: ...{context!r}...")
    raw_tex = page.eval_on_selector_all(
        ".arithmatex",
        "els => els.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60))",
    )
    problems += [f"{name}: a formula left as raw TeX: {tex!r}" for tex in raw_tex]
    raw_mermaid = page.eval_on_selector_all(
        "pre.mermaid, div.mermaid, code.language-mermaid",
        # Material draws into a closed shadow root: a drawn diagram shows no text of its own, while
        # one left as source is a <pre> still, or a <div> whose text is the source; a fence that
        # was not taken for a diagram is code in the language `mermaid`.
        "els => els.filter(e => e.tagName !== 'DIV' || (e.innerText.trim() !== '' && !e.querySelector('svg')))"
        ".map(e => e.textContent.slice(0, 60))",
    )
    problems += [f"{name}: a diagram left as Mermaid source: {src!r}" for src in raw_mermaid]
    images = page.eval_on_selector_all(
        "article img",
        """els => els.map(e => {
            const column = e.closest('article').getBoundingClientRect();
            const box = e.getBoundingClientRect();
            return [e.getAttribute('src'), box.left, box.right, box.width, e.naturalWidth, column.left, column.right];
        })""",
    )
    for src, left, right, width, natural, col_left, col_right in images:
        if width and (right > col_right + 1 or left < col_left - 1):
            problems.append(f"{name}: image {src} ({width:.0f} px) is wider than its column, clipped")
        figure = "assets/plots/" in src or "assets/profiles/" in src
        column = col_right - col_left
        if figure and width < 0.95 * min(column, natural):
            problems.append(f"{name}: figure {src} shown {width:.0f} px wide in a {column:.0f} px column")
    return problems


def test_every_page_loads_clean_offline(browser, base_url: str, site_dir: Path) -> None:
    context = browser.new_context()
    watch = PageWatch(context, base_url)
    page = context.new_page()
    watch.attach(page)
    pages = site_pages(site_dir)
    assert "index.html" in pages and "results.html" in pages and "glossary.html" in pages
    assert any(p.startswith("notebooks/") for p in pages), "the executed notebooks are not on the site"
    broken: list[str] = []
    for name in pages:
        before = len(watch.problems)
        open_page(page, base_url + name)
        wait_for_typesetting(page)
        broken += reader_problems(page, name)
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.getAttribute('src'), e.complete && e.naturalWidth > 0])"
        )
        broken += [f"{name}: image {src} did not load" for src, ok in images if not ok]
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            target = internal_target(site_dir, name, href)
            if target is not None and not (target.is_file() or (target / "index.html").is_file()):
                broken.append(f"{name}: link {href} points at nothing")
        broken += [f"{name}: {p}" for p in watch.problems[before:]]
    context.close()
    assert not broken, "\n".join(broken)


def test_plots_formulas_and_diagrams_render(browser, base_url: str) -> None:
    context = browser.new_context()
    watch = PageWatch(context, base_url)
    page = context.new_page()
    watch.attach(page)
    open_page(page, base_url + "results.html")
    plots = page.eval_on_selector_all(
        "img[src*='assets/plots/']", "els => els.map(e => [e.src, e.naturalWidth])"
    )
    assert any(src.endswith("ladder.png") for src, _ in plots) and all(width > 0 for _, width in plots)

    open_page(page, base_url + "chapters/01_naive_generate.html")
    page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=20_000)
    raw = page.eval_on_selector_all(
        ".arithmatex", "els => els.filter(e => !e.querySelector('mjx-container')).length"
    )
    assert raw == 0, f"{raw} formulas were left as raw TeX"
    # Material replaces each <pre class="mermaid"> by a <div class="mermaid"> holding the drawing.
    page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0", timeout=20_000)
    heights = page.eval_on_selector_all(
        "div.mermaid", "els => els.map(e => e.getBoundingClientRect().height)"
    )
    assert heights and all(h > 40 for h in heights), heights
    assert not watch.problems, watch.problems
    context.close()


def search(page, term: str) -> int:
    page.click("label.md-search__icon, .md-search__input", timeout=10_000)
    page.focus("input.md-search__input")
    page.keyboard.type(term, delay=30)  # as a reader types: Material searches on key events
    page.wait_for_selector(".md-search-result__item", timeout=20_000)
    return page.locator(".md-search-result__item").count()


def test_search_finds_radix_served_and_from_disk(browser, base_url: str, site_dir: Path) -> None:
    context = browser.new_context()
    watch = PageWatch(context, base_url)
    page = context.new_page()
    watch.attach(page)
    open_page(page, base_url + "index.html")
    assert search(page, "radix") > 0
    # From disk, as `open build/site/index.html` does: links are files, and search still works.
    page.goto((site_dir / "index.html").as_uri(), wait_until="load")
    assert search(page, "radix") > 0
    page.keyboard.press("Escape")  # close the search, then follow a link as a reader would
    page.locator("a.md-nav__link[href$='03_radix_cache.html']").first.click()
    page.wait_for_load_state("load")
    assert page.url.startswith("file://") and page.url.endswith("03_radix_cache.html")
    assert "Radix" in page.inner_text("h1")
    assert not [p for p in watch.problems if "left loopback" in p], watch.problems
    context.close()


def test_the_checks_see_a_machine_path_raw_tex_and_a_clipped_image(browser, tmp_path: Path) -> None:
    """The page checks above, on a page made to fail each of them."""
    (tmp_path / "wide.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="3000" height="40"><rect width="3000" height="40"/></svg>'
    )
    (tmp_path / "bad.html").write_text(
        "<html><body><article style='width: 600px; overflow: hidden'>"
        "<p>Traceback: /work/wt/book/.venv/lib/python3.11/site-packages/tqdm/auto.py:21</p>"
        "<span class='arithmatex'>\\(x^2\\)</span>"
        "<pre class='mermaid'>flowchart TB a --> b</pre><div class='mermaid'>flowchart TB</div>"
        "<img src='wide.svg' style='max-width: none'>"
        "<img src='assets/plots/p.png' style='width: 100px'>"
        "</article></body></html>"
    )
    # Each of the other checks alone, and what they must let stand: a command's /tmp/ folder, a
    # relative .venv, a formula MathJax drew.
    (tmp_path / "quiet.html").write_text(
        "<html><body><article style='width: 600px'>"
        "<p>Run <code>. .venv/bin/activate</code>, then</p><pre><code>bench --out /tmp/tp</code></pre>"
        "<span class='arithmatex'><mjx-container>x</mjx-container></span>"
        "</article></body></html>"
    )
    one_each = {
        "a temporary folder in the prose": "<p>Saved to /tmp/tmpa1b2c3/out.json.</p>",
        "a temporary folder in a notebook's output": "<div class='jp-OutputArea'><pre>wrote /tmp/tmpx9/a</pre></div>",
        "a virtualenv in a warning": "<p>TqdmWarning: /opt/x/.venv/lib/python3.12/tqdm/auto.py:21</p>",
        "TeX outside a formula": "<p>The cost is $$ 2 \\times L $$ per step.</p>",
        "a Mermaid fence left as code": "<pre><code class='language-mermaid'>flowchart LR\n a --> b</code></pre>",
    }
    for k, body in enumerate(one_each.values()):
        (tmp_path / f"one{k}.html").write_text(
            f"<html><body><article style='width: 600px'>{body}</article></body></html>"
        )
    (tmp_path / "assets" / "plots").mkdir(parents=True)
    (tmp_path / "assets" / "plots" / "p.png").write_bytes(_png(800))
    context = browser.new_context()
    page = context.new_page()
    page.goto((tmp_path / "bad.html").as_uri(), wait_until="load")
    found = "\n".join(reader_problems(page, "bad.html"))
    context.close()
    for expected in ("path of the build machine", "raw TeX", "Mermaid source", "wider than its column",
                     "shown 100 px wide"):  # fmt: skip
        assert expected in found, found
    context = browser.new_context()
    page = context.new_page()
    page.goto((tmp_path / "quiet.html").as_uri(), wait_until="load")
    assert reader_problems(page, "quiet.html") == []
    seen = {}
    for k, what in enumerate(one_each):
        page.goto((tmp_path / f"one{k}.html").as_uri(), wait_until="load")
        seen[what] = reader_problems(page, what)
    context.close()
    kinds = {"a temporary folder in the prose": "path of the build machine",
             "a temporary folder in a notebook's output": "path of the build machine",
             "a virtualenv in a warning": "path of the build machine",
             "TeX outside a formula": "raw TeX in the text", "a Mermaid fence left as code": "Mermaid source"}  # fmt: skip
    for what, kind in kinds.items():
        assert seen[what] and all(kind in found for found in seen[what]), (what, seen[what])


def _png(width: int) -> bytes:
    """A plain PNG `width` pixels wide, 10 high."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\xff\xff\xff" * width for _ in range(10))
    header = struct.pack(">IIBBBBB", width, 10, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


SHOTS = (("home", "index.html"), ("chapter04", "chapters/04_chunked_prefill.html"),
         ("chapter05", "chapters/05_cuda_graph.html"), ("chapter06", "chapters/06_overlap.html"),
         ("chapter07", "chapters/07_tensor_parallel.html"), ("performance", "serving/performance.html"),
         ("results", "results.html"))  # fmt: skip


def test_screenshots_for_a_person_to_look_at(browser, base_url: str) -> None:
    """The top of each page, and for the chapters and the Performance page the whole page too
    (`<name>_full.png`): the figures, tables and numbers as a reader meets them."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    for name, path in SHOTS:
        open_page(page, base_url + path)
        wait_for_typesetting(page)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=False)
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 10_000
        if name.startswith(("chapter0", "performance")):
            page.screenshot(path=str(SCREENSHOTS / f"{name}_full.png"), full_page=True)
    context.close()
