"""Builds a Python topology project into a component: ``python -m sluice_guest.build [DIR]``
(``sluice build`` runs it for a Python project).

The project's ``pyproject.toml`` names its topology under ``[tool.sluice]``:

    [tool.sluice]
    topology = "uppercase:Uppercase"   # module:attribute, a Processor subclass or a DSL topology
    # python-path = ["src"]            # where the module is, relative to the project (default ".")

componentize-py (pinned: ``COMPONENTIZE_PY``) builds the component against this SDK's copy of
the WIT world. Only the project's python path and this package go into it: the staging
folder holds a copy of ``sluice_guest`` and the app module that exports the topology, and,
when the topology uses them (``sluice_guest.formats``), the pure-Python modules of fastavro
and google.protobuf from this Python's installation (``PACKAGES``): a component's CPython
cannot load their compiled extensions, and needs nothing else of them.
"""

from __future__ import annotations

import argparse
import json
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
WORLD = "formatted-topology"

#: Packages a topology may use through ``sluice_guest.formats`` that the build copies into the
#: component (their ``.py`` files only) when importing the topology loads them: the module
#: name, and the folders of it left out (tests, and protobuf's C++ extension).
PACKAGES = {
    "fastavro": (),
    "google.protobuf": ("pyext", "testdata"),
}

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
    return {"name": name, "topology": sluice["topology"], "paths": [os.path.join(project, p) for p in paths],
            "project": project}


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


# Imports the topology under this Python, as the component will, and says where the packages
# of PACKAGES it loaded are installed.
_PROBE = """
import importlib, json, sys
began = []  # the modules imported, in the order their imports began
class Log:
    def find_spec(self, name, path=None, target=None):
        began.append(name)
sys.meta_path.insert(0, Log())
sys.path[:0] = json.loads(sys.argv[1])
importlib.import_module(sys.argv[2])
found = {}
for name in json.loads(sys.argv[3]):
    module = sys.modules.get(name)
    found[name] = None if module is None else list(getattr(module, "__path__", [module.__file__]))[0]
# fastavro imported before the SDK's formats module: fastavro alone cannot load in a component.
found["fastavro first"] = "fastavro" in began and (
    "sluice_guest.formats" not in began or began.index("fastavro") < began.index("sluice_guest.formats"))
print(json.dumps(found))
"""

#: The SDK's own module of formats: it goes into a component only if the topology imports it
#: (a file in the component costs its size whether imported or not).
FORMATS = "sluice_guest.formats"


def packages_used(config: dict, module: str) -> dict:
    """The packages of ``PACKAGES`` (and ``FORMATS``) that importing the topology's module
    loads, by name, with the folder each is installed in. The topology is imported in a child
    process of this Python (the one its native tests run under) with the project's python
    path; if that fails, all of them that are installed are taken (a bigger component, not a
    broken one)."""
    paths = [os.path.dirname(_SDK)] + [os.path.abspath(p) for p in config["paths"]]
    names = list(PACKAGES) + [FORMATS]
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(paths), module, json.dumps(names)],
                          capture_output=True, text=True, cwd=config["project"],
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if done.returncode == 0:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return {name: path for name, path in found.items() if path}
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    print(f"sluice build: importing {module} under {sys.executable} failed ({last}); the component gets every "
          f"package it may need that is installed here", file=sys.stderr)
    found = {FORMATS: os.path.join(_SDK, "formats.py"), "fastavro first": True}
    for name in PACKAGES:
        try:
            package = __import__(name, fromlist=["__path__"])
        except ImportError:
            continue
        found[name] = list(package.__path__)[0]
    return found


def _copy_package(name: str, source: str, stage: str) -> None:
    """Copies the ``.py`` files of the package ``name`` (installed in ``source``) into the
    staging folder, where its import path says (``google/protobuf``), without its tests."""
    target = os.path.join(stage, *name.split("."))
    left_out = set(PACKAGES.get(name, ())) | {"__pycache__", "tests", "test"}
    for folder, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in left_out)
        relative = os.path.relpath(folder, source)
        for file in files:
            if file.endswith(".py"):
                os.makedirs(os.path.join(target, relative), exist_ok=True)
                shutil.copy2(os.path.join(folder, file), os.path.join(target, relative, file))


def build(project: str, output: str = None, quiet: bool = False) -> str:
    """Builds the project's component; returns where it is."""
    config = _config(project)
    module, attribute = config["topology"].split(":", 1)
    output = output or os.path.join(project, "build", f"{config['name']}.wasm")
    tool = componentize_py()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-build-") as stage:
        packages = packages_used(config, module)
        fastavro_first = packages.pop("fastavro first", False) and "fastavro" in packages
        unused = [] if packages.pop(FORMATS, None) or fastavro_first else ["formats.py"]
        shutil.copytree(_SDK, os.path.join(stage, "sluice_guest"),
                        ignore=shutil.ignore_patterns("__pycache__", "wit", "build.py", "testing.py", *unused))
        for name, source in sorted(packages.items()):
            _copy_package(name, source, stage)
        with open(os.path.join(stage, "_sluice_app.py"), "w") as f:
            f.write(
                "# Written by sluice_guest.build: the component's exports run the topology below.\n"
                # For a topology that imports fastavro before the SDK's formats module (or
                # without it): the SDK lets fastavro load here (bz2 and lzma). Only then: an
                # import more here makes the component's memory image 0.9 MB bigger.
                + ("import sluice_guest.formats\n" if fastavro_first else "")
                + f"from {module} import {attribute} as _topology\n"
                "from sluice_guest._component import exports_for\n"
                "Processor, Introspection, Formats = exports_for(_topology)\n"
            )
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        command = [tool, "-d", os.path.join(_SDK, "wit"), "-w", WORLD, "componentize"]
        for p in [stage] + config["paths"]:
            command += ["-p", p]
        command += ["_sluice_app", "-o", output]
        if not quiet:
            extra = f", with {' and '.join(sorted(packages))}" if packages else ""
            print(f"building {config['name']} ({config['topology']}) with componentize-py {COMPONENTIZE_PY}{extra} …",
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
