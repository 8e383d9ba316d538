"""Example topology: upper-cases every value (UTF-8) and keeps the key (the Python twin of
guests/uppercase)."""

from sluice_guest import Description, Processor


class Uppercase(Processor):
    @classmethod
    def describe(cls):
        return Description("uppercase").source("input").sink("output")

    def process(self, record, ctx):
        ctx.emit("output", record.key, record.value_as().upper())
