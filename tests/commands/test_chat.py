"""``headwise chat`` answers a factual question correctly (greedy), streams it, reports tok/s,
and turns bad arguments into one-line errors."""

from __future__ import annotations

import re

import pytest
import torch

from headwise.cli import main


def test_chat_answers_the_capital_of_france(smollm2_path, capsys):
    assert main(["chat", "What is the capital of France?", "--max-new-tokens", "24",
                 "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out
    assert "tok/s" in err and "new tokens" in err


@pytest.mark.parametrize("flag", ["--bf16", "--q4"])
def test_bf16_and_q4_print_their_speed_beside_the_roof(smollm2_path, capsys, flag):
    """The second line: the roof in tok/s (bytes per token, the weights' and the KV cache's at
    the reply's mean length, over the read bandwidth measured then), the fraction of it the
    decoding reached, and the kernels' path."""
    import torch

    from headwise.fast import native, roof
    from headwise.pretrained import load_gguf

    assert main(["chat", "What is the capital of France?", "--max-new-tokens", "12",
                 "--threads", "1", flag]) == 0
    err = capsys.readouterr().err
    found = re.search(r"\[roof: ([\d.]+) tok/s \((\d+) MiB read per token, weights and KV cache, "
                      r"at ([\d.]+) GB/s, 1 threads\); decoding ran at (\d+)% of it on (.+)\]", err)
    assert found, err
    rate, mib, gbs, percent, kernels = found.groups()
    assert float(rate) == pytest.approx(float(gbs) * 1e9 / (int(mib) * 2**20), rel=0.01)
    prompt, new = map(int, re.search(r"\[(\d+) prompt tokens, (\d+) new tokens", err).groups())
    model = load_gguf(smollm2_path, dtype=torch.bfloat16 if flag == "--bf16" else torch.float32,
                      q4=flag == "--q4").model
    read = roof.step_bytes(model) + roof.cache_bytes(model, 1, prompt + max(1, new // 2))
    assert int(mib) == round(read / 2**20)
    # where the kernels decline (no AVX2 on the CPU or in torch's build), say whose ran and why
    want = (f"headwise's {native.isa()} kernels" if native.isa() else
            f"torch's kernels ({native.status()})")
    assert 0 < int(percent) and kernels == want


@pytest.mark.parametrize("argv, message", [
    (["--top-p", "0.9"], "--top-p samples; give --temperature"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--gguf", "/nonexistent/model.gguf"], "model.gguf does not exist"),
    (["--max-new-tokens", "9000"], "context is 8192 tokens: ask for at most"),
])
def test_bad_arguments_are_one_line_errors(smollm2_path, capsys, argv, message):
    assert main(["chat", "Hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_view_writes_prompt_and_answer_in_one_head_view(tmp_path, capsys):
    pytest.importorskip("gguf")
    pytest.importorskip("jinja2")
    from tests.pretrained import tiny_gguf
    from tests.viz.test_head_view import read_page
    path = tiny_gguf.write(tmp_path / "tiny.gguf", heads=4, kv_heads=2)
    out = tmp_path / "answer.html"
    assert main(["chat", "hi", "--gguf", str(path), "--max-new-tokens", "4", "--view",
                 str(out)]) == 0
    err = capsys.readouterr().err
    n_prompt, n_answer = map(int, re.search(r"prompt \+ answer \((\d+) \+ (\d+) tokens\)",
                                            err).groups())
    meta = read_page(out)[1]
    assert meta["kinds"]["decoder_self"]["kvHeads"] == 2
    assert meta["tokens"]["tgt"][0][0] == "<|im_start|>"  # the chat template's prompt
    assert len(meta["tokens"]["tgt"][0]) == n_prompt + n_answer
    assert meta["generatedStart"] == ([n_prompt] if n_answer else None)


def test_view_must_be_an_html_file(capsys):
    assert main(["chat", "hi", "--view", "answer.png"]) == 2
    assert "expected a .html file" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "nan"], "--temperature must be > 0 and finite, got nan; omit --temperature"),
    (["--temperature", "0"], "--temperature must be > 0 and finite, got 0.0"),
    (["--temperature", "inf"], "--temperature must be > 0 and finite, got inf"),
    (["--temperature", "0.7", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--temperature", "0.7", "--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    # 100,000 threads under a memory limit failed mid-load as a "truncated model file"
    (["--threads", "100000"], "--threads must be an int in [1, "),
    (["--threads", "0"], "--threads must be an int in [1, "),
    (["--device", "bogus"], "--device 'bogus' is not a torch device; use auto, cpu, cuda"),
    (["--device", "meta"], "--device meta: headwise runs on cpu or cuda, not 'meta'"),
    (["--q4", "--device", "cuda"], "--q4 runs CPU 4-bit kernels, not on --device cuda; "
     "drop --q4" if torch.cuda.is_available() else "--device cuda: CUDA is not available here"),
    (["--compile"], "--compile replays the decoding step as a CUDA graph; got --device cpu: "
     "add --device cuda, or drop --compile"),
])
def test_bad_sampling_and_thread_flags_are_refused_before_the_model_loads(monkeypatch, capsys, argv,
                                                                message):
    """--temperature nan and --top-p 1.5 were refused only after the model had loaded (5-85 s),
    in the Python spelling (strategy='greedy'); now first, in the flags' own spelling."""
    from headwise import pretrained

    def no_load(*args, **kwargs):
        raise AssertionError("the model was read before the flags were checked")

    monkeypatch.setattr(pretrained, "read_gguf", no_load)
    monkeypatch.setattr(pretrained, "find_smollm2", no_load)
    assert main(["chat", "Hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "strategy=" not in err and "Traceback" not in err


@pytest.mark.parametrize("prompt", ["", "   ", "\n"])
def test_an_empty_prompt_is_refused_before_the_model_loads(monkeypatch, capsys, prompt):
    """chat "" loaded the model and answered an empty message; view refuses an empty text."""
    from headwise import pretrained

    monkeypatch.setattr(pretrained, "read_gguf", lambda *a, **k: pytest.fail("model read"))
    monkeypatch.setattr(pretrained, "find_smollm2", lambda *a, **k: pytest.fail("model found"))
    assert main(["chat", prompt]) == 2
    err = capsys.readouterr().err
    assert "the prompt is empty; pass a message" in err and err.count("\n") == 1


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("device, flags", [("cpu", []), pytest.param("cuda", [], marks=_CUDA),
                                           pytest.param("cuda", ["--compile"], marks=_CUDA)])
def test_device_puts_the_model_there_and_answers_as_on_the_cpu(tmp_path, capsys, monkeypatch,
                                                                device, flags):
    """chat --device (the README's commands all take one): the model is loaded on it, and the
    greedy reply is the CPU's (a tiny random GGUF; greedy tokens only differ where two logits
    tie within float32 rounding, which random weights make unlikely)."""
    pytest.importorskip("gguf")
    from headwise import pretrained
    from tests.pretrained import tiny_gguf
    path = tiny_gguf.write(tmp_path / "tiny.gguf", heads=4, kv_heads=2)
    argv = ["chat", "hi", "--gguf", str(path), "--max-new-tokens", "6"]
    assert main(argv) == 0
    on_cpu = capsys.readouterr().out
    seen = []
    load = pretrained.load_gguf

    def spy(*args, **kwargs):
        chat = load(*args, **kwargs)
        seen.append(chat.model.lm_head.weight.device)
        return chat

    monkeypatch.setattr(pretrained, "load_gguf", spy)
    assert main([*argv, "--device", device, *flags]) == 0
    assert [d.type for d in seen] == [device]
    assert capsys.readouterr().out == on_cpu
