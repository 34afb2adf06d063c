"""Building what ``headwise trace`` runs: a fresh model of the requested sizes, or a
checkpoint, with random inputs (padding, target padding, weights requests as asked)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands._common import parse_device

if TYPE_CHECKING:
    import torch

WEIGHT_KINDS = {"encoder": ("encoder_self",), "decoder": ("decoder_self", "cross"),
                "transformer": ("encoder_self", "decoder_self", "cross"),
                "lm": ("decoder_self",)}


def build(args) -> tuple[torch.nn.Module, tuple, dict]:
    """The model of ``args`` and its inputs: ``(model, positional args, keyword args)``."""
    import torch
    m = args.embed_dim or 512
    h = args.heads or 8
    backend = args.backend or "auto"
    b, n = args.batch, args.seq
    nk = args.kv_seq or n
    device = parse_device(args.device)
    if args.kind == "mha":
        import headwise as hw

        model = hw.MultiHeadAttention(m, h, head_dim=args.head_dim, kdim=args.kdim,
                                      vdim=args.vdim, num_kv_heads=args.kv_heads,
                                      out_dim=args.out_dim, dropout=args.dropout,
                                      backend=backend).to(device).eval()
        query = torch.randn(b, n, m, device=device)
        cross = args.kdim or args.vdim or nk != n
        kwargs = {"causal": True} if args.causal else {}
        if args.pad:
            kwargs["valid_lens"] = _lengths(b, nk, args.pad, device)
        if args.weights:
            kwargs["return_weights"] = True
        if not cross:
            return model, (query,), kwargs
        key = torch.randn(b, nk, model.kdim, device=device)
        value = torch.randn(b, nk, model.vdim, device=device)
        return model, (query, key, value), kwargs

    from headwise.layers import AttentionConfig
    from headwise.models import LMConfig, TransformerConfig
    from headwise.models import build as build_model

    common = dict(d_model=m, num_heads=h, num_layers=args.layers or 6, d_ff=args.ff or 4 * m,
                  dropout=args.dropout, attention=AttentionConfig(
                      num_kv_heads=args.kv_heads, head_dim=args.head_dim, backend=backend))
    vocab = args.vocab or 1000
    if args.kind == "lm":
        config = LMConfig(vocab_size=vocab, max_len=max(2048, n), **common)
        model = build_model(config)
    else:
        from headwise.models import Decoder, Encoder

        config = TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab,
                                   max_len=max(512, n, nk), **common)
        model = {"encoder": Encoder, "decoder": Decoder, "transformer": build_model}[
            args.kind](config)
    model = model.to(device).eval()
    return model, *_model_inputs(args.kind, model, config, args, vocab, device)


def _model_inputs(kind, model, config, args, vocab, device) -> tuple[tuple, dict]:
    import torch
    b, n = args.batch, args.seq
    nk = args.kv_seq or n
    ids = lambda length: torch.randint(1, vocab, (b, length), device=device)  # noqa: E731
    kwargs: dict = {}
    weights = _weights(args.weights, kind)
    if weights is not None:
        kwargs["return_weights"] = weights
    lens = _lengths(b, nk, args.pad, device) if args.pad else None
    if kind == "lm":
        return (ids(n),), kwargs
    if kind == "encoder":
        lens = _lengths(b, n, args.pad, device) if args.pad else None
        return (ids(n),), {**kwargs, **({"src_valid_lens": lens} if lens is not None else {})}
    if lens is not None:
        kwargs["src_valid_lens"] = lens
    if args.tgt_pad:  # the decoder's self-attention mask: causal AND target padding
        kwargs["tgt_valid_lens"] = _lengths(b, n, args.tgt_pad, device)
    if kind == "decoder":
        memory = torch.randn(b, nk, config.d_model, device=device)
        return (ids(n), memory), kwargs
    return (ids(nk), ids(n)), kwargs


def _lengths(b: int, n: int, pad: int, device) -> torch.Tensor:
    """Every example full except the last, whose final ``pad`` positions are padding."""
    import torch
    lens = torch.full((b,), n, dtype=torch.long, device=device)
    lens[-1] = n - pad
    return lens


def _weights(spec: str | None, kind: str):
    """``--weights`` to a model's ``return_weights``: True, a kind, or {kind: [layers]}."""
    if spec is None:
        return None
    if spec == "all":
        return True
    kinds = WEIGHT_KINDS[kind]
    name, _, layers = spec.partition(":")
    if name not in kinds:
        raise ValueError(f"--weights {spec!r}: unknown kind {name!r}; this model has "
                         f"{', '.join(kinds)} (or give --weights with no value for all)")
    if not layers:
        return {name}
    try:
        return {name: [int(x) for x in layers.split(",")]}
    except ValueError:
        raise ValueError(f"--weights {spec!r}: layers must be integers, e.g. {name}:0,2") from None


