"""The tokenizer and chat template a GGUF file carries, without transformers.

A GGUF has no ``tokenizer.json``: llama.cpp stores the vocabulary, the merges, each token's type
(1 normal, 3 control, 4 user-defined, 6 byte) and the chat template as metadata. For a
``tokenizer.ggml.model == "gpt2"`` file (byte-level BPE, as SmolLM2) this builds the same
``tokenizers`` pipeline as transformers' GGUF converter: BPE over GPT-2's byte alphabet, the
GPT-2 split regex (``ByteLevel``), control tokens matched whole as special tokens.

The chat template is rendered with jinja2 in a sandbox, exactly as transformers'
``apply_chat_template`` renders it (``trim_blocks``, ``lstrip_blocks``), so the prompt ids match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from headwise.errors import CheckpointError

__all__ = ["ChatModel", "ChatTokenizer", "Message", "TextStream"]

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

_CONTROL, _USER_DEFINED = 3, 4
# Special-token spellings a template may write as literals: ChatML's <|im_start|>, <|eot_id|>...
_SPECIAL_LITERAL = re.compile(r"<\|[^<>|\s]+\|>")


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (``bytes_to_unicode``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    extra = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


class ChatTokenizer:
    """Byte-level BPE plus a chat template, built from GGUF metadata.

    ``encode(str) -> list[int]`` (special tokens in the text are matched whole),
    ``decode(ids) -> str`` (special tokens dropped), ``tokens(ids)`` (display strings),
    ``chat(messages) -> list[int]`` (the template rendered, then encoded).
    """

    def __init__(self, tokenizer, *, specials: Sequence[str], bos_id: int | None,
                 eos_id: int | None, chat_template: str | None):
        self.tokenizer = tokenizer
        self.specials = tuple(specials)
        self.bos_id, self.eos_id = bos_id, eos_id
        self.chat_template = chat_template
        if chat_template is not None:
            self._check_template(chat_template)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], source: str = "GGUF") -> ChatTokenizer:
        """From GGUF metadata (``tokenizer.ggml.*`` keys, ``tokenizer.chat_template``)."""
        from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
        from tokenizers.models import BPE

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"{source}: tokenizer.ggml.model is {kind!r}; headwise builds "
                                  "byte-level BPE tokenizers ('gpt2') only")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in meta:
                raise CheckpointError(f"{source}: no {key} in the metadata; a byte-level BPE "
                                      "needs the vocabulary and its merges")
        spelling = byte_alphabet()
        alphabet = set(spelling.values())
        tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
                  for t in meta["tokenizer.ggml.tokens"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = _merges(meta["tokenizer.ggml.merges"], vocab, source)
        bpe = Tokenizer(BPE(vocab=vocab, merges=merges,
                            continuing_subword_prefix="", end_of_word_suffix="",
                            fuse_unk=False, dropout=None))
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        types = list(meta.get("tokenizer.ggml.token_type") or ())
        # Control tokens written outside the byte alphabet are llama.cpp mislabels (adding them
        # would grow the vocabulary past the model's); transformers skips them too.
        specials = [t for t, k in zip(tokens, types, strict=False)
                    if k == _CONTROL and set(t) <= alphabet]
        bpe.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in specials])
        bpe.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types, strict=False) if k == _USER_DEFINED])
        return cls(bpe, specials=specials, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                   eos_id=meta.get("tokenizer.ggml.eos_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"))

    # ---------------------------------------------------------------------------- text
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable token strings: bytes decoded (``Ġthe`` -> `` the``), specials as written."""
        return [self.decode([i], skip_special=False) for i in ids]

    def stream(self) -> TextStream:
        """An incremental decoder: feed ids one at a time, get the new text."""
        return TextStream(self)

    # ---------------------------------------------------------------------------- chat
    def render(self, messages: Sequence[Message] | str, *, system: str | None = None,
               add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages`` (a str is one user message; ``system``
        prepends a system message, else the template's default applies)."""
        if self.chat_template is None:
            raise CheckpointError("this GGUF has no tokenizer.chat_template; encode plain text "
                                  "with encode() instead")
        messages = _as_messages(messages, system)
        try:
            return _compiled(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self._token(self.bos_id), eos_token=self._token(self.eos_id))
        except _TemplateError as exc:
            raise ValueError(f"chat template failed on these messages: {exc}") from None

    def chat(self, messages: Sequence[Message] | str, *, system: str | None = None,
             add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for ``messages`` (the rendered template, special tokens whole)."""
        return self.encode(self.render(messages, system=system,
                                       add_generation_prompt=add_generation_prompt))

    def _token(self, index: int | None) -> str:
        return "" if index is None else self.tokenizer.id_to_token(int(index)) or ""

    def _check_template(self, template: str) -> None:
        _compiled(template)
        unknown = sorted(set(_SPECIAL_LITERAL.findall(template)) - set(self.specials))
        if unknown:
            raise CheckpointError(
                f"chat template writes {unknown}, which the vocabulary does not have as special "
                f"tokens (it has {list(self.specials)}); the prompt would be cut into bytes: "
                "fix tokenizer.chat_template or pass one that matches this vocabulary")


class TextStream:
    """Decode a growing list of ids, returning only the newly completed text each time: a
    character split over several byte tokens is held back until it is whole (or until
    :meth:`flush`, at the end, shows whatever is left)."""

    def __init__(self, tokenizer: ChatTokenizer):
        self.tokenizer, self.ids, self.shown = tokenizer, [], 0

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence so far
            return ""
        new, self.shown = text[self.shown:], len(text)
        return new

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids)
        new, self.shown = text[self.shown:], len(text)
        return new


def check_length(n: int, max_new_tokens: int, context: int, name: str) -> None:
    """``ValueError`` unless a prompt of ``n`` tokens plus ``max_new_tokens`` fit ``context``."""
    if n + max_new_tokens > context:
        fix = (f"shorten the prompt by {n - context + 1} tokens" if n >= context else
               f"ask for at most {context - n} new tokens")
        raise ValueError(f"the prompt is {n} tokens and {max_new_tokens} new tokens were asked "
                         f"for, but {name}'s context is {context} tokens: {fix}")


def _as_messages(messages, system: str | None) -> list[dict[str, str]]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, Sequence) or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise TypeError("messages must be a str or a list of {'role': str, 'content': str}")
    out = [dict(m) for m in messages]
    if system is not None:
        out.insert(0, {"role": "system", "content": system})
    return out


try:  # jinja2 ships with the 'pretrained' extra
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover - only without the extra
    _TemplateError = Exception


@cache
def _compiled(template: str):
    """The template compiled in jinja2's immutable sandbox, as transformers compiles it."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise _TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise CheckpointError(f"tokenizer.chat_template is not a valid jinja2 template: "
                              f"{exc}") from None



# ------------------------------------------------------------------------------ the model
@dataclass
class ChatModel:
    """A chat model loaded from a GGUF: ``model`` (a headwise
    :class:`~headwise.models.TransformerLM`), ``tokenizer`` (:class:`ChatTokenizer`),
    ``config`` (what the file said) and ``path``. :func:`headwise.pretrained.load_gguf` makes
    one."""

    model: Any
    tokenizer: ChatTokenizer
    config: Any
    path: Any

    @property
    def context_length(self) -> int:
        return self.model.config.max_len

    def prompt(self, messages: Sequence[Message] | str, *, system: str | None = None,
               max_new_tokens: int = 0) -> torch.Tensor:
        """``(1, n)`` prompt ids for ``messages`` with the chat template applied; raises
        ``ValueError`` when the prompt and ``max_new_tokens`` do not fit the context."""
        ids = self.tokenizer.chat(messages, system=system)
        self.check_length(len(ids), max_new_tokens)
        device = self.model.lm_head.weight.device
        return torch.tensor([ids], dtype=torch.long, device=device)

    def check_length(self, n: int, max_new_tokens: int = 0) -> None:
        """Raise ``ValueError`` unless ``n`` prompt tokens plus ``max_new_tokens`` fit."""
        check_length(n, max_new_tokens, self.context_length, self.config.name)

    def reply(self, messages: Sequence[Message] | str, *, system: str | None = None,
              max_new_tokens: int = 256, temperature: float | None = None,
              top_p: float | None = None, seed: int | None = None,
              on_text: Callable[[str], None] | None = None,
              compile: bool = False, kv_plan=None) -> tuple[list[int], list[int]]:
        """Generate the assistant's answer (greedy unless ``temperature`` is given), calling
        ``on_text`` with each new piece of text as it is decoded. Returns ``(prompt ids,
        answer ids)``; the answer ends at ``<|im_end|>`` (not included) or after
        ``max_new_tokens``. ``compile``: replay the decoding step as a CUDA graph
        (:func:`headwise.generate`; the model on a GPU). ``kv_plan``: decode with that
        :class:`~headwise.kvplan.KVPlan`'s head-wise cache."""
        from headwise.decode.generation import generate

        prompt = self.prompt(messages, system=system, max_new_tokens=max_new_tokens)
        stream, answer, eos = self.tokenizer.stream(), [], self.tokenizer.eos_id

        ended = []

        def on_token(ids: torch.Tensor) -> None:
            token = int(ids[0])
            if ended or token == eos:  # the answer ends at eos (on a GPU pad may follow)
                ended.append(token)
            else:
                answer.append(token)
                if on_text is not None and (text := stream.push(token)):
                    on_text(text)

        sample = temperature is not None
        generate(self.model, prompt, max_new_tokens=max_new_tokens,
                 strategy="sample" if sample else "greedy",
                 temperature=temperature if sample else 1.0, top_p=top_p, seed=seed,
                 eos_id=eos, on_token=on_token, compile=compile, kv_plan=kv_plan)
        if on_text is not None and (rest := stream.flush()):
            on_text(rest)
        return prompt[0].tolist(), answer


def _merges(lines, vocab: Mapping[str, int], source: str) -> list[tuple[str, str]]:
    """The BPE merges ``"a b"`` as pairs, each part and their join in ``vocab``; else one
    CheckpointError naming the merge (the tokenizers library says only 'Error while
    initializing BPE')."""
    merges = []
    for n, line in enumerate(lines):
        pair = tuple(str(line).split(" ", 1))
        missing = ([p for p in (*pair, "".join(pair)) if p not in vocab] if len(pair) == 2
                   else [str(line)])
        if missing:
            raise CheckpointError(f"{source}: BPE merge {n} ({line!r}) names {missing[0]!r}, "
                                  "which is not in the file's vocabulary (tokenizer.ggml."
                                  "tokens); the tokenizer is inconsistent: re-download or "
                                  "re-convert the file")
        merges.append(pair)
    return merges
