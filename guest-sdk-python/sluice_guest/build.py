"""Builds a Python topology project into a component: ``python -m sluice_guest.build [DIR]``
(``sluice build`` runs it for a Python project).

The project's ``pyproject.toml`` names its topology under ``[tool.sluice]``:

    [tool.sluice]
    topology = "uppercase:Uppercase"   # module:attribute, a Processor subclass or a DSL topology
    # python-path = ["src"]            # where the module is, relative to the project (default ".")

componentize-py (pinned: ``COMPONENTIZE_PY``) builds the component against this SDK's copy of
the WIT world. Only the project's python path and this package go into it: the staging
folder holds a copy of ``sluice_guest`` and the app module that exports the topology.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

#: The componentize-py this SDK is built and tested with.
COMPONENTIZE_PY = "0.25.1"
WORLD = "described-topology"

_SDK = os.path.dirname(os.path.abspath(__file__))


class BuildError(Exception):
    pass


def _config(project: str) -> dict:
    path = os.path.join(project, "pyproject.toml")
    if not os.path.exists(path):
        raise BuildError(f"{project} has no pyproject.toml: is it a Python topology project (`sluice new --python`)?")
    if tomllib is None:
        raise BuildError("building needs Python 3.11 or newer (tomllib)")
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise BuildError(f"{path}: {e}") from None
    sluice = data.get("tool", {}).get("sluice")
    if not isinstance(sluice, dict) or not isinstance(sluice.get("topology"), str) or ":" not in sluice["topology"]:
        raise BuildError(f'{path} has no [tool.sluice] topology = "module:Attribute" naming the topology to build')
    name = data.get("project", {}).get("name") or os.path.basename(os.path.abspath(project))
    paths = sluice.get("python-path", ["."])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise BuildError(f"{path}: [tool.sluice] python-path is a list of folders")
    return {"name": name, "topology": sluice["topology"], "paths": [os.path.join(project, p) for p in paths]}


def componentize_py() -> str:
    """The componentize-py command: $SLUICE_COMPONENTIZE_PY, next to this Python, or on PATH;
    its version must be the pinned one."""
    candidates = [os.environ.get("SLUICE_COMPONENTIZE_PY"),
                  os.path.join(os.path.dirname(sys.executable), "componentize-py"),
                  shutil.which("componentize-py")]
    for c in candidates:
        if c and os.path.exists(c):
            try:
                out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=60).stdout
            except OSError:
                continue
            version = out.strip().split()[-1] if out.strip() else "?"
            if version != COMPONENTIZE_PY:
                raise BuildError(f"{c} is componentize-py {version}; this SDK is built with {COMPONENTIZE_PY}: "
                                 f"pip install componentize-py=={COMPONENTIZE_PY}")
            return c
    raise BuildError(f"componentize-py is not installed: pip install componentize-py=={COMPONENTIZE_PY} "
                     "(the repository's dev/setup-python does it in a venv of its own)")


def build(project: str, output: str = None, quiet: bool = False) -> str:
    """Builds the project's component; returns where it is."""
    config = _config(project)
    module, attribute = config["topology"].split(":", 1)
    output = output or os.path.join(project, "build", f"{config['name']}.wasm")
    tool = componentize_py()
    with tempfile.TemporaryDirectory(prefix="sluice-build-") as stage:
        shutil.copytree(_SDK, os.path.join(stage, "sluice_guest"),
                        ignore=shutil.ignore_patterns("__pycache__", "wit", "build.py", "testing.py"))
        with open(os.path.join(stage, "_sluice_app.py"), "w") as f:
            f.write(
                "# Written by sluice_guest.build: the component's exports run the topology below.\n"
                f"from {module} import {attribute} as _topology\n"
                "from sluice_guest._component import exports_for\n"
                "Processor, Introspection = exports_for(_topology)\n"
            )
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        command = [tool, "-d", os.path.join(_SDK, "wit"), "-w", WORLD, "componentize"]
        for p in [stage] + config["paths"]:
            command += ["-p", p]
        command += ["_sluice_app", "-o", output]
        started = time.monotonic()
        if not quiet:
            print(f"building {config['name']} ({config['topology']}) with componentize-py {COMPONENTIZE_PY} …",
                  file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"componentize-py failed (exit {done.returncode}):\n{done.stderr.strip() or done.stdout.strip()}")
    if not quiet:
        size = os.path.getsize(output)
        print(f"built {output} ({size / 1e6:.1f} MB) in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice_guest.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("project", nargs="?", default=".", help="the project folder (default: .)")
    parser.add_argument("-o", "--output", help="the component to write (default: PROJECT/build/NAME.wasm)")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        path = build(args.project, args.output, args.quiet)
    except BuildError as e:
        print(f"sluice build: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
