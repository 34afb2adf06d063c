"""`trace --explain`: the fold to (b*h, n, d) is computed and found equal to the 4-D layout for
any sizes; the measured table names the kernel each layout takes."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.commands._fold import explain


@settings(max_examples=6, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 9), h=st.integers(1, 4), d=st.integers(1, 8),
       seed=st.integers(0, 2 ** 16))
def test_folded_equals_unfolded_for_any_sizes(b, n, h, d, seed):
    text = explain(b, n, h * d, h, d, measure_n=16, seed=seed)
    assert "folded == unfolded: yes" in text
    assert "same kernel (math) on both layouts, bit for bit: yes" in text
    assert re.search(rf"4\. fold \(optional\) +\({b}, {h}, {n}, {d}\) +-> \({b * h}, {n}, {d}\)",
                     text)
    assert re.search(r"3-D \(b\*h, n, d\) folded +MATH +\d+\.\d+ ms", text)
    assert re.search(r"4-D \(b, h, n, d\) +\w+ +\d+\.\d+ ms +1\.00x", text)
