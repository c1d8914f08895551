"""Build of the optional C accelerator; all other metadata lives in pyproject.toml.

The extensions are `optional`: without a C compiler or Python headers the install still succeeds
and protocol/ runs its pure-Python decoders (protocol/accel.py tells which path is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("protocol._speedups", ["protocol/_speedups.c"], optional=True),
        Extension("protocol._record_speedups", ["protocol/_record_speedups.c"], optional=True),
    ]
)
