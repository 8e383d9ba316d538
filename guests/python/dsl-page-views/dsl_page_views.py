"""Example topology in Python with the stream DSL: page views per user in event-time
windows, each window's count sent once, when the window closes (`emit_final`). The Python
twin of `guests/dsl-page-views`: the same sub-topology, stores and output bytes.

`views` is keyed by user (the value, the page, is not read) and stamped with the time of the
view. Two windowed counts read it, grouped by the user as it is keyed (no repartition):

- `per_minute`: tumbling windows of one minute (store `views_per_minute`);
- `per_5_minutes`: hopping windows of five minutes, one starting every minute (store
  `views_per_5_minutes`): a view counts in the five windows that cover it.

A view may arrive up to 30 s after its window ended (the grace period) and still count; a
later one is dropped. Once stream time is past a window's end and grace, the next
punctuation sends `user → "<start> <end> <count>"` (milliseconds, `end` exclusive), stamped
with its latest view's time."""

from datetime import timedelta

from sluice_guest import Str
from sluice_guest.dsl import TimeWindows, topology

MINUTE = timedelta(minutes=1)
#: How long after its end a window still counts late views.
GRACE = timedelta(seconds=30)


def line(window, count):
    """A closed window as it goes out: keyed by the user, `"<start> <end> <count>"`."""
    return window.key, f"{window.start} {window.end} {count or 0}"


@topology("dsl-page-views")
def page_views(b):
    by_user = b.stream("views", key=Str, value=Str).group_by_key()
    (by_user.windowed_by(TimeWindows.tumbling(MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_minute")
        .to_stream()
        .map(line, key=Str, value=Str)
        .to("per_minute"))
    (by_user.windowed_by(TimeWindows.hopping(5 * MINUTE, MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_5_minutes")
        .to_stream()
        .map(line, key=Str, value=Str)
        .to("per_5_minutes"))
