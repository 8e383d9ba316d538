//! Example topology: upper-cases every value (UTF-8) and keeps the key.

use sluice_guest::{export, Context, Description, Error, Processor, Record, TaskInfo};

struct Uppercase;

impl Processor for Uppercase {
    fn describe() -> Description {
        Description::new("uppercase").source("input").sink("output")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Uppercase)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let text: &str = record.value_as()?;
        ctx.emit("output", record.key(), &text.to_uppercase())
    }
}

export!(Uppercase);
