//! `uppercase` as a component of the 0.1.0 contract (`wit/deps/topology-0.1.0`), written
//! against the WIT directly: what every component uploaded before 0.2.0 is. The host runs
//! it as one sub-topology.

wit_bindgen::generate!({ path: "../../wit/deps/topology-0.1.0", world: "topology" });

use exports::sluice::topology::processor::{Description, Guest, GuestError, TaskInfo};
use sluice_wire::wire::{self, Writer};

struct V1;

fn error(message: impl ToString) -> GuestError {
    GuestError {
        record_index: None,
        message: message.to_string(),
    }
}

impl Guest for V1 {
    fn describe() -> Description {
        Description {
            name: "v1-uppercase".into(),
            sources: vec!["input".into()],
            sinks: vec!["output".into()],
            stores: vec![],
        }
    }

    fn init(task: TaskInfo) -> Result<(), GuestError> {
        sluice::topology::host::log(
            sluice::topology::types::Level::Info,
            &format!("a 0.1.0 component runs {}", task.task_id),
        );
        Ok(())
    }

    fn process(batch: Vec<u8>) -> Result<Vec<u8>, GuestError> {
        let mut out = Writer::new();
        for input in wire::inputs(&batch).map_err(error)? {
            let input = input.map_err(error)?;
            let value = input.value.map(|v| String::from_utf8_lossy(v).to_uppercase());
            out.push_emitted(
                0,
                input.key,
                value.as_deref().map(str::as_bytes),
                wire::INHERIT_TIMESTAMP,
                std::iter::empty(),
            );
        }
        Ok(out.take())
    }

    fn punctuate(_stream_time_ms: i64, _wall_clock_ms: i64) -> Result<Vec<u8>, GuestError> {
        Ok(Writer::new().take())
    }

    fn close() -> Result<Vec<u8>, GuestError> {
        Ok(Writer::new().take())
    }
}

export!(V1);
