"""Where the test suite's CPU goes, test by test: a pytest plugin and its summary.

The suite is CPU-bound on the 2-core CI kind, and most of its CPU is spent in child processes (torch-importing
ranks, gpudoctor CLI runs, SLURM tasks) that /usr/bin/time and RUSAGE_CHILDREN miss when they are not reaped by
their own parent. So each test runs in a cgroup v1 `cpuacct` group of its own (root only): the worker moves itself
in before the test and back after it; every process it starts stays charged there, whatever becomes of it.
Caveat: what a test's fixture starts for the whole session (a test SLURM's daemons, and the jobs they run for
later tests) is charged to the first test that used it.

    PYTHONPATH=benchmarks python -m pytest -n 3 -p suite_cpu          # writes /tmp/gpudoctor-suite-cpu.jsonl
    python benchmarks/suite_cpu.py [N]                                 # CPU-s by folder, file and the top N tests
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
import uuid

ROOT = "/sys/fs/cgroup/cpuacct"
OUT = os.environ.get("GPUDOCTOR_SUITE_CPU", "/tmp/gpudoctor-suite-cpu.jsonl")


def _move(group: str) -> None:
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        group = os.path.join(ROOT, "gdsuite_" + uuid.uuid4().hex[:12])
        os.mkdir(group)
        _move(group)
        started = time.monotonic()
        yield
        _move(ROOT)
        with open(OUT, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "group": group, "wall": time.monotonic() - started}) + "\n")

except ImportError:  # the summary needs no pytest
    pass


def summary(top: int) -> None:
    rows = [json.loads(line) for line in open(OUT)]
    for r in rows:
        try:
            r["cpu"] = int(open(os.path.join(r["group"], "cpuacct.usage")).read()) / 1e9
        except OSError:
            r["cpu"] = 0.0
    folders, files = collections.Counter(), collections.Counter()
    for r in rows:
        path = r["id"].split("::")[0]
        folders[path.split("/")[1] if "/" in path else path] += r["cpu"]
        files[path] += r["cpu"]
    print(f"{len(rows)} tests, {sum(folders.values()):.0f} CPU-s")
    print("by folder:", ", ".join(f"{k} {v:.0f}" for k, v in folders.most_common()))
    for name, cpu in files.most_common(top):
        print(f"{cpu:8.1f}  {name}")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:8.1f}  {r['wall']:6.0f} s  {r['id'][:140]}")


if __name__ == "__main__":
    summary(int(sys.argv[1]) if len(sys.argv) > 1 else 25)
