#!/usr/bin/env bash
# Renders the HTML report of the synthetic history (tests/report.rs) in headless Chromium
# and writes a PNG, to look at by eye: .ci/report-screenshot.sh [OUT_DIR]
# Needs chromium (Debian: apt-get install -y chromium). Writes OUT_DIR/report.html and
# OUT_DIR/report.png (default target/report-screenshot).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/report-screenshot}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
IDEM_REPORT_HTML_OUT="$out/report.html" \
    cargo test --test report cli_report_json_markdown_output_file_and_sql -- --exact --quiet
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
    echo "error: chromium is not installed (apt-get install -y chromium)" >&2
    exit 2
fi
"$browser" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --hide-scrollbars \
    --window-size=1100,2400 --screenshot="$out/report.png" "file://$out/report.html" \
    2>"$out/chromium.log"
test -s "$out/report.png"
echo "wrote $out/report.png"
