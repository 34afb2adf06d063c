"""headwise.decode.feedforward: the feed-forwards' one-row forms (fused or not, transposed or not)
equal their forwards, plus the residual, for rows of any batch."""

import itertools

import pytest
import torch

from headwise.decode.forms import form_of
from headwise.fast import rows as _rows
from headwise.models.feedforward import make_feedforward
from tests.reference.models.test_feedforward import _randomise


@pytest.mark.parametrize("kind, transpose, fuse",
                         list(itertools.product(["mlp", "glu"], [False, True], [False, True])))
def test_row_form_equals_forward(kind, transpose, fuse):
    torch.manual_seed(0)
    ff = _randomise(make_feedforward(kind, 8, 12, activation="silu", bias=True)).eval()
    x = torch.randn(3, 8)
    inner, down = form_of(ff, transpose=transpose, fuse=fuse)
    with torch.no_grad():
        torch.testing.assert_close(_rows.residual(x, inner(x), down), x + ff(x), atol=1e-6,
                                   rtol=1e-6)
