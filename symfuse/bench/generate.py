"""`symfuse bench --task generate`: text generation, each engine in its own process.

Per engine, model, batch and prompt length: time to first token (the prompt's prefill and
the first token), per-token latency (median decoding step) at the prompt's past length,
and tokens per second over the whole generation; per-token latency at a longer past comes
from a second run whose prompt is that long. The physical floor of a decoding step is the
bytes it must read once (every weight, and the cache it attends over) at the read bandwidth
measured here; of a prefill, its multiply-adds at the FMA peak.

Engines: `symfuse` (compiled once; every shape runs on that one compilation), `eager`
(transformers' `generate` with its DynamicCache), `torch-compile` (transformers' static
cache with `torch.compile` on the forward, as its docs advise for speed), `ctranslate2`
(the model converted by CTranslate2's transformers converter, float32, its `generate_batch`;
its per-token latency is the mean step, (whole generation - first token) / (new - 1), as it
reports no step times for a batch).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

ENGINES = ("symfuse", "eager", "torch-compile", "ctranslate2")


@dataclass
class Run:
    engine: str
    model: str
    batch: int
    prompt: int
    new: int
    first_token_ms: float
    step_ms: float  # median decoding step
    tokens_per_second: float


def _prompts(batch: int, prompt: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(prompt * 31 + batch))


def _symfuse(decoder, ids: torch.Tensor, new: int) -> tuple[float, list[float]]:
    decoder.generate(ids, 2, eos_token_id=[])  # warm-up
    decoder.generate(ids, new, eos_token_id=[])
    t = decoder.last
    return t.first_token, t.steps


def _transformers(model, ids: torch.Tensor, new: int) -> tuple[float, list[float]]:
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    args = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        # warm-up at the measured length: a static cache is sized by it (torch.compile's compile)
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **args)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, logits_processor=LogitsProcessorList([Stamp()]),
                       **args)  # fmt: skip
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])]


def _ctranslate2(model, tmp: str):
    """The model converted for CTranslate2 (float32), with a word-level vocabulary `t0..tN` (the
    built-in decoders have random weights and no tokenizer; CTranslate2 takes tokens as text)."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(model.config.vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model.save_pretrained(os.path.join(tmp, "hf"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token="t2")
    tokenizer.save_pretrained(os.path.join(tmp, "hf"))
    TransformersConverter(os.path.join(tmp, "hf")).convert(os.path.join(tmp, "ct2"), quantization="float32")
    threads = torch.get_num_threads()
    return ctranslate2.Generator(os.path.join(tmp, "ct2"), device="cpu", compute_type="float32", intra_threads=threads)


def _ctranslate2_run(generator, ids: torch.Tensor, new: int) -> tuple[float, list[float]]:
    prompts = [[f"t{i}" for i in row] for row in ids.tolist()]
    kw = dict(sampling_topk=1, include_prompt_in_result=False, end_token=[])
    generator.generate_batch(prompts, max_length=new, min_length=new, **kw)  # warm-up
    t0 = time.perf_counter()
    generator.generate_batch(prompts, max_length=1, min_length=1, **kw)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    generator.generate_batch(prompts, max_length=new, min_length=new, **kw)
    whole = time.perf_counter() - t0
    return first, [(whole - first) / max(1, new - 1)] * max(1, new - 1)


def worker(engine: str, model_name: str, shapes: list[tuple[int, int]], new: int) -> list[dict]:
    """Every shape on one engine, in this process."""
    from symfuse.models import load_decoder

    torch.set_grad_enabled(False)
    model = load_decoder(model_name)
    vocab = model.config.vocab_size
    tmp = tempfile.mkdtemp(prefix="symfuse-bench-")
    if engine == "symfuse":
        import symfuse

        decoder = symfuse.compile(model)  # once, for every shape of the run
        generate = functools.partial(_symfuse, decoder)
    elif engine == "ctranslate2":
        generate = functools.partial(_ctranslate2_run, _ctranslate2(model, tmp))
    else:
        if engine == "torch-compile":
            model.generation_config.cache_implementation = "static"
            model.forward = torch.compile(model.forward, dynamic=False)
        generate = functools.partial(_transformers, model)
    runs = []
    for batch, prompt in shapes:
        first, steps = generate(_prompts(batch, prompt, vocab), new)
        total = first + sum(steps)
        runs.append(Run(engine, model_name, batch, prompt, new, 1e3 * first, 1e3 * statistics.median(steps),
                        batch * new / total).__dict__)  # fmt: skip
        print(f"  {engine} {model_name} batch {batch} prompt {prompt}: first token {runs[-1]['first_token_ms']:.1f} "
              f"ms, step {runs[-1]['step_ms']:.2f} ms", file=sys.stderr, flush=True)  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)
    return runs


