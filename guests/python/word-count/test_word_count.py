from sluice_guest import Str, U64
from sluice_guest.testing import TestDriver

from word_count import WordCount


def test_counts_words_across_records_and_keeps_them_in_the_store():
    driver = TestDriver(WordCount)
    driver.pipe_batch("lines", [(None, "To be, or not to_be", 1), (None, "BE", 2)])
    assert driver.read("counts", Str, Str)[-1] == ("be", "3", 2)
    assert driver.store("counts", Str, U64) == {"to": 2, "be": 3, "or": 1, "not": 1}
