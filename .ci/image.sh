#!/usr/bin/env bash
# Builds the idem image through the Containerfile's runtime stage from local parts and runs
# it (issue 23), then the command-job recipe (examples/command-image, issue 38). No Docker
# engine and no registry here: buildah (Debian's package) as root, vfs storage, chroot
# isolation. The `build` stage is replaced by a folder made from a
# binary already built (.ci/rootfs.sh, the script that stage runs), so nothing is pulled.
#
#   bash .ci/image.sh BINARY POSTGRES_URL
#
# Then, inside the image: `idem --version`; `idem run` of a job against POSTGRES_URL
# completing and then skipping; SIGTERM to a running job leaving an interrupted run and a
# free lease (the next run of the same date completes).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1
store=$2
say() { echo "== .ci/image.sh: $*"; }

if ! command -v buildah >/dev/null 2>&1; then
    say "installing buildah (Debian package)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq buildah >/dev/null
fi
root=$(mktemp -d /tmp/idem-image.XXXXXX)
storage="$root/storage"
B=(buildah --root "$storage" --runroot "$root/run" --storage-driver vfs)
container=""
cleanup() {
    [ -n "$container" ] && "${B[@]}" rm "$container" >/dev/null 2>&1 || true
    "${B[@]}" rmi --all --force >/dev/null 2>&1 || true
    rm -rf "$root" 2>/dev/null || true
}
trap cleanup EXIT

# --- build ---------------------------------------------------------------------------
started=$(date +%s)
sh .ci/rootfs.sh "$bin" "$root/build/rootfs"
"${B[@]}" build --quiet --isolation chroot \
    --build-context build="$root/build" \
    --target runtime -t localhost/idem:ci -f Containerfile . >/dev/null
say "image built in $(( $(date +%s) - started )) s"
"${B[@]}" images localhost/idem:ci
container=$("${B[@]}" from localhost/idem:ci)
mnt=$("${B[@]}" mount "$container")
say "image size: $(du -sb "$mnt" | cut -f1) bytes unpacked ($(du -sh "$mnt" | cut -f1)); idem binary $(stat -c %s "$mnt/usr/local/bin/idem") bytes"
"${B[@]}" inspect --format '{{.OCIv1.Config.Entrypoint}} user={{.OCIv1.Config.User}} workdir={{.OCIv1.Config.WorkingDir}} env={{.OCIv1.Config.Env}}' localhost/idem:ci
echo

# The jobs folder: a command job that sleeps for {param.secs} seconds, written into the
# container's /app/jobs (where a ConfigMap would be mounted).
job="ci_image_$$"
cat > "$mnt/app/jobs/$job.toml" <<EOF
name = "$job"
processor = "command"
[params]
secs = "0"
[guards]
lease = "1m"
time_window = "1h"
[command]
run = ["sh", "-c", "sleep {param.secs}; echo slept"]
grace = "5s"
EOF
chmod a+r "$mnt/app/jobs/$job.toml"

# Runs idem inside the image with `buildah run` (the image's user, PATH and environment;
# host network for Postgres on 127.0.0.1).
in_image() {
    "${B[@]}" run --isolation chroot --network host \
        --env IDEM_STORE="$store" --env RUST_LOG=warn \
        "$container" -- idem "$@"
}

say "idem --version (inside the image)"
in_image --version

say "idem run: completes, then skips (inside the image, Postgres store)"
in_image run "$job" --date 2025-01-01 | tee "$root/first"
grep -q "^completed $job for 2025-01-01" "$root/first"
in_image run "$job" --date 2025-01-01 | tee "$root/second"
grep -q "^skipped $job for 2025-01-01 (time_window)" "$root/second"

say "the image's own demo job (SQL on its bundled SQLite warehouse, a SQLite store in the workdir)"
"${B[@]}" run --isolation chroot "$container" -- idem run daily_sales --date 2025-11-18 | tee "$root/demo"
grep -q "^completed daily_sales for 2025-11-18: 3 record(s)" "$root/demo"

# SIGTERM, as Cloud Run or the kubelet sends it: idem must be PID 1 of its own PID
# namespace (where the kernel delivers only the signals it handles), which chroot isolation
# does not give (and OCI isolation needs cgroups this machine lacks). So the image's root
# filesystem runs under `unshare --pid --fork` and `chroot --userspec`, with the image's
# user and environment: idem is PID 1 there, as in a container.
say "SIGTERM to idem as PID 1 running a job (the image's filesystem): interrupted, lease released"
# The job's program sleeps for a time no other process on the machine sleeps for (this
# script's PID as the fraction), so that finding it finds this job's and no one else's.
secs="60.$$"
env -i PATH=/usr/local/bin:/usr/bin:/bin IDEM_JOBS_DIR=/app/jobs \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt IDEM_STORE="$store" RUST_LOG=warn \
    MNT="$mnt" CHROOT="$(command -v chroot)" JOB="$job" SECS="$secs" \
    "$(command -v unshare)" --pid --fork --mount --kill-child /bin/sh -c '
        # /dev and /proc, as a container runtime gives them (in this mount namespace only);
        # then exec: chroot and idem keep PID 1.
        mount --rbind /dev "$MNT/dev" && mount -t proc proc "$MNT/proc" &&
        exec "$CHROOT" --userspec=10001:10001 "$MNT" /usr/local/bin/idem run "$JOB" --date 2025-01-02 --param secs="$SECS"' \
    >"$root/term.out" 2>"$root/term.err" &
