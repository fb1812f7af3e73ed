#!/usr/bin/env python3
"""Drives a running `tandem serve` over HTTP the way users do and reports what they see.

For each kind of text and each number of concurrent users, every user sends one streaming
`POST /v1/completions` at the same moment: the first --prompt-tokens tokens of a corpus document of
that kind (as token ids, cut the way `tandem bench` cuts its prompts, so the two see the same
prompts), greedy, --tokens tokens with `ignore_eos`. From the arrival time of every streamed token it
reports per cell:

  decode tok/s  the users' decode rates summed, each (tokens - 1) / (last token - first token): the
                server's decode rate while they all run, the number to set next to `tandem bench`'s
                decode tok/s on the same lane and users
  total tok/s   all completion tokens over the cell's wall time (prefill and stragglers included)
  TTFT          send to first token, per request (p50 / p99)
  TPOT          (last token - first token) / (tokens - 1), per request (p50 / p99)

Python's standard library only (runs on the device machine as it is). Exit 1 when a request fails
or returns fewer tokens than asked: a benchmark of wrong answers is not a benchmark.

  bench/serve_load.py --url http://127.0.0.1:8080 --tokenizer MODEL_DIR --tandem build/tandem \\
      --corpus corpus.jsonl --users 1,8,16,32 --tokens 64 --out serve.json
"""
import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def die(msg):
    print(f"serve_load: {msg}", file=sys.stderr)
    sys.exit(2)


def tokenize(tandem, tokenizer, text):
    r = subprocess.run([tandem, "tokenize", "--tokenizer", tokenizer], input=text.encode(),
                       capture_output=True, check=False)
    if r.returncode != 0:
        die(f"tandem tokenize failed: {r.stderr.decode(errors='replace').strip()}")
    return json.loads(r.stdout)


def prompts_of(docs, kind, args, want):
    """The first prompt_tokens tokens of up to `want` documents of `kind` that have that many."""
    out = []
    for d in docs:
        if d.get("kind") != kind or len(out) >= want:
            continue
        text = d.get("text", "")
        ids = tokenize(args.tandem, args.tokenizer, text[: args.prompt_tokens * 16])
        if len(ids) < args.prompt_tokens and args.prompt_tokens * 16 < len(text):
            ids = tokenize(args.tandem, args.tokenizer, text)
        if len(ids) >= args.prompt_tokens:
            out.append(ids[: args.prompt_tokens])
    if not out:
        die(f"--kinds {kind}: no document of this kind in {args.corpus} has {args.prompt_tokens} tokens")
    return out


class Request:
    def __init__(self):
        self.sent = 0.0
        self.arrivals = []  # monotonic time of each chunk that carried completion text
        self.end = None     # monotonic time of the chunk with the finish reason (sent after the last token)
        self.error = None
        self.usage = None
        self.finish = None


def stream_one(url, headers, body, req, barrier):
    u = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
        barrier.wait()
        req.sent = time.monotonic()
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            req.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = time.monotonic()
            chunk = json.loads(data)
            if "error" in chunk:
                req.error = f"stream error: {chunk['error']}"
                return
            if chunk.get("usage"):
                req.usage = chunk["usage"]
            for c in chunk.get("choices", []):
                # A chunk carries the text of the tokens decoded since the last one (more than one when the
                # client reads slower than the server decodes); how many tokens in all, usage says.
                if c.get("finish_reason"):
                    req.finish = c["finish_reason"]
                    req.end = now
                elif not req.arrivals or c.get("text"):
                    req.arrivals.append(now)
        conn.close()
    except Exception as e:  # noqa: BLE001 (reported per request, counted as a failure)
        req.error = f"{type(e).__name__}: {e}"


