#!/usr/bin/env bash
# Install / start / stop a local BigQuery emulator (PyPI `bqemulator`, DuckDB-backed)
# for idem's BigQuery store tests. Works offline once `install` has run; `install`
# itself needs only PyPI.
#
#   .ci/bqemulator.sh install        # idempotent; creates the venv
#   URL=$(.ci/bqemulator.sh start)   # prints exactly one line: http://127.0.0.1:PORT
#   .ci/bqemulator.sh status         # prints the URL if running (exit 1 if not)
#   .ci/bqemulator.sh stop
#
# Environment:
#   IDEM_BQEMU_VENV          venv dir            (default: $HOME/.cache/idem/bqemu-venv)
#   IDEM_BQEMU_REQUIREMENTS  pinned requirements (default: <repo>/../shared/bqemulator-requirements.txt)
#   IDEM_BQEMU_PYTHON        interpreter >= 3.11 used to create the venv (default: python3)
#   IDEM_BQEMU_PORT          REST port           (default: a free port)
#   IDEM_BQEMU_STATE_DIR     pid/log/url files   (default: ${TMPDIR:-/tmp}/idem-bqemu)
#   IDEM_BQEMU_START_TIMEOUT seconds to wait for /healthz (default: 60)
#   IDEM_BQEMU_PARSE_CACHE   0: start without .ci/bqemu-site's sqlglot parse cache (default: 1)
#
# Why the pins differ from the shared requirements file: bqemulator hard-requires
# DuckDB's `spatial` extension at boot (`INSTALL spatial; LOAD spatial`, no switch
# to turn it off) and would download it from the network. The PyPI package
# `duckdb-extension-spatial==1.5.5` ships that extension file, but only for
# duckdb 1.5.5, so duckdb is pinned to 1.5.5 and the file is installed into a
# DuckDB extension dir under the venv; the emulator runs with HOME pointing there
# so its `INSTALL spatial` is a no-op and nothing is downloaded.
set -euo pipefail

BQEMU_VERSION=1.4.0
DUCKDB_VERSION=1.5.5
EXTRA_PINS=("duckdb==${DUCKDB_VERSION}" "duckdb-extension-spatial==${DUCKDB_VERSION}" "numpy")
STAMP_SALT=v1 # bump to force a reinstall when this script's install logic changes

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
VENV=${IDEM_BQEMU_VENV:-$HOME/.cache/idem/bqemu-venv}
PYTHON=${IDEM_BQEMU_PYTHON:-python3}
STATE_DIR=${IDEM_BQEMU_STATE_DIR:-${TMPDIR:-/tmp}/idem-bqemu}
PID_FILE=$STATE_DIR/bqemu.pid
URL_FILE=$STATE_DIR/bqemu.url
LOG_FILE=$STATE_DIR/bqemu.log
START_TIMEOUT=${IDEM_BQEMU_START_TIMEOUT:-60}
DUCKDB_HOME=$VENV/duckdb-home # used as HOME for the emulator: holds ~/.duckdb/extensions
STAMP=$VENV/.idem-bqemu-stamp

log() { echo "bqemulator.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

find_requirements() {
    local candidates=(
        "${IDEM_BQEMU_REQUIREMENTS:-}"
        "$SCRIPT_DIR/../../shared/bqemulator-requirements.txt"
        "$SCRIPT_DIR/../shared/bqemulator-requirements.txt"
    )
    local c
    for c in "${candidates[@]}"; do
        if [[ -n "$c" && -f "$c" ]]; then
            echo "$c"
            return 0
        fi
    done
    die "pinned requirements not found (tried: ${candidates[*]}); set IDEM_BQEMU_REQUIREMENTS"
}

# Requirements actually installed: the shared pins, with duckdb replaced by ours.
effective_requirements() {
    grep -v -i -E '^[[:space:]]*(duckdb|duckdb-extension-spatial|numpy)[[:space:]]*([=<>!~;[]|$)' "$1" || true
    printf '%s\n' "${EXTRA_PINS[@]}"
}

stamp_value() {
    { echo "$STAMP_SALT bqemulator==$BQEMU_VERSION"; effective_requirements "$1"; } | sha256sum | cut -d' ' -f1
}

is_installed() {
    local req=$1
    [[ -x "$VENV/bin/bqemulator" && -f "$STAMP" ]] || return 1
    [[ "$(cat "$STAMP")" == "$(stamp_value "$req")" ]] || return 1
    "$VENV/bin/python" -c "import bqemulator, duckdb, numpy, sys; sys.exit(0 if bqemulator.__version__ == '$BQEMU_VERSION' and duckdb.__version__ == '$DUCKDB_VERSION' else 1)" 2>/dev/null || return 1
    compgen -G "$DUCKDB_HOME/.duckdb/extensions/v$DUCKDB_VERSION/*/spatial.duckdb_extension" >/dev/null
}

cmd_install() {
    local req
    req=$(find_requirements)
    if is_installed "$req"; then
        log "already installed in $VENV (bqemulator $BQEMU_VERSION, duckdb $DUCKDB_VERSION)"
        return 0
    fi
    "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
        || die "$PYTHON is older than 3.11 (set IDEM_BQEMU_PYTHON)"
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating venv $VENV"
        mkdir -p "$(dirname "$VENV")"
        "$PYTHON" -m venv "$VENV"
    fi
    rm -f "$STAMP"
    local tmp_req
    tmp_req=$(mktemp)
    # shellcheck disable=SC2064
    trap "rm -f '$tmp_req'" EXIT
    effective_requirements "$req" >"$tmp_req"
    log "pip install (requirements: $req, duckdb pinned to $DUCKDB_VERSION)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$tmp_req" >&2
    log "installing DuckDB spatial extension into $DUCKDB_HOME/.duckdb/extensions"
    mkdir -p "$DUCKDB_HOME"
    HOME=$DUCKDB_HOME "$VENV/bin/python" - <<'PY' >&2
import glob, os
import duckdb, duckdb_extension_spatial as m
files = glob.glob(os.path.join(os.path.dirname(m.__file__), "extensions", "*", "spatial.duckdb_extension"))
if not files:
    raise SystemExit("spatial.duckdb_extension not found in duckdb_extension_spatial")
con = duckdb.connect(":memory:")
con.execute(f"FORCE INSTALL '{files[0]}'")
con.execute("LOAD spatial")
con.execute("SELECT ST_AsText(ST_Point(1, 2))").fetchone()
PY
    stamp_value "$req" >"$STAMP"
    is_installed "$req" || die "install finished but verification failed"
    log "installed bqemulator $BQEMU_VERSION in $VENV"
}

pid_alive() {
    local pid=$1
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q bqemulator
}

running_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid=$(cat "$PID_FILE" 2>/dev/null || true)
    pid_alive "$pid" && echo "$pid"
}

