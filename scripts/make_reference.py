#!/usr/bin/env python3
"""Records what Hugging Face transformers computes on a model folder, in the file `tandem verify` reads.

    pip install transformers==5.17.0 torch==2.11.0 safetensors
    python3 scripts/make_reference.py MODEL_DIR expected.safetensors [--prompt TEXT ...] [--gen-tokens G]
    tandem verify --model MODEL_DIR --expected expected.safetensors

Writes (docs/verify.md has the table; shared/fixtures/oracle/README.md the fixtures made the same way):
  input_ids   I32 [B, T]         B prompts cut to the length T of the shortest
  logits      F32 [B, T, vocab]  one full forward over every prompt
  moe_in.L    F32 [B*T, hidden]  input of the MoE block of layer L (rows batch-major); MoE layers only
  moe_out.L   F32 [B*T, hidden]  its output (shared experts and routed scaling included)
  gen_tokens  I32 [B, G]         greedy continuation, one token a step with the KV cache (no stop at EOS)
  gen_logits  F32 [B, G, vocab]  the logits each of those tokens was chosen from

The model runs in float32 with eager attention (a bf16 checkpoint runs on its bf16 values widened to
f32, as tandem computes). The greedy loop is written out rather than left to model.generate(), so that
no generation config (EOS, minimum length, repetition penalty) changes which token is picked.
"""
import argparse
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="Hugging Face model folder (config.json + safetensors, tokenizer files)")
    p.add_argument("out", help="file to write, e.g. expected.safetensors")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text (repeat for a batch; default: two built-in prompts)")
    p.add_argument("--ids", default=None,
                   help="prompts as token ids instead of text: '1,2,3;4,5,6' (';' between prompts, equal lengths)")
    p.add_argument("--gen-tokens", type=int, default=6, help="greedy tokens to record per prompt (default 6)")
    p.add_argument("--max-prompt-tokens", type=int, default=32, help="cut prompts to at most this many tokens")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the folder's own modelling code")
    return p.parse_args()


DEFAULT_PROMPTS = [
    "The sidecar computes the cold experts while the primary runs the hot ones.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
]


def prompt_ids(args, torch):
    if args.ids:
        rows = [[int(t) for t in part.split(",") if t.strip()] for part in args.ids.split(";") if part.strip()]
        if not rows or len({len(r) for r in rows}) != 1:
            sys.exit("make_reference: --ids needs prompts of one length, e.g. '1,2,3;4,5,6'")
        return torch.tensor(rows, dtype=torch.long)
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(args.model_dir, trust_remote_code=args.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader failure means the same thing here
        sys.exit(f"make_reference: no usable tokenizer in {args.model_dir} ({e}); give --ids 1,2,3;4,5,6")
    texts = args.prompt or DEFAULT_PROMPTS
    encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    t = min(min(len(e) for e in encoded), args.max_prompt_tokens)
    if t == 0:
        sys.exit("make_reference: a prompt encodes to no tokens")
    return torch.tensor([e[:t] for e in encoded], dtype=torch.long)


def moe_blocks(model):
    """(layer index, MoE block) for every decoder layer whose feed-forward block has routed experts."""
    layers = model.model.layers
    found = []
    for i, layer in enumerate(layers):
        block = getattr(layer, "block_sparse_moe", None) or getattr(layer, "mlp", None)
        if block is not None and hasattr(block, "experts"):  # a dense MLP has no experts
            found.append((i, block))
    return found


def main():
    args = parse_args()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="eager",
                                                 trust_remote_code=args.trust_remote_code)
    model.eval()
    ids = prompt_ids(args, torch)
    B, T = ids.shape
    vocab = model.config.vocab_size
    if int(ids.max()) >= vocab:
        sys.exit(f"make_reference: a prompt id is >= the model's vocab_size {vocab}")

    out = {}
    capture = {"on": True}

    def hooks_for(layer):
        def pre(module, inputs):
            if capture["on"]:
                x = inputs[0]
                out[f"moe_in.{layer}"] = x.reshape(-1, x.shape[-1]).detach().float().clone()

        def post(module, inputs, output):
            if capture["on"]:
                y = output[0] if isinstance(output, tuple) else output  # some blocks also return router logits
                out[f"moe_out.{layer}"] = y.reshape(-1, y.shape[-1]).detach().float().clone()
        return pre, post

    blocks = moe_blocks(model)
    if not blocks:
        sys.exit("make_reference: no MoE block found (looked for layers[i].mlp / .block_sparse_moe with .experts)")
    for layer, block in blocks:
        pre, post = hooks_for(layer)
        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)

    gen_tokens, gen_logits = [], []
    with torch.no_grad():
        # 1. The full forward over every prompt; it also fills the KV cache for step 2.
        step = model(input_ids=ids, use_cache=True)
        out["logits"] = step.logits.float().clone()
        capture["on"] = False
        # 2. Greedy decode with the KV cache, one token a step, G steps whatever the token (no EOS stop).
        past, last = step.past_key_values, step.logits[:, -1, :]
        for _ in range(args.gen_tokens):
            gen_logits.append(last.float().clone())
            nxt = last.argmax(dim=-1, keepdim=True)  # [B, 1]; ties go to the lowest id
            gen_tokens.append(nxt)
            step = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, last = step.past_key_values, step.logits[:, -1, :]

    out["input_ids"] = ids.to(torch.int32)
    out["gen_tokens"] = torch.cat(gen_tokens, dim=1).to(torch.int32)  # [B, G]
    out["gen_logits"] = torch.stack(gen_logits, dim=1)  # [B, G, vocab]
    assert out["logits"].shape == (B, T, vocab), out["logits"].shape
    for layer, _ in blocks:
        assert out[f"moe_out.{layer}"].shape == (B * T, model.config.hidden_size), layer
    import transformers
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "model_dir": args.model_dir,
            "made_by": "scripts/make_reference.py"}
    save_file({k: v.contiguous() for k, v in out.items()}, args.out, metadata=meta)
    print(f"make_reference: wrote {args.out}: {B} prompts x {T} tokens, {len(blocks)} MoE layers "
          f"({', '.join(str(l) for l, _ in blocks)}), {args.gen_tokens} greedy tokens each")
    print(f"next: tandem verify --model {args.model_dir} --expected {args.out}")


if __name__ == "__main__":
    main()
