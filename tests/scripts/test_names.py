#!/usr/bin/env python3
"""Fails on a Catch2 test name that ctest cannot run as one test.

catch_discover_tests registers each TEST_CASE by name; ctest splits a name at
';' (a CMake list), and each piece then matches no test case, which Catch2
reports as a pass: the test silently never runs. Names also must not start
with '-' (Catch2 reads them as options), and their '[' and ']' must pair: an
unbalanced '[' makes CMake read the rest of the discovered list as one
element, and ctest then registers only some of the tests.
With a test binary and its build directory, also checks that ctest registered
every test case the binary lists (ctest -N): nothing is lost whatever the cause.
  test_names.py [TESTS_DIR [TEST_BINARY BUILD_DIR]]
"""
import pathlib
import re
import subprocess
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
        if name.count("[") != name.count("]"):
            bad.append(f"{path}:{line}: test name has unpaired '[' or ']' (CMake's list breaks): {name}")
if len(sys.argv) > 3:
    binary, build = sys.argv[2], sys.argv[3]
    # Catch2 2.x exits with the number of tests listed.
    listed = subprocess.run([binary, "--list-test-names-only"], capture_output=True, text=True).stdout
    names = [n for n in listed.splitlines() if n.strip()]
    out = subprocess.run(["ctest", "-N"], cwd=build, capture_output=True, text=True, check=True).stdout
    registered = set(re.findall(r"^\s*Test\s+#\d+: (.*)$", out, re.M))
    missing = [n for n in names if n not in registered]
    for n in missing[:20]:
        bad.append(f"{binary} lists a test that ctest did not register: {n}")
    if missing:
        bad.append(f"{len(missing)} of {len(names)} test cases are not registered with ctest")
    else:
        print(f"test names: ctest registered all {len(names)} test cases of {binary}")
for b in bad:
    print(b)
if bad:
    sys.exit(1)
print("test names: every TEST_CASE is one ctest test")
