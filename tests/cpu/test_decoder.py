"""Decoders: a transformers causal LM compiled once, generating over a paged key/value cache.

Small GPT-2 and Llama (grouped-query) configs with seeded random weights; every check is
against the eager model, and none may compile again.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import symfuse
from symfuse.runtime.kv import BLOCK, CacheError, paged_attention
from symfuse.runtime.target import ISAS, cpuinfo_features, has_isa, machine_arch
from tests.support.without_transformers import run_without_transformers

VOCAB = 120


def _gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=320)).eval()


def _llama():
    torch.manual_seed(1)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=320)  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def compiled(request):
    model = {"gpt2": _gpt2, "llama": _llama}[request.param]()
    before = symfuse.compile_count()
    decoder = symfuse.compile(model)
    assert symfuse.compile_count() == before + 1
    return model, decoder


def assert_greedy(model, out: torch.Tensor, prompt: int) -> None:
    """`out` ([B, prompt + n]) is eager's greedy continuation: at every generated position, the
    token eager's logits rank first, unless eager's top two differ by less than 1e-3 there (a
    tie any rounding may break; the rows are not compared past it)."""
    with torch.no_grad():
        logits = model(out, use_cache=False).logits
    for row, seq in zip(logits, out):
        for j in range(prompt, out.shape[1]):
            top = row[j - 1].topk(2).values
            if float(top[0] - top[1]) < 1e-3:
                break
            assert int(row[j - 1].argmax()) == int(seq[j]), f"position {j}: eager picks {int(row[j - 1].argmax())}"


def test_teacher_forced_logits_match_eager_over_a_growing_past(compiled):
    model, decoder = compiled
    before = symfuse.compile_count()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (3, 17 + 256), generator=g)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
    cache = decoder.new_cache(blocks=1)  # grows while decoding
    seqs = [cache.add() for _ in range(3)]
    worst = float((decoder.forward(cache, seqs, ids[:, :17]) - full[:, 16]).abs().max())
    for t in range(17, ids.shape[1]):  # 256 steps, past 17..272: across block edges (multiples of 16) and primes
        logits = decoder.forward(cache, seqs, ids[:, t : t + 1])
        worst = max(worst, float((logits - full[:, t]).abs().max()))
    assert worst < 1e-4 * max(1.0, float(full.abs().max()))
    assert [s.length for s in seqs] == [ids.shape[1]] * 3
    assert symfuse.compile_count() == before


@pytest.mark.parametrize("prompt", [1, 2, 13, 16, 31])
def test_greedy_generation_equals_eager_generate(compiled, prompt):
    model, decoder = compiled
    before = symfuse.compile_count()
    ids = torch.randint(0, VOCAB, (2, prompt), generator=torch.Generator().manual_seed(prompt))
    out = decoder.generate(ids, max_new_tokens=20, eos_token_id=[])
    assert out.shape == (2, prompt + 20) and torch.equal(out[:, :prompt], ids)
    assert_greedy(model, out, prompt)
    assert symfuse.compile_count() == before


def test_a_batch_of_different_prompt_lengths_generates_as_each_alone(compiled):
    model, decoder = compiled
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 17, 1, 40)]
    together = decoder.generate(prompts, max_new_tokens=15, eos_token_id=[])
    for p, t in zip(prompts, together):
        alone = decoder.generate([p], max_new_tokens=15, eos_token_id=[])[0]
        assert t == alone and len(t) == len(p) + 15
        assert_greedy(model, torch.tensor([t]), len(p))


def test_generation_stops_at_eos_and_pads_the_batch(compiled):
    _, decoder = compiled
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    free = decoder.generate(ids, max_new_tokens=10, eos_token_id=[])
    eos = int(free[0, 7])  # the first row's third new token ends it
    out = decoder.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=VOCAB + 1)
    first = out[0].tolist()
    end = first.index(eos, 5) + 1  # (the token may be in the prompt too)
    assert end <= 8 and first[:end] == free[0, :end].tolist()
    assert first[end:] == [VOCAB + 1] * (15 - end)


def test_sampling_is_seeded_and_top_k_1_is_greedy(compiled):
    _, decoder = compiled
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    a = decoder.generate(ids, 12, do_sample=True, temperature=0.8, top_p=0.9, seed=7, eos_token_id=[])
    b = decoder.generate(ids, 12, do_sample=True, temperature=0.8, top_p=0.9, seed=7, eos_token_id=[])
    assert torch.equal(a, b)
    greedy = decoder.generate(ids, 12, eos_token_id=[])
    assert torch.equal(decoder.generate(ids, 12, do_sample=True, top_k=1, seed=3, eos_token_id=[]), greedy)


def test_transformers_generate_runs_on_the_compiled_decoder(compiled):
    model, decoder = compiled
    lm = symfuse.ForCausalLM(decoder, model.config, model.generation_config)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as transformers' tokenizers pad a batch for generation
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        ours = lm.generate(ids, **kw)
    assert_greedy(model, ours[:1], 9)
    alone = decoder.generate([ids[1, 4:].tolist()], 10, eos_token_id=[])[0]  # row 1 without its padding
    assert ours[1, 4:].tolist() == alone


def test_the_cache_gives_blocks_back_and_refuses_misuse(compiled):
    _, decoder = compiled
    cache = decoder.new_cache(blocks=2)
    seq = cache.add()
    decoder.forward(cache, [seq], torch.zeros(1, 3 * BLOCK + 1, dtype=torch.int64))
    assert len(seq.blocks) == 4 and cache.capacity >= 4
    free = len(cache.free)
    cache.remove(seq)
    assert len(cache.free) == free + 4
    with pytest.raises(CacheError, match="removed"):
        decoder.forward(cache, [seq], torch.zeros(1, 1, dtype=torch.int64))
    other = symfuse.runtime.kv.KVCache("another model", 1, 1, 8, 64)
    with pytest.raises(CacheError, match="made for another model"):
        decoder.forward(other, [other.add()], torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="exceeds the model's context of 320"):
        decoder.generate(torch.zeros(1, 315, dtype=torch.int64), max_new_tokens=10)
    with pytest.raises(ValueError, match="token 120 is outside the vocabulary"):
        decoder.generate(torch.full((1, 3), VOCAB), max_new_tokens=1)


def test_a_cancelled_generation_leaves_cache_and_decoder_usable(compiled):
    model, decoder = compiled
    cache = decoder.new_cache()
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(6))

    def stop(i, token):
        if len(seen) == 5:
            raise KeyboardInterrupt
        seen.append(token)

    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        decoder.generate(ids, 30, on_token=stop, cache=cache, eos_token_id=[])
    assert not cache.sequences and len(cache.free) == cache.capacity
    out = decoder.generate(ids, 10, cache=cache, eos_token_id=[])
    assert torch.equal(out, decoder.generate(ids, 10, eos_token_id=[]))
    assert_greedy(model, out, 8)


def test_two_threads_generate_at_once_with_their_own_caches(compiled):
    model, decoder = compiled
    ids = [torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in (5, 11)]
    alone = [decoder.generate(x, 12, eos_token_id=[]) for x in ids]
    got: dict[int, torch.Tensor] = {}

    def work(i):
        for _ in range(3):
            got[i] = decoder.generate(ids[i], 12, eos_token_id=[])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert torch.equal(got[i], alone[i])


def test_a_sliding_window_model_generates_as_eager():
    torch.manual_seed(2)
    config = MistralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=VOCAB, sliding_window=8, max_position_embeddings=128,
    )  # fmt: skip
    model = MistralForCausalLM(config).eval()
    decoder = symfuse.compile(model)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
    cache = decoder.new_cache()
    seq = cache.add()
    worst = float((decoder.forward(cache, [seq], ids[:, :20]) - full[:, 19]).abs().max())
    for t in range(20, 40):
        worst = max(worst, float((decoder.forward(cache, [seq], ids[:, t : t + 1]) - full[:, t]).abs().max()))
    assert worst < 1e-4 * max(1.0, float(full.abs().max()))


class _Paged(torch.nn.Module):
    def __init__(self, scale: float, window: int) -> None:
        super().__init__()
        self.scale, self.window = scale, window

    def forward(self, q, k, v, k_pool, v_pool, table, lengths):
        return torch.ops.symfuse.paged_attention(q, k, v, k_pool, v_pool, table, lengths, self.scale, self.window)


@pytest.mark.parametrize(
    "window,isa,cache", [(0, None, torch.float32), (5, None, torch.float32), (5, "avx2", torch.float32),
                         (0, "generic", torch.float32), (3, None, torch.bfloat16)]
)  # fmt: skip
def test_the_native_paged_attention_kernel_matches_its_reference(window, isa, cache):
    hq, hkv, d = 6, 2, 20  # d not a multiple of any vector width
    dyn = {"q": {0: "B", 2: "S"}, "k": {0: "B", 2: "S"}, "v": {0: "B", 2: "S"}, "k_pool": {0: "N"},
           "v_pool": {0: "N"}, "table": {0: "B", 1: "M"}, "lengths": {0: "B"}}  # fmt: skip

    def case(lengths: list[int], s: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        b, width = len(lengths), max(1, max(-(-(n + s) // BLOCK) for n in lengths))
        blocks = b * width + 3
        table = torch.randperm(blocks, generator=g)[: b * width].view(b, width)  # blocks scattered in the pools
        kv = [
            torch.randn(shape, generator=g).to(cache) for shape in [(b, hkv, s, d)] * 2 + [(blocks, hkv, BLOCK, d)] * 2
        ]
        return (torch.randn(b, hq, s, d, generator=g), *kv, table, torch.tensor(lengths))

    if isa == "avx2" and not has_isa(ISAS["avx2"], machine_arch(), cpuinfo_features()):
        pytest.skip("this CPU does not run AVX2 code")  # (an x86 CPU without AVX2, or an ARM one: generic covers it)
    module = symfuse.compile(_Paged(0.3, window), case([3, 5], 2, 0), dyn, **({"isa": isa} if isa else {}))
    assert module.native.host.paged and " = paged(" in module.native.host.source  # the library's kernel
    before = symfuse.compile_count()
    for i, (lengths, s) in enumerate([([0], 1), ([0], 37), ([1], 1), ([16, 0, 31], 1), ([700], 1), ([5, 64, 129], 4),
                                      ([2, 3], 16), ([250], 7)]):  # fmt: skip
        x = case(lengths, s, i)
        want = paged_attention(*x, 0.3, window)
        assert torch.allclose(module(*x), want, atol=1e-5, rtol=1e-4), (lengths, s)
    assert symfuse.compile_count() == before
    bad = list(case([3], 1, 0))
    bad[5] = torch.full_like(bad[5], 10**6)
    with pytest.raises(IndexError, match="block table holds entries outside"):
        module(*bad)


def test_a_saved_decoder_generates_in_a_fresh_process_without_transformers(compiled, tmp_path):
    model, decoder = compiled
    path = str(tmp_path / "decoder")
    decoder.save(path)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(11))
    want = decoder.generate(ids, 16, eos_token_id=[])
    run = run_without_transformers(
        f"""
        import torch, symfuse
        d = symfuse.load({path!r})
        out = d.generate(torch.tensor({ids.tolist()}), max_new_tokens=16, eos_token_id=[])
        print("OUT", out.tolist(), symfuse.compile_count(), type(d).__name__)
        """
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("OUT"))
    assert line == f"OUT {want.tolist()} 0 Decoder"


def test_symfuse_generate_compiles_saves_and_reports_speed(tmp_path, capsys):
    from symfuse.cli import main

    path = str(tmp_path / "tiny")
    assert main(["generate", "llama-tiny", "--max-new-tokens", "6", "--save", path]) == 0
    assert main(["generate", path, "--prompt-ids", "1,2,3", "--batch", "2", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "batch 2, prompt 3 tokens, 10 new tokens" in out
    assert "time to first token" in out and "per-token latency: median" in out
    assert main(["generate", path, "--prompt", "hello"]) == 2
    assert "needs a tokenizer saved beside the decoder" in capsys.readouterr().err


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_returns_to_its_level_after_a_thousand_generations(compiled):
    _, decoder = compiled
    cache = decoder.new_cache()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (1 + i % 29,), generator=g).tolist() for i in range(1000)]
    for p in prompts[:100]:  # pools, workspaces and allocator caches reach their size
        decoder.generate([p], 3, cache=cache, eos_token_id=[])
    level = _rss_mb()
    for p in prompts:
        decoder.generate([p], 3, cache=cache, eos_token_id=[])
    assert not cache.sequences and len(cache.free) == cache.capacity
    assert _rss_mb() - level < 16, f"memory grew by {_rss_mb() - level:.1f} MB over 1,000 generations"


def test_a_bf16_decoder_keeps_its_cache_in_bf16_and_follows_eager():
    model = _llama()
    decoder = symfuse.compile(model, precision="bf16")
    cache = decoder.new_cache()
    assert all(p.dtype == torch.bfloat16 for p in cache.pools)
    with pytest.raises(CacheError, match="holds torch.float32"):
        decoder.forward(symfuse.runtime.kv.KVCache(decoder.spec.fingerprint, 2, 2, 8, 320), [], torch.zeros(0, 1))
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
    seqs = [cache.add(), cache.add()]
    worst = float((decoder.forward(cache, seqs, ids[:, :20]) - full[:, 19]).abs().max())
    for t in range(20, 40):
        worst = max(worst, float((decoder.forward(cache, seqs, ids[:, t : t + 1]) - full[:, t]).abs().max()))
    assert worst < 3e-2 * float(full.abs().max())  # bfloat16 weights, cache and intermediates


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", pad_token="w0", eos_token="w1")


def test_a_transformers_pipeline_and_a_streamer_run_on_the_decoder(compiled):
    from transformers import pipeline

    model, decoder = compiled
    tokenizer = _word_tokenizer()
    lm = symfuse.ForCausalLM(decoder, model.config, model.generation_config)
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    text = "w5 w17 w3 w99"
    ours = pipeline("text-generation", model=lm, tokenizer=tokenizer)(text, **kw)
    eager = pipeline("text-generation", model=model, tokenizer=tokenizer)(text, **kw)
    assert ours[0]["generated_text"] == eager[0]["generated_text"] != text

    class Collect:
        def __init__(self) -> None:
            self.tokens: list[int] = []
            self.ended = False

        def put(self, value) -> None:
            self.tokens += value.reshape(-1).tolist()

        def end(self) -> None:
            self.ended = True

    streamer = Collect()
    ids = torch.tensor([[5, 17, 3, 99]])
    out = decoder.generate(ids, 8, streamer=streamer, eos_token_id=[])
    assert streamer.ended and streamer.tokens == out[0].tolist()
