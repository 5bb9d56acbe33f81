"""Where a rollout's decoding time goes, without a checkpoint: SmolLM2-135M's shape with random weights, a batch of
left-padded prompts as RL generates them, every reply forced to `--new` tokens (the length a batch runs to when one
reply hits the limit). Prints ms a token step and tokens/s for Hugging Face `generate` as `HFEngine` calls it (dynamic
cache, the logits kept for pi_rollout), without the logits, optionally with a static cache (which `generate` compiles:
the first call pays for it) and other attention kernels, then the CUDA kernels a step spends its time in.

    python scripts/decode_speed.py --batch 64 --prompt 1500-2500 --new 256 --static --attention
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from musacoder.hfdecode import decoding_attention

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    tie_word_embeddings=True, pad_token_id=0, eos_token_id=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", default="1500-2500", help="prompt lengths, drawn uniformly from LO-HI tokens")
    ap.add_argument("--new", type=int, default=256, help="tokens generated per reply")
    ap.add_argument("--profile-steps", type=int, default=32, help="token steps under the profiler (0: none)")
    ap.add_argument("--static", action="store_true", help="also a static cache, which generate compiles")
    ap.add_argument("--attention", action="store_true", help="also the math backend and HF's eager attention")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(dev, torch.bfloat16).eval()
    lo, hi = map(int, a.prompt.split("-"))
    lens = torch.randint(lo, hi + 1, (a.batch,)).tolist()
    width = max(lens)
    ids = torch.zeros(a.batch, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lens):  # left padding, as HFEngine pads
        ids[i, width - n:] = torch.randint(3, SMOLLM2_135M["vocab_size"], (n,))
        mask[i, width - n:] = 1
    ids, mask = ids.to(dev), mask.to(dev)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def generate(new: int, backends=None, **kw):
        cfg = GenerationConfig(do_sample=True, temperature=0.9, top_p=0.95, max_new_tokens=new, min_new_tokens=new,
                               pad_token_id=0, eos_token_id=[2], return_dict_in_generate=True, **kw)
        # `backends`: in place of decoding_attention's (a context around it would be overridden by it)
        with torch.no_grad(), decoding_attention() if backends is None else sdpa_kernel(backends):
            model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)

    print(f"{dev}, batch {a.batch}, prompts {lo}-{hi} tokens, {a.new} new tokens, torch {torch.__version__}")
    ways = [("dynamic cache, logits kept (HFEngine)", {"output_logits": True}, 1), ("dynamic cache", {}, 1)]
    if a.static:
        ways.append(("static cache (compiled)", {"cache_implementation": "static"}, 2))
    for name, kw, reps in ways:
        for rep in range(reps):
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync()
            t = time.perf_counter()
            generate(a.new, **kw)
            sync()
            dt = time.perf_counter() - t
            peak = f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev == "cuda" else ""
            print(f"{name}{' (call 2)' if rep else ''}: {dt:.1f} s, {1000 * dt / a.new:.1f} ms a token step, "
                  f"{a.batch * a.new / dt:.0f} tokens/s{peak}", flush=True)
    if a.attention:  # the decode attention alone: torch's math backend, and HF's eager attention
        for name, attn in (("sdpa, math backend only", "sdpa"), ("eager attention", "eager")):
            model.set_attn_implementation(attn)
            sync()
            t = time.perf_counter()
            generate(a.new, backends=[SDPBackend.MATH] if attn == "sdpa" else None)
            sync()
            dt = time.perf_counter() - t
            print(f"dynamic cache, {name}: {dt:.1f} s, {1000 * dt / a.new:.1f} ms a token step, "
                  f"{a.batch * a.new / dt:.0f} tokens/s", flush=True)
        model.set_attn_implementation("sdpa")
    if a.profile_steps:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with profile(activities=acts) as prof:
            generate(a.profile_steps)
        key = "cuda_time_total" if dev == "cuda" else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
