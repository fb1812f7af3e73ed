// The official OpenAI client (the `openai` npm package, pinned in package.json) against `tandem serve` on
// the tiny synthetic model: chat and completions, streaming and not, stop strings, max_tokens, usage
// (also in the last chunk with stream_options.include_usage), errors (status and body: 400, 401, 404)
// and the API key. Greedy decoding throughout, so a streamed answer must equal the same request's
// non-streamed one token for token. Usage: node openai_client.mjs --tandem BIN --work DIR
import assert from "node:assert/strict";
import { check, finish, importPackage, options, startServer, synthModel } from "./lib/harness.mjs";

const opt = options();
const { default: OpenAI } = await importPackage("openai");
const model = synthModel(opt.tandem, opt.work);
const name = "tiny-e2e";
const key = "sk-e2e-secret";
const [open, keyed] = await Promise.all([
  startServer({ tandem: opt.tandem, work: opt.work, model, name: "open", extra: ["--served-model-name", name] }),
  startServer({ tandem: opt.tandem, work: opt.work, model, name: "keyed", extra: ["--served-model-name", name, "--api-key", key] }),
]);
// No --api-key on `open`: the client still sends one (it insists), which the server must ignore.
const client = new OpenAI({ baseURL: `${open.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const greedy = { model: name, temperature: 0 };
const hello = [{ role: "user", content: "Hello! Count to five, please." }];
const strip = (s) => s.replace(/\uFFFD+$/, "");  // an answer cut mid-character ends in U+FFFD

// Streams a request; returns { text, finish, usage, chunks, usageChunks }.
async function streamed(api, body) {
  const stream = await api.create({ ...body, stream: true });
  let text = "", finish = null, usage = null, chunks = 0, usageChunks = 0, finishes = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) { usage = c.usage; usageChunks++; assert.deepEqual(c.choices, [], "the usage chunk has no choices"); }
    for (const ch of c.choices) {
      assert.equal(ch.index, 0);
      text += api === client.completions ? ch.text ?? "" : ch.delta?.content ?? "";
      if (api !== client.completions && ch.delta?.role !== undefined) assert.equal(ch.delta.role, "assistant");
      if (ch.finish_reason) { finish = ch.finish_reason; finishes++; }
    }
  }
  assert.equal(finishes, 1, "exactly one chunk carries the finish_reason");
  return { text, finish, usage, chunks, usageChunks };
}

function checkUsage(u, completion) {
  assert.ok(u, "usage present");
  assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `prompt_tokens ${u.prompt_tokens}`);
  if (completion !== undefined) assert.equal(u.completion_tokens, completion);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
}

// Expects `promise` to reject with an APIError of `status`; returns the error for more checks.
async function rejects(promise, status) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `an APIError, got ${e}`);
    assert.equal(e.status, status, `status ${e.status}: ${e.message}`);
    assert.equal(typeof e.error?.message, "string", `body has error.message: ${JSON.stringify(e.error)}`);
    assert.ok(e.error.message.length > 0);
    return e;
  }
  assert.fail(`expected HTTP ${status}, the request succeeded`);
}

let ref;  // the greedy chat answer, 32 tokens at most
let refCompletion;

await check("GET /v1/models lists the served model name", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [name]);
  const m = await client.models.retrieve(name).catch(() => null);
  if (m) assert.equal(m.id, name);  // retrieve is optional in the issue; if answered, it must be right
});

await check("chat, not streamed: content, finish_reason, usage", async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: hello, max_tokens: 32 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, name);
  assert.ok(r.id && typeof r.id === "string");
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, "assistant");
  assert.equal(typeof c.message.content, "string");
  assert.ok(["length", "stop"].includes(c.finish_reason), c.finish_reason);
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 32);
  if (c.finish_reason === "length") assert.equal(r.usage.completion_tokens, 32);
  ref = { text: c.message.content, finish: c.finish_reason, usage: r.usage };
  console.log(`     greedy answer: ${JSON.stringify(ref.text)} (${ref.finish}, ${r.usage.completion_tokens} tokens)`);
});

await check("chat, streamed: the same text, one finish_reason, no usage unless asked", async () => {
  const s = await streamed(client.chat.completions, { ...greedy, messages: hello, max_tokens: 32 });
  assert.equal(s.text, ref.text);
  assert.equal(s.finish, ref.finish);
  assert.equal(s.usageChunks, 0);
});

await check("chat, streamed with stream_options.include_usage: usage in the last chunk only", async () => {
  const s = await streamed(client.chat.completions,
    { ...greedy, messages: hello, max_tokens: 32, stream_options: { include_usage: true } });
  assert.equal(s.text, ref.text);
  assert.equal(s.usageChunks, 1);
  assert.deepEqual(s.usage, ref.usage);
});

await check("max_tokens and max_completion_tokens cut at that many tokens (finish_reason length)", async () => {
  assert.equal(ref.finish, "length", "the reference answer stopped early; pick another prompt");
  for (const field of ["max_tokens", "max_completion_tokens"]) {
    const r = await client.chat.completions.create({ ...greedy, messages: hello, [field]: 5 });
    assert.equal(r.choices[0].finish_reason, "length", field);
    assert.equal(r.usage.completion_tokens, 5, field);
    assert.ok(ref.text.startsWith(strip(r.choices[0].message.content)), `${field}: a prefix of the longer answer`);
  }
  const s = await streamed(client.chat.completions, { ...greedy, messages: hello, max_tokens: 5, stream_options: { include_usage: true } });
  assert.equal(s.finish, "length");
  assert.equal(s.usage.completion_tokens, 5);
});

// A stop string taken from the middle of the reference answer: the answer must end right before its
// first occurrence, with finish_reason stop, and the stop string never appears in what was sent.
function stopString(text) {
  const chars = [...text];
  for (let i = Math.floor(chars.length / 2); i + 2 <= chars.length; i++) {
    const s = chars.slice(i, i + 2).join("");
    if (!s.includes("\uFFFD") && s.trim().length === 2) return s;
  }
  for (let i = 1; i + 2 <= chars.length; i++) {
    const s = chars.slice(i, i + 2).join("");
    if (!s.includes("\uFFFD")) return s;
  }
  return undefined;
}

await check("stop strings: cut before the first occurrence, never emitted (chat, streamed and not)", async () => {
  const stop = stopString(ref.text);
  assert.ok(stop, `no usable stop string in ${JSON.stringify(ref.text)}`);
  const expected = ref.text.slice(0, ref.text.indexOf(stop));
  const r = await client.chat.completions.create({ ...greedy, messages: hello, max_tokens: 32, stop: [stop, "\u0001never"] });
  assert.equal(r.choices[0].message.content, expected, `stop ${JSON.stringify(stop)}`);
  assert.equal(r.choices[0].finish_reason, "stop");
  const s = await streamed(client.chat.completions, { ...greedy, messages: hello, max_tokens: 32, stop });
  assert.equal(s.text, expected);
  assert.equal(s.finish, "stop");
});

await check("completions, not streamed and streamed: same text, usage", async () => {
  const prompt = "The quick brown fox";
  const r = await client.completions.create({ ...greedy, prompt, max_tokens: 24 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, name);
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, "string");
  checkUsage(r.usage, r.choices[0].finish_reason === "length" ? 24 : undefined);
  refCompletion = { text: r.choices[0].text, finish: r.choices[0].finish_reason, usage: r.usage };
  const s = await streamed(client.completions, { ...greedy, prompt, max_tokens: 24, stream_options: { include_usage: true } });
  assert.equal(s.text, refCompletion.text);
  assert.equal(s.finish, refCompletion.finish);
  assert.deepEqual(s.usage, refCompletion.usage);
  const stop = stopString(refCompletion.text);
  assert.ok(stop, `no usable stop string in ${JSON.stringify(refCompletion.text)}`);
  const cut = await client.completions.create({ ...greedy, prompt, max_tokens: 24, stop });
  assert.equal(cut.choices[0].text, refCompletion.text.slice(0, refCompletion.text.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, "stop");
});

await check("POST /apply-template then /v1/completions on its prompt gives the chat answer", async () => {
  const r = await fetch(`${open.url}/apply-template`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages: hello, add_generation_prompt: true }) });
  assert.equal(r.status, 200);
  const { prompt } = await r.json();
  assert.equal(typeof prompt, "string");
  assert.ok(prompt.includes(hello[0].content), `the prompt holds the message: ${JSON.stringify(prompt)}`);
  const c = await client.completions.create({ ...greedy, prompt, max_tokens: 32 });
  assert.equal(c.choices[0].text, ref.text);
  assert.equal(c.usage.prompt_tokens, ref.usage.prompt_tokens);
});

await check("400: wrong types and malformed JSON, in OpenAI's error shape", async () => {
  await rejects(client.chat.completions.create({ ...greedy, messages: "not a list" }), 400);
  await rejects(client.chat.completions.create({ ...greedy, messages: hello, max_tokens: -1 }), 400);
  await rejects(client.chat.completions.create({ ...greedy, messages: hello, temperature: "hot" }), 400);
  await rejects(client.completions.create({ ...greedy, prompt: "x", max_tokens: 1e9 }), 400);
  await rejects(client.chat.completions.create({ ...greedy, messages: hello, stream: true, max_tokens: -1 }), 400);
  const r = await fetch(`${open.url}/v1/chat/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: '{"model": "tiny-e2e", "messages": [' });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(typeof body.error?.message, "string");
  assert.equal(typeof body.error?.type, "string");
});