def num(x):
    return "-" if x is None else f"{x:.1f}"


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_cell(args, headers, prompts, users):
    reqs = [Request() for _ in range(users)]
    barrier = threading.Barrier(users)
    threads = []
    for i in range(users):
        body = json.dumps({"model": args.model, "prompt": prompts[i % len(prompts)], "max_tokens": args.tokens,
                           "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                           "ignore_eos": True})
        threads.append(threading.Thread(target=stream_one, args=(args.url, headers, body, reqs[i], barrier)))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    def n_tokens(r):
        return (r.usage or {}).get("completion_tokens", -1)
    bad = [r.error or f"{n_tokens(r)} tokens of {args.tokens} (finish_reason {r.finish}; usage {r.usage})"
           for r in reqs if r.error or n_tokens(r) != args.tokens or r.end is None]
    if bad:
        return {"users": users, "failed": bad}
    # The server sends a chunk only for tokens that complete some text (a token ending inside a UTF-8
    # character waits for the next), so the first token is the first chunk's (or, with no text at all,
    # the finish chunk's) and the last token's time is the finish chunk's, which follows it at once.
    first = [r.arrivals[0] if r.arrivals else r.end for r in reqs]
    ttft = [f - r.sent for f, r in zip(first, reqs)]
    tpot = [(r.end - f) / (args.tokens - 1) for f, r in zip(first, reqs)]
    return {
        "users": users,
        # None when a request's tokens all came at once (no decode time to divide by).
        "decode_tok_s": sum(1 / t for t in tpot) if all(t > 0 for t in tpot) else None,
        "total_tok_s": users * args.tokens / wall,
        "ttft_ms_p50": 1e3 * pct(ttft, 50), "ttft_ms_p99": 1e3 * pct(ttft, 99),
        "tpot_ms_p50": 1e3 * pct(tpot, 50), "tpot_ms_p99": 1e3 * pct(tpot, 99),
        "wall_s": wall,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default %(default)s)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json or the model folder (the prompts' token ids)")
    ap.add_argument("--tandem", default="build/tandem", help="the tandem binary, for `tandem tokenize`")
    ap.add_argument("--corpus", required=True, help="JSON-lines corpus the prompts come from")
    ap.add_argument("--kinds", default="prose,code_python,code_c,json,shell")
    ap.add_argument("--users", default="1,8,16,32", help="concurrent users per cell, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (ignore_eos)")
    ap.add_argument("--model", default="", help="the model name to send (default: the server's first)")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--label", default="serve")
    ap.add_argument("--out", help="write the cells as JSON here")
    args = ap.parse_args()
    if args.tokens < 2 or args.prompt_tokens < 1:
        die("--tokens must be at least 2 and --prompt-tokens at least 1")
    users = [int(u) for u in args.users.split(",")]
    kinds = args.kinds.split(",")
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"

    u = urllib.parse.urlsplit(args.url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        conn.request("GET", "/v1/models", headers=headers)
        models = json.loads(conn.getresponse().read())
    except Exception as e:  # noqa: BLE001
        die(f"no server at {args.url}: {e}")
    if not args.model:
        args.model = models["data"][0]["id"]

    docs = [json.loads(line) for line in open(args.corpus, encoding="utf-8") if line.strip()]
    prompts = {k: prompts_of(docs, k, args, max(users)) for k in kinds}
    run_cell(args, headers, prompts[kinds[0]], 1)  # warm-up: first-use costs stay out of the table

    cells, failed = [], False
    print(f"{'kind':<12} {'users':>5} {'decode tok/s':>12} {'total tok/s':>11} {'TTFT ms p50/p99':>16} "
          f"{'TPOT ms p50/p99':>16}")
    for n in users:
        for k in kinds:
            c = run_cell(args, headers, prompts[k], n)
            c["kind"] = k
            cells.append(c)
            if "failed" in c:
                failed = True
                print(f"{k:<12} {n:>5} FAILED: {c['failed'][0]} ({len(c['failed'])} requests)")
                continue
            print(f"{k:<12} {n:>5} {num(c['decode_tok_s']):>12} {c['total_tok_s']:>11.1f} "
                  f"{c['ttft_ms_p50']:>7.1f}/{c['ttft_ms_p99']:<8.1f} {c['tpot_ms_p50']:>7.2f}/{c['tpot_ms_p99']:<8.2f}")
        ok = [c for c in cells if c["users"] == n and "failed" not in c]
        if ok:
            decode = [c["decode_tok_s"] for c in ok]
            print(f"{'mean':<12} {n:>5} {num(None if None in decode else statistics.mean(decode)):>12} "
                  f"{statistics.mean(c['total_tok_s'] for c in ok):>11.1f}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"label": args.label, "url": args.url, "model": args.model, "tokens": args.tokens,
                       "prompt_tokens": args.prompt_tokens, "command": " ".join(sys.argv), "cells": cells}, f,
                      indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