healthy() { curl -fsS -m 2 -o /dev/null "$1/healthz" 2>/dev/null; }

free_port() {
    "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

port_is_free() {
    "$VENV/bin/python" -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.close()' "$1" 2>/dev/null
}

# True once *our* process logged that it listens on port $1 (so a /healthz answer
# cannot come from some other server already bound to the port).
listening_logged() {
    grep '"rest.listen"' "$LOG_FILE" 2>/dev/null | grep -q "\"port\": $1[,}]"
}

cmd_start() {
    local req
    req=$(find_requirements)
    is_installed "$req" || die "emulator not installed in $VENV; run: $0 install"
    mkdir -p "$STATE_DIR"

    local pid
    if pid=$(running_pid) && [[ -f "$URL_FILE" ]] && healthy "$(cat "$URL_FILE")"; then
        log "already running (pid $pid)"
        cat "$URL_FILE"
        return 0
    fi
    [[ -n "${pid:-}" ]] && cmd_stop >/dev/null
    rm -f "$PID_FILE" "$URL_FILE"

    local port=${IDEM_BQEMU_PORT:-}
    [[ -n "$port" ]] || port=$(free_port)
    port_is_free "$port" || die "port $port on 127.0.0.1 is already in use (IDEM_BQEMU_PORT=${IDEM_BQEMU_PORT:-})"
    local url="http://127.0.0.1:$port"

    # The parse cache (.ci/bqemu-site/sitecustomize.py, read at the interpreter's start from
    # PYTHONPATH): the same statement text is parsed once, not at each of the emulator's
    # passes over it (issue 36: parsing was half its CPU time).
    local site=""
    [[ "${IDEM_BQEMU_PARSE_CACHE:-1}" == 0 ]] || site=$SCRIPT_DIR/bqemu-site
    # Run from the state dir so a stray .bqemu.toml in the caller's cwd is not read.
    # stdin/stdout/stderr are detached so `URL=$(... start)` returns immediately.
    (
        cd "$STATE_DIR"
        HOME=$DUCKDB_HOME \
        BQEMU_ENABLE_FORMAT_EXTENSIONS=false \
        BQEMU_QUERY_CACHE_TTL_SECONDS=${BQEMU_QUERY_CACHE_TTL_SECONDS:-0} \
        BQEMU_LOG_FORMAT=${BQEMU_LOG_FORMAT:-json} \
        BQEMU_LOG_LEVEL=${BQEMU_LOG_LEVEL:-info} \
        BQEMU_TRACING_ENABLED=false \
        PYTHONPATH=$site \
        exec "$VENV/bin/bqemulator" start \
            --rest-host 127.0.0.1 --rest-port "$port" \
            --grpc-host 127.0.0.1 --grpc-port 0 \
            --ephemeral --project "${BQEMU_DEFAULT_PROJECT_ID:-test-project}" \
            </dev/null >"$LOG_FILE" 2>&1
    ) &
    pid=$!
    echo "$pid" >"$PID_FILE"

    local deadline=$((SECONDS + START_TIMEOUT))
    until listening_logged "$port" && healthy "$url"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "emulator exited during startup; last log lines ($LOG_FILE):"
            tail -n 40 "$LOG_FILE" >&2 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            log "emulator not healthy at $url/healthz after ${START_TIMEOUT}s; last log lines ($LOG_FILE):"
            tail -n 40 "$LOG_FILE" >&2 || true
            kill -TERM "$pid" 2>/dev/null || true
            sleep 2
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$PID_FILE"
            exit 1
        fi
        sleep 0.2
    done
    echo "$url" >"$URL_FILE"
    log "started pid $pid, log $LOG_FILE"
    echo "$url"
}

cmd_stop() {
    if [[ ! -f "$PID_FILE" ]]; then
        log "not running (no pid file $PID_FILE)"
        return 0
    fi
    local pid
    pid=$(cat "$PID_FILE" 2>/dev/null || true)
    if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        local _
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid ignored SIGTERM for 10s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped pid $pid"
    else
        log "stale pid file (pid ${pid:-?} not a running emulator); removing"
    fi
    rm -f "$PID_FILE" "$URL_FILE"
}

cmd_status() {
    local pid
    if pid=$(running_pid) && [[ -f "$URL_FILE" ]] && healthy "$(cat "$URL_FILE")"; then
        cat "$URL_FILE"
        return 0
    fi
    log "not running"
    return 1
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 {install|start|stop|status}" >&2
        exit 2
        ;;
esac
