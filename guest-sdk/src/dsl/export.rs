//! A DSL topology as a [`Processor`]: `describe` and every `init` run the topology
//! function; `init` builds the chain of the task's sub-topology; [`crate::export_dsl!`]
//! exports it.

use std::marker::PhantomData;

use super::graph::Topology;
use super::runtime::{DslTask, SourceRecord};
use super::state::HostStores;
use super::StreamsBuilder;
use crate::{Context, Description, Error, Processor, Record, TaskInfo};

/// A topology written with the DSL: its name and its topology function. The function runs
/// at `describe` and again at every task's `init`, so it must build the same graph each
/// time (no randomness, no clock). [`crate::export_dsl!`] implements this for you.
pub trait DslTopology: 'static {
    /// The topology's name, for logs and metrics (the manifest names the deployment).
    const NAME: &'static str;

    fn topology(builder: &mut StreamsBuilder);
}

/// The [`Processor`] that runs a [`DslTopology`]: one task's chain of operators.
pub struct DslProcessor<T> {
    task: DslTask,
    _topology: PhantomData<fn() -> T>,
}

impl<T: DslTopology> Processor for DslProcessor<T> {
    fn describe() -> Description {
        match Topology::build(T::NAME, T::topology) {
            Ok(topology) => topology.description(),
            // `describe` cannot fail otherwise; the host refuses the upload and shows the
            // guest's stderr, which holds this message.
            Err(e) => panic!("{e}"),
        }
    }

    fn operators() -> Vec<(String, Vec<String>)> {
        match Topology::build(T::NAME, T::topology) {
            Ok(topology) => topology.operators(),
            Err(_) => Vec::new(),
        }
    }

    fn init(task: &TaskInfo) -> Result<Self, Error> {
        let topology = Topology::build(T::NAME, T::topology)?;
        Ok(DslProcessor {
            task: topology.instantiate(&task.subtopology, &mut HostStores)?,
            _topology: PhantomData,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let record = SourceRecord {
            source: record.source(),
            partition: record.partition(),
            offset: record.offset(),
            key: record.key(),
            value: record.value(),
            timestamp: record.timestamp(),
        };
        self.task.process(&record, ctx)
    }

    fn batch_started(&mut self) -> Result<(), Error> {
        self.task.batch_started()
    }

    fn batch_done(&mut self, _ctx: &mut Context) -> Result<(), Error> {
        self.task.batch_done()
    }

    fn punctuate(&mut self, stream_time_ms: i64, ctx: &mut Context) -> Result<(), Error> {
        self.task.punctuate(stream_time_ms, ctx)
    }

    fn close(&mut self, ctx: &mut Context) -> Result<(), Error> {
        self.task.close(ctx)
    }
}

/// Exports a DSL topology as the topology of this component: a name and a function
/// `fn(&mut StreamsBuilder)`. Use it once per crate, instead of [`crate::export!`].
///
/// ```
/// fn topology(b: &mut sluice_guest::dsl::StreamsBuilder) {
///     b.stream::<String, String>("in").filter(|_, v| !v.is_empty()).to("out");
/// }
///
/// sluice_guest::export_dsl!("non-empty", topology);
/// ```
#[macro_export]
macro_rules! export_dsl {
    ($name:expr, $topology:path) => {
        #[doc(hidden)]
        struct __SluiceDslTopology;

        impl $crate::dsl::DslTopology for __SluiceDslTopology {
            const NAME: &'static str = $name;

            fn topology(builder: &mut $crate::dsl::StreamsBuilder) {
                $topology(builder)
            }
        }

        $crate::export!($crate::dsl::DslProcessor<__SluiceDslTopology>);
    };
}