await check("404: an unknown model, named in the error", async () => {
  const e = await rejects(client.chat.completions.create({ model: "no-such-model", messages: hello, max_tokens: 4 }), 404);
  assert.ok(e.error.message.includes("no-such-model"), e.error.message);
  await rejects(client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 4, stream: true }), 404);
});

await check("the API key: 401 without it or with a wrong one, served with it; /health needs none", async () => {
  const bad = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
  await rejects(bad.chat.completions.create({ ...greedy, messages: hello, max_tokens: 4 }), 401);
  await rejects(bad.models.list(), 401);
  await rejects(bad.chat.completions.create({ ...greedy, messages: hello, max_tokens: 4, stream: true }), 401);
  const none = await fetch(`${keyed.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: name, prompt: "x", max_tokens: 2 }) });
  assert.equal(none.status, 401);
  assert.equal(typeof (await none.json()).error?.message, "string");
  const good = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: key, maxRetries: 0 });
  const r = await good.chat.completions.create({ ...greedy, messages: hello, max_tokens: 32 });
  assert.equal(r.choices[0].message.content, ref.text, "the keyed server answers as the open one");
  assert.equal((await fetch(`${keyed.url}/health`)).status, 200);
});

await check("the server still serves after the errors", async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: hello, max_tokens: 32 });
  assert.equal(r.choices[0].message.content, ref.text);
});

for (const s of [open, keyed]) console.log(`${s.name}: stopped (${await s.stop()})`);
finish();
