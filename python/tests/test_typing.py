"""The type stubs as a user's type checker reads them: `mypy --strict` is clean on a
script using the whole new API (typing/user_script.py), which also runs; and refuses what
is wrong (typing/misuse.py). mypy comes from PyPI, in the test's virtualenv."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent / "typing"


def _mypy(path):
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("IDEM_REQUIRE_SERVICES") == "1":
            pytest.fail("mypy is not installed (IDEM_REQUIRE_SERVICES=1): pip install mypy")
        pytest.skip("mypy is not installed")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        cwd=HERE,
    )


def test_mypy_strict_is_clean_on_a_user_script():
    out = _mypy(HERE / "user_script.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
    ran = subprocess.run([sys.executable, str(HERE / "user_script.py")], capture_output=True, text=True, env={**os.environ, "IDEM_STORE": "memory://"})
    assert ran.returncode == 0, ran.stderr


def test_mypy_strict_refuses_misuse():
    out = _mypy(HERE / "misuse.py")
    assert out.returncode == 1
    errors = {int(line.split(":")[1]) for line in out.stdout.splitlines() if ": error:" in line}
    expected = {
        n for n, line in enumerate((HERE / "misuse.py").read_text().splitlines(), 1) if "# error:" in line
    }
    assert errors == expected, out.stdout
