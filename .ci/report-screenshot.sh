#!/usr/bin/env bash
# Renders the HTML report of the synthetic history (tests/it/report.rs), then `idem status
# --format html` (tests/it/cli.rs), in headless Chromium and writes PNGs, to look at by eye:
#   .ci/report-screenshot.sh [OUT_DIR]
# Needs chromium (Debian: apt-get install -y chromium). Writes OUT_DIR/report.html,
# report.png, status.html and status.png (default target/report-screenshot).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/report-screenshot}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
IDEM_REPORT_HTML_OUT="$out/report.html" \
    cargo test --test it report::cli_report_json_markdown_output_file_and_sql -- --exact --quiet
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
    echo "error: chromium is not installed (apt-get install -y chromium)" >&2
    exit 2
fi
flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-quic
       --disable-background-networking --disable-component-update --disable-sync
       --hide-scrollbars --user-data-dir="$out/profile")
"$browser" "${flags[@]}" --window-size=1100,2400 --screenshot="$out/report.png" \
    "file://$out/report.html" 2>"$out/chromium.log"
# What the browser made of the page: the DOM after parsing, and the picture.
"$browser" "${flags[@]}" --dump-dom "file://$out/report.html" >"$out/report.dom.html" \
    2>>"$out/chromium.log"
fail() { echo "error: the HTML report did not render as expected: $*" >&2; exit 1; }
test -s "$out/report.png" || fail "no screenshot (see $out/chromium.log)"
# A blank page of this size compresses to a few KB; the report's tables and charts do not.
bytes=$(wc -c <"$out/report.png")
[ "$bytes" -gt 40000 ] || fail "the screenshot is nearly blank ($bytes bytes)"
# One summary table and one chart per processor of the CLI test's history (8 processors).
charts=$(grep -o '<svg' "$out/report.dom.html" | wc -l)
[ "$charts" -ge 8 ] || fail "$charts charts in the rendered page, expected one per processor (8)"
grep -q '<table' "$out/report.dom.html" || fail "no summary table in the rendered page"
for verdict in enable consider keep not_needed not_enough_data; do
    grep -q "$verdict" "$out/report.dom.html" || fail "verdict $verdict missing"
done
echo "wrote $out/report.png ($bytes bytes, $charts charts)"

# The same for `idem status --format html` (tests/it/cli.rs: a job with dates completed,
# failed and missing, and an `idem exec` job known from the ledger).
IDEM_STATUS_HTML_OUT="$out/status.html" \
    cargo test --test it cli::status_names_missing_and_failed_dates_and_run_missing_runs_exactly_those -- --exact --quiet
"$browser" "${flags[@]}" --window-size=900,400 --screenshot="$out/status.png" \
    "file://$out/status.html" 2>>"$out/chromium.log"
"$browser" "${flags[@]}" --dump-dom "file://$out/status.html" >"$out/status.dom.html" \
    2>>"$out/chromium.log"
test -s "$out/status.png" || fail "no screenshot of the status page (see $out/chromium.log)"
sbytes=$(wc -c <"$out/status.png")
[ "$sbytes" -gt 8000 ] || fail "the status screenshot is nearly blank ($sbytes bytes)"
for state in completed failed missing; do
    grep -q "data-state=\"$state\"" "$out/status.dom.html" || fail "no $state cell in the rendered status page"
done
grep -q '<th class="job">adhoc</th>' "$out/status.dom.html" || fail "the exec job's row is missing"
echo "wrote $out/status.png ($sbytes bytes)"
