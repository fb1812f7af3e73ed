// Shared by the end-to-end tests: command-line options, a tiny synthetic model, `tandem serve` started
// on a free loopback port and stopped again, the checks' bookkeeping, and exit 77 (CTest's skip) when
// a tool the test needs is missing. Every child process is killed when the test exits, however it exits.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const kSkip = 77;
export const e2eDir = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
export const sourceDir = path.resolve(e2eDir, "..", "..");

// --tandem PATH (the binary), --work DIR (this test's scratch folder, emptied first) and optionally
// --artifacts DIR (where files worth keeping go, e.g. a screenshot; created, not emptied; default WORK).
export function options() {
  const major = Number(process.versions.node.split(".")[0]);
  if (major < 18) skip(`node ${process.versions.node} is too old: the tests need 18 or later (fetch, web streams)`);
  const o = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--") || argv[i + 1] === undefined) fail(`bad arguments: ${argv.join(" ")}`);
    o[argv[i].slice(2)] = argv[i + 1];
  }
  if (!o.tandem || !fs.existsSync(o.tandem)) fail(`--tandem: no tandem binary at '${o.tandem}'`);
  if (!o.work) fail("--work DIR is required");
  fs.rmSync(o.work, { recursive: true, force: true });
  fs.mkdirSync(o.work, { recursive: true });
  o.artifacts ??= o.work;
  fs.mkdirSync(o.artifacts, { recursive: true });
  return o;
}

export function fail(msg) {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
}
export function skip(reason) {
  console.log(`SKIP: ${reason}`);
  process.exit(kSkip);
}

// The first of `names` found on PATH (or an absolute path that exists), else undefined.
export function findTool(...names) {
  for (const n of names) {
    if (path.isAbsolute(n)) { if (fs.existsSync(n)) return n; continue; }
    const r = spawnSync("sh", ["-c", `command -v ${n}`], { encoding: "utf8" });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  return undefined;
}

// The npm packages in tests/e2e/node_modules (installed by scripts/setup.sh with `npm ci`).
export async function importPackage(name) {
  const dir = path.join(e2eDir, "node_modules", name);
  if (!fs.existsSync(dir))
    fail(`the npm package '${name}' is not in ${path.join(e2eDir, "node_modules")}: run scripts/setup.sh ` +
         `(it runs 'npm ci' there from the committed package-lock.json)`);
  return import(name);
}

// ---- Checks: each one named, run in order, failures collected; the summary decides the exit code.
const results = [];
export async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push({ name, ok: true });
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push({ name, ok: false });
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
export function finish() {
  const bad = results.filter((r) => !r.ok);
  console.log(`${results.length - bad.length} passed, ${bad.length} failed`);
  process.exit(bad.length ? 1 : 0);
}

// ---- Processes: all children are killed on exit.
const children = new Set();
function killAll() {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) { try { process.kill(c.pid, "SIGKILL"); } catch {} }
}
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { killAll(); process.exit(1); });

// Starts `cmd args`, its stdout+stderr appended to `logFile`. Returns the ChildProcess.
export function startProcess(cmd, args, logFile, opts = {}) {
  const log = fs.openSync(logFile, "a");
  const child = spawn(cmd, args, { stdio: ["ignore", log, log], ...opts });
  fs.closeSync(log);
  children.add(child);
  child.on("exit", () => children.delete(child));
  return child;
}

export function exited(child) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((res) => child.once("exit", res));
}

export async function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// `tandem synth --preset PRESET --out WORK/model-PRESET` (seconds for tiny).
export function synthModel(tandem, work, preset = "tiny") {
  const out = path.join(work, `model-${preset}`);
  const r = spawnSync(tandem, ["synth", "--preset", preset, "--out", out], { encoding: "utf8" });
  if (r.status !== 0) fail(`tandem synth --preset ${preset} failed (exit ${r.status}): ${r.stderr}`);
  return out;
}

