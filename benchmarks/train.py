"""Training throughput: headwise TransformerLM vs the same model hand-written in plain torch.nn
+ F.scaled_dot_product_attention (nanoGPT style), char-level LM on Jane Austen's novels.

Model (both), CPU: 6 layers, 6 heads, d_model 384, d_ff 1536, context 256, batch 8, pre-norm,
learned positions, exact GELU, biases, tied embeddings, no dropout. One step = forward + backward +
fused AdamW (as `headwise train` runs it) on a real batch of the Austen corpus (`make corpora`;
without it, a clearly-labelled synthetic text). The plain model gets headwise's initial weights,
so both start from the same loss (checked). Candidates run interleaved in one process; medians
of per-round ratios.

``--device cuda`` (issue #28's training row): the GPT-2-small shape, 12 layers, 12 heads,
d_model 768, d_ff 3072, vocab 256 (random tokens), context 1024, batch 8, bf16 autocast (and
fp32 without ``--quick``), TF32 off; a measurement is 5 steps then one synchronisation (a training
loop queues steps ahead; neither step reads its loss back); the logits of both models are
compared in fp32 first; CUDA kernels and host syncs of one step of each (torch.profiler, the
sync debug mode). ``--quick``: fewer rounds (< 1 minute on an H100).

    python benchmarks/train.py [--budget 120] [--threads 2] [--profile]
    python benchmarks/train.py --device cuda [--quick]

Goals: CPU: headwise fp32 >= 0.95x plain fp32; headwise bf16 autocast >= 2.3x headwise fp32.
CUDA: headwise bf16 >= 0.98x plain bf16 (speed, i.e. plain ms / headwise ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import _device as G  # noqa: E402
from headwise.data import CorpusMissingError, LMBatch, TextLMTask, make_task  # noqa: E402
from headwise.models import LMConfig, build  # noqa: E402


@dataclass(frozen=True)
class Shape:
    layers: int = 6
    heads: int = 6
    d: int = 384
    ff: int = 1536
    ctx: int = 256
    batch: int = 8


CPU_SHAPE = Shape()
GPU_SHAPE = Shape(layers=12, heads=12, d=768, ff=3072, ctx=1024, batch=8)  # GPT-2 small
GPU_VOCAB = 256
CPU = torch.device("cpu")
TINY_SHAPE = Shape(layers=1, heads=2, d=32, ff=64, ctx=32, batch=2)  # --plumbing


class PlainBlock(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads, D = s.heads, s.d
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, s.ff), nn.Linear(s.ff, D)

    def forward(self, x):
        b, n, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class PlainGPT(nn.Module):
    """nanoGPT's model with headwise's choices (biases, exact GELU): the anchor."""

    def __init__(self, vocab, s: Shape = CPU_SHAPE):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, s.d), nn.Embedding(s.ctx, s.d)
        self.blocks = nn.ModuleList(PlainBlock(s) for _ in range(s.layers))
        self.ln_f = nn.LayerNorm(s.d)
        self.head = nn.Linear(s.d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def copy_from(self, hw_model):
        self.wte.weight.copy_(hw_model.embed.tokens.weight)
        self.wpe.weight.copy_(hw_model.embed.positions.weight)
        for mine, theirs in zip(self.blocks, hw_model.blocks, strict=True):
            a = theirs.self_attn
            mine.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mine.qkv.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            mine.proj.load_state_dict(a.out_proj.state_dict())
            mine.ln1.load_state_dict(theirs.attn_norm.state_dict())
            mine.ln2.load_state_dict(theirs.ff_norm.state_dict())
            mine.up.load_state_dict(theirs.ff.up.state_dict())
            mine.down.load_state_dict(theirs.ff.down.state_dict())
        self.ln_f.load_state_dict(hw_model.final_norm.state_dict())


def data(context=CPU_SHAPE.ctx):
    try:
        task = make_task("austen", context=context)
        label = "Jane Austen's six novels (r-cran-janeaustenr), char-level"
    except CorpusMissingError as exc:
        print(f"# {exc}\n# FALLING BACK to a synthetic text: the numbers are NOT on Austen",
              flush=True)
        words = ["the", "of", "and", "to", "a", "in", "her", "was", "she", "not", "be", "had"]
        g = torch.Generator().manual_seed(0)
        text = " ".join(words[i] for i in torch.randint(0, len(words), (400_000,), generator=g))
        task = TextLMTask(text, name="synthetic", context=context)
        label = "SYNTHETIC word salad (Austen corpus missing)"
    return task, label


def make(kind, vocab, precision, batch, s: Shape = CPU_SHAPE, device=CPU):
    torch.manual_seed(0)
    hw_model = build(LMConfig(vocab_size=vocab, d_model=s.d, num_heads=s.heads,
                              num_layers=s.layers, d_ff=s.ff, max_len=s.ctx, dropout=0.0,
                              activation="gelu", positional="learned",
                              tie_embeddings=True)).train()
    model = hw_model
    if kind == "plain":
        model = PlainGPT(vocab, s).train()
        model.copy_from(hw_model)
    model = model.to(device)
    # both models: the fused AdamW that `headwise train` uses (plain torch has it too)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    x, y = batch.inputs.to(device), batch.labels.to(device)
    read = device.type == "cpu"  # on a GPU neither step reads its loss back (a sync)

    def logits():
        out = model(x)
        return out[0] if isinstance(out, tuple) else out

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            z = logits()
        loss = F.cross_entropy(z.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item() if read else loss.detach()
    step.logits = logits
    return model, step


def with_three_gemms(step):
    """``step`` with headwise's self-attention projecting q, k and v as three GEMMs (what it
    runs off the CPU without autograd) instead of one over ``cat(W_q, W_k, W_v)`` (its rule
    while training, :func:`headwise.fast.joint_qkv`): that choice measured on the device."""
    import headwise.layers as layers
    rule = layers.joint_qkv

    def run():
        layers.joint_qkv = lambda *tensors: False
        try:
            return step()
        finally:
            layers.joint_qkv = rule
    run.logits = step.logits
    return run


def gpu_rows(precision, batch, s, device, quick) -> list[dict]:
    """headwise, headwise with three QKV GEMMs, plain: ms/step, speed vs plain, kernels and syncs
    per step, and the fp32 logits gap headwise vs plain (same weights)."""
    steps = {kind: make(kind, GPU_VOCAB, precision, batch, s, device)[1]
             for kind in ("headwise", "plain")}
    steps["headwise, three QKV GEMMs"] = with_three_gemms(
        make("headwise", GPU_VOCAB, precision, batch, s, device)[1])
    with torch.no_grad():
        a, b = (steps[k].logits().float() for k in ("headwise", "plain"))
        gap = ((a - b).abs().max() / b.abs().max()).item()
    del a, b
    per_step = {k: G.counts(fn, device) for k, fn in steps.items()}
    times = G.interleave(steps, device, k=5, warmup=2, min_rounds=5,
                         max_rounds=12 if quick else 40, budget_s=12.0 if quick else 40.0)
    return [{"model": f"{k} {precision}", "ms/step": C.median_ms(times[k]),
             "tokens/s": s.batch * s.ctx / statistics.median(times[k]),
             "speed vs plain": C.ratio(times["plain"], times[k]),
             "kernels/step": per_step[k].get("kernels", "-"),
             "host syncs/step": per_step[k].get("syncs", "-"),
             "logits gap vs plain (fp32, rel)": f"{gap:.1e}" if k != "plain" else "-",
             "rounds": len(times[k])} for k in steps]


def gpu_main(args, device):
    """The issue's training row on a GPU (see the module docstring)."""
    G.setup(device)
    s = TINY_SHAPE if args.plumbing else GPU_SHAPE
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, GPU_VOCAB, (s.batch, s.ctx + 1), generator=g)
    batch = LMBatch(tokens[:, :-1], tokens[:, 1:], torch.full((s.batch,), s.ctx),
                    torch.ones(s.batch, s.ctx, dtype=torch.bool))
    print(f"# {G.describe(device)}", flush=True)
    print(f"# {'tiny plumbing' if args.plumbing else 'GPT-2-small'} shape: {s.layers} layers, "
          f"d_model {s.d}, {s.heads} heads, d_ff {s.ff}, vocab {GPU_VOCAB} (random tokens), "
          f"batch {s.batch}x{s.ctx}, learned positions, GELU, tied embeddings, fused AdamW; "
          f"5 steps per measurement", flush=True)
    rows = []
    for precision in ["bf16"] if args.quick else ["bf16", "fp32"]:
        rows += gpu_rows(precision, batch, s, device, args.quick)
        print(C.table(rows, list(rows[0])), file=sys.stderr, flush=True)  # progress
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("\n## Training step, headwise vs plain (nanoGPT style, same weights)\n")
    print(C.table(rows, list(rows[0])))
    hw_bf16 = next(r for r in rows if r["model"] == "headwise bf16")["speed vs plain"]
    print(f"\ngoal headwise bf16 >= 0.98x plain bf16: {hw_bf16:.3f}x "
          f"{'PASS' if hw_bf16 >= 0.98 else 'FAIL'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of timed rounds")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="also print a torch.profiler table of one fp32 step of each model")
    ap.add_argument("--device", default="cpu", help="cpu (the CPU tables) or cuda (the GPU row)")
    ap.add_argument("--quick", action="store_true", help="--device cuda: bf16 only, few rounds")
    ap.add_argument("--plumbing", action="store_true",
                    help="the --device table at a tiny size, on any device (checks the script)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type != "cpu" or args.plumbing:
        return gpu_main(args, device)
    BATCH, CTX = CPU_SHAPE.batch, CPU_SHAPE.ctx
    task, label = data()
    batch = task.batch(0, BATCH)
    vocab = task.tokenizer.vocab_size
    steps, first = {}, {}
    for kind in ("headwise", "plain"):
        for precision in ("fp32", "bf16"):
            model, step = make(kind, vocab, precision, batch)
            first[(kind, precision)] = step()
            steps[f"{kind} {precision}"] = step
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# data: {label}; vocab {vocab}; batch {BATCH}x{CTX}; {n_params / 1e6:.2f}M params; "
          f"{torch.get_num_threads()} threads; torch {torch.__version__}", flush=True)
    print("# first-step loss (same weights, same batch): "
          + ", ".join(f"{k[0]} {k[1]} {v:.5f}" for k, v in first.items()), flush=True)
    times = C.interleave(steps, warmup=1, min_rounds=5, max_rounds=60, budget_s=args.budget)
    tok = BATCH * CTX
    rows = []
    for name, ts in times.items():
        rows.append({"model": name, "ms/step": C.median_ms(ts),
                     "tokens/s": tok / statistics.median(ts),
                     "vs plain fp32": C.ratio(times["plain fp32"], ts),
                     "vs headwise fp32": C.ratio(times["headwise fp32"], ts),
                     "rounds": len(ts)})
    print(C.table(rows, ["model", "ms/step", "tokens/s", "vs plain fp32", "vs headwise fp32",
                         "rounds"]))
    hw32 = C.ratio(times["plain fp32"], times["headwise fp32"])
    bf = C.ratio(times["headwise fp32"], times["headwise bf16"])
    print(f"\ngoal headwise fp32 >= 0.95x plain fp32: {hw32:.3f}x "
          f"{'PASS' if hw32 >= 0.95 else 'FAIL'}")
    print(f"goal headwise bf16 >= 2.3x headwise fp32: {bf:.2f}x {'PASS' if bf >= 2.3 else 'FAIL'}")
    loss_gap = abs(first[("headwise", "fp32")] - first[("plain", "fp32")])
    print(f"first-step fp32 loss gap headwise vs plain: {loss_gap:.2e} "
          f"{'(same model)' if loss_gap < 1e-4 else '(MODELS DIFFER)'}")
    if args.profile:
        from torch.profiler import profile
        for name in ("headwise fp32", "plain fp32"):
            with profile() as prof:
                steps[name]()
            print(f"\n## {name}\n" + prof.key_averages().table(sort_by="self_cpu_time_total",
                                                             row_limit=15))


if __name__ == "__main__":
    main()
