"""benchmarks/generate.py --device cuda: decoding on a GPU against plain PyTorch and Hugging Face.

Table (a): a GPT-2-small-shaped LM (12 layers, 768 wide, 12 heads, d_ff 3072, vocab 4096,
learned positions, GELU, tied embeddings, no biases), fp32 (TF32 off), prompt 16, 128 new tokens
greedy, batch 1 and 8:

  headwise eager     headwise.generate: the prompt through the modules, then the fixed-shape
                     step (headwise.step.DecodeStep off the CPU)
  headwise graph     headwise.generate(..., compile=True): that step replayed as a CUDA graph
  plain eager        ~40 lines of torch with preallocated (b, h, L, d) buffers and SDPA, the same
                     weights (benchmarks/generate.py's PlainGPT): the anchor

Table (b): a SmolLM2-135M-shaped Llama (30 layers, 576 wide, 9 query / 3 key/value heads,
SwiGLU 1536, RoPE, RMSNorm, tied 49152-token embedding; random weights built by transformers and
copied into headwise by name: benchmarks/llama_decode.py's ``build``), bf16, batch 1, prompt 64,
128 new tokens greedy: headwise eager and graph vs HF ``generate`` (default dynamic cache) and
HF ``generate(cache_implementation="static", disable_compile=True)`` ("hf static": its static
cache run eagerly, the anchor of the eager goal), and HF's default with a static cache, which
transformers compiles by itself ("hf static compiled": 280 against 40 tokens/s eagerly on an H100,
session 17; before that session this column was taken for the eager one).

Every run is timed whole (prefill included) between ``torch.cuda.synchronize()`` calls; the
candidates of a table are interleaved in one process (rotating order, medians of per-round
ratios). Greedy tokens are compared with the anchor and printed ("same tokens"; bf16 rounds
differently from HF's kernels, so (b) also prints how many leading tokens agree).
"""

from __future__ import annotations

import time

import torch

import _common as C
import headwise
from headwise.models import LMConfig, TransformerLM

NEW = 128


def _timed(fn):
    def run():
        fn()
        torch.cuda.synchronize()
    return run


def _agree(a: torch.Tensor, b: torch.Tensor, start: int) -> int:
    """Leading new tokens on which every row of ``a`` and ``b`` agrees."""
    a, b = a[:, start:].cpu(), b[:, start:].cpu()
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).all(0)
    return int(n if bool(same.all()) else int((~same).int().argmax()))


