"""Headless Chromium for the web page: Debian's chromium through the system
chromedriver, nothing downloaded (Selenium Manager stays offline). Shared by
tests/e2e/test_webui.py and tools/webui_screenshots.py."""
from __future__ import annotations

import os
import pathlib
import time

CHROMIUM = pathlib.Path(os.environ.get("INFERD_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = pathlib.Path(os.environ.get("INFERD_CHROMEDRIVER", "/usr/bin/chromedriver"))
DESKTOP = (1280, 800)
PHONE = (390, 844)


def browser_missing() -> str | None:
    """Why no browser can start here, or None."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
    return None


def new_browser():
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver  # imported here: a clear message if missing, not a collection error
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={DESKTOP[0]},{DESKTOP[1]}", "--disable-extensions", "--no-first-run",
                "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


def set_viewport(browser, size: tuple[int, int], mobile: bool = False) -> None:
    """The page's viewport exactly (a window's size includes the browser's own bars)."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": mobile})


def by_id(browser, element_id: str):
    from selenium.webdriver.common.by import By
    return browser.find_element(By.ID, element_id)


def wait_for(condition, timeout: float = 30.0, message: str = "condition", poll: float = 0.02):
    """condition()'s first true value; an AssertionError naming `message` after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


def send(browser, text: str) -> None:
    """Types a message into the page and presses Enter."""
    from selenium.webdriver.common.keys import Keys
    box = by_id(browser, "message")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def last_answer(browser) -> list:
    """[state, rendered text] of the newest answer, or [None, '']."""
    return browser.execute_script("""
        const a = [...document.querySelectorAll('article.assistant')].pop();
        return a ? [a.dataset.state, a.querySelector('.answer').textContent] : [null, ''];""")
