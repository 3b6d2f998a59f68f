#!/usr/bin/env python3
"""Fails on a Catch2 test name that ctest cannot run as one test.

catch_discover_tests registers each TEST_CASE by name; ctest splits a name at
';' (a CMake list), and each piece then matches no test case, which Catch2
reports as a pass: the test silently never runs. Names also must not start
with '-' (Catch2 reads them as options).
  test_names.py [TESTS_DIR]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
# TEST_CASE( followed by one or more adjacent string literals (the name).
pattern = re.compile(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
bad = []
for path in sorted(root.rglob("*.cpp")):
    text = path.read_text(encoding="utf-8", errors="replace")
    for m in pattern.finditer(text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        line = text.count("\n", 0, m.start()) + 1
        if ";" in name:
            bad.append(f"{path}:{line}: test name has ';' (ctest splits it and runs nothing): {name}")
        if name.startswith("-"):
            bad.append(f"{path}:{line}: test name starts with '-' (Catch2 reads it as an option): {name}")
for b in bad:
    print(b)
if bad:
    sys.exit(1)
print("test names: every TEST_CASE is one ctest test")
