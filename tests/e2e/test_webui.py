"""The web chat page at / (issue 21), in a real headless browser: Debian's
Chromium driven by Selenium through the system chromedriver (nothing is
downloaded). The page loads, streams an answer that matches the server's,
stops a long answer mid-stream (and the server frees the request), asks for
the API key when the server has one, renders Markdown safely, and works by
keyboard and on a phone-sized screen. --no-webui leaves / a 404.

The browser tests skip only where Chromium or chromedriver is not installed
(CI installs them through scripts/setup.sh)."""
from __future__ import annotations

import json
import re
import time

import pytest
import requests

from conftest import MODEL_NAME
from webui_browser import (DESKTOP, PHONE, browser_missing, by_id, last_answer, new_browser, send, set_viewport,
                           wait_for)


@pytest.fixture(scope="module")
def browser():
    if why := browser_missing():
        pytest.skip(f"the web page tests need a browser: {why}")
    try:
        driver = new_browser()
    except ImportError:
        pytest.fail("selenium is missing: pip install selenium (scripts/setup.sh does)")
    yield driver
    driver.quit()


# ---- helpers ----------------------------------------------------------------

def open_page(browser, srv, expect_model: bool = True):
    """The page on a clean slate: no stored conversation, settings or key."""
    browser.get(srv.base_url + "/")
    browser.execute_script("localStorage.clear()")
    browser.get_log("browser")  # drop what came before
    browser.refresh()
    if expect_model:
        wait_for(lambda: by_id(browser, "model-name").text == MODEL_NAME, message="the model's name")


def dialog_open(browser, dialog_id) -> bool:
    return browser.execute_script(f"return document.getElementById('{dialog_id}').open")


def set_settings(browser, **fields):
    """Fills the settings dialog through its controls and saves it."""
    by_id(browser, "open-settings").click()
    wait_for(lambda: dialog_open(browser, "settings"), message="the settings dialog")
    for element_id, value in fields.items():
        element = by_id(browser, element_id.replace("_", "-"))
        if element.get_attribute("type") == "checkbox":
            if element.is_selected() != bool(value):
                element.click()
        else:
            element.clear()
            element.send_keys(str(value))
    by_id(browser, "save-settings").click()
    wait_for(lambda: not dialog_open(browser, "settings"), message="the settings dialog to close")


def answer_meta(browser) -> str:
    return browser.execute_script(
        "return [...document.querySelectorAll('article.assistant .message-meta')].pop().textContent")


def stored_messages(browser) -> list[dict]:
    return json.loads(browser.execute_script("return localStorage.getItem('inferd.chat')"))["messages"]


def severe_console_errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def show_stored_exchange(browser, question: str, answer: str, **answer_fields):
    """Reloads the page on a conversation stored as if an earlier visit had had it."""
    chat = {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer, "state": "done", **answer_fields}]}
    browser.execute_script("localStorage.setItem('inferd.chat', arguments[0])", json.dumps(chat))
    browser.refresh()
    wait_for(lambda: browser.execute_script("return document.querySelectorAll('article.message').length") == 2,
             message="the stored conversation")


def page_files(base_url: str) -> list[str]:
    """The page and every file it references."""
    html = requests.get(base_url + "/", timeout=10).text
    return ["/"] + re.findall(r'(?:src|href)="(/webui/[^"]+)"', html)


# ---- the page as HTTP serves it ----------------------------------------------

def test_page_and_its_files_are_served_with_a_strict_policy(server):
    files = page_files(server.base_url)
    assert {"/webui/app.js", "/webui/style.css", "/webui/vendor/marked.min.js",
            "/webui/vendor/purify.min.js"} <= set(files)
    for path in files + ["/index.html"]:
        r = requests.get(server.base_url + path, timeout=10)
        assert r.status_code == 200, path
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Cache-Control"] == "no-cache"
        # Revalidation: the same file again is a 304 with no body.
        again = requests.get(server.base_url + path, headers={"If-None-Match": r.headers["ETag"]}, timeout=10)
        assert again.status_code == 304 and again.content == b"" and "Content-Length" not in again.headers
    page = requests.get(server.base_url + "/", timeout=10)
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline for the CSP to refuse
    assert requests.get(server.base_url + "/webui/app.js", timeout=10).headers["Content-Type"].startswith(
        "text/javascript")
    assert requests.get(server.base_url + "/webui/missing.js", timeout=10).status_code == 404
    assert requests.post(server.base_url + "/", timeout=10).status_code == 404