def _warm_compile(model, prompt) -> float:
    """Seconds of the first compile=True generation (capture included) after an eager one."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    headwise.generate(model, prompt, max_new_tokens=NEW, compile=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def gpt_rows(device, batches, quick: bool) -> list[dict]:
    from generate import PlainGPT  # (benchmarks/generate.py: the plain anchor)

    torch.manual_seed(0)
    cfg = LMConfig(4096, d_model=768, num_heads=12, num_layers=12, d_ff=3072, max_len=1024,
                   dropout=0.0, activation="gelu", positional="learned", tie_embeddings=True,
                   bias=False)
    model = TransformerLM(cfg).eval().to(device)
    plain = PlainGPT(model)
    rows = []
    for b in batches:
        prompt = torch.randint(0, 4096, (b, 16), generator=torch.Generator().manual_seed(b))
        prompt = prompt.to(device)
        want = plain.generate(prompt, NEW)
        eager = headwise.generate(model, prompt, max_new_tokens=NEW)
        first_graph_s = _warm_compile(model, prompt)
        graph = headwise.generate(model, prompt, max_new_tokens=NEW, compile=True)
        fns = {"plain": _timed(lambda p=prompt: plain.generate(p, NEW)),
               "eager": _timed(lambda p=prompt: headwise.generate(model, p, max_new_tokens=NEW)),
               "graph": _timed(lambda p=prompt: headwise.generate(model, p, max_new_tokens=NEW,
                                                                  compile=True))}
        t = C.interleave(fns, warmup=1, min_rounds=3 if quick else 7,
                         budget_s=2.0 if quick else 10.0)
        n = b * NEW
        rows.append({"batch": b, "plain tok/s": n / C.median_ms(t["plain"]) * 1e3,
                     "headwise eager tok/s": n / C.median_ms(t["eager"]) * 1e3,
                     "headwise graph tok/s": n / C.median_ms(t["graph"]) * 1e3,
                     "eager / plain": C.ratio(t["plain"], t["eager"]),
                     "graph / plain": C.ratio(t["plain"], t["graph"]),
                     "same tokens (eager, graph)": (torch.equal(eager, want),
                                                    torch.equal(graph, want)),
                     "first graph run s": first_graph_s, "rounds": len(t["plain"])})
        print(C.table(rows[-1:], list(rows[-1])), flush=True)
    return rows


def llama_rows(device, quick: bool) -> list[dict]:
    from llama_decode import build  # (benchmarks/llama_decode.py: HF + headwise, same weights)

    hf, ours = build(30)
    hf, ours = hf.to(device, torch.bfloat16), ours.to(device, torch.bfloat16)
    hf.generation_config.eos_token_id = None  # random weights: decode all 128 tokens
    hf.generation_config.pad_token_id = 0
    prompt = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)

    def run_hf(**kw):
        with torch.inference_mode():
            return hf.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                               **kw)
    want = run_hf()
    # transformers compiles a static-cache generate by itself; disable_compile runs it eagerly
    static = run_hf(cache_implementation="static", disable_compile=True)
    run_hf(cache_implementation="static")  # (its compilation, outside the timing)
    eager = headwise.generate(ours, prompt, max_new_tokens=NEW)
    first_graph_s = _warm_compile(ours, prompt)
    graph = headwise.generate(ours, prompt, max_new_tokens=NEW, compile=True)
    fns = {"hf": _timed(run_hf),
           "hf static": _timed(lambda: run_hf(cache_implementation="static",
                                              disable_compile=True)),
           "hf static compiled": _timed(lambda: run_hf(cache_implementation="static")),
           "eager": _timed(lambda: headwise.generate(ours, prompt, max_new_tokens=NEW)),
           "graph": _timed(lambda: headwise.generate(ours, prompt, max_new_tokens=NEW,
                                                     compile=True))}
    t = C.interleave(fns, warmup=1, min_rounds=2 if quick else 5,
                     budget_s=1.0 if quick else 20.0)
    rate = {k: NEW / C.median_ms(v) * 1e3 for k, v in t.items()}
    row = {"hf tok/s": rate["hf"], "hf static tok/s": rate["hf static"],
           "hf static compiled tok/s": rate["hf static compiled"],
           "headwise eager tok/s": rate["eager"], "headwise graph tok/s": rate["graph"],
           "eager / hf static": C.ratio(t["hf static"], t["eager"]),
           "graph / hf static": C.ratio(t["hf static"], t["graph"]),
           "graph / hf static compiled": C.ratio(t["hf static compiled"], t["graph"]),
           "eager / hf": C.ratio(t["hf"], t["eager"]),
           "tokens agreeing with hf (eager, graph, hf static)": (
               _agree(eager, want, 64), _agree(graph, want, 64), _agree(static, want, 64)),
           "graph == eager tokens": torch.equal(graph, eager),
           "first graph run s": first_graph_s, "rounds": len(t["hf"])}
    print(C.table([row], list(row)), flush=True)
    return [row]


def run(device: str, batches, quick: bool) -> None:
    device = torch.device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    name = torch.cuda.get_device_name(device)
    print(f"# {name}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{'--quick, ' if quick else ''}new tokens {NEW}, greedy")
    results = {}
    for label, fn in (("a", lambda: gpt_rows(device, batches, quick)),
                      ("b", lambda: llama_rows(device, quick))):
        try:  # (one GPU run for everything: a failing table must not hide the other)
            results[label] = fn()
        except Exception as e:  # noqa: BLE001
            print(f"table ({label}) failed: {type(e).__name__}: {e}", flush=True)
    if "a" in results:
        print("\n## (a) 12 layers / 768 / 12 heads, fp32, prompt 16, 128 new tokens: "
              "headwise vs a plain preallocated-cache loop\n")
        print(C.table(results["a"], list(results["a"][0])))
    if "b" in results:
        print("\n## (b) SmolLM2-135M-shaped Llama, random weights, bf16, batch 1, prompt 64, "
              "128 new tokens: headwise vs HF generate\n")
        print(C.table(results["b"], list(results["b"][0])))
    print("\n## Goals (issue #28)\n")
    for row in results.get("a", []):
        for key, goal in (("eager / plain", 1.0), ("graph / plain", 3.0)):
            print(f"- (a) batch {row['batch']}: {key} >= {goal}: {row[key]:.3g} "
                  f"{'PASS' if row[key] >= goal else 'FAIL'}")
    for row in results.get("b", []):
        for key, goal in (("eager / hf static", 1.0), ("graph / hf static", 1.5)):
            print(f"- (b) {key} >= {goal}: {row[key]:.3g} {'PASS' if row[key] >= goal else 'FAIL'}")
        print(f"- (b) graph / hf static compiled (transformers' own compiled step; no goal): "
              f"{row['graph / hf static compiled']:.3g}")
    print(f"\n(total {time.perf_counter() - start:.0f} s; 'first graph run s' is a whole "
          "compile=True generation including the capture of its step)")
