"""A headless Chromium driven by Selenium, for the viewer's browser tests and its docs screenshot.

Uses the system's ``chromium`` and ``chromedriver`` (Debian: ``apt-get install chromium
chromium-driver``) and never downloads a browser or a driver.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> tuple[str, str] | str:
    """``(browser, driver)`` paths, or a sentence saying what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; it is in the test extra)"
    browser = os.environ.get("AGENTBOOST_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = os.environ.get("AGENTBOOST_CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser or not driver:
        missing = " and ".join(name for name, path in (("chromium", browser), ("chromedriver", driver)) if not path)
        return f"no {missing} found (Debian: apt-get install chromium chromium-driver)"
    return browser, driver


def open_chromium(*, width: int = 1400, height: int = 1000, scale: float = 1.0) -> Any:
    """A headless Chromium WebDriver that records the page's console (``driver.get_log("browser")``)."""
    found = find_chromium()
    if isinstance(found, str):
        raise RuntimeError(found)
    browser, driver = found
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-extensions", f"--window-size={width},{height}", f"--force-device-scale-factor={scale}",
                "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver, log_output=os.devnull))
