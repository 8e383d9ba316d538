"""With SLUICE_FASTAVRO_PURE=1, the tests run as a component would: fastavro's compiled
modules, _bz2 and _lzma cannot be imported (componentize-py's CPython has none of them), so
fastavro and sluice_guest.formats run on what a component holds. test_formats.py runs itself
that way too."""

import os
import sys


class _AsInAComponent:
    """Refuses the imports a component's CPython cannot make (a plain finder: importlib.abc
    would import zipfile, and bz2 with it, before it is in place)."""

    def find_spec(self, name, path=None, target=None):
        if name in ("_bz2", "_lzma") or (name.startswith("fastavro._") and not name.endswith(("_py", "_common"))):
            raise ImportError(f"{name} cannot be imported in a component (SLUICE_FASTAVRO_PURE)")
        return None


if os.environ.get("SLUICE_FASTAVRO_PURE") == "1":
    assert "fastavro" not in sys.modules, "fastavro was imported before conftest.py"
    # pytest imported them already (zipfile does): forgotten, so that an import finds none.
    for name in ("bz2", "_bz2", "lzma", "_lzma"):
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, _AsInAComponent())
