"""Training throughput: headwise TransformerLM vs the same model hand-written in plain torch.nn
+ F.scaled_dot_product_attention (nanoGPT style), char-level LM on Jane Austen's novels.

Model (both): 6 layers, 6 heads, d_model 384, d_ff 1536, context 256, batch 8, pre-norm, learned
positions, exact GELU, biases, tied embeddings, no dropout. One step = forward + backward +
fused AdamW (as `headwise train` runs it) on a real batch of the Austen corpus (`make corpora`; without it, a clearly-labelled
synthetic text). The plain model gets headwise's initial weights, so both start from the same
loss (checked). Candidates run interleaved in one process; medians of per-round ratios.

    python benchmarks/train.py [--budget 120] [--threads 2] [--profile]

Goals: headwise fp32 >= 0.95x plain fp32; headwise bf16 autocast >= 2.3x headwise fp32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from headwise.data import CorpusMissingError, TextLMTask, make_task  # noqa: E402
from headwise.models import LMConfig, build  # noqa: E402

LAYERS, HEADS, D, FF, CTX, BATCH = 6, 6, 384, 1536, 256, 8


class PlainBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class PlainGPT(nn.Module):
    """nanoGPT's model with headwise's choices (biases, exact GELU): the anchor."""

    def __init__(self, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(PlainBlock() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
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


def data():
    try:
        task = make_task("austen", context=CTX)
        label = "Jane Austen's six novels (r-cran-janeaustenr), char-level"
    except CorpusMissingError as exc:
        print(f"# {exc}\n# FALLING BACK to a synthetic text: the numbers are NOT on Austen",
              flush=True)
        words = ["the", "of", "and", "to", "a", "in", "her", "was", "she", "not", "be", "had"]
        g = torch.Generator().manual_seed(0)
        text = " ".join(words[i] for i in torch.randint(0, len(words), (400_000,), generator=g))
        task = TextLMTask(text, name="synthetic", context=CTX)
        label = "SYNTHETIC word salad (Austen corpus missing)"
    return task, label


def make(kind, vocab, precision, batch):
    torch.manual_seed(0)
    hw_model = build(LMConfig(vocab_size=vocab, d_model=D, num_heads=HEADS, num_layers=LAYERS,
                              d_ff=FF, max_len=CTX, dropout=0.0, activation="gelu",
                              positional="learned", tie_embeddings=True)).train()
    model = hw_model
    if kind == "plain":
        model = PlainGPT(vocab).train()
        model.copy_from(hw_model)
    # both models: the fused AdamW that `headwise train` uses (plain torch has it too)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    x, y = batch.inputs, batch.labels

    def logits():
        out = model(x)
        return out[0] if isinstance(out, tuple) else out

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            z = logits()
        loss = F.cross_entropy(z.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return model, step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of timed rounds")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="also print a torch.profiler table of one fp32 step of each model")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
