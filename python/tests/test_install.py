"""The package as installed: a distribution and an import name of its own (`pyidem`,
free on PyPI, where `idem` is another project), and, in CI, an abi3 manylinux wheel
installed into a virtualenv with no Rust toolchain on the PATH (.ci/python.sh sets
IDEM_PY_FROM_WHEEL=1 there)."""

import importlib.metadata
import os
import pathlib
import shutil
import sys

import pytest

import pyidem


def test_the_distribution_and_import_names_are_pyidem():
    dist = importlib.metadata.distribution("pyidem")
    assert dist.metadata["Name"] == "pyidem"
    assert dist.version == pyidem.__version__
    # Nothing it installs is a top-level `idem` (the other project's import name).
    tops = {pathlib.PurePosixPath(f).parts[0] for f in dist.files or []}
    assert "idem" not in tops and all(t.startswith("pyidem") for t in tops), tops
    assert pyidem.Gate.__module__ == "pyidem._idem" and pyidem.Report.__module__ == "pyidem"


def _from_wheel():
    if os.environ.get("IDEM_PY_FROM_WHEEL") != "1":
        if os.environ.get("IDEM_REQUIRE_SERVICES") == "1":
            pytest.fail("IDEM_PY_FROM_WHEEL is not set (IDEM_REQUIRE_SERVICES=1): .ci/python.sh sets it")
        pytest.skip("IDEM_PY_FROM_WHEEL not set: the package is not the installed wheel")


def test_installed_from_an_abi3_manylinux_wheel_without_rust():
    _from_wheel()
    dist = importlib.metadata.distribution("pyidem")
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags and all(t.startswith("cp39-abi3-manylinux") for t in tags), tags
    # Imported from the virtualenv's site-packages, not from the source tree.
    here = pathlib.Path(pyidem.__file__).resolve()
    assert pathlib.Path(sys.prefix).resolve() in here.parents, here
    assert "site-packages" in here.parts
    native = pathlib.Path(pyidem._idem.__file__)
    assert native.name == "_idem.abi3.so", native
    # And no Rust toolchain could have built anything here.
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool) is None, f"{tool} is on the PATH"
    assert sys.prefix != sys.base_prefix, "not a virtualenv"
