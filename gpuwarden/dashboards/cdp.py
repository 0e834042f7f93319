"""A tiny Chromium DevTools Protocol client: enough to load dashboard pages in real headless
Chromium, read what a person would see, click a button and take a screenshot.

Used by the browser tests and ``scripts/screenshots.py``; never by the dashboard itself. It speaks
the real protocol over a WebSocket (``websocket-client``, already installed with the
``kubernetes`` client), so no Playwright or Selenium is needed.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--hide-scrollbars",
)
EXCEPTION_MARKERS = ("Traceback (most recent call last)", 'data-testid="stException"')

# What the page shows while a script runs; a page is settled when none of it is there.
_BUSY_JS = """(() => {
  const widget = document.querySelector('[data-testid="stStatusWidget"]');
  const busy = document.querySelector('[data-testid="stSkeleton"], [data-testid="stAppSkeleton"], [data-testid="stSpinner"]');
  return Boolean((widget && /Running|Connecting|Stop/i.test(widget.innerText)) || busy);
})()"""


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """One headless Chromium with one page, driven over the DevTools WebSocket."""

    def __init__(self, binary: str, profile_dir: str | Path, width: int = 1400, height: int = 1000,
                 start_timeout_s: float = 60.0) -> None:
        import websocket  # websocket-client

        self.profile = Path(profile_dir)
        self.profile.mkdir(parents=True, exist_ok=True)
        (self.profile / "DevToolsActivePort").unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        port_file = self.profile / "DevToolsActivePort"
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params) -> dict:
        message_id = next(self._ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def open_page(self, path: str) -> bool:
        """Go to another page of a Streamlit app already loaded, through its sidebar link (no reload:
        the same session, as a person clicks). False when the link is not there."""
        return bool(self.evaluate(
            "(() => { const want = " + json.dumps(path.strip("/")) + ";"
            " const links = [...document.querySelectorAll('a[data-testid=\"stSidebarNavLink\"]')];"
            " const a = links.find(l => new URL(l.href).pathname.replace(/^\\/+|\\/+$/g, '') === want);"
            " if (!a) return false; a.click(); return true; })()"))

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML") or ""

    def settle(self, needles: tuple[str, ...] = (), timeout_s: float = 60.0) -> str:
        """Wait until every needle is on the page and no script is running; return the page text.
        Raises TimeoutError naming what is missing."""
        deadline = time.monotonic() + timeout_s
        quiet_since = None
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            ready = all(n in text for n in needles) and not self.evaluate(_BUSY_JS)
            if ready:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 0.3:  # stays settled: charts and fragments drawn
                    return text
            else:
                quiet_since = None
            time.sleep(0.1)
        missing = [n for n in needles if n not in text]
        raise TimeoutError(f"page never settled; missing {missing}; it shows: {text[:300]!r}")

    def click(self, label: str) -> bool:
        """Click the first button whose text is ``label``; False when there is none."""
        return bool(self.evaluate(
            "(() => { const b = [...document.querySelectorAll('button')].find(e => e.innerText.trim() === "
            + json.dumps(label) + "); if (!b) return false; b.click(); return true; })()"))

    def box(self, selector: str) -> tuple[float, float, float, float] | None:
        """(x, y, width, height) of the first element matching ``selector``, scrolled into view;
        None when there is none."""
        found = self.evaluate(
            "(() => { const e = document.querySelector(" + json.dumps(selector) + "); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x, r.y, r.width, r.height]; })()")
        return tuple(found) if found else None

    def click_at(self, x: float, y: float) -> None:
        """A real left click (press and release) at viewport point (x, y), as a mouse does it."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: str | Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()

    def __enter__(self) -> Chromium:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()
