"""Example topology written with the stream DSL in Python: a true word count. Lines (keys
ignored) are split into lower-case words, regrouped by word through the repartition topic
`words`, and counted in the store `counts` (word → count, 8 bytes big-endian); every new
count goes to `totals` keyed by its word. It compiles to the same two sub-topologies,
repartition topic and store as the Rust `guests/dsl-word-count`, and writes the same bytes."""

from sluice_guest import Str
from sluice_guest.dsl import Unit, topology


@topology("dsl-word-count")
def word_count(b):
    (b.stream("lines", key=Unit, value=Str)
      .flat_map_values(lambda line: [w.lower() for w in line.split()])
      .group_by(lambda _, word: word, key=Str)
      .named("words")
      .count("counts")
      .to_stream()
      .to("totals"))
