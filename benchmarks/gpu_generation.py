"""Generation throughput of the GPU worker's transformers engine, and its use while it feeds a search.

torch and transformers only (no vLLM, Ray or DuckDB), so it runs on a bare GPU machine:

    python3 benchmarks/gpu_generation.py                 # a 1.5B configuration (Qwen2-1.5B shape), bf16, GPU
    python3 benchmarks/gpu_generation.py --tiny          # a 2-layer model on CPU: checks the script runs

The model is randomly initialized from a configuration (no hub), so the figures measure
the hardware and the engine, not replies. Part 1: tokens/s of batched `generate` at
several batch sizes (prompt and reply lengths like a mutation prompt's). Part 2: a
closed loop shaped like a search: `--proposals` requests in flight, each followed by an
"evaluation" of `--eval-s` seconds before its island asks again; the engine batches
whatever is queued. It prints proposals/s, mean batch, tokens/s and the GPU's busy share
(time inside generate over wall time; also NVML's utilization when available).
"""
from __future__ import annotations

import argparse
import queue
import threading
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def model_config(tiny: bool) -> Qwen2Config:
    if tiny:
        return Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1e6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(tiny: bool):
    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(model_config(tiny)).to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.3f} B parameters, {dtype}, on {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    return model, device


def generate(model, device, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Seconds for one batched generate of exactly `new_tokens` per row."""
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (batch, prompt_len), device=device)
    mask = torch.ones_like(ids)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=True, temperature=0.8, pad_token_id=0)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def throughput(model, device, batches, prompt_len, new_tokens) -> None:
    generate(model, device, 1, prompt_len, 4)  # warm-up (kernels, allocator)
    print(f"\npart 1: batched generate, prompt {prompt_len} tokens, {new_tokens} new tokens per row")
    print("batch | seconds | generated tokens/s | per-request tokens/s")
    for batch in batches:
        seconds = generate(model, device, batch, prompt_len, new_tokens)
        rate = batch * new_tokens / seconds
        print(f"{batch:5d} | {seconds:7.2f} | {rate:18.1f} | {rate / batch:20.1f}")


def feed_search(model, device, proposals, eval_s, duration_s, max_batch, prompt_len, new_tokens) -> None:
    """A closed loop: each of `proposals` islands waits for its reply, 'evaluates', asks again."""
    waiting: queue.Queue = queue.Queue()
    stop = time.monotonic() + duration_s
    busy, sizes, done = 0.0, [], 0
    for island in range(proposals):
        waiting.put(island)
    timers: list[threading.Timer] = []
    utils = []
    start = time.monotonic()
    while time.monotonic() < stop:
        try:
            batch = [waiting.get(timeout=0.05)]
        except queue.Empty:
            continue
        while len(batch) < max_batch and not waiting.empty():
            batch.append(waiting.get_nowait())
        busy += generate(model, device, len(batch), prompt_len, new_tokens)
        sizes.append(len(batch))
        done += len(batch)
        if device == "cuda":
            try:
                utils.append(torch.cuda.utilization())
            except Exception:  # noqa: BLE001  NVML may be missing; the busy share still stands
                pass
        for island in batch:  # each island evaluates its child, then asks again
            timer = threading.Timer(eval_s, waiting.put, args=(island,))
            timer.start()
            timers.append(timer)
    wall = time.monotonic() - start
    for timer in timers:
        timer.cancel()
    print(f"\npart 2: feeding a search ({proposals} proposals in flight, {eval_s:g} s evaluation each, "
          f"max batch {max_batch}, {wall:.0f} s)")
    print(f"proposals/s {done / wall:.2f} | mean batch {sum(sizes) / max(len(sizes), 1):.1f} | "
          f"generated tokens/s {done * new_tokens / wall:.1f} | busy share {busy / wall:.0%}"
          + (f" | NVML utilization mean {sum(utils) / len(utils):.0f}%" if utils else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on CPU (checks the script)")
    parser.add_argument("--batches", default="", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=0)
    parser.add_argument("--new-tokens", type=int, default=0)
    parser.add_argument("--proposals", type=int, default=32)
    parser.add_argument("--eval-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=0)
    args = parser.parse_args()
    tiny = args.tiny
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([1, 2, 4] if tiny else [1, 4, 16, 64])
    prompt_len = args.prompt_len or (64 if tiny else 1024)
    new_tokens = args.new_tokens or (8 if tiny else 256)
    model, device = build(tiny)
    throughput(model, device, batches, prompt_len, new_tokens)
    feed_search(model, device, args.proposals if not tiny else 4, args.eval_s if not tiny else 0.2,
                args.duration_s or (3 if tiny else 120), max(batches), prompt_len, new_tokens)


if __name__ == "__main__":
    main()
