"""The boundary checks of MultiHeadAttention (headwise.layers.checks): constructor arguments
and call inputs, each a readable error naming what was expected and the fix."""

import pytest
import torch

import headwise as hw
from headwise.layers import checks


@pytest.mark.parametrize("make,match", [
    (lambda: hw.MultiHeadAttention(510, 8), "embed_dim=510 is not divisible by num_heads=8; "
                                            "pass head_dim=63 or use num_heads="),
    (lambda: hw.MultiHeadAttention(16, 4, num_kv_heads=3), "not a multiple of num_kv_heads"),
    (lambda: hw.MultiHeadAttention(16, 0), "num_heads must be >= 1"),
    (lambda: hw.MultiHeadAttention(16, 4, dropout=1.5), "dropout"),
    (lambda: hw.MultiHeadAttention(16, 4, backend="nope"), "unknown backend"),
    (lambda: hw.MultiHeadAttention(16, 4, head_dim=2.5), "head_dim must be an int"),
])
def test_bad_configs(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_forward_inputs():
    mha = hw.MultiHeadAttention(8, 2, kdim=5)
    x, kv = torch.randn(2, 4, 8), torch.randn(2, 6, 5)
    cases = [
        (dict(query=torch.randn(4, 8), key=kv), "batch-first"),
        (dict(query=torch.randn(2, 4, 7), key=kv), "expected 8"),
        (dict(query=x, key=torch.randn(2, 6, 8)), "kdim=8"),
        (dict(query=x, key=torch.randn(3, 6, 5)), "batch sizes differ"),
        (dict(query=x, key=kv, value=torch.randn(2, 5, 5)), "positions"),
        (dict(query=x, key=kv, mask=torch.ones(2, 1, 1, 4, dtype=torch.bool)), "broadcast"),
        (dict(query=x, key=kv, mask=torch.ones(2, 1, 1, 6, dtype=torch.long)), "bool"),
        (dict(query=x, key=kv, valid_lens=torch.tensor([1, 2, 3])), "valid_lens"),
        (dict(query=x, key=kv, head_mask=torch.ones(3)), "head_mask"),
    ]
    for kwargs, match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            mha(**kwargs)


def test_dtype_check_names_the_parameters_dtype_and_the_fix():
    mha = hw.MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"torch.float64 but the module's parameters are "
                                        r"torch.float32; pass query.to\(torch.float32\)"):
        checks.dtypes(mha, x, x, x)
    with pytest.raises(TypeError, match="token ids go through an embedding"):
        checks.dtypes(mha, torch.ones(1, 3, 8, dtype=torch.long), x, x)
    checks.dtypes(mha, x.float(), x.float(), x.float())  # the module's own dtype passes


@pytest.mark.parametrize("t, error, match", [
    ([[1, 2]], TypeError, r"^W: ids must be a torch.Tensor, got list$"),
    (torch.ones(3), ValueError, r"^W: ids must be \(b, n\), got shape \(3,\); add a batch axis "
                                r"with ids.unsqueeze\(0\)$"),
    (torch.ones(1, 2, 3), ValueError, r"^W: ids must be \(b, n\), got shape \(1, 2, 3\)$"),
])
def test_batched_names_the_shape_and_the_batch_axis_fix(t, error, match):
    from headwise.layers.checks import batched

    batched(torch.ones(2, 3), "ids", 2, "(b, n)", "W", var="ids")  # the right rank passes
    with pytest.raises(error, match=match):
        batched(t, "ids", 2, "(b, n)", "W", var="ids")
