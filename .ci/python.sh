#!/usr/bin/env bash
# The Python package (python/, PyO3 + maturin): built into a virtualenv, then its pytest
# suite against the stores .ci/run started (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL).
# Reuses the repository's target dir, so the idem crate and its dependencies already
# built by `cargo test` are not built again. A skipped test fails the run.
#   bash .ci/python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { echo "== .ci/python.sh: $*"; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

venv=${IDEM_PY_VENV:-$CARGO_TARGET_DIR/py-venv}
python=${IDEM_PYTHON:-python3}
if [ ! -x "$venv/bin/maturin" ] || [ ! -x "$venv/bin/pytest" ]; then
    say "virtualenv $venv with maturin and pytest (PyPI)"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "pytest>=7"
fi

# A debug build of the abi3 extension, installed into the virtualenv (no wheel copy).
say "maturin develop (debug, abi3 for CPython >= 3.9)"
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet)

# The tests compare with the CLI: the debug binary `cargo test` built (a no-op then).
cargo build --quiet --bin idem
export IDEM_BIN="$CARGO_TARGET_DIR/debug/idem"
export IDEM_REQUIRE_SERVICES=1

say "pytest python/tests"
log=$(mktemp)
set +e
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# No test may skip (pytest exits 0 with skips).
if [ "$status" -eq 0 ] && tail -n 3 "$log" | grep -q " skipped"; then
    say "tests were skipped: failing"
    status=1
fi
say "done in $(( $(date +%s) - started )) s (exit $status)"
exit "$status"
