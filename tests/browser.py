""" Headless Chromium for the explorer page: Debian's ``chromium`` and ``chromium-driver`` driven by Selenium

Without a browser the page tests skip and say why, except in CI (``CI`` set), where ``.ci/run`` installs it and a
missing browser is a failure.
"""
import json
import os
import shutil
import tempfile
import time
from typing import List, Optional

import pytest
from helpers import HANG_TIMEOUT_S

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')
CHROMEDRIVER = shutil.which('chromedriver')
# the flags of a closed network: without the background-networking ones Chromium keeps dialling Google's hosts
CHROMIUM_FLAGS = ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--disable-dev-shm-usage', '--window-size=1500,1400')


def require_browser() -> None:
    """Skip (fail in CI) unless Selenium, Chromium and ChromeDriver are installed."""
    missing = [name for name, found in (('chromium', CHROMIUM), ('chromedriver', CHROMEDRIVER)) if not found]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append('selenium (pip)')
    if missing:
        reason = (f'no browser to test the page in: {", ".join(missing)} missing (apt-get install chromium '
                  f'chromium-driver; pip install selenium)')
        if os.environ.get('CI'):
            pytest.fail(reason + '; .ci/run installs them')
        pytest.skip(reason)


def chromium_driver():
    """A headless Chromium session that records the console and every network request."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f'--user-data-dir={tempfile.mkdtemp(prefix="sa-explorer-chromium-")}')
    options.set_capability('goog:loggingPrefs', {'browser': 'ALL', 'performance': 'ALL'})
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def open_page(driver, path, timeout: float = HANG_TIMEOUT_S) -> None:
    """Open ``path`` from file:// and wait until the page says it is ready (an error on the page ends the wait)."""
    driver.get(f'file://{os.path.abspath(path)}')
    deadline = time.monotonic() + timeout
    while not driver.execute_script('return !!(window.saExplorer && window.saExplorer.ready)'):
        errors = console_errors(driver)
        if errors or time.monotonic() > deadline:
            raise AssertionError(f'the page did not get ready: {errors or "timed out"}')
        time.sleep(0.1)


def console_errors(driver) -> List[str]:
    return [entry['message'] for entry in driver.get_log('browser') if entry['level'] in ('SEVERE', 'ERROR')]


def requested_urls(driver, page) -> List[str]:
    """Every URL that the document ``page`` asked for since the last call (Chrome's performance log; the browser's
    own new-tab page is another document)."""
    url = f'file://{os.path.abspath(page)}'
    urls = []
    for entry in driver.get_log('performance'):
        message = json.loads(entry['message'])['message']
        if message['method'] == 'Network.requestWillBeSent' and message['params'].get('documentURL') == url:
            urls.append(message['params']['request']['url'])
    return urls


def page_probs(driver, model: int, layer: int, head: int, row: int, col: int, image: int = 0,
               epoch: Optional[int] = None) -> List[float]:
    return driver.execute_script('return saExplorer.probs(...arguments)', model, layer, head, row, col, image, epoch)