def test_no_webui_leaves_the_api_alone(start_server):
    srv = start_server("--no-webui")
    for path in ("/", "/index.html", "/webui/app.js"):
        r = requests.get(srv.base_url + path, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
    assert requests.get(srv.base_url + "/v1/models", timeout=10).status_code == 200


# ---- the page in the browser ---------------------------------------------------

def test_streams_an_answer_that_matches_the_server(browser, server):
    set_viewport(browser, DESKTOP)
    open_page(browser, server)
    system = "You answer in one short sentence."
    set_settings(browser, system_prompt=system, temperature=0, max_tokens=96, ignore_eos=True)
    # Every length the answer's text takes, as the page renders it.
    browser.execute_script("""
        window.lengthsSeen = [];
        new MutationObserver(() => {
          const a = [...document.querySelectorAll('article.assistant .answer')].pop();
          const n = a ? a.textContent.length : 0, seen = window.lengthsSeen;
          if (seen[seen.length - 1] !== n) seen.push(n);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""")
    question = "Name three colours of the rainbow."
    send(browser, question)
    polled = []
    wait_for(lambda: last_answer(browser)[0] is not None, message="the answer to appear")
    while True:
        state, text = last_answer(browser)
        if state != "streaming":
            break
        if text and (not polled or polled[-1] != len(text)):
            polled.append(len(text))
        time.sleep(0.01)
    assert state == "done", f"the answer ended as {state}: {text!r}"
    assert len(polled) >= 2 and polled == sorted(polled), f"text did not grow while streaming: {polled}"
    lengths = browser.execute_script("return window.lengthsSeen")
    assert len(set(lengths)) >= 3, f"the page rendered the answer in fewer than 3 steps: {lengths}"

    expected = requests.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0, "max_tokens": 96,
        "ignore_eos": True}).json()
    messages = stored_messages(browser)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == question
    assert messages[1]["content"] == expected["choices"][0]["message"]["content"]
    assert last_answer(browser)[1].strip()
    # Time to first token and speed, from the stream's usage (exact count, no "~").
    meta = answer_meta(browser)
    assert re.search(r"first token \d+\.\d\d s · \d+\.\d tokens/s · 96 tokens", meta), meta
    assert by_id(browser, "message").get_attribute("value") == ""
    assert severe_console_errors(browser) == []  # no CSP refusals, no script errors

    # The conversation survives a reload; "New chat" clears it.
    browser.refresh()
    wait_for(lambda: len(browser.execute_script("return document.querySelectorAll('article.message')")) == 2,
             message="the conversation to come back after a reload")
    by_id(browser, "new-chat").click()
    assert browser.execute_script("return document.querySelectorAll('article.message').length") == 0
    assert stored_messages(browser) == []


