"""Shared pytest setup: the repository root is importable (protocol/, broker/) without installing it."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
