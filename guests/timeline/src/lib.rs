//! Example topology: each user's events, kept in time order under tuple keys.
//!
//! Records are keyed by user; the value is a command:
//! - `add <time> <text>` keeps `text` as the user's event at `time` (ms, may be negative);
//! - `trim <time>` deletes the user's events before `time` and emits `trimmed <n>`;
//! - `show` emits the user's events oldest first, `<time>=<text>` separated by spaces,
//!   stamped with the time of the newest (the input's when there is none).
//!
//! The store's key is `(user, time)`: its encoding sorts by user, then by time with negative
//! times first, so a prefix scan of `(user,)` reads one user's events in time order (and not
//! those of a user whose name merely starts with the same text).

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct Timeline {
    events: Store<(String, i64), String>,
}

impl Processor for Timeline {
    fn describe() -> Description {
        Description::new("timeline")
            .source("commands")
            .sink("timelines")
            .store("events")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Timeline {
            events: Store::open("events")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let user: String = record.key_as()?;
        let command: &str = record.value_as()?;
        let time = |text: &str| -> Result<i64, Error> {
            text.parse()
                .map_err(|e| Error::msg(format!("{command:?} at offset {}: {e}", record.offset())))
        };
        match command.split_once(' ').unwrap_or((command, "")) {
            ("add", rest) => {
                let (at, text) = rest.split_once(' ').unwrap_or((rest, ""));
                self.events.put(&(user, time(at)?), &text.to_string())
            }
            ("trim", at) => {
                let from = (user.clone(), i64::MIN);
                let n = self
                    .events
                    .delete_range(Some(&from), Some(&(user.clone(), time(at)?)))?;
                ctx.emit("timelines", Some(&user), &format!("trimmed {n}"))
            }
            ("show", _) => {
                let mut shown = Vec::new();
                let mut newest = None;
                for entry in self.events.prefix(&(user.as_str(),))? {
                    let ((_, at), text) = entry?;
                    shown.push(format!("{at}={text}"));
                    newest = Some(at);
                }
                let value = shown.join(" ");
                match newest {
                    Some(at) => ctx.emit_at("timelines", Some(&user), &value, at),
                    None => ctx.emit("timelines", Some(&user), &value),
                }
            }
            _ => Err(Error::msg(format!(
                "{command:?} at offset {} is not a command (add, trim, show)",
                record.offset()
            ))),
        }
    }
}

export!(Timeline);
