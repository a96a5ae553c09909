"""`lace explore` driven in a real headless Chromium (Debian's package, through Playwright): load the page,
pick an image, apply a transplant, check that the bars and both neighbour lists change and that the random
edit's list differs, open an atom page, the map and the two models side by side, save screenshots."""

from __future__ import annotations

import shutil
import warnings

import pytest
from fastapi.testclient import TestClient

from lace.explore.app import create_app
from lace.explore.serve import BackgroundServer
from tests.explore_world import shared_session

# How long the page may take to show what a request asked for. The suite runs on two xdist workers of a 2-core
# machine, so a request can wait behind a multi-process test on the other worker: 15 s timed out there once
# (the same page answered in well under a second alone). The checks on what the page shows are unchanged.
TIMEOUT_MS = 60_000


def _skip(reason: str) -> None:
    """Skip with the reason in pytest's warnings summary, which even a quiet run prints."""
    warnings.warn(f"browser test skipped: {reason}", UserWarning, stacklevel=2)
    pytest.skip(reason)


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _skip("no chromium on PATH (Debian's chromium package; `make test` runs scripts/ensure_browser.sh to install it)")
    return path


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip("Playwright for Python is not installed (pyproject's dev extra)")
    return sync_playwright


def _transplant(session) -> tuple[int, str, str]:
    """An image and a transplant whose edit moves both neighbour lists and whose random control lists other
    images: chosen through the API, so the browser has something to show; the page is what is tested."""
    client = TestClient(create_app(session))
    for image in range(session.n_images):
        for option in client.post("/api/inspect", json={"image": image}).json()["options"]:
            for target in option["targets"]["transplant"]:
                body = {"image": image, "kind": "transplant", "source": option["concept"], "target": target, "k": 8}
                result = client.post("/api/edit", json=body)
                if result.status_code != 200:
                    continue
                lists = result.json()
                if (lists["images"]["after"]["ids"] != lists["images"]["before"]["ids"]
                        and lists["captions"]["after"]["ids"] != lists["captions"]["before"]["ids"]
                        and lists["images"]["random"]["ids"] != lists["images"]["after"]["ids"]):
                    return image, option["concept"], target
    pytest.fail("no transplant in the tiny world moves both neighbour lists")


def _texts(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def _ids(page, selector: str) -> list[str]:
    return [page.locator(selector).nth(i).get_attribute("data-id") for i in range(page.locator(selector).count())]


# long: one browser session walked through the page's three views, with its checks in order
@pytest.mark.slow  # a Chromium process started and driven: seconds
def test_explore_page_in_headless_chromium(tmp_path):
    chromium, sync_playwright = _chromium(), _playwright()
    session = shared_session()
    image, source, target = _transplant(session)
    with BackgroundServer(create_app(session)) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(TIMEOUT_MS)
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("#grid figure").count() > 0

        page.fill("#search", str(image))
        page.wait_for_selector(f"#grid figure[data-id='{image}']")
        page.click(f"#grid figure[data-id='{image}']")
        page.wait_for_selector("#bars-query .bar")
        page.select_option("#edit-source", source)
        page.select_option("#edit-kind", "transplant")
        page.select_option("#edit-target", target)
        page.click("#edit-apply")
        page.wait_for_selector("#list-after li")
        page.screenshot(path=str(tmp_path / "explore-edit.png"), full_page=True)

        assert _texts(page, "#bars-after .bar") != _texts(page, "#bars-before .bar")
        assert page.locator("#bars-after .bar.changed").count() > 0
        assert _ids(page, "#list-after img") != _ids(page, "#list-before img")
        assert _ids(page, "#list-after li") != _ids(page, "#list-before li")
        assert _ids(page, "#list-random img") != _ids(page, "#list-after img")
        assert f"'{target}'" in page.inner_text("#share-after")
        assert "effect check" in page.inner_text("#edit-check")

        page.locator("#bars-after .bar").first.click()
        page.wait_for_selector("#atom-title")
        assert "Atom" in page.inner_text("#atom-title") and page.locator("#atom-concepts li").count() > 0
        page.screenshot(path=str(tmp_path / "explore-atom.png"), full_page=True)

        page.click("#tab-map")
        page.wait_for_function("document.getElementById('map-legend').textContent.length > 0")
        box = page.locator("#map").bounding_box()
        page.locator("#map").click(position={"x": box["width"] / 2, "y": box["height"] / 2})
        page.wait_for_selector("#point-title")
        assert page.locator("#point-forward li").count() > 0 and "mean" in page.inner_text("#point")
        page.screenshot(path=str(tmp_path / "explore-map.png"), full_page=True)

        page.click("#tab-compare")
        page.wait_for_selector(".compare-grid")
        assert page.locator(".compare-grid > div").count() == 2
        assert page.locator("#compare-bars-0 .bar").count() > 0 and f"#{image}" in page.inner_text("#compare-note")
        page.screenshot(path=str(tmp_path / "explore-compare.png"), full_page=True)

        page.click("#tab-inspect")
        page.locator("#list-after li").first.click()
        page.wait_for_function("document.querySelector('#query b').textContent === 'caption'")
        assert page.locator("#bars-query .bar").count() > 0
        page.fill("#caption-input", "   ")
        page.click("#caption-go")
        page.wait_for_selector("#error:not([hidden])")
        assert "at least one word" in page.inner_text("#error") and "Traceback" not in page.inner_text("#error")
        browser.close()
    assert errors == []
    for name in ("edit", "atom", "map", "compare"):
        assert (tmp_path / f"explore-{name}.png").stat().st_size > 10_000
