"""Screenshots of `lace explore` for the README: docs/images/explore-{edit,atom,map}.png.

Runs the explorer as `lace explore` does with no model (the demo's cached world, base and dictionary,
made with the quick sizes if missing; any `lace explore` flag may follow), serves it in a background
thread and drives Debian's chromium through Playwright: an image, a transplant, an atom page, the map.

    PYTHONPATH=src python scripts/explore_screenshots.py [--demo runs/demo] [--out docs/images] [--edit-image N]

The README's were made with `--split test` on the default demo's world, base and dictionary (stages 1-3 of
`lace demo` with its default settings).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

from lace.cli import build_parser
from lace.commands.explore import session_from_args
from lace.explore.app import create_app
from lace.explore.serve import BackgroundServer

IMAGES_LOADED = ("selector => [...document.querySelectorAll(selector)]"
                 ".every(image => image.complete && image.naturalWidth > 0)")


def _first_transplant(page) -> None:
    """Pick grid images in order until one offers a transplant, and apply it."""
    for index in range(page.locator("#grid figure").count()):
        page.locator("#grid figure").nth(index).click()
        page.wait_for_selector("#bars-query .bar")
        if page.locator("#edit-kind option[value='transplant']").count():
            page.select_option("#edit-kind", "transplant")
            page.click("#edit-apply")
            page.wait_for_selector("#list-after li")
            return
    raise SystemExit("no image in the grid offers a transplant")


def main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    own.add_argument("--out", default="docs/images", help="folder of the PNGs")
    own.add_argument("--edit-image", type=int, default=None, help="image id to edit (default: the first with a transplant)")
    ours, rest = own.parse_known_args(argv)
    args = build_parser().parse_args(["explore", "--no-progress", *rest])
    session = session_from_args(args)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (scripts/ensure_browser.sh installs Debian's)")
    out = Path(ours.out)
    out.mkdir(parents=True, exist_ok=True)
    with BackgroundServer(create_app(session)) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        if ours.edit_image is not None:
            page.fill("#search", str(ours.edit_image))
            page.wait_for_selector(f"#grid figure[data-id='{ours.edit_image}']")
        _first_transplant(page)
        page.wait_for_function(IMAGES_LOADED, arg="#edit-result img, #query img")
        page.screenshot(path=str(out / "explore-edit.png"))
        page.locator("#bars-after .bar").first.click()
        page.wait_for_selector("#atom-title")
        page.wait_for_function(IMAGES_LOADED, arg=".atom-images img")
        page.screenshot(path=str(out / "explore-atom.png"))
        page.click("#tab-map")
        page.wait_for_function("document.getElementById('map-legend').textContent.length > 0")
        box = page.locator("#map").bounding_box()
        page.locator("#map").click(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
        page.wait_for_selector("#point-title")
        page.screenshot(path=str(out / "explore-map.png"))
        browser.close()
    for name in ("edit", "atom", "map"):
        path = out / f"explore-{name}.png"
        with Image.open(path) as shot:  # a 256-colour palette keeps a README image small
            shot.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
