from __future__ import annotations

import pytest

from tests.log.log_helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()
