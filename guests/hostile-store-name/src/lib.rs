//! Hostile test topology: declares a store named `..`: the host must refuse the name before it becomes a path.

use sluice_guest::__private::bindings::exports::sluice::topology0_2_0::processor::{
    Description, Guest, GuestError, TaskInfo,
};

struct Hostile;

impl Guest for Hostile {
    fn describe() -> Description {
        Description {
            name: "dots".into(),
            sources: vec!["input".into()],
            sinks: vec!["output".into()],
            stores: vec!["..".into()],
            internal_topics: Vec::new(),
            subtopologies: Vec::new(),
            global_stores: Vec::new(),
        }
    }

    fn init(_task: TaskInfo) -> Result<(), GuestError> {
        Ok(())
    }

    fn process(batch: Vec<u8>) -> Result<Vec<u8>, GuestError> {
        Ok(batch[..4].to_vec().iter().map(|_| 0).collect())
    }

    fn punctuate(_stream_time_ms: i64, _wall_clock_ms: i64) -> Result<Vec<u8>, GuestError> {
        Ok(vec![0; 4])
    }

    fn close() -> Result<Vec<u8>, GuestError> {
        Ok(vec![0; 4])
    }
}

impl sluice_guest::__private::IntrospectionGuest for Hostile {
    fn describe_operators() -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
}

/// It declares no formats: its topics are bytes.
impl sluice_guest::__private::FormatsGuest for Hostile {
    fn describe_formats() -> Vec<sluice_guest::__private::WitTopicFormat> {
        Vec::new()
    }
}

sluice_guest::__private::bindings::__export_topology!(Hostile with_types_in sluice_guest::__private::bindings);
