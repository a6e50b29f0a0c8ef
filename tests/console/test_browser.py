"""The console in Debian's headless Chromium, driven by Selenium 4: every page rendered and
saved as a screenshot (test-artifacts/console/, or $TIDEMQ_ARTIFACTS/console), the live chart
polling, a reset of offsets by time clicked through its confirm step, and a dead letter resent
to its group from the DLQ page.

The browser and its driver are Debian's (`make chromium` installs them); both paths are passed
explicitly and SE_OFFLINE is set, so selenium-manager never downloads anything. The browser is
blocking, so each browser session runs in a thread while the loop serves the cluster and the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from zoneinfo import ZoneInfo

import pytest
from console_harness import Served, artifacts_dir, committed, consume_all

from tidemq import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from tidemq.protocol import message as pm
from tidemq.testing import eventually

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
WAIT_S = 20.0
# A zone away from UTC (and not a whole hour), so a time read in the wrong zone shows.
BROWSER_TZ = "Asia/Kolkata"

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (`make chromium` installs them)",
)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

T = TypeVar("T")


@contextmanager
def chromium(tz: str | None = None) -> Iterator[WebDriver]:
    """Headless Chromium; `tz` its time zone (TZ of the driver, which the browser inherits)."""
    os.environ["SE_OFFLINE"] = "true"  # never let selenium-manager fetch a browser or driver
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    env = {**os.environ, "TZ": tz} if tz else None
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER), env=env))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: WebDriver, css: str) -> None:
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))


async def in_browser(session: Callable[[WebDriver], T], tz: str | None = None) -> T:
    def run() -> T:
        with chromium(tz) as driver:
            return session(driver)

    return await asyncio.to_thread(run)


async def _dead_letter(served: Served, group: str, topic: str, body: bytes) -> None:
    """Send one message and have `group` fail it straight to %DLQ%group."""
    async with Producer("PG-browser", served.cluster.namesrv_addr) as producer:
        await producer.send(Message(topic, body, keys="dead-1"))

    def always_fails(msgs: list[MessageExt]) -> None:
        raise RuntimeError("poison")

    consumer = PushConsumer(
        group, served.cluster.namesrv_addr, consume_from_where=FIRST, max_reconsume_times=0
    )
    consumer.subscribe(topic)
    consumer.register_listener(always_fails)
    await consumer.start()
    store = served.cluster.brokers[0].store
    try:
        await eventually(lambda: store.max_offset(pm.dlq_topic(group), 0) == 1)
    finally:
        await consumer.shutdown()


async def test_every_page_renders_and_is_saved(served: Served) -> None:
    await _dead_letter(served, "CG-shots", "Orders", b'{"order": 1}')
    async with Producer("PG-browser", served.cluster.namesrv_addr) as producer:
        sent = await producer.send(Message("Orders", b"\x00\x01binary", keys="bin"))
    out = artifacts_dir()
    pages = {
        "cluster": "/",
        "broker": f"/broker/{served.cluster.broker_addr}",
        "topics": "/topics",
        "topic": "/topics/Orders",
        "groups": "/groups",
        "group": "/groups/CG-shots",
        "messages": "/messages?by=time&topic=Orders",
        "message": f"/message?id={sent.offset_msg_id}",
        "dlq": "/dlq",
        "dlq-group": "/dlq/CG-shots",
        "transactions": "/transactions",
        "not-found": "/topics/NoSuchTopic",
    }

    def visit(driver: WebDriver) -> dict[str, str]:
        headings = {}
        for name, path in pages.items():
            driver.get(served.base_url + path)
            wait_for(driver, "h1")
            if driver.find_elements(By.CSS_SELECTOR, "figure.chart canvas"):
                # The live chart has polled three times and drawn two rates (a line).
                WebDriverWait(driver, WAIT_S).until(
                    lambda d: (
                        int(
                            d.find_element(By.CSS_SELECTOR, "canvas").get_attribute("data-points")
                            or 0
                        )
                        >= 2
                    )
                )
            driver.save_screenshot(str(out / f"{name}.png"))
            headings[name] = driver.find_element(By.CSS_SELECTOR, "h1").text
        return headings

    # Traffic while the pages are open, so the live charts draw a rate above zero.
    async with Producer("PG-traffic", served.cluster.namesrv_addr) as traffic:

        async def keep_sending() -> None:
            while True:
                await traffic.send(Message("Orders", b"tick"))
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(keep_sending())
        try:
            headings = await in_browser(visit)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    assert headings["cluster"] == "Cluster"
    assert headings["topic"] == "Topic Orders"
    assert headings["group"] == "Consumer group CG-shots"
    assert headings["dlq-group"] == "Dead letters of CG-shots"
    assert headings["message"] == f"Message {sent.msg_id}"
    assert headings["not-found"] == "Not found (404)"
    for name in pages:
        assert (out / f"{name}.png").stat().st_size > 1000, name


async def test_reset_offset_by_time_is_clicked_through_and_confirmed(served: Served) -> None:
    """The person types the time in the browser's zone (+05:30 here): the plan and the reset
    use that instant, which the plan page shows in UTC and as epoch ms."""
    before = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).replace(microsecond=0)
    before_ms = int(before.timestamp() * 1000)
    typed = before.astimezone(ZoneInfo(BROWSER_TZ)).strftime("%Y-%m-%dT%H:%M:%S")
    async with Producer("PG-browser", served.cluster.namesrv_addr) as producer:
        for n in range(5):
            await producer.send(Message("Ledger", b"%d" % n))
    await consume_all(served, "CG-reset", "Ledger", 5)
    assert await committed(served, "CG-reset", "Ledger") == 5

    def click_through(driver: WebDriver) -> tuple[str, int, str, str]:
        driver.get(served.base_url + "/groups/CG-reset")
        driver.find_element(By.ID, "reset-link").click()
        wait_for(driver, "#topic")
        label = driver.find_element(By.CSS_SELECTOR, "[data-local-label]").text
        driver.find_element(By.ID, "topic").send_keys("Ledger")
        # A datetime-local input's typing order depends on the locale: set its value as ISO.
        driver.execute_script("document.getElementById('time').value = arguments[0];", typed)
        driver.find_element(By.ID, "preview").click()
        wait_for(driver, "#confirm")
        changed = len(driver.find_elements(By.CSS_SELECTOR, "#changes tr.changed"))
        shown = driver.find_element(By.CSS_SELECTOR, ".instant").text
        driver.save_screenshot(str(artifacts_dir() / "reset-confirm.png"))
        driver.find_element(By.ID, "confirm").click()
        wait_for(driver, "#result")
        return label, changed, shown, driver.find_element(By.ID, "result").text

    label, changed, shown, result = await in_browser(click_through, tz=BROWSER_TZ)
    assert "UTC+05:30" in label
    assert changed >= 1  # the queues that held the five messages
    assert shown == f"{before:%Y-%m-%d %H:%M:%S}Z UTC ({before_ms} ms since the epoch)"
    assert result.startswith("Offsets of CG-reset on Ledger reset to")
    assert f"({before_ms} ms since the epoch)" in result
    assert await committed(served, "CG-reset", "Ledger") == 0


async def test_a_dead_letter_is_resent_to_its_group_from_the_console(served: Served) -> None:
    await _dead_letter(served, "CG-dlq", "Payments", b"pay-42")
    got: list[MessageExt] = []
    consumer = PushConsumer("CG-dlq", served.cluster.namesrv_addr, consume_from_where=FIRST)
    consumer.subscribe("Payments")
    consumer.register_listener(got.extend)
    other: list[MessageExt] = []
    bystander = PushConsumer("CG-other", served.cluster.namesrv_addr, consume_from_where=FIRST)
    bystander.subscribe("Payments")
    bystander.register_listener(other.extend)
    await consumer.start()
    await bystander.start()
    try:
        await eventually(lambda: len(other) == 1)  # the original, once

        def resend(driver: WebDriver) -> str:
            driver.get(served.base_url + "/dlq")
            driver.find_element(By.LINK_TEXT, "CG-dlq").click()
            wait_for(driver, "a.resend")
            driver.find_element(By.CSS_SELECTOR, "a.resend").click()
            wait_for(driver, "#confirm")
            driver.find_element(By.ID, "confirm").click()
            wait_for(driver, "#result")
            return str(driver.find_element(By.ID, "result").text)

        assert (await in_browser(resend)).startswith("Resent to CG-dlq as ")
        await eventually(lambda: any(m.body == b"pay-42" for m in got), timeout_s=WAIT_S)
    finally:
        await consumer.shutdown()
        await bystander.shutdown()
    again = next(m for m in got if m.body == b"pay-42")
    assert again.topic == "Payments"  # restored from RETRY_TOPIC
    assert again.keys == ("dead-1",)
    assert len(other) == 1  # only the group it was resent to received it
