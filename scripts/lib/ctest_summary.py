#!/usr/bin/env python3
"""Summarises a CTest JUnit file (ctest --output-junit): passed, failed and skipped tests, each skip with
why (the reason the test printed: "no CUDA device: backend tests skipped", a GTEST_SKIP message), so a run
that skipped tests never reads as one that passed them.

Usage: ctest_summary.py JUNIT.xml STAGE   -> prints the stage's lines; exit 1 when a test failed or none ran.
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET


def skip_reason(out):
    lines = [l.strip() for l in out.splitlines()]
    for i, l in enumerate(lines):  # GTEST_SKIP(): "file:line: Skipped" then the message
        if l.endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1]:
            return lines[i + 1]
    for l in lines:
        if re.search(r"skipped", l, re.I) and not l.startswith("["):
            return l
    return "no reason printed"


def main():
    path, stage = sys.argv[1], sys.argv[2]
    root = ET.parse(path).getroot()
    passed, failed, skipped = [], [], collections.Counter()
    for tc in root.iter("testcase"):
        name, status = tc.get("name"), tc.get("status", "run")
        out = "".join(e.text or "" for e in tc.iter("system-out"))
        if tc.find("skipped") is not None or status in ("skipped", "notrun", "disabled"):
            skipped[skip_reason(out)] += 1
        elif tc.find("failure") is not None or tc.find("error") is not None or status == "fail":
            failed.append(name)
        else:
            passed.append(name)
    for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"{stage}: {n} skipped: {reason}")
    for name in failed:
        print(f"{stage}: FAILED {name}")
    print(f"{stage}: {len(passed)} passed, {len(failed)} failed, {sum(skipped.values())} skipped")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
