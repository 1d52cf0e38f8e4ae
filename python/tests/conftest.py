"""Shared fixtures of the Python tests."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mosaic_binary():
    """The `mosaic` binary: $MOSAIC_BIN, else this checkout's release, ci or debug build; None
    where there is none."""
    env = os.environ.get("MOSAIC_BIN")
    if env and Path(env).is_file():
        return env
    for prof in ("release", "ci", "debug"):
        b = ROOT / "target" / prof / "mosaic"
        if b.is_file():
            return str(b)
    return None
