"""kvpress's presses on SmolLM2 for benchmarks/kv.py, run by the ``.kvpress/`` interpreter
(``make kvpress``: kvpress 0.5.5 and the older transformers it pins; headwise is not imported).

    .kvpress/bin/python benchmarks/_kvpress_cells.py SPEC.json

SPEC: ``model_dir`` (a float32 transformers copy of SmolLM2 and its tokenizer), ``ids``
(Austen token ids), ``texts`` (50 other Austen passages, for DuoAttention's on-the-fly scores),
``lengths``, ``dtypes``, ``batches``, ``heldout``, ``reserve``, ``steps``, ``warmup``,
``budget`` (seconds of timing per prompt) and ``presses``: ``[name, kind, compression_ratio]``
(kind ``full``, ``streaming``, ``duo``, ``duo-fly`` or ``duo-austen``: :func:`make_press`; the
ratio a number or one per prompt length, ``{"8192": 0.48}``).

For each prompt (``n - reserve`` tokens, the last ``heldout`` held out) and press: the
prompt's prefill under the press (kvpress compresses the cache there), the peak RSS rise over
that prefill, the next-token loss on the held-out tokens (forwarded over the compressed cache,
at their true positions), the cache's exact tensor bytes after them; then, for each batch, that
cache repeated to the batch's rows and decoding steps timed interleaved with the full cache's,
same process. A press that fails (DuoAttentionPress downloads its head patterns or BookSum)
gives its one-line reason. Prints one JSON line: the rows.
"""

from __future__ import annotations

import contextlib
import copy
import json
import statistics
import sys
import time

import torch


def rss(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def cache_bytes(cache) -> int:
    """Exact bytes of a transformers cache's key/value tensors (either layout)."""
    if hasattr(cache, "layers"):
        pairs = [(layer.keys, layer.values) for layer in cache.layers]
    else:
        pairs = list(zip(cache.key_cache, cache.value_cache, strict=True))
    return sum(t.numel() * t.element_size() for pair in pairs for t in pair
               if isinstance(t, torch.Tensor))


def make_press(kind: str, ratio: float, texts: list[str]):
    """The press of ``kind``: ``duo`` loads DuoAttention's published head patterns,
    ``duo-fly`` scores heads by kvpress's on-the-fly method (on BookSum, downloaded),
    ``duo-austen`` the same method on ``texts`` (Austen passages) instead of BookSum."""
    import kvpress

    if kind == "full":
        return None
    if kind == "streaming":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if kind == "duo-austen":
        import pandas as pd
        from kvpress.presses import duo_attention_press as duo

        class Texts:  # (what datasets' load_dataset(...) gives the method: .to_pandas())
            def to_pandas(self):
                return pd.DataFrame({"chapter": texts})

        duo.load_dataset = lambda *a, **k: Texts()
    return kvpress.DuoAttentionPress(head_compression_ratio=ratio,
                                     on_the_fly_scoring=kind != "duo")


def why_not(e: Exception) -> str:
    """A press's failure in one line."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    if isinstance(e, AssertionError) and "not in" in text:
        return ("not run: DuoAttentionPress ships head patterns for 6 checkpoints only, "
                "downloaded at run time; SmolLM2 is not one")
    return f"not run: {text[:150]}"


def prefill(model, prompt, held, kind: str, ratio: float, texts: list[str]):
    """(row, cache): bytes, peak rise, held-out loss; the cache after the held-out tokens."""
    from transformers import DynamicCache

    press = make_press(kind, ratio, texts)
    cache = DynamicCache()
    reset_peak()
    base = rss("VmRSS")
    with torch.inference_mode():
        with press(model) if press is not None else contextlib.nullcontext():
            first = model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        start, end = prompt.shape[1], prompt.shape[1] + held.shape[1]
        at = torch.arange(start, end)[None].expand(held.shape[0], -1)
        # (positions given, as kvpress's pipeline does: a compressed cache is shorter)
        rest = model(held, past_key_values=cache, use_cache=True, position_ids=at).logits
        kv = cache_bytes(cache)  # (the compressed prompt and the held-out tokens)
    peak = rss("VmHWM") - base
    logits = torch.cat([first[:, -1:], rest[:, :-1]], 1).float()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), held.flatten()).item()
    return dict(kv=kv / 2**20, peak=peak, loss=loss), cache, end


def interleave(fns: dict, budget: float) -> dict:
    names, times, start = list(fns), {k: [] for k in fns}, time.perf_counter()
    for name in names:  # warm-up
        fns[name]()
    r = 0
    while r < 3 or (r < 12 and time.perf_counter() - start < budget):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.process_time()
            fns[name]()
            times[name].append(time.process_time() - t0)
        r += 1
    return times


def stepper(model, cache, token, at: int, steps: int):
    pos = torch.full_like(token, at)

    def run():
        with torch.inference_mode():
            for _ in range(steps):
                model(token, past_key_values=cache, use_cache=True, position_ids=pos)
    return run


def tiled(cache, batch: int):
    """A copy of the one-row ``cache`` repeated to ``batch`` rows (the same prompt in each)."""
    cache = copy.deepcopy(cache)
    if batch > 1:
        cache.batch_repeat_interleave(batch)
    return cache


def measure(model, ids, spec, n: int) -> list[dict]:
    """Rows of each press at prompt ``n``: one prefill, its cache repeated to each batch."""
    x = torch.tensor(ids[:n - spec["reserve"]])[None]
    prompt, held = x[:, :-spec["heldout"]], x[:, -spec["heldout"]:]
    made, rows = {}, []
    if spec.get("warmup", True):  # (the buffers at this length, before the peaks)
        prefill(model, prompt, held, "full", 0.0, [])
    for name, kind, ratio in spec["presses"]:
        share = ratio[str(n)] if isinstance(ratio, dict) else ratio  # (per prompt)
        try:
            made[name] = prefill(model, prompt, held, kind, share, spec["texts"])
        except Exception as e:  # (a press that cannot run here: its reason, one line)
            rows.append(dict(press=name, batch=1, note=why_not(e)))
    for b in spec["batches"]:
        steppers, here = {}, []
        for name, (row, cache, at) in made.items():
            c = tiled(cache, b)
            kv = cache_bytes(c) / 2**20 if b > 1 else row["kv"]
            here.append(dict(row, press=name, batch=b, kv=kv,
                             peak=row["peak"] if b == 1 else "—"))
            steppers[name] = stepper(model, c, x[:, -1:].expand(b, -1), at, spec["steps"])
        if "full" in steppers:
            times = interleave(steppers, spec["budget"])
            for row in here:
                t = times[row["press"]]
                row["ms/step"] = 1000 * statistics.median(t) / spec["steps"]
                row["speed"] = statistics.median(
                    f / p for f, p in zip(times["full"], t, strict=True))
        rows += here
    return rows


def main() -> int:
    import transformers

    spec = json.loads(open(sys.argv[1]).read())
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.LlamaForCausalLM.from_pretrained(
        spec["model_dir"], torch_dtype=torch.float32, attn_implementation="sdpa").eval()
    out = []
    for dtype in spec["dtypes"]:
        model = model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        for n in spec["lengths"]:
            for row in measure(model, spec["ids"], spec, n):
                out.append(dict(row, dtype=dtype, prompt=n))
            print(f"# kvpress {dtype} {n} done", file=sys.stderr, flush=True)
    from importlib.metadata import version

    print(json.dumps({"rows": out, "versions": {"kvpress": version("kvpress"),
                                                "transformers": transformers.__version__,
                                                "torch": torch.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
