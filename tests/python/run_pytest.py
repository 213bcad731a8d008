#!/usr/bin/env python3
"""CTest's entry to the Python package's tests (tests/CMakeLists.txt, python_api*):
pytest on the arguments, or exit 77 (skipped) when pytest is not installed
(requirements-test.txt has it)."""
import sys

try:
    import pytest
except ImportError:
    print("pytest is not installed (pip install -r requirements-test.txt): skipping")
    sys.exit(77)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
