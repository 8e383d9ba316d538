//! Hostile test topology: the DSL word count (its counts go through a record cache), whose
//! `describe-operators` traps. The host cannot learn from it that the topology holds
//! updates back, and must still have it send them on before every commit
//! (`tests/tests/all/hostile.rs`).

use sluice_guest::dsl::{DslProcessor, DslTopology, StreamsBuilder};
use sluice_guest::{Context, Description, Error, Processor, Record, TaskInfo};

struct WordCount;

impl DslTopology for WordCount {
    const NAME: &'static str = "hostile-operators-trap";

    fn topology(b: &mut StreamsBuilder) {
        b.stream::<(), String>("lines")
            .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
            .group_by(|_, word| word.clone())
            .named("words")
            .count("counts")
            .to_stream()
            .to("totals");
    }
}

struct Hostile(DslProcessor<WordCount>);

impl Processor for Hostile {
    fn describe() -> Description {
        DslProcessor::<WordCount>::describe()
    }

    fn operators() -> Vec<(String, Vec<String>)> {
        panic!("describe-operators refuses")
    }

    fn init(task: &TaskInfo) -> Result<Self, Error> {
        Ok(Hostile(DslProcessor::init(task)?))
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        self.0.process(record, ctx)
    }

    fn batch_started(&mut self) -> Result<(), Error> {
        self.0.batch_started()
    }

    fn batch_done(&mut self, ctx: &mut Context) -> Result<(), Error> {
        self.0.batch_done(ctx)
    }

    fn punctuate(&mut self, stream_time_ms: i64, ctx: &mut Context) -> Result<(), Error> {
        self.0.punctuate(stream_time_ms, ctx)
    }

    fn close(&mut self, ctx: &mut Context) -> Result<(), Error> {
        self.0.close(ctx)
    }
}

sluice_guest::export!(Hostile);
