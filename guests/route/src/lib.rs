//! Example topology: records whose value parses as an even integer go to `even`, every
//! other record (odd numbers and anything that is not a number) to `odd`.

use sluice_guest::{export, Context, Description, Error, Processor, Record, TaskInfo};

struct Route;

impl Processor for Route {
    fn describe() -> Description {
        Description::new("route").source("input").sink("even").sink("odd")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Route)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let even = record
            .value()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.trim().parse::<i64>().ok())
            .is_some_and(|n| n % 2 == 0);
        let sink = if even { "even" } else { "odd" };
        ctx.emit_raw(sink, record.key(), record.value(), None, &[])
    }
}

export!(Route);
