#!/usr/bin/env bash
# The Python package (python/, PyO3 + maturin) as a user gets it: built into an abi3
# manylinux wheel, installed into a fresh virtualenv whose PATH has no Rust toolchain,
# and its pytest suite run against the installed wheel, with the stores .ci/run started
# (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL). A skipped test fails the run.
#   bash .ci/python.sh          # build the wheel, then install and test it
#   bash .ci/python.sh build    # only build the wheel (into $CARGO_TARGET_DIR/wheels)
#   bash .ci/python.sh test     # only install the wheel built before and test it
#   bash .ci/python.sh tools    # only make what needs no wheel: maturin's virtualenv and the
#                               # tests' fresh one with pytest and mypy (both from PyPI)
# (.ci/run makes the tools while the tests build, builds the wheel in its second test
# stream and tests it after both streams.)
#
# The wheel is built with the dev profile (IDEM_PY_PROFILE, default `dev`) and, with it,
# the package's `share-test-build` feature (python/Cargo.toml: the dependencies' features
# the tests' build has, no code of its own): it reuses the dependencies `cargo test`
# compiled in the same target dir, compiling only the library (as published wheels have
# it: every backend, no CLI), PyO3 and the package itself, where a release wheel would
# compile all of them again (minutes on the 2-core CI machine). The packaging under test
# (abi3 tag, manylinux audit, what the wheel holds, an install without Rust) is the same
# for both profiles; only optimisation differs, tokio's pausable clock, which nothing
# pauses, and the CLI's own dependencies, linked in and never called. Published wheels
# are built with `maturin build --release` (docs/python.md).
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
    all|build|test|tools) ;;
    *) echo "usage: bash .ci/python.sh [build|test|tools]  (unknown phase: $phase)" >&2; exit 2 ;;
esac
wheels="$CARGO_TARGET_DIR/wheels"
tools=${IDEM_PY_TOOLS:-$CARGO_TARGET_DIR/py-tools}
# The tests' virtualenv: made fresh (no wheel in it yet) by `tools`, which marks it so;
# `test` takes it only with that mark, takes the mark away, and removes it when done.
test_venv=$CARGO_TARGET_DIR/py-test-venv
fresh_mark=$test_venv/.fresh-for-idem-tests

# The PATH without any folder holding cargo, rustc or maturin: the tests' virtualenv is
# made, filled and run without a Rust toolchain in reach.
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

maturin_tools() {
    if [ ! -x "$tools/bin/maturin" ]; then
        say "virtualenv $tools with maturin (PyPI)"
        "$python" -m venv "$tools"
        "$tools/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2"
    fi
}
test_tools() {
    rm -rf "$test_venv"
    say "fresh virtualenv $test_venv with pytest and mypy (PyPI), PATH without Rust"
    PATH="$bare_path" "$python" -m venv "$test_venv"
    PATH="$test_venv/bin:$bare_path" "$test_venv/bin/pip" install -q --disable-pip-version-check "pytest>=7" "mypy>=1.10"
    touch "$fresh_mark"
}
if [ "$phase" = tools ]; then
    tools_started=$(date +%s)
    maturin_tools
    test_tools
    say "tools made in $(( $(date +%s) - tools_started )) s"
    exit 0
fi

# --- Build: maturin in a virtualenv of its own (PyPI) ---------------------------------
if [ "$phase" != test ]; then
    maturin_tools
    rm -rf "$wheels"
    features=()
    [ "$profile" != dev ] || features=(--features share-test-build)
    say "maturin build --profile $profile ${features[*]} (abi3 wheel for CPython >= 3.9)"
    build_started=$(date +%s)
    build_log=$(mktemp)
    if ! (cd python && "$tools/bin/maturin" build --profile "$profile" "${features[@]}" --out "$wheels") >"$build_log" 2>&1; then
        tail -n 40 "$build_log"
        say "maturin build failed"
        exit 1
    fi
    say "maturin build: $(( $(date +%s) - build_started )) s"
    # What it compiled: with the dev profile, the library, PyO3's crates and the package
    # only (more means the dependencies' features drifted from the tests' build, which
    # costs time, not correctness: python/Cargo.toml).
    say "compiled: $(grep -oE 'Compiling [^ ]+' "$build_log" | cut -d' ' -f2 | tr '\n' ' ')"
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

# The tests compare with the CLI: IDEM_BIN when set (.ci/run: the binary `cargo test`
# built), else the debug binary built now. Not `cargo build` in CI: without the
# dev-dependencies' features it is a build of its own (about 60 s there).
if [ -z "${IDEM_BIN:-}" ]; then
    cargo build --quiet --bin idem
    export IDEM_BIN="$CARGO_TARGET_DIR/debug/idem"
fi

# --- Install: into a fresh virtualenv (made by `tools` before, or now), no Rust toolchain
# on the PATH -----------------------------------------------------------------------------
if [ -f "$fresh_mark" ]; then
    say "the fresh virtualenv $test_venv (pytest and mypy in it, no wheel yet)"
else
    test_tools
fi
rm -f "$fresh_mark"
venv=$test_venv
trap 'rm -rf "$venv"' EXIT
install_started=$(date +%s)
PATH="$venv/bin:$bare_path" "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "$wheel"
say "wheel installed in $(( $(date +%s) - install_started )) s"

# --- pytest against the installed wheel ------------------------------------------------
export IDEM_REQUIRE_SERVICES=1 IDEM_PY_FROM_WHEEL=1
say "pytest python/tests (the installed wheel)"
log=$(mktemp)
set +e
# From a folder outside the source tree, so `import pyidem` can only be the wheel.
run_dir=$(mktemp -d)
trap 'rm -rf "$venv" "$run_dir"' EXIT
(cd "$run_dir" && PATH="$venv/bin:$bare_path" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider --durations=8 \
    --rootdir "$repo/python" "$repo/python/tests") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# No test may skip (pytest exits 0 with skips).
if [ "$status" -eq 0 ] && tail -n 3 "$log" | grep -q " skipped"; then
    say "tests were skipped: failing"
    status=1
fi
say "done in $(( $(date +%s) - started )) s (exit $status)"
exit "$status"
