// The page at `/` in a real browser: headless Chromium (Debian's `chromium`) driven over the DevTools
// protocol (a WebSocket, the `ws` npm package) loads the page served by `tandem serve` on the tiny
// model, waits for its live metrics and health, types a message into the chat box, sends it and reads
// the streamed answer off the page, which must equal the API's greedy answer to the same request. The
// page must throw no JavaScript error. A screenshot is kept: ARTIFACTS/browser-page.png (CTest passes
// BUILD/artifacts/e2e; its path is printed). Usage: node browser.mjs --tandem BIN --work DIR [--artifacts DIR]
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { check, fail, findTool, finish, importPackage, options, skip, sleep, sourceDir, startProcess,
         startServer, synthModel } from "./lib/harness.mjs";

const browserBin = findTool(process.env.CHROMIUM || "chromium", "chromium-browser", "google-chrome");
if (!browserBin) skip("no chromium on PATH (scripts/setup.sh installs Debian's chromium; or set $CHROMIUM)");
const opt = options();
const screenshot = path.join(opt.artifacts, "browser-page.png");
fs.rmSync(screenshot, { force: true });  // what is there afterwards is this run's
const { default: WebSocket } = await importPackage("ws");
const model = synthModel(opt.tandem, opt.work);
const server = await startServer({ tandem: opt.tandem, work: opt.work, model, extra: ["--served-model-name", "tiny-page"] });

// ---- Chromium, headless, its DevTools port chosen by itself and read from its stderr.
const profile = path.join(opt.work, "chromium-profile");
const browserLog = path.join(opt.work, "chromium.log");
const chromiumArgs = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
  "--no-default-browser-check", "--disable-extensions", "--disable-background-networking", "--mute-audio",
  `--user-data-dir=${profile}`, "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"];
fs.writeFileSync(browserLog, `$ ${browserBin} ${chromiumArgs.join(" ")}\n`);
const browser = startProcess(browserBin, chromiumArgs, browserLog);
let devtools;
for (const t0 = Date.now(); !devtools; await sleep(100)) {
  const m = /DevTools listening on (ws:\/\/\S+)/.exec(fs.readFileSync(browserLog, "utf8"));
  if (m) devtools = new URL(m[1]);
  else if (browser.exitCode !== null || browser.signalCode !== null) fail(`chromium exited early:\n${fs.readFileSync(browserLog, "utf8")}`);
  else if (Date.now() - t0 > 30000) fail(`chromium printed no DevTools address in 30 s:\n${fs.readFileSync(browserLog, "utf8")}`);
}

// A page target over its own WebSocket: send(method, params) → result; events by name.
async function openPage() {
  const targets = await (await fetch(`http://${devtools.host}/json/list`)).json();
  const page = targets.find((t) => t.type === "page");
  assert.ok(page, `a page target: ${JSON.stringify(targets)}`);
  const ws = new WebSocket(page.webSocketDebuggerUrl, { perMessageDeflate: false });
  await new Promise((res, rej) => { ws.once("open", res); ws.once("error", rej); });
  let next = 1;
  const pending = new Map(), listeners = [];
  ws.on("message", (raw) => {
    const msg = JSON.parse(raw.toString());
    if (msg.id && pending.has(msg.id)) {
      const { res, rej } = pending.get(msg.id);
      pending.delete(msg.id);
      msg.error ? rej(new Error(`${msg.error.message} (${msg.error.code})`)) : res(msg.result);
    } else if (msg.method) for (const l of listeners) l(msg);
  });
  const send = (method, params = {}) => new Promise((res, rej) => {
    const id = next++;
    pending.set(id, { res, rej });
    ws.send(JSON.stringify({ id, method, params }));
  });
  return { send, on: (fn) => listeners.push(fn), close: () => ws.close() };
}

const page = await openPage();
const jsErrors = [], consoleErrors = [];
page.on((m) => {
  if (m.method === "Runtime.exceptionThrown") jsErrors.push(m.params.exceptionDetails.exception?.description || m.params.exceptionDetails.text);
  if (m.method === "Runtime.consoleAPICalled" && m.params.type === "error") consoleErrors.push(m.params.args.map((a) => a.value ?? a.description).join(" "));
});
await page.send("Runtime.enable");
await page.send("Page.enable");

