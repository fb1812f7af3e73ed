// Two `tandem serve` instances behind HAProxy (Debian's `haproxy`) on loopback, routed by GET /health
// (the configuration docs/serving.md shows), under load from concurrent clients; then one instance's
// lane trips. Every request must either complete with the greedy reference answer or fail cleanly:
// an HTTP error or a refused connection before its first token, or (a stream in flight on the tripped
// instance) an explicit error event / finish_reason "error". An answer that ends normally but is cut
// short or differs from the reference fails the test, as does the tripped instance staying in the pool.
// Both servers run the peer lane, each with its own `tandem peer`; the fault kills server a's peer
// with SIGKILL while a has sequences running: a real trip (the primary sees its peer gone), after
// which a must end its streams with an error event and answer /health with 503. TANDEM_E2E_FAULT=kill
// instead kills server a itself (SIGKILL): then its in-flight streams can only be cut by the transport,
// which the client sees as an error; counted and reported, not failed. After a trip, a fresh peer is
// started on a's lane: a (--restart-lane on) re-attaches, passes its probe and rejoins the pool, and
// answers correctly again.
// Usage: node haproxy.mjs --tandem BIN --work DIR
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { check, fail, findTool, finish, freePort, makeRowmap, options, skip, sleep, sseEvents, startPeer, startProcess,
         startServer, synthModel, tail } from "./lib/harness.mjs";

const haproxyBin = findTool(process.env.HAPROXY || "haproxy", "/usr/sbin/haproxy");
if (!haproxyBin) skip("no haproxy on PATH or in /usr/sbin (scripts/setup.sh installs Debian's haproxy; or set $HAPROXY)");
const mode = process.env.TANDEM_E2E_FAULT || "trip";
if (!["trip", "kill"].includes(mode)) fail(`TANDEM_E2E_FAULT=${mode}: trip or kill`);
const opt = options();
const model = synthModel(opt.tandem, opt.work);
const rowmap = makeRowmap(opt.tandem, opt.work, model);
// Lane names are per run, so parallel runs never meet; their segments are removed at the end.
const lanes = { a: `e2e${process.pid}a`, b: `e2e${process.pid}b` };
const peers = {};
for (const k of ["a", "b"]) peers[k] = await startPeer({ tandem: opt.tandem, work: opt.work, model, rowmap, lane: lanes[k] });
const serverFlags = (k) => ["--served-model-name", "tiny-lb", "--max-seqs", "8", "--prefill-chunk", "64", "--threads", "1",
                            "--lane", "peer", "--peer", lanes[k], "--rowmap", rowmap, "--restart-lane", "on"];
const [a, b] = await Promise.all(["a", "b"].map((k) =>
  startServer({ tandem: opt.tandem, work: opt.work, model, name: k, extra: serverFlags(k) })));
process.on("exit", () => { for (const l of Object.values(lanes)) fs.rmSync(`/dev/shm/tandem-${l}`, { force: true }); });

// ---- HAProxy, with the configuration docs/serving.md shows (ports and paths filled in).
const port = await freePort();
const statsSock = path.join(opt.work, "haproxy.sock");
const cfgFile = path.join(opt.work, "haproxy.cfg");
fs.writeFileSync(cfgFile, `# Written by tests/e2e/haproxy.mjs; the same as docs/serving.md's example.
global
    stats socket ${statsSock} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    # A request its server refused, dropped unanswered or answered 503 (lane down, nothing generated)
    # is sent again to another server; one already answering is never retried.
    option http-buffer-request
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend tandem
    bind 127.0.0.1:${port}
    default_backend tandem_servers

backend tandem_servers
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server inter 500ms fastinter 200ms downinter 1s fall 1 rise 2
    server a 127.0.0.1:${a.port} check
    server b 127.0.0.1:${b.port} check
`);
const haproxyLog = path.join(opt.work, "haproxy.log");
const checkCfg = startProcess(haproxyBin, ["-c", "-f", cfgFile], haproxyLog);
await new Promise((res) => checkCfg.once("exit", res));
if (checkCfg.exitCode !== 0) fail(`haproxy -c rejects ${cfgFile}:\n${tail(haproxyLog)}`);
const haproxy = startProcess(haproxyBin, ["-db", "-f", cfgFile], haproxyLog);
const lb = `http://127.0.0.1:${port}`;

