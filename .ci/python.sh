#!/usr/bin/env bash
# The Python package (python/, PyO3 + maturin) as a user gets it: built into an abi3
# manylinux wheel, installed into a fresh virtualenv whose PATH has no Rust toolchain,
# and its pytest suite run against the installed wheel, with the stores .ci/run started
# (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL). A skipped test fails the run.
#   bash .ci/python.sh          # build the wheel, then install and test it
#   bash .ci/python.sh build    # only build the wheel (into $CARGO_TARGET_DIR/wheels)
#   bash .ci/python.sh test     # only install the wheel built before and test it
# (.ci/run builds the wheel in its second test stream and tests it after both streams.)
#
# The wheel is built with the dev profile (IDEM_PY_PROFILE, default `dev`): it reuses the
# dependencies `cargo test` compiled in the same target dir, where a release wheel would
# compile all of them again (minutes on the 2-core CI machine). The packaging under test
# (abi3 tag, manylinux audit, what the wheel holds, an install without Rust) is the same
# for both profiles; only optimisation differs. Published wheels are built with
# `maturin build --release` (docs/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$(date +%s)
say() { echo "== .ci/python.sh: $*"; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
python=${IDEM_PYTHON:-python3}
profile=${IDEM_PY_PROFILE:-dev}
phase=${1:-all}
case "$phase" in
    all|build|test) ;;
    *) echo "usage: bash .ci/python.sh [build|test]  (unknown phase: $phase)" >&2; exit 2 ;;
esac
wheels="$CARGO_TARGET_DIR/wheels"

# --- Build: maturin in a virtualenv of its own (PyPI) ---------------------------------
if [ "$phase" != test ]; then
    tools=${IDEM_PY_TOOLS:-$CARGO_TARGET_DIR/py-tools}
    if [ ! -x "$tools/bin/maturin" ]; then
        say "virtualenv $tools with maturin (PyPI)"
        "$python" -m venv "$tools"
        "$tools/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2"
    fi
    rm -rf "$wheels"
    say "maturin build --profile $profile (abi3 wheel for CPython >= 3.9)"
    build_started=$(date +%s)
    build_log=$(mktemp)
    if ! (cd python && "$tools/bin/maturin" build --profile "$profile" --out "$wheels") >"$build_log" 2>&1; then
        tail -n 40 "$build_log"
        say "maturin build failed"
        exit 1
    fi
    say "maturin build: $(( $(date +%s) - build_started )) s"
fi

# --- The wheel: exactly one abi3 manylinux wheel ---------------------------------------
shopt -s nullglob
built=("$wheels"/pyidem-*-cp39-abi3-manylinux*_x86_64.whl "$wheels"/pyidem-*-cp39-abi3-manylinux*_aarch64.whl)
shopt -u nullglob
if [ "${#built[@]}" -ne 1 ]; then
    say "expected one abi3 manylinux wheel in $wheels, found: $(ls "$wheels" 2>/dev/null | tr '\n' ' ')(\`bash .ci/python.sh build\` builds it)"
    exit 1
fi
wheel=${built[0]}
say "the wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
if [ "$phase" = build ]; then
    exit 0
fi

# The tests compare with the CLI: the debug binary `cargo test` built (a no-op then).
cargo build --quiet --bin idem
export IDEM_BIN="$CARGO_TARGET_DIR/debug/idem"

# --- Install: a fresh virtualenv, no Rust toolchain on the PATH ------------------------
# The PATH without any folder holding cargo, rustc or maturin.
bare_path=""
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    [ -n "$d" ] || continue
    if [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ -e "$d/maturin" ]; then continue; fi
    bare_path="${bare_path:+$bare_path:}$d"
done
for tool in cargo rustc maturin; do
    if PATH="$bare_path" command -v "$tool" >/dev/null; then
        say "$tool is still on the PATH for the install: $(PATH="$bare_path" command -v "$tool")"
        exit 1
    fi
done
venv=$(mktemp -d)/venv
say "fresh virtualenv $venv; pip install the wheel, pytest and mypy (PyPI), PATH without Rust"
PATH="$bare_path" "$python" -m venv "$venv"
install_started=$(date +%s)
PATH="$venv/bin:$bare_path" "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "$wheel"
say "wheel installed in $(( $(date +%s) - install_started )) s"
PATH="$venv/bin:$bare_path" "$venv/bin/pip" install -q --disable-pip-version-check "pytest>=7" "mypy>=1.10"

# --- pytest against the installed wheel ------------------------------------------------
export IDEM_REQUIRE_SERVICES=1 IDEM_PY_FROM_WHEEL=1
say "pytest python/tests (the installed wheel)"
log=$(mktemp)
set +e
# From a folder outside the source tree, so `import pyidem` can only be the wheel.
(cd "$(dirname "$venv")" && PATH="$venv/bin:$bare_path" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
    --rootdir "$repo/python" "$repo/python/tests") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# No test may skip (pytest exits 0 with skips).
if [ "$status" -eq 0 ] && tail -n 3 "$log" | grep -q " skipped"; then
    say "tests were skipped: failing"
    status=1
fi
rm -rf "$(dirname "$venv")"
say "done in $(( $(date +%s) - started )) s (exit $status)"
exit "$status"
