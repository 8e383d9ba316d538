"""What the build puts into a component besides the SDK (no componentize-py needed here): the
pure-Python modules of fastavro and google.protobuf, and the SDK's formats module, only for a
topology that imports them. (Components built from the examples are loaded by the host in
tests/tests/all/runtime.rs.)"""

import importlib.util
import os
import textwrap

import pytest

from sluice_guest import build


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # its parent package is not there either
        return False


def project(tmp_path, source: str) -> dict:
    (tmp_path / "topo.py").write_text(textwrap.dedent(source))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "t"\n[tool.sluice]\ntopology = "topo:T"\n')
    return build._config(str(tmp_path))


PLAIN = """
    from sluice_guest import Description, Processor
    class T(Processor):
        @classmethod
        def describe(cls):
            return Description("t").source("in")
"""


def test_a_topology_without_formats_gets_neither_fastavro_nor_the_formats_module(tmp_path):
    assert build.packages_used(project(tmp_path, PLAIN), "topo") == {}


@pytest.mark.skipif(not installed("fastavro"), reason="needs fastavro")
def test_a_topology_of_avro_values_gets_fastavros_python_files_only(tmp_path):
    config = project(tmp_path, PLAIN + """
    from sluice_guest.formats import Avro
    CODEC = Avro('"string"')
""")
    found = build.packages_used(config, "topo")
    assert set(found) == {"fastavro", build.FORMATS}, "not google.protobuf: the topology does not use it"
    # A topology that imports fastavro before the SDK's formats module: the app module imports
    # the SDK's first (fastavro alone does not load in a component).
    first = build.packages_used(project(tmp_path, PLAIN + "    import fastavro\n    import sluice_guest.formats\n"),
                                "topo")
    assert first["fastavro first"] is True
    stage = tmp_path / "stage"
    build._copy_package("fastavro", found["fastavro"], str(stage))
    files = [os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs]
    assert "fastavro/_read_py.py" in files and "fastavro/io/binary_decoder.py" in files
    assert all(f.endswith(".py") for f in files), [f for f in files if not f.endswith(".py")]


@pytest.mark.skipif(not installed("google.protobuf"), reason="needs protobuf")
def test_a_topology_of_protobuf_messages_gets_protobufs_python_files_without_its_extensions(tmp_path):
    config = project(tmp_path, PLAIN + """
    from google.protobuf import descriptor_pb2
""")
    found = build.packages_used(config, "topo")
    assert "google.protobuf" in found and "fastavro" not in found
    stage = tmp_path / "stage"
    build._copy_package("google.protobuf", found["google.protobuf"], str(stage))
    assert (stage / "google" / "protobuf" / "internal" / "python_message.py").exists()
    assert not (stage / "google" / "protobuf" / "pyext").exists()
    assert not (stage / "google" / "__init__.py").exists(), "google stays a namespace package"


def test_a_topology_that_does_not_import_natively_gets_all_that_is_installed(tmp_path, capsys):
    found = build.packages_used(project(tmp_path, "import not_installed_anywhere\n"), "topo")
    assert build.FORMATS in found
    assert "importing topo under" in capsys.readouterr().err
