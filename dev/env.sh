# Sourced by the dev/ scripts and .ci/run: where builds and caches live.
#
# The target directory and Maven repository live outside the clone, so a fresh clone
# (CI's included) reuses the compiled RocksDB, librdkafka and wasmtime instead of
# spending ~25 minutes rebuilding them. Override either by setting it beforehand.
SLUICE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SLUICE_ROOT
export SLUICE_CACHE="${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SLUICE_CACHE/target}"
# Two cores: more parallel rustc/C++ jobs only thrash memory and the page cache.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"
# The Python toolchain (dev/setup-python): componentize-py and pytest, pinned, in a venv.
export SLUICE_PYTHON_VENV="${SLUICE_PYTHON_VENV:-$SLUICE_CACHE/python/componentize-py-0.25.1}"
