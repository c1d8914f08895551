"""Fixtures for the storage engine tests (helpers live in log_helpers.py)."""

from __future__ import annotations

import pytest

from tests.log.log_helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()
