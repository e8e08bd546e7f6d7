"""Fixtures: a SQLite store per test, the CI's Postgres and Redis, the `idem` binary.

Under CI (IDEM_REQUIRE_SERVICES=1, as .ci/run sets it) a missing service fails the test
instead of skipping it.
"""

import os
import pathlib
import subprocess
import uuid

import pytest

import pyidem

REPO = pathlib.Path(__file__).resolve().parents[2]
# shared/ beside the repository (as CI lays it), or where IDEM_SHARED_DIR says.
SHARED = pathlib.Path(os.environ.get("IDEM_SHARED_DIR", REPO.parent / "shared"))
PEER_DATA = SHARED / "peer-data" / "fund_loads_input.ndjson"


def _service(var: str) -> str:
    url = os.environ.get(var)
    if not url:
        if os.environ.get("IDEM_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{var} is not set (IDEM_REQUIRE_SERVICES=1)")
        pytest.skip(f"{var} not set")
    return url


@pytest.fixture
def name():
    """A processor name of its own, so tests never see each other's runs."""
    return f"py_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite://{tmp_path}/idem.db"


@pytest.fixture
def store(sqlite_url):
    return pyidem.open_store(sqlite_url)


@pytest.fixture
def postgres_url():
    return _service("IDEM_TEST_POSTGRES_URL")


@pytest.fixture
def redis_url():
    return _service("IDEM_TEST_REDIS_URL")


def _resp(sock, *args: str):
    """Sends one Redis command and reads its reply (the few reply types SCAN and UNLINK
    give), over a bare socket: the tests need no Redis client package."""
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(b), b)
    sock.sendall(out)
    reader = sock.makefile("rb")

    def read():
        line = reader.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else reader.read(n + 2)[:-2].decode()
        if kind == b"*":
            return [read() for _ in range(int(rest))]
        return rest.decode()

    return read()


def delete_redis_prefix(url: str, prefix: str) -> int:
    """Deletes every key of `url`'s database that starts with `prefix`."""
    import socket
    import urllib.parse

    u = urllib.parse.urlparse(url)
    deleted = 0
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=10) as sock:
        db = u.path.strip("/")
        if db:
            _resp(sock, "SELECT", db)
        cursor = "0"
        while True:
            cursor, keys = _resp(sock, "SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000")
            if keys:
                deleted += _resp(sock, "UNLINK", *keys)
            if cursor == "0":
                return deleted


@pytest.fixture
def redis_prefix_url(redis_url):
    """The CI's Redis under a fresh key prefix, whose keys are deleted after the test."""
    prefix = f"idem-py-{uuid.uuid4().hex[:8]}"
    yield f"{redis_url}?prefix={prefix}"
    delete_redis_prefix(redis_url, prefix)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def event_store_url(request, sqlite_url):
    """An event-key store of each kind (Redis under a fresh key prefix, deleted after)."""
    if request.param == "sqlite":
        return sqlite_url
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    return request.getfixturevalue("redis_prefix_url")


@pytest.fixture(scope="session")
def idem_bin():
    """The `idem` binary of this repository (built if need be; CI built it already)."""
    path = os.environ.get("IDEM_BIN")
    if path:
        return path
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    binary = target / "debug" / "idem"
    subprocess.run(["cargo", "build", "--quiet", "--bin", "idem"], cwd=REPO, check=True)
    return str(binary)


@pytest.fixture
def peer_data():
    if not PEER_DATA.exists():
        pytest.fail(f"{PEER_DATA} is missing (shared/ beside the repository)")
    return PEER_DATA
