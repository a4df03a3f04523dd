"""The scripts the site needs in a reader's browser, shipped with it so the book reads offline.

    python -m scripts.docs_assets           # fetch once (npm registry), unpack into docs/javascripts/vendor/
    python -m scripts.docs_assets --check   # exit 1 if they are missing or of another version

MathJax typesets the formulas and Mermaid draws the diagrams. Material for MkDocs would load both
from a CDN; offline a reader would then see raw `\\(n\\)` and raw `flowchart TB`. We take pinned
versions from the npm registry with `npm pack` (the package's own tarball, integrity-checked by
npm, no dependencies), keep the tarballs in `.cache/docs-vendor/` so the next build needs no
network, and unpack only what the site loads into `docs/javascripts/vendor/` (ignored by git:
nothing vendored is committed). MathJax's SVG output carries its fonts inside the script, so
formulas render from `file://` too, where browsers refuse web fonts.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "docs-vendor"
VENDOR = ROOT / "docs" / "javascripts" / "vendor"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    members: tuple[str, ...]  # paths (or folder prefixes) inside the tarball's package/ folder

    @property
    def tarball(self) -> Path:
        return CACHE / f"{self.name}-{self.version}.tgz"

    @property
    def target(self) -> Path:
        return VENDOR / self.name


PACKAGES = (
    # es5/: the combined TeX+MathML->SVG component and the pieces it loads on demand (TeX
    # extensions through autoload, the menu's accessibility modules).
    Package(
        "mathjax",
        "3.2.2",
        ("LICENSE", "es5/tex-mml-svg.js", "es5/input/tex/extensions/", "es5/a11y/", "es5/sre/", "es5/ui/"),
    ),  # fmt: skip
    Package("mermaid", "11.17.2", ("LICENSE", "dist/mermaid.min.js")),
    # Material's offline plugin runs the search worker in an iframe on file:// with this shim.
    Package("iframe-worker", "1.0.4", ("LICENSE", "shim/index.js")),
)


def fetch(package: Package) -> None:
    if package.tarball.is_file():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            f"{package.name} {package.version} is not in {CACHE} and npm is not installed: install Node.js "
            "(apt-get install npm) or copy the tarball there"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    spec = f"{package.name}@{package.version}"
    done = subprocess.run(
        [npm, "pack", "--silent", "--pack-destination", str(CACHE), spec], capture_output=True, text=True
    )
    if done.returncode != 0 or not package.tarball.is_file():
        raise SystemExit(f"npm pack {spec} failed:\n{done.stderr.strip()}")


def wanted(package: Package, name: str) -> str | None:
    """The path under the package's target folder for a tarball member, or None to skip it."""
    inner = name.removeprefix("package/")
    for member in package.members:
        if inner == member or (member.endswith("/") and inner.startswith(member)):
            return inner.removeprefix("es5/").removeprefix("dist/")
    return None


def unpack(package: Package) -> int:
    if package.target.exists():
        shutil.rmtree(package.target)
    count = 0
    with tarfile.open(package.tarball) as tar:
        for info in tar.getmembers():
            inner = wanted(package, info.name)
            if inner is None or not info.isfile() or ".." in Path(inner).parts:
                continue
            path = package.target / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None
            path.write_bytes(io.BufferedReader(source).read())
            count += 1
    (package.target / "VERSION").write_text(package.version + "\n")
    return count


def up_to_date(package: Package) -> bool:
    stamp = package.target / "VERSION"
    return stamp.is_file() and stamp.read_text().strip() == package.version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if an asset is missing or outdated")
    args = parser.parse_args(argv)
    stale = [p for p in PACKAGES if not up_to_date(p)]
    if args.check:
        for p in stale:
            print(f"missing: {p.name} {p.version} in {p.target.relative_to(ROOT)} (run make docs-assets)")
        return 1 if stale else 0
    for package in stale:
        fetch(package)
        print(
            f"unpacked {package.name} {package.version}: {unpack(package)} files in {package.target.relative_to(ROOT)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
