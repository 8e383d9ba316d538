//! Test topology: sub-topologies `a` and `b` feed each other through internal topics, a
//! loop records would go round for ever in. The host refuses it, naming the loop.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Subtopology, TaskInfo};

struct Loop;

impl Processor for Loop {
    fn describe() -> Description {
        Description::new("stage-loop")
            .source("input")
            .internal_topic("ab", None)
            .internal_topic("ba", None)
            .subtopology(Subtopology::new("a").source("input").source("ba").sink("ab"))
            .subtopology(Subtopology::new("b").source("ab").sink("ba"))
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Loop)
    }

    fn process(&mut self, _record: &Record<'_>, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }
}

export!(Loop);