// Evaluates `expr` in the page; returns its value (JSON-able). Throws on an exception in the page.
async function evaluate(expr) {
  const r = await page.send("Runtime.evaluate", { expression: expr, returnByValue: true, awaitPromise: true });
  if (r.exceptionDetails) throw new Error(`in the page: ${r.exceptionDetails.exception?.description || r.exceptionDetails.text}`);
  return r.result.value;
}
async function waitFor(expr, what, timeoutMs = 30000) {
  const t0 = Date.now();
  for (;;) {
    const v = await evaluate(expr);
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(100);
  }
}

const message = "Hello from the browser test.";
const maxTokens = 24;

await check("GET / serves the checked-in page byte for byte, as text/html", async () => {
  const r = await fetch(`${server.url}/`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get("content-type") || "", /^text\/html/);
  const served = Buffer.from(await r.arrayBuffer());
  const source = fs.readFileSync(path.join(sourceDir, "src", "server", "page", "index.html"));
  assert.ok(served.equals(source), `served ${served.length} bytes, the source has ${source.length}: rebuild tandem?`);
});

await check("the page loads and shows the lane's state, live metrics and the model", async () => {
  await page.send("Page.navigate", { url: `${server.url}/` });
  await waitFor(`document.readyState === "complete"`, "the page to load");
  await waitFor(`document.getElementById("state").classList.contains("ok")`, "the health badge to turn ok");
  await waitFor(`document.getElementById("scrape").textContent.startsWith("updated")`, "a /metrics scrape to render");
  await waitFor(`document.getElementById("opt-model").value === "tiny-page"`, "the model list");
  const kv = await evaluate(`document.getElementById("kv-text").textContent`);
  assert.ok(!/no KV metrics/.test(kv), `KV use shown: ${kv}`);
});

await check("a chat message sent through the box streams the API's greedy answer onto the page", async () => {
  const r = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tiny-page", messages: [{ role: "user", content: message }], max_tokens: maxTokens, temperature: 0 }) });
  assert.equal(r.status, 200);
  const ref = (await r.json()).choices[0];
  await evaluate(`(() => {
    document.getElementById("opt-max").value = "${maxTokens}";
    document.getElementById("opt-temp").value = "0";
    document.getElementById("chat-input").value = ${JSON.stringify(message)};
    document.getElementById("chat-send").click();
    return true; })()`);
  const state = await waitFor(`(() => { const m = [...document.querySelectorAll("#chat-log .msg.assistant")].pop();
    return m && m.dataset.state !== "streaming" && m.dataset.state; })()`, "the streamed answer to finish", 60000);
  const got = await evaluate(`(() => { const m = [...document.querySelectorAll("#chat-log .msg.assistant")].pop();
    return { text: m.querySelector(".text").textContent, finish: m.dataset.finish,
             note: [...m.children].slice(1).map((e) => e.textContent).join(" ") }; })()`);
  assert.equal(state, "done", `the page's answer ended in ${state}: ${got.note}`);
  assert.equal(got.text, ref.message.content);
  assert.equal(got.finish, ref.finish_reason);
  const user = await evaluate(`document.querySelector("#chat-log .msg.user .text").textContent`);
  assert.equal(user, message);
  console.log(`     the page shows: ${JSON.stringify(got.text)} (${got.note})`);
});

await check("the metrics on the page count the answer", async () => {
  // Two completions so far: the reference request and the page's own.
  await waitFor(`document.getElementById("m-req").textContent === "2 ok"`, "the requests card to count 2 ok", 10000);
  await waitFor(`document.getElementById("m-ttft").textContent !== "–"`, "a time to first token", 10000);
});

await check("the page threw no JavaScript error", async () => {
  assert.deepEqual(jsErrors, []);
  assert.deepEqual(consoleErrors, []);
});

await check("a screenshot of the page is kept", async () => {
  const { data } = await page.send("Page.captureScreenshot", { format: "png" });
  const file = screenshot;
  fs.writeFileSync(file, Buffer.from(data, "base64"));
  assert.ok(fs.statSync(file).size > 1000);
  console.log(`     screenshot: ${file}`);
});

page.close();
browser.kill("SIGTERM");
console.log(`server: stopped (${await server.stop()})`);
finish();
