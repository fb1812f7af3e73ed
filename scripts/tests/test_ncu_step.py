#!/usr/bin/env python3
"""scripts/ncu_step.py on a synthetic Nsight Compute CSV: steps split at the embedding kernel, the last
N averaged per kernel and grid, and a clear error when fewer steps are there."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "ncu_step.py")

HEADER = ('"ID","Kernel Name","Grid Size","Block Size","dram__bytes_read.sum","gpu__time_duration.sum",'
          '"launch__registers_per_thread"\n')
UNITS = '"","","","","byte","nsecond","register/thread"\n'


def row(i, name, grid, ns, by):
    return f'"{i}","{name}(Args)","{grid}","(256, 1, 1)","{by}","{ns}","40"\n'


def csv_text(steps):
    out = ["==PROF== Connected to process\n", HEADER, UNITS]  # ncu's own lines are skipped
    i = 0
    for s in range(steps):
        for name, grid, ns, by in [("embedding_kernel<bf16>", "(1, 1, 1)", 1000, 0),
                                   ("linear_kernel<bf16, 1, 1>", "(168, 1, 1)", 10000 + s, "5,000,000"),
                                   ("linear_kernel<bf16, 1, 1>", "(48, 1, 1)", 8000, 1500000),
                                   ("linear_kernel<bf16, 1, 1>", "(168, 1, 1)", 10000 + s, "5,000,000")]:
            out.append(row(i, name, grid, ns, by))
            i += 1
    return "".join(out)


class NcuStep(unittest.TestCase):
    def run_script(self, text, *args):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        try:
            return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
        finally:
            os.unlink(f.name)

    def test_last_steps_per_kernel_and_grid(self):
        r = self.run_script(csv_text(3), "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # Steps 1 and 2: (1000 + 2·(10001 or 10002) + 8000) ns → 29.0 and 29.006 µs, mean 29.003.
        self.assertIn("2 steps, 29.0 us of kernels per step, 11.5 MB read from DRAM per step", lines[0])
        big = [l for l in lines if "grid(168, 1, 1)" in l]
        self.assertEqual(len(big), 1)
        fields = big[0].split()
        self.assertEqual(fields[0], "20.0")   # us per step: two calls of 10.0015 µs
        self.assertEqual(fields[2], "2.0")    # calls per step
        self.assertEqual(fields[4], "500")    # GB/s: 5 MB in 10.0015 µs
        self.assertEqual(fields[5], "40")     # registers
        self.assertTrue(lines[2].rstrip().endswith("grid(168, 1, 1) block(256, 1, 1)"))  # largest first

    def test_too_few_steps_is_an_error(self):
        r = self.run_script(csv_text(1), "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("1 steps found, 2 wanted", r.stderr)


if __name__ == "__main__":
    unittest.main()
