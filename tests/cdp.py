"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only).

Chromium reads commands from its fd 3 and writes replies and events to its fd 4, each message a
JSON object ended by a NUL byte. A small Python launcher puts our two pipe ends on fds 3 and 4
and then execs Chromium, so no ``preexec_fn`` runs in a process that may hold threads, and no
websocket library or port is needed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)

LAUNCHER = """
import fcntl, os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
r2, w2 = fcntl.fcntl(r, fcntl.F_DUPFD, 10), fcntl.fcntl(w, fcntl.F_DUPFD, 10)
os.dup2(r2, 3)
os.dup2(w2, 4)
for fd in {r, w, r2, w2} - {3, 4}:
    os.close(fd)
os.execv(sys.argv[3], sys.argv[3:])
"""


class CDPError(RuntimeError):
    pass


class Browser:
    """Headless Chromium driven through the DevTools pipe; one page, attached in flat mode."""

    def __init__(self, executable: str, profile: Path, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout = timeout
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        args = [
            sys.executable,
            "-c",
            LAUNCHER,
            str(to_child_r),
            str(from_child_w),
            executable,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile.parent / f"{profile.name}-stderr.log"  # a file, not a pipe: Chromium is chatty and must never block on it
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(args, pass_fds=(to_child_r, from_child_w), stdout=subprocess.DEVNULL, stderr=log)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- transport -------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_child, json.dumps(message).encode() + b"\0")

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise CDPError(f"Chromium closed the pipe; its log: {self.log.read_text(errors='replace')[-2000:]}")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        self._send(message)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._receive(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    # -- page ------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event (a change of fragment alone loads nothing: see ``Page.navigate``)."""
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        if "loaderId" in self.call("Page.navigate", {"url": url}):
            self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        found = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in found:
            raise CDPError(f"{expression}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll ``expression`` until it is truthy (a page's own asynchronous work, such as an image decode)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def click(self, x: float, y: float) -> None:
        """A real mouse click (pressed, released) at viewport coordinates, through the input pipeline."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            params = {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" else "none", "clickCount": 1 if kind != "mouseMoved" else 0}
            self.call("Input.dispatchMouseEvent", params)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send({"id": self._next + 1, "method": "Browser.close", "params": {}})
        except OSError:
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
