"""The explorer page in a real browser: Debian's headless Chromium driven by Playwright.

Never downloads a browser: it uses /usr/bin/chromium (``apt-get install chromium``) and is
skipped, saying why, when that or the ``playwright`` package is missing. Screenshots of the four
figures go to docs/img/explorer-*.png.
"""

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conftest import start_explorer

from specdec import theory
from specdec.explorer import Explorer
from specdec.models.toy import WORKED_TARGET

CHROMIUM = os.environ.get("SPECDEC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# Screenshots of each figure, to look at; the README's come from SPECDEC_SCREENSHOT_DIR=docs/img.
IMG = Path(os.environ.get("SPECDEC_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "specdec-screenshots")

if os.environ.get("SPECDEC_REQUIRE_BROWSER"):  # scripts/test.sh sets it: CI must not skip these
    from playwright import sync_api

    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        raise RuntimeError(f"SPECDEC_REQUIRE_BROWSER is set but there is no Chromium at {CHROMIUM}")
else:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium", allow_module_level=True)

GREEN, ORANGE, BLUE = "rgb(19, 112, 58)", "rgb(179, 71, 0)", "rgb(31, 95, 191)"




@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 980, "height": 900}, device_scale_factor=1.5)
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.goto(server.url)
    pg.expected_errors = []  # console messages a test provokes on purpose
    yield pg
    context.close()
    unexpected = [e for e in errors if not any(x in e for x in pg.expected_errors)]
    assert not unexpected, unexpected


def style(locator, prop):
    return locator.evaluate(f"(e) => getComputedStyle(e).getPropertyValue('{prop}')")


def shot(page, selector, name):
    IMG.mkdir(parents=True, exist_ok=True)
    page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring
    page.locator(selector).screenshot(path=str(IMG / f"explorer-{name}.png"), animations="disabled")


def test_run_one_round_counts_and_colours(page):
    sync_api.expect(page.locator("#toy-text")).to_have_text("the")
    page.locator("#round-gamma").fill("5")
    sync_api.expect(page.locator("#round-gamma-value")).to_have_text("5")
    seen, produced = set(), 0
    for i in range(1, 41):
        page.get_by_role("button", name="Run one round").click()
        sync_api.expect(page.locator("#toy-runs")).to_have_text(str(i))
        line = page.locator("#round-line")
        accepted, rejected = line.locator(".tok.accepted"), line.locator(".tok.rejected")
        target = line.locator(".tok.target")
        assert target.count() == 1 and rejected.count() <= 1
        kind = "bonus" if "bonus" in target.get_attribute("class") else "recovered"
        assert (rejected.count() == 1) == (kind == "recovered")
        assert accepted.count() + rejected.count() + line.locator(".tok.unchecked").count() == 5
        produced += accepted.count() + 1
        assert page.locator("#toy-tokens").inner_text() == str(produced)
        assert page.locator("#toy-per-run").inner_text() == f"{produced / i:.2f}"
        assert page.locator("#toy-text span").count() == produced + 1
        seen.add(kind)
        if i >= 5 and seen == {"bonus", "recovered"}:
            break
    assert seen == {"bonus", "recovered"}
    # Colours, and the cues that do not rely on colour: strike-through and underline.
    for _ in range(40):  # end on a round with a rejection, to show every style in the screenshot
        if page.locator("#round-line .tok.rejected").count():
            break
        i += 1
        page.get_by_role("button", name="Run one round").click()
        sync_api.expect(page.locator("#toy-runs")).to_have_text(str(i))
    legend = page.locator("#fig-round .legend")
    assert style(legend.locator(".tok.accepted"), "color") == GREEN
    rejected = legend.locator(".tok.rejected")
    assert style(rejected, "color") == ORANGE and "line-through" in style(rejected, "text-decoration-line")
    target = legend.locator(".tok.target")
    assert style(target, "color") == BLUE and "underline" in style(target, "text-decoration-line")
    for chip in page.locator("#round-line .tok.accepted").all():
        assert style(chip, "color") == GREEN
    assert style(page.locator("#round-line .tok.target"), "color") == BLUE
    shot(page, "#fig-round", "round")


def test_histogram_matches_the_target(page):
    bars = page.locator("#draws-chart g.bar")
    sync_api.expect(bars).to_have_count(6, timeout=30_000)
    for word, p in zip(("cat", "dog", "fish"), WORKED_TARGET, strict=True):
        target = page.locator(f"#draws-chart g.bar[data-word='{word}'][data-series='target']")
        observed = page.locator(f"#draws-chart g.bar[data-word='{word}'][data-series='observed']")
        assert float(target.get_attribute("data-value")) == pytest.approx(p)
        freq = float(observed.get_attribute("data-value"))
        assert abs(freq - p) < 0.02
        # the drawn heights say the same as the numbers
        h_target = target.locator("rect").bounding_box()["height"]
        h_observed = sum(r.bounding_box()["height"] for r in observed.locator("rect").all())
        assert h_observed / h_target == pytest.approx(freq / p, rel=0.02)
    assert re.search(r"10,000 draws", page.locator("#draws-note").inner_text())
    shot(page, "#fig-draws", "draws")


def test_best_gamma_readout_follows_theory(page):
    sync_api.expect(page.locator("#best-gamma")).to_have_text(str(theory.optimal_gamma(0.8, 0.05, max_gamma=16)))
    for alpha, c in [(0.4, 0.05), (0.9, 0.0), (0.6, 0.2), (0.95, 0.02), (0.8, 0.05)]:
        page.locator("#gamma-c").fill(str(c))
        page.locator("#gamma-alpha").fill(str(alpha))
        sync_api.expect(page.locator("#gamma-alpha-value")).to_have_text(f"{alpha:.2f}")
        best = theory.optimal_gamma(alpha, c, max_gamma=16)
        sync_api.expect(page.locator("#best-gamma")).to_have_text(str(best))
        sync_api.expect(page.locator("#gamma-chart .marker-label")).to_have_text(f"best γ = {best}")
        # Filling c, then α, asks twice; the first answer may have the same best γ: wait for the second.
        dot, expected = page.locator("#gamma-chart .series.speedup .dot").nth(best - 1), theory.expected_speedup(
            alpha, best, c)
        deadline = time.monotonic() + 10
        while float(dot.get_attribute("data-value")) != pytest.approx(expected) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert float(dot.get_attribute("data-value")) == pytest.approx(expected)
    shot(page, "#fig-gamma", "gamma")


def test_live_generation_on_the_toy_pair(page):
    sync_api.expect(page.locator("#live-pair")).to_contain_text("toy pair")
    page.locator("#live-max").fill("40")
    page.locator("#live-compare").check()
    page.get_by_role("button", name="Generate").click()
    sync_api.expect(page.locator("#live-status")).to_contain_text("done", timeout=30_000)
    spec = page.locator("#panel-speculative")
    assert spec.locator("[data-stat=tokens]").inner_text() == "40"
    assert page.locator("#panel-plain [data-stat=tokens]").inner_text() == "40"
    assert page.locator("#panel-plain [data-stat=tokens_per_call]").inner_text() == "1.00"
    alpha = float(spec.locator("[data-stat=alpha]").inner_text())
    assert 0.85 <= alpha <= 1.0
    assert float(spec.locator("[data-stat=tokens_per_call]").inner_text()) > 1.0
    pieces = page.locator("#out-speculative .tok-live")
    classes = {p.get_attribute("class").split()[-1] for p in pieces.all()}
    assert classes <= {"accepted", "recovered", "bonus"} and "accepted" in classes
    assert style(page.locator("#out-speculative .tok-live.accepted").first, "color") == GREEN
    text = page.locator("#out-speculative").inner_text()
    assert len(text.split()) >= 30
    assert page.locator("#out-plain .tok-live.plain").count() == 40
    shot(page, "#fig-live", "live")


def test_malformed_request_in_the_page_shows_the_message(page, server):
    sync_api.expect(page.locator("#live-pair")).to_contain_text("toy pair")
    page.expected_errors.append("status of 400 (Bad Request)")
    page.locator("#live-prompt").fill("the zebra")
    page.get_by_role("button", name="Generate").click()
    # The first stream may load the pair; the message then comes as an error event or a 400.
    sync_api.expect(page.locator("#live-status")).to_contain_text("zebra", timeout=30_000)
    status = page.evaluate("fetch('/api/toy/round', {method: 'POST', headers: {'Content-Type': 'application/json'},"
                           " body: '{bad'}).then(r => r.status)")
    assert status == 400
    page.get_by_role("button", name="Run one round").click()  # the server still serves
    sync_api.expect(page.locator("#toy-runs")).to_have_text("1")


class SlowPair:
    """The toy pair with a target that takes 50 ms per call."""

    def __new__(cls):
        from specdec.models.toy import ToyPair

        pair = ToyPair()
        score = pair.target.score

        def slow(tokens):
            time.sleep(0.05)
            return score(tokens)

        pair.target.score = slow
        return pair


def test_closing_the_tab_stops_its_generation(browser):
    srv = start_explorer(Explorer(SlowPair, "a slow toy pair"))
    try:
        pg = browser.new_page()
        pg.goto(srv.url)
        pg.locator("#live-prompt").fill("the cat")
        pg.locator("#live-max").fill("1000")
        pg.get_by_role("button", name="Generate").click()
        sync_api.expect(pg.locator("#panel-speculative [data-stat=tokens]")).not_to_have_text("0", timeout=30_000)
        assert srv.explorer.live.active == 1
        pg.close()
        deadline = time.monotonic() + 10
        while srv.explorer.live.active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.explorer.live.active == 0 and srv.explorer.live.finished == 1
    finally:
        srv.stop()
