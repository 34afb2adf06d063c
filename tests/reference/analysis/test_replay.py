"""SmolLM2-135M (from its GGUF: headwise's Llama-style decoder) with the replayed ablation
passes of :class:`headwise.analysis.replay.Replay` against full passes of
:func:`headwise.ablate`: the same losses, with heads removed before, in and after the first
changed block, and after greedy's heads gone so far change the base. Tolerance as in
tests/analysis/test_replay.py: the same float32 arithmetic, 8 ulps of the loss (rel 1e-6)."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.analysis.replay import Replay
from headwise.analysis.run import default_loss


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from headwise.pretrained import load_gguf
    return load_gguf(smollm2_path).model.eval()


def full(model, cells, tokens) -> float:
    heads: dict = {}
    for kind, layer, head in cells:
        heads.setdefault(kind, {}).setdefault(layer, []).append(head)
    with hw.ablate(model, heads), torch.no_grad():
        return float(default_loss(model, tokens))


def test_replayed_passes_equal_full_passes_on_smollm2(smollm2):
    tokens = torch.randint(0, smollm2.config.vocab_size, (2, 24),
                           generator=torch.Generator().manual_seed(0))
    gone = [("decoder_self", 12, 4), ("decoder_self", 3, 0)]
    later = [("decoder_self", layer, layer % 9) for layer in (0, 2, 3, 11, 12, 13, 29)]
    want_loss = [full(smollm2, [*gone, cell], tokens) for cell in later]  # full passes
    with Replay(smollm2) as replay:
        run = lambda: float(default_loss(smollm2, tokens))  # noqa: E731
        replay.measure([], run)
        replay.rebase(gone[:1])
        replay.measure(gone[:1], run)
        replay.rebase(gone)
        before = replay.run
        got = [replay.measure([*gone, cell], run) for cell in later]
    assert got == pytest.approx(want_loss, rel=1e-6)
    # a pass computes every block from the first that is either changed (its own head) or not
    # remembered for the base: after the base gained block 3's head, blocks 0-2 are; each pass
    # then remembers the base's blocks it computed before its own
    remembered, want = 3, 0
    for _, layer, _ in later:
        want += 30 - min(layer, remembered)
        remembered = max(remembered, layer)
    assert replay.run - before == want == 30 + 28 + 27 + 27 + 19 + 18 + 17
