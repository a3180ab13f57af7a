#!/usr/bin/env python3
"""Screenshots of the web chat page for the README: the real server answering
a real question (greedy, so the picture can be made again), at a desktop size
(1280x800) and a phone size (390x844), saved as PNG into docs/img/.

    python3 tools/webui_screenshots.py [--out docs/img] [--model PATH] [--prompt TEXT]

Needs the build (build/inferd), the default model, Chromium, chromedriver and
selenium (scripts/setup.sh installs them all)."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from conftest import DEFAULT_MODEL, MODEL_NAME, start, stop  # noqa: E402
from webui_browser import (DESKTOP, PHONE, browser_missing, by_id, last_answer, new_browser, send,  # noqa: E402
                           set_viewport, wait_for)

PROMPT = "Write a Python function that reverses a string, with a short explanation."


def shoot(browser, base_url: str, size: tuple[int, int], mobile: bool, path: pathlib.Path) -> None:
    set_viewport(browser, size, mobile)
    browser.get(base_url + "/")
    wait_for(lambda: by_id(browser, "model-name").text == MODEL_NAME, message="the model's name")
    wait_for(lambda: last_answer(browser)[0] == "done", message="the stored answer")
    browser.execute_script("document.activeElement.blur()")  # no focus ring in the picture
    browser.save_screenshot(str(path))
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs" / "img")
    parser.add_argument("--model", type=pathlib.Path, default=DEFAULT_MODEL)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()
    if why := browser_missing():
        print(f"error: {why}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        srv = start(pathlib.Path(tmp), model=args.model)
        browser = new_browser()
        try:
            set_viewport(browser, DESKTOP)
            browser.get(srv.base_url + "/")
            browser.execute_script("localStorage.clear(); localStorage.setItem('inferd.settings', arguments[0])",
                                   json.dumps({"temperature": 0, "max_tokens": args.max_tokens}))
            browser.refresh()
            wait_for(lambda: by_id(browser, "model-name").text == MODEL_NAME, message="the model's name")
            send(browser, args.prompt)
            wait_for(lambda: last_answer(browser)[0] not in (None, "streaming"), timeout=300, message="the answer")
            if last_answer(browser)[0] != "done":
                print(f"error: the answer ended as {last_answer(browser)[0]}", file=sys.stderr)
                return 1
            # Both sizes show the stored conversation, as a reload would.
            shoot(browser, srv.base_url, DESKTOP, False, args.out / "webui-desktop.png")
            shoot(browser, srv.base_url, PHONE, True, args.out / "webui-phone.png")
        finally:
            browser.quit()
            stop(srv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
