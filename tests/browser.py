"""Headless Chromium (Debian's `chromium`, installed by `make install` where apt-get runs) for the
run report's tests: the DOM after the page's script ran, and screenshots."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make install installs "
                                                              "Debian's chromium where apt-get runs)")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0"]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *args], check=False, capture_output=True, text=True, timeout=timeout)


def page_dom(path: Path, fragment: str = "") -> tuple[str, str]:
    """(the DOM after the page's scripts ran, Chromium's log) of the file opened at `#fragment`."""
    done = _run(["--dump-dom", f"file://{path.resolve()}#{fragment}"])
    return done.stdout, done.stderr


def console_errors(log: str) -> list[str]:
    """Script errors Chromium logged (uncaught exceptions, console.error)."""
    return [line for line in log.splitlines() if "CONSOLE" in line and ("Uncaught" in line or ":ERROR:" in line)]


def screenshot(path: Path, fragment: str, out: Path, size: str = "1300,900") -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--window-size={size}", f"--screenshot={out.resolve()}", f"file://{path.resolve()}#{fragment}"])
    return out
