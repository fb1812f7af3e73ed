#!/usr/bin/env python3
"""Per-kernel GPU time of one decode step from an Nsight Compute CSV (`ncu --csv --page raw`).

Usage: ncu_step.py NCU.csv [STEPS]
The CSV is what `ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread
--csv --page raw bench_gpu_decode ...` printed. Steps are delimited by the embedding kernel (the first
launch of every step); the last STEPS steps (default 2) are averaged. Kernels run one at a time under
ncu, so the times are the kernels' own, without launch gaps or PDL overlap.
"""
import csv
import sys
from collections import OrderedDict


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    head, data = rows[0], rows[2:]  # the second row holds the units
    col = {name: i for i, name in enumerate(head)}
    name_c, grid_c, block_c = col["Kernel Name"], col["Grid Size"], col["Block Size"]
    t_c = col["gpu__time_duration.sum"]
    b_c = col.get("dram__bytes_read.sum")
    r_c = col.get("launch__registers_per_thread")
    starts = [i for i, r in enumerate(data) if "embedding" in r[name_c]]
    if len(starts) < steps:
        sys.exit(f"{path}: {len(starts)} steps found, {steps} wanted")
    first = starts[-steps]
    per = OrderedDict()
    total_ns = 0.0
    total_b = 0.0
    for r in data[first:]:
        name = r[name_c].split("(")[0]
        key = f"{name} grid{r[grid_c]} block{r[block_c]}"
        ns = float(r[t_c].replace(",", ""))
        by = float(r[b_c].replace(",", "")) if b_c is not None and r[b_c] not in ("", "n/a") else 0.0
        e = per.setdefault(key, {"ns": 0.0, "calls": 0, "bytes": 0.0, "regs": r[r_c] if r_c is not None else "?"})
        e["ns"] += ns
        e["calls"] += 1
        e["bytes"] += by
        total_ns += ns
        total_b += by
    print(f"{path}: {steps} steps, {total_ns / steps / 1e3:.1f} us of kernels per step, "
          f"{total_b / steps / 1e6:.1f} MB read from DRAM per step")
    print(f"{'us/step':>9} {'share':>6} {'calls':>6} {'us/call':>8} {'GB/s':>7} {'regs':>5}  kernel")
    for key, e in sorted(per.items(), key=lambda kv: -kv[1]["ns"]):
        gbs = e["bytes"] / e["ns"] if e["ns"] else 0.0
        print(f"{e['ns'] / steps / 1e3:9.1f} {100 * e['ns'] / total_ns:5.1f}% {e['calls'] / steps:6.1f} "
              f"{e['ns'] / e['calls'] / 1e3:8.2f} {gbs:7.0f} {e['regs']:>5}  {key}")


if __name__ == "__main__":
    main()