def test_stop_aborts_the_request_on_the_server(browser, server):
    set_viewport(browser, DESKTOP)
    open_page(browser, server)
    set_settings(browser, max_tokens=1500, ignore_eos=True)
    aborted_before = server.metric("inferd:request_success_total", finished_reason="abort")
    tokens_before = server.metric("inferd:generation_tokens_total")
    send(browser, "Tell me a very long story about the sea.")
    wait_for(lambda: len(last_answer(browser)[1]) > 20, message="the answer to start streaming")
    assert server.metric("inferd:num_requests_running") == 1
    assert not by_id(browser, "stop").get_attribute("hidden")
    assert by_id(browser, "send").get_attribute("disabled")

    by_id(browser, "stop").click()
    stopped_at = time.time()
    wait_for(lambda: server.metric("inferd:num_requests_running") == 0, timeout=5,
             message="the server's running-request count to return to 0")
    assert time.time() - stopped_at < 3
    assert server.metric("inferd:num_requests_waiting") == 0
    assert server.metric("inferd:request_success_total", finished_reason="abort") == aborted_before + 1
    assert server.metric("inferd:generation_tokens_total") - tokens_before < 1500

    state, text = last_answer(browser)
    assert state == "stopped"
    assert answer_meta(browser).startswith("stopped")
    time.sleep(0.3)
    assert last_answer(browser)[1] == text, "text kept arriving after Stop"
    assert by_id(browser, "stop").get_attribute("hidden")
    assert not by_id(browser, "send").get_attribute("disabled")
    assert browser.switch_to.active_element == by_id(browser, "message")
    assert stored_messages(browser)[1]["content"], "the partial answer is kept"

    # Again from the keyboard: Esc in the message box stops the next answer.
    from selenium.webdriver.common.keys import Keys
    send(browser, "Go on.")
    wait_for(lambda: len(browser.find_elements("css selector", "article.assistant")) == 2
             and len(last_answer(browser)[1]) > 20, message="the second answer to start streaming")
    by_id(browser, "message").send_keys(Keys.ESCAPE)
    wait_for(lambda: server.metric("inferd:num_requests_running") == 0, timeout=5,
             message="the running-request count to return to 0 after Esc")
    assert last_answer(browser)[0] == "stopped"
    assert server.metric("inferd:request_success_total", finished_reason="abort") == aborted_before + 2
    assert [m["role"] for m in stored_messages(browser)] == ["user", "assistant"] * 2


def test_api_key_prompt(browser, start_server):
    srv = start_server(api_key="webui-secret")
    assert requests.get(srv.base_url + "/", timeout=10).status_code == 200  # the page needs no key
    assert requests.get(srv.base_url + "/v1/models", timeout=10).status_code == 401
    set_viewport(browser, DESKTOP)
    open_page(browser, srv, expect_model=False)

    # The page's first API call gets 401: the labelled key dialog opens, focused.
    wait_for(lambda: dialog_open(browser, "key-dialog"), message="the API key dialog")
    key_input = by_id(browser, "api-key")
    assert browser.switch_to.active_element == key_input
    assert browser.execute_script("return document.getElementById('api-key').labels[0].textContent") == "API key"
    key_input.send_keys("wrong-key\n")
    wait_for(lambda: dialog_open(browser, "key-dialog") and "refused" in by_id(browser, "key-reason").text,
             message="the dialog to say the key was refused")
    by_id(browser, "api-key").send_keys("webui-secret\n")
    wait_for(lambda: by_id(browser, "model-name").text == MODEL_NAME, message="the model's name")
    assert not dialog_open(browser, "key-dialog")

    set_settings(browser, temperature=0, max_tokens=8, ignore_eos=True)
    send(browser, "Hello!")
    wait_for(lambda: last_answer(browser)[0] in ("done", "error", "stopped"), message="the answer")
    assert last_answer(browser)[0] == "done" and last_answer(browser)[1].strip()

    # Reloaded, the page uses the stored key and asks nothing.
    browser.refresh()
    wait_for(lambda: by_id(browser, "model-name").text == MODEL_NAME, message="the model's name after reload")
    assert not dialog_open(browser, "key-dialog")
    # Forgotten, the next call asks again; Cancel leaves an error on the answer, not a hang.
    by_id(browser, "open-settings").click()
    by_id(browser, "forget-key").click()
    by_id(browser, "save-settings").click()
    send(browser, "Hello again!")
    wait_for(lambda: dialog_open(browser, "key-dialog"), message="the API key dialog after forgetting the key")
    by_id(browser, "cancel-key").click()
    wait_for(lambda: last_answer(browser)[0] == "error", message="the cancelled answer to show an error")
    # The unanswered question stays on screen but is not sent again.
    assert [m.get("excluded", False) for m in stored_messages(browser)] == [False, False, True, True]


