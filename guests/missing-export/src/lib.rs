//! A component of the Sluice world that leaves out one export (`process`): its WIT is our
//! world with that function removed.

wit_bindgen::generate!({ path: "wit", world: "topology" });

use exports::sluice::topology::processor::{Description, Guest, GuestError, TaskInfo};

struct Partial;

impl Guest for Partial {
    fn describe() -> Description {
        Description {
            name: "partial".into(),
            sources: vec!["input".into()],
            sinks: vec!["output".into()],
            stores: vec![],
        }
    }

    fn init(_task: TaskInfo) -> Result<(), GuestError> {
        Ok(())
    }

    fn punctuate(_stream_time_ms: i64, _wall_clock_ms: i64) -> Result<Vec<u8>, GuestError> {
        Ok(vec![0; 4])
    }

    fn close() -> Result<Vec<u8>, GuestError> {
        Ok(vec![0; 4])
    }
}

export!(Partial);
