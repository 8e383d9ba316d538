from sluice_guest.testing import TestDriver

from uppercase import Uppercase


def test_upper_cases_values_and_keeps_keys_and_timestamps():
    driver = TestDriver(Uppercase)
    driver.pipe_batch("input", [(b"k", "hello", 5), (None, "ça va", 6)])
    assert driver.read("output") == [(b"k", b"HELLO", 5), (None, "ÇA VA".encode(), 6)]
