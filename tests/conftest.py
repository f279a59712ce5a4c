"""Shared test fixtures.

The original MNIST / Fashion-MNIST IDX files are read from ``$FEDNET_DATA`` (the Makefile points
it at ``../shared/data``); tests that need them skip with a clear reason when it is unset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Directory holding ``mnist/`` and ``fashion-mnist/`` IDX files (``$FEDNET_DATA``)."""
    value = os.environ.get("FEDNET_DATA")
    if not value or not (Path(value) / "mnist").is_dir():
        pytest.skip("FEDNET_DATA does not point at a directory with mnist/ (see README)")
    return Path(value)
