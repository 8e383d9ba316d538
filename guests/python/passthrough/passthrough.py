"""Emits every record to `output` unchanged (key, value, timestamp): what crossing the batch
boundary costs a Python topology, with no work of its own."""

from sluice_guest import Description, Processor


class Passthrough(Processor):
    @classmethod
    def describe(cls):
        return Description("passthrough").source("input").sink("output")

    def process(self, record, ctx):
        ctx.emit("output", record.key, record.value)
