"""The explorer in a real browser: headless Chromium opens report.html from disk, a real mouse click
on a patch redraws every map, and what the page shows agrees with plain computations.

Chromium is driven over the DevTools pipe (``cdp.py``, stdlib only). A missing Chromium skips
this test with the reason, unless ``PROBE_REQUIRE_BROWSER=1`` (set by ``.ci/run``, which installs Debian's
``chromium``) makes it required.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from cdp import Browser
from report_stores import bare_copies, invoke, plain_cosine, plain_follow, plain_rank, plain_window, stored, synthetic_store

from probe_toolkit.demo.doctor import find_browser
from probe_toolkit.report import write_report

G = 14


def chromium() -> str:
    found = find_browser()
    if found is None:
        if os.environ.get("PROBE_REQUIRE_BROWSER") != "1":
            pytest.skip("no Chromium found (apt-get install chromium, or set PROBE_CHROMIUM); CI sets PROBE_REQUIRE_BROWSER=1 to require it")
        pytest.fail("PROBE_REQUIRE_BROWSER=1 but Chromium not found (apt-get install chromium, or set PROBE_CHROMIUM)")
    return found


@pytest.fixture(scope="module")
def page(tiny_stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("report-browser")
    stores = bare_copies(tiny_stores, root / "cache")
    invoke("decode", stores["selfpatch"], "--cache", root / "cache", "-q")  # the decoder's sections, without labels
    written = write_report([stores["dino"], stores["selfpatch"]], root / "report", cache_dir=root / "cache", formats="png")
    return SimpleNamespace(stores=stores, written=written, url=written.html.resolve().as_uri())


def _state(browser: Browser) -> dict:
    return json.loads(browser.evaluate("JSON.stringify(window.probeExplorer.state)"))


def _click_patch(browser: Browser, patch: int, grid: int = G) -> None:
    box = browser.evaluate(
        "(function () { var c = document.getElementById('pe-image'); c.scrollIntoView({block: 'start'});"
        " var r = c.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()"
    )
    r, c = divmod(patch, grid)
    browser.click(box[0] + (c + 0.5) * box[2] / grid, box[1] + (r + 0.5) * box[3] / grid)


def _click_button(browser: Browser, query: str) -> None:
    box = browser.evaluate(
        f"(function () {{ var b = document.querySelector('button[data-query=\"{query}\"]'); b.scrollIntoView({{block: 'center'}});"
        " var r = b.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()"
    )
    browser.click(box[0] + box[2] / 2, box[1] + box[3] / 2)


def _expected(page, label: str, patch: int, query: str = "patch") -> dict:
    """What the page must show for one store, from the stored arrays by plain Python."""
    store = page.stores["dino" if label.startswith("dino") else "selfpatch"]
    image = page.written.report.follow
    weights = stored(store, "attention_224", image).astype(np.float64)
    start = weights.shape[-1] - G * G
    row = 0 if query == "cls" else start + patch
    top5 = [[k - start for k in plain_rank(weights[h, row], list(range(weights.shape[-1])), 5)] for h in range(weights.shape[0])]
    sim = plain_cosine(stored(store, "tokens_224", image))
    return {"top5": top5, "topk": plain_rank(sim[patch], plain_window(G, patch), 4), "topCrop": plain_rank(sim[patch], [j for j in range(G * G) if j != patch], 8)}


def test_clicking_a_patch_redraws_every_map(page, tmp_path):
    with Browser(chromium(), tmp_path / "profile", width=1400, height=1100) as browser:
        browser.call("Network.enable")
        browser.open(page.url)
        assert browser.wait_for("window.probeExplorer && window.probeExplorer.state.ready && window.probeExplorer.state.picture")
        before = _state(browser)
        labels = page.written.report.stores
        assert before["patch"] == 34 and browser.evaluate("document.body.dataset.patch") == "34"
        assert set(before["stores"]) == set(labels)

        _click_patch(browser, 0)  # a real mouse click, through Chromium's input pipeline
        after = _state(browser)
        assert after["patch"] == 0 and after["query"] == "patch"
        assert browser.evaluate("document.body.dataset.patch") == "0" and browser.evaluate("location.hash") == "#patch=0"
        assert sorted(after["window"]) == plain_window(G, 0)
        for label in labels:
            old, new = before["stores"][label], after["stores"][label]
            assert all(a != b for a, b in zip(old["heads"], new["heads"])) and old["mean"] != new["mean"] and old["cosine"] != new["cosine"]
            want = _expected(page, label, 0)
            assert new["top5"] == want["top5"] and new["topk"] == want["topk"] and new["topCrop"] == want["topCrop"]
            assert new["inWindow"] == len(set(want["topCrop"]) & set(plain_window(G, 0)))
        shot = browser.screenshot(tmp_path / "explorer-patch-0.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        # the class token's row: the DINO store redraws, the store without a class token says so
        _click_button(browser, "cls")
        cls = _state(browser)
        dino = next(label for label in labels if label.startswith("dino"))
        plain = next(label for label in labels if not label.startswith("dino"))
        assert cls["query"] == "cls" and browser.evaluate("location.hash") == "#patch=0&query=cls"
        assert cls["stores"][dino]["top5"] == _expected(page, dino, 0, "cls")["top5"]
        assert cls["stores"][dino]["heads"] != after["stores"][dino]["heads"]
        assert cls["stores"][plain]["top5"] == [] and cls["stores"][plain]["cosine"] == after["stores"][plain]["cosine"]

        # a fragment chooses the patch when the page opens, and when it changes later
        browser.open("about:blank")
        browser.open(page.url + "#patch=100")
        assert browser.wait_for("window.probeExplorer && window.probeExplorer.state.ready")
        assert _state(browser)["patch"] == 100 and _state(browser)["query"] == "patch"
        browser.evaluate("location.hash = '#patch=150&query=cls'")
        assert browser.wait_for("window.probeExplorer.state.patch === 150 && window.probeExplorer.state.query === 'cls'")

        requests = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
        assert requests and all(url.startswith(("file:", "data:")) for url in requests), requests


def test_a_28_by_28_grid_uses_two_byte_indices(tmp_path):
    """784 patches (a ViT-S/8 at 224 px) need two bytes per patch index; no image file: drawn from tokens."""
    grid = 28
    store = synthetic_store(tmp_path / "s8-cdcdcdcd" / "teacher.zarr", grid)
    written = write_report([store], tmp_path / "report", patch=700, formats="png")
    with Browser(chromium(), tmp_path / "profile", width=1400, height=1100) as browser:
        browser.open(written.html.resolve().as_uri())
        assert browser.wait_for("window.probeExplorer && window.probeExplorer.state.ready && window.probeExplorer.state.picture")
        assert _state(browser)["patch"] == 700
        _click_patch(browser, 783, grid)
        state = _state(browser)
        (label,) = written.report.stores
        weights = stored(store, "attention_224", "gone.jpg").astype(np.float64)
        sim = plain_cosine(stored(store, "tokens_224", "gone.jpg"))
        shown = state["stores"][label]
        assert state["patch"] == 783 and sorted(state["window"]) == plain_window(grid, 783)
        assert shown["top5"] == [plain_rank(weights[h, 783], list(range(grid * grid)), 5) for h in range(2)]
        assert shown["topk"] == plain_rank(sim[783], plain_window(grid, 783), 4)
        assert shown["topCrop"] == plain_rank(sim[783], list(range(783)), 8)


def test_new_sections_render_in_the_browser(page, tmp_path):
    """PCA, Fiedler vectors and the published-elsewhere table: present, every figure decoded, and
    the published numbers listed once each with a source."""
    with Browser(chromium(), tmp_path / "profile", width=1000, height=900) as browser:
        browser.open(page.url)
        assert browser.wait_for("document.readyState === 'complete'")
        present = browser.evaluate("Array.from(document.querySelectorAll('section[data-present=true]')).map(s => s.id)")
        assert {"token-pca", "decoder", "decoder-cuts", "references"} <= set(present)
        images = browser.evaluate("Array.from(document.querySelectorAll('section figure img')).map(i => [i.complete, i.naturalWidth, i.closest('section').id])")
        assert images and all(done and width > 100 for done, width, _ in images), images
        assert {"token-pca", "decoder-cuts"} <= {section for _, _, section in images}
        rows = browser.evaluate("Array.from(document.querySelectorAll('#references tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))")
        assert rows and len({tuple(r) for r in rows}) == len(rows)
        assert all(r[-1].strip() for r in rows) and not any("_" in r[0] for r in rows)
        text = browser.evaluate("document.body.innerText")
        assert not any(word in text.lower() for word in ("course", "thesis"))
        browser.screenshot(tmp_path / "report-new-sections.png")


def test_a_mixed_grid_report_draws_every_store_on_its_own_grid(tmp_path):
    """14 × 14 (class token), 28 × 28 and 16 × 16 with 4 registers in one page: each store follows the
    patch under the centre of the picture's patch, and a register's row is drawn where the network has one."""
    specs = {"s16": (14, 16, dict(class_token=True)), "s8": (28, 8, {}), "v2reg": (16, 14, dict(class_token=True, registers=4))}
    stores = {name: synthetic_store(tmp_path / f"{name}-{i}{i}{i}{i}" / "teacher.zarr", grid, seed=i, **kw) for i, (name, (grid, _, kw)) in enumerate(specs.items())}
    written = write_report(list(stores.values()), tmp_path / "report", patch=34, formats="png")
    labels = dict(zip(stores, written.report.stores))

    def expect(state: dict, patch: int, query: str = "patch") -> None:
        for name, (grid, size, kw) in specs.items():
            shown, want = state["stores"][labels[name]], plain_follow(patch, (14, 14, 16), (grid, grid), size)
            assert shown["patch"] == want and shown["grid"] == [grid, grid], name
            weights = stored(stores[name], "attention_224", "gone.jpg").astype(np.float64)
            cls, start = int(kw.get("class_token", False)), int(kw.get("class_token", False)) + kw.get("registers", 0)
            row = start + want if query == "patch" else cls + int(query[3:]) if int(query[3:]) < kw.get("registers", 0) else None
            names = lambda k, cls=cls, start=start: -1 if k < cls else -2 if k < start else k - start  # noqa: E731
            assert shown["top5"] == (
                [] if row is None else [[names(k) for k in plain_rank(weights[h, row], list(range(weights.shape[-1])), 5)] for h in range(weights.shape[0])]
            ), (name, query)
            sim = plain_cosine(stored(stores[name], "tokens_224", "gone.jpg"))
            assert sorted(shown["window"]) == plain_window(grid, want) and shown["topk"] == plain_rank(sim[want], plain_window(grid, want), 4)

    with Browser(chromium(), tmp_path / "profile", width=1400, height=1100) as browser:
        browser.open(written.html.resolve().as_uri())
        assert browser.wait_for("window.probeExplorer && window.probeExplorer.state.ready && window.probeExplorer.state.picture")
        expect(_state(browser), 34)
        _click_patch(browser, 195, 14)  # a real click on the last patch, centred at pixel (216, 216): (26, 26) at /8 (a border: upper left), (15, 15) at /14
        state = _state(browser)
        assert state["patch"] == 195 and [state["stores"][labels[n]]["patch"] for n in specs] == [195, 26 * 28 + 26, 255]
        expect(state, 195)
        _click_button(browser, "reg1")
        assert _state(browser)["query"] == "reg1" and browser.evaluate("location.hash") == "#patch=195&query=reg1"
        expect(_state(browser), 195, "reg1")
        browser.evaluate("location.hash = '#patch=100&query=reg3'")
        assert browser.wait_for("window.probeExplorer.state.patch === 100 && window.probeExplorer.state.query === 'reg3'")
        expect(_state(browser), 100, "reg3")