// A rowmap for `model` with `cold` of its experts per MoE layer cold: the repo's docs as the corpus,
// profiled briefly (`tandem corpus`, `profile`, `plan`, as docs/quickstart.md does). Returns its path.
export function makeRowmap(tandem, work, model, cold = 8) {
  const corpus = path.join(work, "corpus.jsonl"), stats = path.join(work, "stats.json"), rowmap = path.join(work, "rowmap.json");
  for (const args of [["corpus", path.join(sourceDir, "docs"), "--out", corpus],
                      ["profile", "--model", model, "--corpus", corpus, "--max-tokens-per-kind", "300", "--threads", "1", "--out", stats],
                      ["plan", "--model", model, "--stats", stats, "--cold-per-layer", String(cold), "--out", rowmap]]) {
    const r = spawnSync(tandem, args, { encoding: "utf8" });
    if (r.status !== 0) fail(`tandem ${args.join(" ")} failed (exit ${r.status}): ${r.stderr}`);
  }
  return rowmap;
}

// `tandem peer` for lane `lane`, waited for until it logs that it serves (its log: WORK/`log`.log,
// default peer-LANE). Returns its ChildProcess.
export async function startPeer({ tandem, work, model, rowmap, lane, log: logName = `peer-${lane}`, timeoutMs = 60000 }) {
  const log = path.join(work, `${logName}.log`);
  const args = ["peer", "--model", model, "--rowmap", rowmap, "--lane", lane, "--threads", "1"];
  fs.writeFileSync(log, `$ ${tandem} ${args.join(" ")}\n`);
  const proc = startProcess(tandem, args, log);
  for (const t0 = Date.now(); !/lane \S+ serving|: serving/.test(fs.readFileSync(log, "utf8")); await sleep(100)) {
    if (proc.exitCode !== null || proc.signalCode !== null) fail(`peer ${lane} exited early:\n${tail(log)}`);
    if (Date.now() - t0 > timeoutMs) fail(`peer ${lane} not serving after ${timeoutMs} ms:\n${tail(log)}`);
  }
  console.log(`peer ${lane}: serving (pid ${proc.pid}, log ${log})`);
  return proc;
}

// A real chat template for the synthetic model (it ships only a minimal ChatML one): Qwen3's, from the
// repo's fixtures.
export const chatTemplate = path.join(sourceDir, "tests", "fixtures", "chat_templates", "Qwen-Qwen3-0.6B.jinja");

// Starts `tandem serve` on a free port and waits until GET /health answers 200.
// Returns { url, port, proc, log, name, stop() }. `extra`: more flags.
export async function startServer({ tandem, work, model, name = "server", extra = [], timeoutMs = 60000 }) {
  const port = await freePort();
  const log = path.join(work, `${name}.log`);
  const args = ["serve", "--model", model, "--host", "127.0.0.1", "--port", String(port),
                "--chat-template-file", chatTemplate, ...extra];
  fs.writeFileSync(log, `$ ${tandem} ${args.join(" ")}\n`);
  const proc = startProcess(tandem, args, log);
  const url = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null)
      fail(`${name}: tandem serve exited (${proc.exitCode ?? proc.signalCode}) before it was healthy; its log:\n${tail(log)}`);
    try {
      const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) });
      if (r.status === 200) break;
    } catch {}
    if (Date.now() - t0 > timeoutMs) fail(`${name}: /health not 200 within ${timeoutMs} ms; log:\n${tail(log)}`);
    await sleep(100);
  }
  console.log(`${name}: tandem serve healthy at ${url} after ${Date.now() - t0} ms (log: ${log})`);
  return {
    url, port, proc, log, name,
    // SIGTERM, then SIGKILL after 10 s. Returns how it ended ("exit 0", "signal SIGKILL", ...).
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        const t = setTimeout(() => proc.kill("SIGKILL"), 10000);
        await exited(proc);
        clearTimeout(t);
      }
      return proc.exitCode !== null ? `exit ${proc.exitCode}` : `signal ${proc.signalCode}`;
    },
  };
}

export function tail(file, n = 40) {
  try { return fs.readFileSync(file, "utf8").split("\n").slice(-n).join("\n"); } catch { return "(no log)"; }
}

// Reads an SSE response body (fetch): yields each event's data. Throws if the transport breaks.
export async function* sseEvents(body) {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of body) {
    buf += dec.decode(chunk, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(l[5] === " " ? 6 : 5));
      if (data.length) yield data.join("\n");
    }
  }
  // A partial event left in `buf` at the end is dropped, as the SSE spec says.
}
