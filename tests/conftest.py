"""Shared fixtures. ``smoke_dir`` is the session's one smoke prebuilt
directory (tests/_smoke.py): built for real (FlyDSL compiles on the CPU, both
arches) and linked by whichever test asks first, in any test order."""

from __future__ import annotations

import pytest

import _smoke


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory):
    """Built and linked; read it, copy it to change it."""
    return _smoke.smoke_dir(tmp_path_factory)