def test_markdown_is_rendered_and_sanitized(browser, server):
    """A stored answer full of Markdown and hostile HTML, as a model might write it, with its thinking."""
    set_viewport(browser, DESKTOP)
    open_page(browser, server)
    hostile = ("**bold** and `code`\n\n```python\nprint('<b>not bold</b>')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
               "<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script>"
               "[link](javascript:window.pwned=3) <a href=\"https://example.com\">site</a>")
    show_stored_exchange(browser, "<i>not italic</i>", hostile, reasoning="<b>thinking</b> stays text")
    found = browser.execute_script("""
        const answer = document.querySelector('article.assistant .answer');
        const user = document.querySelector('article.user .message-body');
        return {
          strong: answer.querySelector('strong')?.textContent,
          code: answer.querySelector('pre code')?.textContent,
          cells: answer.querySelectorAll('td').length,
          copy: answer.querySelectorAll('.code-block button.copy-code').length,
          language: answer.querySelector('.code-block .code-language')?.textContent,
          scripts: answer.querySelectorAll('script').length,
          handlers: [...answer.querySelectorAll('*')]
            .filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
          jsLinks: [...answer.querySelectorAll('a')]
            .filter(a => (a.getAttribute('href') || '').startsWith('javascript')).length,
          link: answer.querySelector('a[href="https://example.com"]')?.rel,
          userText: user.textContent, userItalic: user.querySelectorAll('i').length,
          thinking: document.querySelector('article.assistant details.reasoning .reasoning-text')?.textContent,
          thinkingOpen: document.querySelector('article.assistant details.reasoning')?.open,
          pwned: window.pwned ?? null,
        };""")
    assert found["strong"] == "bold"
    assert found["code"].strip() == "print('<b>not bold</b>')"
    assert found["cells"] == 2 and found["copy"] == 1 and found["language"] == "python"
    assert found["scripts"] == 0 and found["handlers"] == 0 and found["jsLinks"] == 0
    assert found["link"] == "noopener noreferrer"
    assert found["userText"] == "<i>not italic</i>" and found["userItalic"] == 0  # the user's text stays text
    assert found["thinking"] == "<b>thinking</b> stays text" and found["thinkingOpen"] is False
    time.sleep(0.2)
    assert browser.execute_script("return window.pwned ?? null") is None


def test_keyboard_labels_and_phone_layout(browser, server):
    from selenium.webdriver.common.keys import Keys
    set_viewport(browser, PHONE, mobile=True)
    open_page(browser, server)
    # Every control has an accessible name.
    unnamed = browser.execute_script("""
        return [...document.querySelectorAll('input, textarea, button, select')].filter(e =>
          !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.getAttribute('aria-labelledby') &&
          !e.textContent.trim()).map(e => e.outerHTML);""")
    assert unnamed == []
    # Shift+Enter is a new line, not a send.
    box = by_id(browser, "message")
    box.send_keys("first line")
    box.send_keys(Keys.SHIFT, Keys.ENTER)
    box.send_keys("second line")
    assert box.get_attribute("value") == "first line\nsecond line"
    assert browser.execute_script("return document.querySelectorAll('article.message').length") == 0
    box.send_keys(Keys.TAB)
    assert browser.switch_to.active_element == by_id(browser, "send")
    box.clear()

    # A long conversation on a 390 px screen: nothing runs off the side, the
    # message box stays on screen, and the settings dialog fits.
    long_word = "x" * 300
    show_stored_exchange(browser, f"a long word: {long_word}", f"```\n{long_word}\n```\n\n{long_word}\n\n" * 6)
    layout = browser.execute_script("""
        const r = (id) => document.getElementById(id).getBoundingClientRect();
        return {scrollWidth: document.documentElement.scrollWidth, width: window.innerWidth,
                height: window.innerHeight, send: r('send'), message: r('message'), top: r('new-chat')};""")
    assert layout["width"] == PHONE[0]
    assert layout["scrollWidth"] <= layout["width"], "the page scrolls sideways on a phone"
    for name in ("send", "message", "top"):
        box_rect = layout[name]
        assert 0 <= box_rect["left"] and box_rect["right"] <= layout["width"], name
        assert 0 <= box_rect["top"] and box_rect["bottom"] <= layout["height"], name
    by_id(browser, "open-settings").click()
    rect = browser.execute_script("return document.getElementById('settings').getBoundingClientRect()")
    assert rect["left"] >= 0 and rect["right"] <= PHONE[0] and rect["bottom"] <= PHONE[1]
    box = browser.switch_to.active_element
    box.send_keys(Keys.ESCAPE)
    wait_for(lambda: not dialog_open(browser, "settings"), message="Escape to close the settings")
    set_viewport(browser, DESKTOP)