runner=$!
idem_pid=""
for _ in $(seq 1 150); do
    idem_pid=$(pgrep -f "^/usr/local/bin/idem run $job --date 2025-01-02" | head -1 || true)
    if [ -n "$idem_pid" ] && pgrep -f "^sleep $secs\$" >/dev/null; then break; fi
    sleep 0.2
done
[ -n "$idem_pid" ] || { cat "$root/term.err"; echo "idem never started"; exit 1; }
grep NSpid "/proc/$idem_pid/status"
[ "$(awk '/^NSpid/ {print $NF}' "/proc/$idem_pid/status")" = 1 ] || { echo "idem is not PID 1 in its namespace"; exit 1; }
kill -TERM "$idem_pid"
set +e
wait "$runner"
code=$?
set -e
cat "$root/term.out" "$root/term.err"
say "exit code after SIGTERM: $code"
[ "$code" -ne 0 ] || { echo "an interrupted run must not exit 0"; exit 1; }
in_image --format json runs --job "$job" --limit 1 | tee "$root/runs.json"
grep -q '"status": *"failed"' "$root/runs.json"
grep -qi 'interrupted' "$root/runs.json"
if pgrep -f "^sleep $secs\$" >/dev/null; then echo "the job's program outlived idem"; exit 1; fi
# The lease is free: the same date runs again at once (no in_progress skip).
in_image run "$job" --date 2025-01-02 | tee "$root/rerun"
grep -q "^completed $job for 2025-01-02" "$root/rerun"
# --- The command-job recipe (examples/command-image/Containerfile): idem copied out of the
# image just built into a user's own image. A registry's python:*-slim cannot be pulled
# here, so the user's base is this machine's Python (the interpreter, its standard library
# and the libraries they load) with /bin/sh, sleep, grep and sed: what a Debian-based slim
# image holds for a command job. Built through the recipe unchanged (only its two build
# arguments point at local images), then run: a Python job completes, then skips.
say "the command-job recipe: idem copied into a user's Python image"
base="$root/pybase"
mkdir -p "$base/bin" "$base/usr/bin" "$base/tmp"
chmod 1777 "$base/tmp"
# Debian's own interpreter (a pyenv shim on PATH is a script, not the binary).
python=$(readlink -f /usr/bin/python3)
cp "$(command -v dash)" "$base/bin/sh"
for tool in sleep grep sed; do cp "$(command -v "$tool")" "$base/bin/$tool"; done
cp "$python" "$base/usr/bin/python3"
stdlib=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
mkdir -p "$base$(dirname "$stdlib")"
cp -a "$stdlib" "$base$stdlib"
rm -rf "$base$stdlib/test" "$base$stdlib"/site-packages "$base$stdlib"/dist-packages
# ... and libgcc_s, which Debian's required package libgcc-s1 puts in every Debian image
# (idem loads it; the recipe's base must have it).
gcc_s=$(ldd "$bin" | grep -o '/[^ ]*/libgcc_s[^ ]*')
for lib in $gcc_s $(ldd "$python" "$(command -v dash)" "$(command -v sleep)" "$(command -v grep)" "$(command -v sed)" | grep -o '/[^ ]*' | sort -u); do
    case "$lib" in *:) continue ;; esac
    mkdir -p "$base$(dirname "$lib")"
    cp -L "$lib" "$base$lib"
done
printf 'FROM scratch\nCOPY . /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n' > "$root/pybase.Containerfile"
"${B[@]}" build --quiet --isolation chroot -t localhost/pybase:ci -f "$root/pybase.Containerfile" "$base" >/dev/null
"${B[@]}" build --quiet --isolation chroot \
    --build-arg IDEM_IMAGE=localhost/idem:ci --build-arg BASE_IMAGE=localhost/pybase:ci \
    -t localhost/my-jobs:ci -f examples/command-image/Containerfile examples/command-image >/dev/null
"${B[@]}" inspect --format '{{.OCIv1.Config.Entrypoint}} user={{.OCIv1.Config.User}} workdir={{.OCIv1.Config.WorkingDir}}' localhost/my-jobs:ci
echo
jobs_image=$("${B[@]}" from localhost/my-jobs:ci)
in_jobs_image() {
    "${B[@]}" run --isolation chroot --network host \
        --env IDEM_STORE="$store" --env RUST_LOG=warn \
        "$jobs_image" -- idem "$@"
}
in_jobs_image jobs
# The store is shared with earlier runs of this script: the day's keys are forgotten first.
day=2025-02-03
in_jobs_image purge daily_rollup --date "$day" --yes >/dev/null
in_jobs_image run daily_rollup --date "$day" | tee "$root/py-first"
grep -q "^rolled up $day with Python 3" "$root/py-first"
grep -q "^completed daily_rollup for $day" "$root/py-first"
in_jobs_image run daily_rollup --date "$day" | tee "$root/py-second"
grep -q "^skipped daily_rollup for $day (time_window)" "$root/py-second"
"${B[@]}" rm "$jobs_image" >/dev/null

say "image checks passed"
