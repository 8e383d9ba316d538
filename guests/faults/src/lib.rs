//! Test topology: passes values through to `output`, except for values that name a fault:
//!
//! | value        | what the guest does                                  |
//! |--------------|------------------------------------------------------|
//! | `panic`      | panics (a trap, with a message on stderr)            |
//! | `loop`       | never returns (the host's call deadline stops it)    |
//! | `oom`        | allocates until memory runs out (the host's cap)     |
//! | `undeclared` | emits to a sink it did not declare                   |
//! | `error`      | returns an error                                     |
//! | `store`      | opens a store it did not declare                     |

use std::hint::black_box;

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct Faults;

impl Processor for Faults {
    fn describe() -> Description {
        Description::new("faults").source("input").sink("output")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Faults)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        match record.value().unwrap_or_default() {
            b"panic" => panic!("boom at offset {}", record.offset()),
            b"loop" => loop {
                black_box(0u64);
            },
            b"oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            b"undeclared" => {
                // The error is ignored on purpose: the host must stop the task anyway.
                let _ = ctx.emit("nowhere", record.key(), record.value().unwrap_or_default());
                Ok(())
            }
            b"error" => Err(Error::msg(format!("refusing the record at offset {}", record.offset()))),
            b"store" => Store::<String, String>::open("undeclared").map(drop),
            _ => ctx.emit_raw("output", record.key(), record.value(), None, &[]),
        }
    }
}

export!(Faults);
