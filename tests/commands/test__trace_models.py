"""What `headwise trace` traces: the model and inputs its size options describe."""

import pytest
import torch

from headwise.cli import build_parser
from headwise.commands._trace_models import _lengths, _weights, build


def _args(*argv):
    return build_parser().parse_args(["trace", *argv])


def test_mha_options_build_that_module_and_its_inputs():
    model, inputs, kwargs = build(_args("mha", "--embed-dim", "4", "--heads", "2", "--head-dim",
                                        "3", "--kdim", "3", "--vdim", "2", "--seq", "5",
                                        "--kv-seq", "6", "--pad", "2"))
    assert (model.embed_dim, model.num_heads, model.head_dim, model.kdim, model.vdim) == (
        4, 2, 3, 3, 2)
    assert [tuple(t.shape) for t in inputs] == [(1, 5, 4), (1, 6, 3), (1, 6, 2)]
    assert kwargs["valid_lens"].tolist() == [4]
    out, _ = model(*inputs, **kwargs)
    assert out.shape == (1, 5, 4)


@pytest.mark.parametrize("kind", ["lm", "encoder", "decoder", "transformer"])
def test_model_kinds_build_and_run(kind):
    model, inputs, kwargs = build(_args(kind, "--embed-dim", "8", "--heads", "2", "--layers",
                                        "1", "--vocab", "20", "--seq", "4"))
    with torch.no_grad():
        model(*inputs, **kwargs)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_weights_option_and_padding_lengths():
    assert _weights(None, "lm") is None and _weights("all", "lm") is True
    assert _weights("cross", "transformer") == {"cross"}
    assert _weights("cross:0,2", "transformer") == {"cross": [0, 2]}
    with pytest.raises(ValueError, match="unknown kind 'cross'; this model has decoder_self"):
        _weights("cross", "lm")
    with pytest.raises(ValueError, match="layers must be integers, e.g. cross:0,2"):
        _weights("cross:a", "transformer")
    assert _lengths(3, 7, 2, "cpu").tolist() == [7, 7, 5]
