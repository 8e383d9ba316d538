"""The Python twins of the topologies in ``guest-sdk/tests/python_dsl.rs``, and their runner:
``python dsl_twins.py CASE.json`` runs a case's steps through the Python DSL's test driver and
writes what the Rust test compares (description, operator lines, outputs per sink, stores).

The first five twins are the examples in ``guests/python/``, imported as they ship (the Avro
one needs fastavro: run this with the venv of ``dev/setup-python``)."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
for example in ("dsl-word-count", "dsl-page-views", "dsl-enrich-orders", "dsl-orders-payments", "dsl-avro-orders"):
    sys.path.insert(0, os.path.join(ROOT, "guests", "python", example))

from sluice_guest import I64, Str, U64  # noqa: E402
from sluice_guest.dsl import JoinWindows, SessionWindows, SlidingWindows, TimeWindows, topology  # noqa: E402
from sluice_guest.dsl._graph import Topology  # noqa: E402
from sluice_guest.dsl.testing import TestDriver  # noqa: E402

from dsl_avro_orders import avro_orders  # noqa: E402
from dsl_enrich_orders import enrich_orders  # noqa: E402
from dsl_orders_payments import orders_payments  # noqa: E402
from dsl_page_views import page_views  # noqa: E402
from dsl_word_count import word_count  # noqa: E402


@topology("mixed")
def mixed(b):
    b.cache_max_bytes(300)
    events = b.stream("events", key=Str, value=Str)
    names = b.table("names", "names", key=Str, value=Str)
    parts = (events.split()
             .branch(lambda _, v: v.startswith("a"))
             .branch(lambda _, v: len(v) > 3)
             .default_branch())
    parts[0].map_values(str.upper).peek(lambda k, v: None).to("upper")
    (parts[1].merge(parts[2])
        .select_key(lambda _, v: v[:1])
        .group_by_key()
        .reduce(lambda a, b: f"{a}+{b}", "joined")
        .to_stream()
        .to("reduced"))
    events.map(lambda k, v: (v, k)).to_table("latest").to_stream().to("latest_out")
    lengths = names.filter(lambda _, v: len(v) % 2 == 0).map_values(len, value=U64)
    (events.filter_not(lambda k, _: k.endswith("4"))
        .select_key(lambda _, v: f"k{len(v) % 5}")
        .left_join(lengths, lambda v, n: f"{v}:{-1 if n is None else n}")
        .to("with_length"))
    (events.flat_map(lambda k, v: [(c, k) for c in v])
        .group_by_key()
        .count("letters")
        .to_stream()
        .to("letter_counts"))


@topology("windowed")
def windowed(b):
    b.cache_max_bytes(230)
    events = b.stream("events", key=Str, value=Str)
    names = b.table("names", "names", key=Str, value=Str)
    (events.group_by_key()
        .windowed_by(TimeWindows.hopping(timedelta(seconds=10), timedelta(seconds=5)).grace(timedelta(seconds=2)))
        .aggregate(lambda: 0, lambda _, v, a: a + len(v), "lens", value=I64)
        .to_stream()
        .map(lambda w, n: (f"{w.key}@{w.start}-{w.end}", -1 if n is None else n), key=Str, value=I64)
        .to("lens"))
    (events.group_by(lambda _, v: v[:2])
        .named("by_prefix")
        .windowed_by(TimeWindows.tumbling(7_000))
        .reduce(lambda a, b: b if b > a else a, "largest")
        .to_stream()
        .map(lambda w, v: (w.key, v or ""), key=Str, value=Str)
        .to("largest"))
    (events.flat_map_values(list)
        .group_by_key()
        .windowed_by(TimeWindows.hopping(10_000, 5_000))
        .count("char_windows")
        .to_stream()
        .map(lambda w, n: (f"{w.key}@{w.start}", n or 0), key=Str, value=U64)
        .to("chars_out"))
    events.join(names, lambda v, n: f"{v} by {n}").to("joined")


@topology("tables")
def tables(b):
    def or_dash(v):
        return "-" if v is None else v
    orders = b.table("accounts", "accounts", key=Str, value=Str)
    statuses = b.table("statuses", "statuses", key=Str, value=Str)
    joined = orders.join(statuses, lambda o, s: f"{o}/{s}")
    joined.to_stream().to("joined")
    orders.left_join(statuses, lambda o, s: f"{o}/{or_dash(s)}").to_stream().to("left")
    orders.outer_join(statuses, lambda o, s: f"{or_dash(o)}/{or_dash(s)}").to_stream().to("outer")
    by_first = joined.group_by(lambda _, v: (v[:1], v))
    by_first.count("per_letter").to_stream().to("letter_counts")
    (by_first.reduce(lambda a, b: f"{a}+{b}", lambda a, b: a.replace(f"+{b}", "", 1), "reduced")
        .to_stream().to("reduced"))
    (statuses.group_by(lambda _, s: (s, len(s)), value=I64)
        .aggregate(lambda: 0, lambda _, v, a: a + v, lambda _, v, a: a - v, "status_totals", value=I64)
        .to_stream().to("totals_out"))


@topology("sessions")
def sessions(b):
    clicks = b.stream("clicks", key=Str, value=Str).group_by_key()
    (clicks.windowed_by(SessionWindows.with_inactivity_gap(5_000).grace(3_000))
        .emit_final()
        .count("final_sessions")
        .to_stream()
        .map(lambda w, n: (w.key, f"{w.start} {w.end} {n or 0}"), key=Str, value=Str)
        .to("final"))
    (clicks.windowed_by(SessionWindows.with_inactivity_gap(4_000))
        .aggregate(str, lambda _, v, a: a + v, lambda _, a, b: f"{a}|{b}", "joined_sessions", value=Str)
        .to_stream()
        .map(lambda w, v: (f"{w.key}@{w.start}-{w.end}", v), key=Str, value=Str)
        .to("updates"))


@topology("stream_joins")
def stream_joins(b):
    def or_dash(v):
        return "-" if v is None else v
    orders = b.stream("orders", key=Str, value=Str)
    payments = b.stream("payments", key=Str, value=Str)
    (orders.left_join_stream(payments, lambda o, p: f"{o} unpaid" if p is None else f"{o} paid by {p}",
                             JoinWindows.of(10_000).before(0).grace(3_000))
        .to("paid"))
    orders.join_stream(payments, lambda o, p: f"{o}+{p}", JoinWindows.of(2_000).grace(1_000)).to("inner")
    (orders.outer_join_stream(payments, lambda o, p: f"{or_dash(o)}|{or_dash(p)}", JoinWindows.of(3_000).after(1_000))
        .to("outer"))
    (orders.select_key(lambda _, v: v[:1])
        .join_stream(payments.select_key(lambda _, v: v[:1]), lambda o, p: f"{o}={p}", JoinWindows.of(1_000))
        .to("by_letter"))


@topology("sliding")
def sliding(b):
    clicks = b.stream("clicks", key=Str, value=Str).group_by_key()
    (clicks.windowed_by(SlidingWindows.with_time_difference(6_000).grace(3_000))
        .emit_final()
        .count("sliding_final")
        .to_stream()
        .map(lambda w, n: (w.key, f"{w.start} {w.end} {n or 0}"), key=Str, value=Str)
        .to("final"))
    (clicks.windowed_by(SlidingWindows.with_time_difference(4_000))
        .reduce(lambda a, b: a + b, "sliding_joined")
        .to_stream()
        .map(lambda w, v: (f"{w.key}@{w.start}-{w.end}", v), key=Str, value=Str)
        .to("updates"))


TWINS = {
    "dsl-word-count": word_count,
    "dsl-page-views": page_views,
    "dsl-enrich-orders": enrich_orders,
    "dsl-orders-payments": orders_payments,
    "dsl-avro-orders": avro_orders,
    "mixed": mixed,
    "windowed": windowed,
    "tables": tables,
    "sessions": sessions,
    "stream_joins": stream_joins,
    "sliding": sliding,
}


def schema(s):
    return None if s is None else [s.kind, s.text, s.message, [list(i) for i in s.imports]]


def hx(b):
    return None if b is None else bytes(b).hex()


def main(path):
    with open(path) as f:
        case = json.load(f)
    twin = TWINS[case["twin"]]
    compiled = Topology.build(twin.topology_name, twin.topology_function)
    driver = TestDriver(twin)
    for step in case["steps"]:
        if "pipe" in step:
            source, key, value, ts = step["pipe"]
            driver.pipe(source, None if key is None else bytes.fromhex(key),
                        None if value is None else bytes.fromhex(value), ts)
        else:
            driver.punctuate()
    outputs = {sink: [[hx(o.key), hx(o.value), o.timestamp] for o in driver.outputs if o.sink == sink]
               for sink in case["sinks"]}
    stores = {}
    for name in driver.description.stores:
        store = driver.stores.get(name)
        stores[name] = [] if store is None else [[k.hex(), store.values[k].hex()] for k in store.keys]
    d = driver.description
    print(json.dumps({
        "description": {
            "name": d.name, "sources": d.sources, "sinks": d.sinks, "stores": d.stores,
            "internal_topics": [[n, p] for n, p in d.internal_topics],
            "subtopologies": [[s.name, s.sources, s.sinks, s.stores] for s in d.subtopologies],
            "global_stores": [[n, t] for n, t in d.global_stores],
            "formats": [[f.topic, schema(f.key), schema(f.value)] for f in d.formats],
        },
        "operators": [[name, lines] for name, lines in compiled.operators()],
        "outputs": outputs,
        "stores": stores,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