_FIXED_SIZES = ("embed_dim", "heads", "head_dim", "kv_heads", "ff", "vocab", "layers")
SMOLLM2_TEXT = "The capital of France is"


def _refuse_sizes(args, source: str) -> None:
    for name in _FIXED_SIZES:
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} cannot be combined with {source}: "
                             f"the {source.lstrip('-')} fixes the sizes")


def from_gguf(args) -> tuple[torch.nn.Module, tuple, dict]:
    """``--model smollm2`` (or ``--gguf FILE``): the pretrained decoder on ``--text``."""
    import torch

    from headwise.commands._decoder_view import load

    _refuse_sizes(args, "--model")
    device = parse_device(args.device)
    chat = load(args.gguf, device)
    text = SMOLLM2_TEXT if args.text is None else args.text
    ids = chat.tokenizer.encode(text)
    if not ids:
        raise ValueError("--text is empty after tokenization")
    chat.check_length(len(ids))
    c = chat.config
    print(f"{c.name}: {c.num_layers} layers, {c.num_heads} query heads sharing "
          f"{c.num_kv_heads} key/value heads; text {text!r} -> {len(ids)} "
          f"token{'s' * (len(ids) != 1)} "
          f"{chat.tokenizer.tokens(ids)}")
    args.seq, args.batch = len(ids), 1
    kwargs = {}
    weights = _weights(args.weights, "lm")
    if weights is not None:
        kwargs["return_weights"] = weights
    return chat.model, (torch.tensor([ids], device=device),), kwargs


def from_checkpoint(args) -> tuple[torch.nn.Module, tuple, dict]:
    import torch

    from headwise import checkpoint

    _refuse_sizes(args, "--checkpoint")
    folder = Path(args.checkpoint)
    loaded = checkpoint.load(folder, device=args.device)
    model, config = loaded.model.eval(), loaded.config
    kind = config.kind
    if args.backend:
        from headwise.attend import check_backend

        check_backend(args.backend, "--backend")
        for sub in model.modules():
            if hasattr(sub, "backend") and hasattr(sub, "num_heads"):
                sub.backend = args.backend
    device = parse_device(args.device)
    vocab = getattr(config, "vocab_size", None) or config.tgt_vocab_size
    if args.text is not None:
        if loaded.tokenizer is None:
            raise ValueError(f"--text: checkpoint {folder} has no tokenizer; trace random ids "
                             "(omit --text)")
        ids = torch.tensor([loaded.tokenizer.encode(args.text)], device=device)
        if ids.shape[1] == 0:
            raise ValueError("--text is empty after tokenization")
        shown = (loaded.tokenizer.tokens(ids[0].tolist()) if hasattr(loaded.tokenizer, "tokens")
                 else ids[0].tolist())
        print(f"{folder}: {kind} checkpoint; text {args.text!r} -> {ids.shape[1]} tokens "
              f"{shown}")
        args.seq = ids.shape[1]
        args.batch = 1
        if kind == "lm":
            return model, (ids,), _model_inputs("lm", model, config, args, vocab, device)[1]
        args.kv_seq = ids.shape[1]
        _, kwargs = _model_inputs(kind, model, config, args, vocab, device)
        return model, (ids, ids), kwargs
    if kind == "transformer":
        vocab = min(config.src_vocab_size, config.tgt_vocab_size)
    return model, *_model_inputs(kind, model, config, args, vocab, device)