def floors(model_name: str, shapes: list[tuple[int, int]], phys: dict) -> dict:
    """Per shape: the decoding step's floor (weights and the cache at that past, read once) and
    the prefill's (its multiply-adds at the FMA peak), in ms."""
    from symfuse.models import load_decoder

    with torch.device("meta"):  # its shapes only: no weights made
        model = load_decoder(model_name)
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    layers, hidden = c.num_hidden_layers, c.hidden_size
    kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head = hidden // c.num_attention_heads
    out = {}
    for batch, prompt in shapes:
        cache = 2 * layers * kv * head * prompt * batch * 4
        step = (params * 4 + cache) / (phys["read_gbps"] * 1e9) * 1e3
        flops = 2 * params * batch * prompt + 4 * layers * hidden * batch * prompt * prompt / 2
        prefill = flops / (phys["fma_gflops"] * 1e9) * 1e3 if phys.get("fma_gflops") else None
        out[f"{batch}x{prompt}"] = {"step_ms": step, "prefill_ms": prefill}
    return out


def run(models: list[str], engines: list[str], batches: list[int], prompts: list[int], new: int, out_dir: str,
        progress=print, command: str = "") -> str:  # fmt: skip
    """Every engine in its own process; the table in `out_dir/generate.md` (and .json)."""
    from symfuse.bench.worker import physics

    os.makedirs(out_dir, exist_ok=True)
    phys = physics()
    shapes = [(b, p) for b in batches for p in prompts]
    results: list[dict] = []
    failures: dict[str, str] = {}
    for model in models:
        for engine in engines:
            progress(f"generate: {engine} on {model}")
            cmd = [sys.executable, "-m", "symfuse.bench.generate", engine, model, json.dumps(shapes), str(new)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                failures[f"{engine}/{model}"] = (done.stderr.strip().splitlines() or ["?"])[-1][:300]
                continue
            results += json.loads(done.stdout.strip().splitlines()[-1])
    report = {"command": command, "new_tokens": new, "physics": phys, "runs": results, "failures": failures,
              "floors": {m: floors(m, shapes, phys) for m in models}}  # fmt: skip
    with open(os.path.join(out_dir, "generate.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = table(report)
    with open(os.path.join(out_dir, "generate.md"), "w") as f:
        f.write(text)
    return text


def table(report: dict) -> str:
    phys = report["physics"]
    lines = [
        f"`{report.get('command', '')}`: {report.get('new_tokens', '?')} new tokens a prompt; step = median decoding "
        "step; floor = every weight and the cache at the prompt's length read once",
        "",
        f"read bandwidth {phys['read_gbps']:.1f} GB/s"
        + (f", FMA peak {phys['fma_gflops']:.0f} GFLOP/s" if phys.get("fma_gflops") else ""),
        "",
        "| model | batch | prompt | engine | first token ms | step ms | tokens/s | step floor ms | step / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        floor = report["floors"][r["model"]][f"{r['batch']}x{r['prompt']}"]["step_ms"]
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['engine']} | {r['first_token_ms']:.1f} | "
            f"{r['step_ms']:.2f} | {r['tokens_per_second']:.1f} | {floor:.2f} | {r['step_ms'] / floor:.2f}x |"
        )
    for k, v in report["failures"].items():
        lines.append(f"\n{k} failed: {v}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    engine, model_name, shapes, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(worker(engine, model_name, [tuple(s) for s in shapes], new)))
