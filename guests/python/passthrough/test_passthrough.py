from sluice_guest.testing import TestDriver

from passthrough import Passthrough


def test_every_record_goes_through_unchanged():
    driver = TestDriver(Passthrough)
    driver.pipe_batch("input", [(b"k", b"\x00\xff", 5), (None, None, 6)])
    assert driver.read("output") == [(b"k", b"\x00\xff", 5), (None, None, 6)]