// `show stat` on the admin socket: { a: "UP", b: "DOWN", ... } for the backend's servers.
async function serverStates() {
  const csv = await new Promise((res, rej) => {
    const s = net.createConnection(statsSock);
    let out = "";
    s.on("connect", () => s.write("show stat\n"));
    s.on("data", (d) => (out += d));
    s.on("end", () => res(out));
    s.on("error", rej);
  });
  const lines = csv.trim().split("\n");
  const head = lines[0].replace(/^# /, "").split(",");
  const states = {};
  for (const l of lines.slice(1)) {
    const f = l.split(",");
    if (f[head.indexOf("pxname")] === "tandem_servers" && !["FRONTEND", "BACKEND"].includes(f[head.indexOf("svname")]))
      states[f[head.indexOf("svname")]] = f[head.indexOf("status")];
  }
  return states;
}
async function waitStates(want, timeoutMs, what) {
  const t0 = Date.now();
  let last;
  for (;;) {
    try { last = await serverStates(); } catch (e) { last = String(e); }
    if (Object.entries(want).every(([k, v]) => typeof last === "object" && String(last[k]).startsWith(v))) return Date.now() - t0;
    if (haproxy.exitCode !== null) fail(`haproxy exited (${haproxy.exitCode}):\n${tail(haproxyLog)}`);
    if (Date.now() - t0 > timeoutMs) throw new Error(`${what}: after ${timeoutMs} ms haproxy says ${JSON.stringify(last)}`);
    await sleep(50);
  }
}
await waitStates({ a: "UP", b: "UP" }, 20000, "both servers up").catch((e) => fail(`${e.message}\n${tail(haproxyLog)}`));
console.log(`haproxy: ${lb} in front of a (${a.url}) and b (${b.url}); config ${cfgFile}`);

// ---- The reference: each prompt's greedy answer, asked of b directly.
const prompts = ["Tell me about load balancers.", "What is a lane?", "Count to ten.", "Write a haiku about caches.",
                 "Why is the sky blue?", "List three prime numbers."];
const maxTokens = 16;
const body = (i, stream) => JSON.stringify({ model: "tiny-lb", messages: [{ role: "user", content: prompts[i] }],
                                             max_tokens: maxTokens, temperature: 0, stream });
const reference = [];
for (let i = 0; i < prompts.length; i++) {
  const r = await fetch(`${b.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: body(i, false) });
  if (r.status !== 200) fail(`reference request ${i}: HTTP ${r.status} ${await r.text()}`);
  const c = (await r.json()).choices[0];
  reference.push({ text: c.message.content, finish: c.finish_reason });
}

// One request through HAProxy, classified:
//   complete      200, whole answer, finish length|stop ([DONE] when streamed), text equals the reference
//   refused       an HTTP error status, or no response at all (connection refused/reset before headers)
//   error-event   streamed tokens, then an explicit error (an error event or finish_reason "error")
//   transport-cut streamed tokens, then the connection broke (the client's HTTP library raised it)
//   WRONG         anything else: a normal-looking end that is short, lacks [DONE] or finish_reason,
//                 or a complete answer that differs from the reference
async function request(i, stream) {
  let res;
  try {
    res = await fetch(`${lb}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: body(i, stream) });
  } catch (e) {
    return { kind: "refused", why: `no response: ${e.cause?.code || e.message}` };
  }
  if (res.status !== 200) {
    const text = await res.text().catch((e) => `(body unreadable: ${e.message})`);
    return { kind: "refused", why: `HTTP ${res.status}`, status: res.status, body: text.slice(0, 200) };
  }
  const ref = reference[i];
  if (!stream) {
    let j;
    try { j = await res.json(); } catch (e) { return { kind: "WRONG", why: `a 200 whose body did not parse: ${e.message}` }; }
    const c = j.choices?.[0];
    if (c?.finish_reason === "error") return { kind: "WRONG", why: "a 200 with finish_reason error (a whole answer that failed must be an HTTP error)" };
    if (c?.message?.content !== ref.text || c?.finish_reason !== ref.finish)
      return { kind: "WRONG", why: `answer ${JSON.stringify(c?.message?.content)} (${c?.finish_reason}) != reference ${JSON.stringify(ref.text)}` };
    return { kind: "complete" };
  }
  let text = "", finishReason = null, done = false, tokens = 0, errorEvent = null;
  try {
    for await (const data of sseEvents(res.body)) {
      if (data === "[DONE]") { done = true; continue; }
      const chunk = JSON.parse(data);
      if (chunk.error) { errorEvent = chunk.error.message || JSON.stringify(chunk.error); continue; }
      for (const c of chunk.choices || []) {
        if (c.delta?.content) { text += c.delta.content; tokens++; }
        if (c.finish_reason) finishReason = c.finish_reason;
      }
    }
  } catch (e) {
    if (errorEvent || finishReason === "error") return { kind: "error-event", why: errorEvent || "finish_reason error", tokens };
    return { kind: tokens ? "transport-cut" : "refused", why: `stream broke after ${tokens} chunks: ${e.cause?.code || e.message}`, tokens };
  }
  if (errorEvent || finishReason === "error") return { kind: "error-event", why: errorEvent || "finish_reason error", tokens };
  if (!done || !finishReason) return { kind: "WRONG", why: `the stream ended normally without ${done ? "a finish_reason" : "[DONE]"} after ${tokens} chunks: ${JSON.stringify(text)}` };
  if (text !== ref.text || finishReason !== ref.finish)
    return { kind: "WRONG", why: `streamed ${JSON.stringify(text)} (${finishReason}) != reference ${JSON.stringify(ref.text)}` };
  return { kind: "complete" };
}

