#!/usr/bin/env python3
"""bench/serve_load.py against a real `tandem serve` on a tiny synthetic model (CPU): every cell of the
table has its numbers and the JSON says the same; a server that is not there is a clear error (exit 2);
a request the server refuses fails the run (exit 1), not a table of wrong answers.
Usage: test_serve_load.py TANDEM_BINARY"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "serve_load.py")
TANDEM = None


class ServeLoad(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.model = os.path.join(d, "tiny")
        subprocess.run([TANDEM, "synth", "--preset", "tiny", "--out", cls.model, "--seed", "5"], check=True,
                       capture_output=True)
        cls.corpus = os.path.join(d, "corpus.jsonl")
        with open(cls.corpus, "w", encoding="utf-8") as f:
            for i in range(4):
                text = f"Note {i}: rivers run to the sea, and the sea gives back rain over the hills. " * 4
                f.write(json.dumps({"kind": "prose", "text": text}) + "\n")
                f.write(json.dumps({"kind": "code_c", "text": f"int f{i}(int x) {{ return x * {i} + 1; }}\n" * 6}) + "\n")
        cls.log = open(os.path.join(d, "serve.err"), "w+", encoding="utf-8")
        cls.server = subprocess.Popen([TANDEM, "serve", "--model", cls.model, "--port", "0", "--threads", "1",
                                       "--ctx", "256", "--max-seqs", "4"], stdout=subprocess.DEVNULL, stderr=cls.log)
        cls.port = 0
        for _ in range(300):
            cls.log.seek(0)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", cls.log.read())
            if m:
                cls.port = int(m.group(1))
                break
            if cls.server.poll() is not None:
                break
            time.sleep(0.1)
        if not cls.port:
            cls.log.seek(0)
            raise RuntimeError("tandem serve did not start: " + cls.log.read())

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(timeout=30)
        cls.log.close()
        cls.tmp.cleanup()

    def load(self, *extra, url=None):
        out = os.path.join(self.tmp.name, "cells.json")
        if os.path.exists(out):
            os.remove(out)
        r = subprocess.run([sys.executable, SCRIPT, "--url", url or f"http://127.0.0.1:{self.port}", "--tokenizer",
                            self.model, "--tandem", TANDEM, "--corpus", self.corpus, "--out", out, *extra],
                           capture_output=True, text=True, timeout=300)
        cells = None
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                cells = json.load(f)["cells"]
        return r, cells

    def test_every_cell_has_its_numbers(self):
        r, cells = self.load("--kinds", "prose,code_c", "--users", "1,3", "--tokens", "6", "--prompt-tokens", "12")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([(c["kind"], c["users"]) for c in cells],
                         [("prose", 1), ("code_c", 1), ("prose", 3), ("code_c", 3)])
        for c in cells:
            self.assertNotIn("failed", c)
            self.assertGreater(c["total_tok_s"], 0)
            self.assertGreater(c["ttft_ms_p50"], 0)
            self.assertLessEqual(c["ttft_ms_p50"], c["ttft_ms_p99"])
            self.assertLessEqual(c["tpot_ms_p50"], c["tpot_ms_p99"])
            if c["decode_tok_s"] is not None:
                self.assertGreater(c["decode_tok_s"], 0)
        rows = [line.split() for line in r.stdout.splitlines()]
        self.assertEqual(sum(1 for row in rows if row and row[0] == "mean"), 2, r.stdout)

    def test_no_server_is_a_clear_error(self):
        r, _ = self.load("--users", "1", url="http://127.0.0.1:9")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("no server at http://127.0.0.1:9", r.stderr)

    def test_refused_requests_fail_the_run(self):
        # 300 prompt tokens + 6 do not fit the server's --ctx 256: every request gets 400.
        r, _ = self.load("--kinds", "prose", "--users", "1", "--tokens", "6", "--prompt-tokens", "300")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED", r.stdout)
        self.assertIn("HTTP 400", r.stdout)


if __name__ == "__main__":
    TANDEM = sys.argv.pop(1) if len(sys.argv) > 1 else "build/tandem"
    unittest.main()
