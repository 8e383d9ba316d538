"""Example topology: splits text into words (lower-cased, letters and digits) and keeps a
running count per word in the store `counts`; emits `word -> count` (as text) on every update.

The Python twin of guests/word-count: the same store (word as UTF-8 -> count as 8 bytes
big-endian) and the same output, so either can take over the other's state."""

import re

from sluice_guest import Description, Processor, Store, Str, U64

_WORD = re.compile(r"[^\W_]+")  # letters and digits (`\w` without the underscore)


class WordCount(Processor):
    @classmethod
    def describe(cls):
        return Description("word-count").source("lines").sink("counts").store("counts")

    def init(self, task):
        self.counts = Store("counts", key=Str, value=U64)

    def process(self, record, ctx):
        counts = self.counts
        for word in _WORD.findall(record.value_as()):
            word = word.lower()
            count = counts.get(word, 0) + 1
            counts.put(word, count)
            ctx.emit("counts", word, str(count))
