"""A hostile topology in Python, for the sandbox tests (tests/tests/all/python.rs). It passes
records through to `output`, except for values that name an attack; each attack must cost
only this topology's own task.

| value              | attack                                                         |
|--------------------|----------------------------------------------------------------|
| `loop`             | spins forever                                                  |
| `alloc`            | asks for 3 GiB at once                                         |
| `hoard`            | keeps 1 MiB blocks until the memory limit stops it             |
| `recursion`        | recurses until Python's recursion limit                        |
| `deep-recursion`   | lifts the recursion limit, then recurses until the stack ends  |
| `exit`             | `sys.exit(3)`                                                  |
| `os-exit`          | `os._exit(3)` (WASI's exit)                                    |
| `bad-count`        | hands back an output buffer that claims 4 billion records      |
| `undeclared-sink`  | emits through the raw WIT import to a sink it did not declare  |
|                    | (ignoring the error; the SDK's `emit` refuses it itself)       |
| `undeclared-store` | opens a store it did not declare (ignoring the error)          |
| `state-bomb`       | puts 8 MiB values in one call until something stops it         |

`init` raises when the topology's deployed name contains `init-raise`."""

import os
import sys

from sluice_guest import Description, Error, Processor, Store

try:  # the raw WIT bindings: only in the component
    from componentize_py_types import Err
    from wit_world.imports import host as raw_host
    from wit_world.imports import sluice_topology_types_0_1_0 as raw_types
except ImportError:
    raw_host = None

_KEPT = []


def _recurse(n):
    return _recurse(n + 1) + 1


class Hostile(Processor):
    @classmethod
    def describe(cls):
        return Description("hostile-py").source("input").sink("output").store("state")

    def init(self, task):
        if "init-raise" in task.topology:
            raise ValueError(f"refusing to start {task.task_id}")
        self.state = Store("state")

    def process(self, record, ctx):
        attack = record.value_as()
        if attack == "loop":
            while True:
                pass
        elif attack == "alloc":
            _KEPT.append(bytearray(3 << 30))
        elif attack == "hoard":
            while True:
                _KEPT.append(bytearray(1 << 20))
        elif attack == "recursion":
            _recurse(0)
        elif attack == "deep-recursion":
            sys.setrecursionlimit(10**8)
            _recurse(0)
        elif attack == "exit":
            sys.exit(3)
        elif attack == "os-exit":
            os._exit(3)
        elif attack == "bad-count":
            ctx._out.count = 0xFFFFFF00
            return
        elif attack == "undeclared-sink":
            try:
                raw_host.emit("elsewhere", raw_types.Output(key=None, value=b"x", timestamp=None, headers=[]))
            except Err:
                pass
        elif attack == "undeclared-store":
            try:
                Store("not-declared")
            except Error:
                pass
        elif attack == "state-bomb":
            i = 0
            while True:
                self.state.put(i.to_bytes(8, "big"), bytes(8 << 20))
                i += 1
        ctx.emit("output", record.key, record.value)