// ---- Load: `workers` clients in a loop, streamed and whole requests alternating.
const results = [];
let running = true, faultAt = null;
async function worker(w) {
  for (let n = 0; running; n++) {
    const i = (w + n) % prompts.length, stream = (w + n) % 2 === 0, t = Date.now();
    const r = await request(i, stream);
    results.push({ ...r, stream, start: t, end: Date.now() });
  }
}
const workers = Array.from({ length: 6 }, (_, w) => worker(w));

// Waits (no timing assertion: a slow machine only waits longer) until `pred()` holds.
async function waitUntil(pred, what, timeoutMs = 120000) {
  for (const t0 = Date.now(); !pred(); await sleep(50))
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}
// 200s a server sent on /v1/chat/completions, from its own /metrics.
async function answered(server) {
  const m = await (await fetch(`${server.url}/metrics`)).text();
  return Number(/^tandem_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} (\S+)/m.exec(m)?.[1] || 0);
}

await check("under load both servers answer through HAProxy, every answer equal to the reference", async () => {
  await waitUntil(() => results.length >= 24, "24 requests through HAProxy");
  const before = results.slice();
  const notComplete = before.filter((r) => r.kind !== "complete");
  assert.deepEqual(notComplete, [], "before the fault every request completes");
  // a had no request but through HAProxy; b had the references directly.
  const [na, nb] = [await answered(a), await answered(b)];
  assert.ok(na >= 1 && nb > prompts.length, `HAProxy used both servers: a answered ${na}, b ${nb - prompts.length} (beside the references)`);
});

// The fault, taken while a has sequences running (its own /metrics says so).
async function runningOn(server) {
  try {
    const m = await (await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(1000) })).text();
    return Number(/^tandem_running_sequences (\S+)/m.exec(m)?.[1] || 0);
  } catch { return 0; }
}

