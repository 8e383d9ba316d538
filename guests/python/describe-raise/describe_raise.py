"""A topology whose `describe` raises: a worker refuses to load it, and the error carries the
Python traceback (`describe` has no error in the contract, so the exception traps)."""

from sluice_guest import Description, Processor


def _sinks():
    raise KeyError("no sink configured")


class DescribeRaises(Processor):
    @classmethod
    def describe(cls):
        return Description("describe-raises").source("input").sink(_sinks())

    def process(self, record, ctx):
        pass
