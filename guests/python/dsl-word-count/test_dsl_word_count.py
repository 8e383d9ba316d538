from sluice_guest import Str, U64
from sluice_guest.dsl.testing import TestDriver

from dsl_word_count import word_count


def test_counts_words_across_lines():
    driver = TestDriver(word_count)
    driver.pipe("lines", None, "To be or not to be", 1)
    totals = driver.read("totals", Str, U64)
    assert totals[-1] == ("be", 2, 1)
    assert dict((k, v) for k, v, _ in totals) == {"to": 2, "be": 2, "or": 1, "not": 1}
    assert driver.store("counts", Str, U64) == {"be": 2, "not": 1, "or": 1, "to": 2}


def test_compiles_to_the_rust_twins_sub_topologies():
    d = TestDriver(word_count).description
    assert d.sources == ["lines", "words"] and d.sinks == ["totals", "words"]
    assert d.stores == ["counts"] and d.internal_topics == [("words", None)]
    assert [(s.name, s.sources, s.sinks, s.stores) for s in d.subtopologies] == [
        ("lines", ["lines"], ["words"], []),
        ("words", ["words"], ["totals"], ["counts"]),
    ]
