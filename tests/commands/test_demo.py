"""The demo's model learns the reversal's anti-diagonal: after a shorter run, some head of the
last decoder layer's cross-attention puts its largest weight on the mirrored source position
for >= 90% of target positions; and `headwise demo` writes its report."""

import dataclasses
import json

import torch

import headwise as hw
from headwise import HeadScores
from headwise.analysis.removal import seq2seq_metrics
from headwise.cli import main
from headwise.commands.demo import demo_config, mirror_scores
from headwise.data import make_task
from headwise.train import train


def test_mirror_scores_of_a_perfect_anti_diagonal():
    class Mirror(torch.nn.Module):  # attends exactly to j = n - 1 - i
        def forward(self, src, tgt, *, src_valid_lens, return_weights):
            b, i = tgt.shape
            w = torch.zeros(1, b, 2, i, src.shape[1])
            for k, n in enumerate(src_valid_lens.tolist()):
                for t in range(n):
                    w[0, k, 1, t, n - 1 - t] = 1.0
                    w[0, k, 0, t, t] = 1.0
            return None, {"cross": list(w)}
    batch = make_task("reverse").eval_set(20)
    scores = mirror_scores(Mirror(), batch)
    assert scores.shape == (1, 2) and scores[0, 1] == 1.0 and scores[0, 0] < 0.2


def test_last_decoder_layer_learns_the_anti_diagonal():
    cfg = dataclasses.replace(demo_config(steps=300, seed=0, precision="fp32", threads=1),
                              max_len=12, warmup=50, eval_size=300, eval_every=0)
    result = train(cfg, progress=False)
    assert result.metrics["exact_match"] > 0.95
    batch = result.task.eval_set(300)
    scores = mirror_scores(result.model, batch)
    last = scores[-1]
    assert last.max() >= 0.90, scores
    assert scores[0].max() < 0.5  # the first layer does not do the lookup: the test can fail


def test_demo_writes_its_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich must not wrap the (long, under xdist) path
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "30", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "held-out exact match:" in text and f"report: {out.resolve()}" in text
    for name in ("checkpoint/model.safetensors", "metrics.json", "demo.json", "head_view.html",
                 "cross_attention.png", "trace.txt", "trace.md", "README.md"):
        assert (out / name).is_file(), name
    demo = json.loads((out / "demo.json").read_text())
    assert len(demo["mirror_scores"]) == 2 and len(demo["examples"]) == 6
    page = (out / "head_view.html").read_text()
    assert "<script" in page
    # the page opens on cross-attention at the mirror head, and the terminal shows that head
    meta = json.loads(page.split('id="hw-meta">', 1)[1].split("</script>", 1)[0])
    layer, head = demo["best_mirror_head"]
    assert meta["initial"] == {"kind": "cross", "layer": layer, "head": head}
    assert f"cross-attention of decoder layer {layer}, head {head}" in text
    # the importance grid: written, equal to headwise.importance on the first 256 held-out
    # strings, and shown on the head view's grid
    from headwise import checkpoint, importance
    grid = HeadScores.from_json((out / "importance.json").read_text())
    assert (out / "importance.png").stat().st_size > 5000
    model = checkpoint.load(out / "checkpoint").model
    heldout = make_task("reverse", min_len=4, max_len=16, num_symbols=20).eval_set(1000)
    want = importance(model, type(heldout)(*(getattr(heldout, f)[:256] for f in
                                             ("src", "src_lens", "tgt_in", "tgt_out"))))
    for kind in ("encoder_self", "decoder_self", "cross"):
        torch.testing.assert_close(grid[kind], want[kind], atol=1e-6, rtol=1e-4)
        assert meta["kinds"][kind]["importance"] == grid[kind].tolist()
    # the bars are labelled with the default method; the demo names the top head and the
    # exact match left without the four least important, measured on the other 744 strings
    assert grid.method == "greedy" and meta["importanceMethod"] == grid.describe()
    heads = demo["which_heads"]
    kind, layer, head, _ = grid.ranked()[0]
    assert heads["top"] == f"{kind} layer {layer} head {head}"
    assert heads["measured_on"] == 744 and len(heads["least"]) == 4
    measured = type(heldout)(*(getattr(heldout, f)[256:] for f in
                               ("src", "src_lens", "tgt_in", "tgt_out")))
    tok = make_task("reverse", min_len=4, max_len=16, num_symbols=20).tokenizer
    with hw.ablate(model, grid.least(4)):
        assert heads["exact_match_without"] == seq2seq_metrics(model, measured, tok)["exact_match"]
    assert f"the most important is {heads['top']}" in " ".join(text.split())
    assert "rows = queries, columns = keys" in text
    assert "cross_attn" in (out / "trace.txt").read_text()
    # one measure names the mirror head: the demo's is `heads catalogue`'s most-mirror head on
    # the same checkpoint, by the same score; `view` says it opens by another measure
    assert "The mirror head (mirror score: weight on the mirrored key" in " ".join(text.split())
    layer, head = demo["best_mirror_head"]
    score = demo["mirror_scores"][layer][head]
    assert max(max(row) for row in demo["mirror_scores"]) == score
    assert main(["heads", "catalogue", "--checkpoint", str(out / "checkpoint"),
                 "-o", str(tmp_path / "cat")]) == 0
    listed = capsys.readouterr().out
    assert f"most mirror     cross layer {layer} head {head}: {score:.3f} (weight on the " \
           "mirrored key" in listed
    assert main(["view", "--checkpoint", str(out / "checkpoint"), "--src", "abcdefgh",
                 "-o", str(tmp_path / "view")]) == 0
    assert ("the most focused head on this input (largest mean of its rows' maximum weight, "
            "not the mirror score)") in capsys.readouterr().out
