"""Headless Chromium for the dashboard test: Debian's ``chromium`` and ``chromium-driver``,
installed on first use (apt, as root), driven by Selenium with nothing downloaded."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.packages import ensure_debian

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def installed() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def ensure_chromium() -> str | None:
    """Install the Debian packages if missing; the reason when that is impossible."""
    return ensure_debian(["chromium", "chromium-driver"], [CHROMIUM, CHROMEDRIVER])


@contextmanager
def headless_chromium(width: int = 1440, height: int = 1300) -> Iterator[Any]:
    """A Selenium driver of headless Chromium with an empty profile, closed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must fetch nothing
    with tempfile.TemporaryDirectory(prefix="batchserve-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        options.add_argument(f"--window-size={width},{height}")
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            yield driver
        finally:
            driver.quit()


if __name__ == "__main__":
    # `make test` installs the browser beside its other setup (apt-get took over a minute of
    # the dashboard test's own time); the test installs it itself where this did not.
    print(ensure_chromium() or "chromium and chromium-driver installed")
