from sluice_guest import Str
from sluice_guest.dsl.testing import TestDriver

from dsl_page_views import page_views

SEC = 1_000
MIN = 60 * SEC


def read(driver, sink):
    return driver.read(sink, Str, Str)


def test_a_window_goes_out_once_when_it_closes_with_its_latest_views_time():
    driver = TestDriver(page_views)
    for at in (1 * SEC, 20 * SEC, 59 * SEC):
        driver.pipe("views", "ann", "/", at)
    driver.punctuate()
    assert read(driver, "per_minute") == []  # not closed: 59 s < 60 s + 30 s
    driver.pipe("views", "ann", "/", 70 * SEC)  # late for nothing, in the next minute
    driver.pipe("views", "ann", "/", 30 * SEC)  # late, within grace: counts
    driver.pipe("views", "bob", "/", 90 * SEC)  # closes [0, 60 s)
    driver.punctuate()
    assert read(driver, "per_minute") == [("ann", "0 60000 4", 59 * SEC)]
    driver.pipe("views", "ann", "/", 10 * SEC)  # after the close: dropped
    driver.punctuate()
    assert read(driver, "per_minute") == []


def test_a_restart_neither_sends_a_window_again_nor_early():
    driver = TestDriver(page_views)
    driver.pipe("views", "ann", "/", 5 * SEC)
    driver.pipe("views", "ann", "/", 95 * SEC)
    driver.punctuate()
    assert read(driver, "per_minute") == [("ann", "0 60000 1", 5 * SEC)]
    stores = driver.close()
    again = TestDriver(page_views, stores=stores)
    again.pipe("views", "ann", "/", 96 * SEC)
    again.punctuate()
    assert read(again, "per_minute") == []
    # Hopping: [0, 300 s) closes at 330 s.
    again.pipe("views", "cat", "/", 330 * SEC)
    again.punctuate()
    got = read(again, "per_5_minutes")
    assert ("ann", "0 300000 3", 96 * SEC) in got  # 5 s, 95 s and 96 s