await check(`fault (${mode}) on a under load: it leaves the pool, b serves on`, async () => {
  for (let t0 = Date.now(); (await runningOn(a)) < 1; await sleep(5))
    assert.ok(Date.now() - t0 < 10000, "a never had a sequence running under the load");
  faultAt = Date.now();
  if (mode === "trip") {
    peers.a.kill("SIGKILL");
    console.log(`     killed a's peer (pid ${peers.a.pid}) with SIGKILL while a had sequences running`);
  } else {
    a.proc.kill("SIGKILL");
    console.log(`     killed server a (pid ${a.proc.pid}) with SIGKILL while it had sequences running`);
  }
  const downMs = await waitStates({ a: "DOWN", b: "UP" }, 15000, "a out of the pool");
  console.log(`     haproxy marked a DOWN ${downMs} ms after the fault`);
  if (mode === "trip") {
    const h = await fetch(`${a.url}/health`);
    assert.equal(h.status, 503, "a tripped server's /health answers 503");
    console.log(`     a's /health: ${h.status} ${await h.text()}`);
    assert.equal(a.proc.exitCode, null, "a tripped server keeps running (it answers /health)");
  }
  const downAt = Date.now();
  await waitUntil(() => results.filter((r) => r.start > downAt).length >= 24, "24 requests begun after a left the pool");
  const after = results.filter((r) => r.start > downAt);
  assert.deepEqual(after.filter((r) => r.kind !== "complete"), [], "after a left the pool every request completes (on b)");
});

if (mode === "trip")
  await check("a rejoins once its peer is back: re-attached, probed, UP in HAProxy, answering correctly", async () => {
    const upBefore = Date.now();
    peers.a = await startPeer({ tandem: opt.tandem, work: opt.work, model, rowmap, lane: lanes.a, log: "peer-a-again" });
    // a retries the attach with a growing pause (1, 2, 4, ... s), so this may take several seconds.
    let health;
    for (const t0 = Date.now(); ; await sleep(100)) {
      const h = await fetch(`${a.url}/health`);
      health = await h.json();
      if (h.status === 200) break;
      assert.ok(Date.now() - t0 < 60000, `a not healthy 60 s after its peer came back: ${JSON.stringify(health)}`);
    }
    assert.equal(health.lane.restarts, 1, `one restart: ${JSON.stringify(health)}`);
    assert.equal(health.lane.peer_pid, peers.a.pid, "a attached to the new peer");
    const upMs = await waitStates({ a: "UP", b: "UP" }, 20000, "a back in the pool");
    console.log(`     a healthy again (restarts ${health.lane.restarts}); haproxy marked it UP ${upMs} ms later`);
    const upAt = Date.now(), na = await answered(a);
    await waitUntil(() => results.filter((r) => r.start > upAt).length >= 24, "24 requests begun after a rejoined");
    assert.ok((await answered(a)) > na, "HAProxy sent work to a again");
    assert.deepEqual(results.filter((r) => r.start > upAt && r.kind !== "complete"), [],
                     "after a rejoined every request completes");
    console.log(`     ${Date.now() - upBefore} ms from the new peer's start to 24 good answers after the rejoin`);
  });

running = false;
await Promise.all(workers);

await check("no request was cut short silently or answered wrongly", async () => {
  const count = {};
  for (const r of results) count[r.kind] = (count[r.kind] || 0) + 1;
  console.log(`     ${results.length} requests: ${JSON.stringify(count)}`);
  for (const r of results.filter((r) => r.kind !== "complete"))
    console.log(`     ${r.kind} (${r.stream ? "streamed" : "whole"}, begun ${r.start - faultAt} ms after the fault): ${r.why}${r.body ? ` ${r.body}` : ""}`);
  assert.deepEqual(results.filter((r) => r.kind === "WRONG"), []);
  if (mode === "trip")
    assert.deepEqual(results.filter((r) => r.kind === "transport-cut"), [],
                     "a tripped server is alive: it must end its streams with an error event, not a broken connection");
  const early = results.filter((r) => r.kind !== "complete" && r.end < faultAt);
  assert.deepEqual(early, [], "nothing failed before the fault");
});

haproxy.kill("SIGTERM");
for (const s of [a, b]) console.log(`${s.name}: stopped (${await s.stop()})`);
for (const [k, p] of Object.entries(peers)) if (p.exitCode === null && p.signalCode === null) p.kill("SIGTERM");
finish();
