"""The head catalogue page: self-contained, its data intact, safe against any token text."""

import json
import re

import pytest
import torch

from headwise.analysis.catalogue import catalogue
from headwise.models import LMConfig, build
from headwise.viz import catalogue_page


@pytest.fixture(scope="module")
def cat():
    torch.manual_seed(0)
    lm = build(LMConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=2, d_ff=8,
                        max_len=16)).eval()
    names = ["</script><b>x", "é", *[f"t{i}" for i in range(10)]]
    return catalogue(lm, torch.randint(0, 12, (4, 9)), tokens=lambda ids: [names[i] for i in ids],
                     name="tiny lm")


def test_page_is_offline_and_carries_the_catalogue(cat, tmp_path):
    view = catalogue_page(cat, tmp_path / "c.html", title="T <1>")
    text = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert view.path == tmp_path / "c.html"
    assert "<title>T &lt;1&gt;</title>" in text
    assert "default-src 'none'" in text  # the same CSP as the head view: nothing is fetched
    assert "http://" not in text and "https://" not in text
    assert text.count("</script>") == 2  # a token "</script>" cannot close the data block
    data = json.loads(re.search(r'id="hw-catalogue">(.*?)</script>', text, re.S).group(1))
    assert data["heads"] == cat.heads and data["meta"]["title"] == "T <1>"
    assert cat.page().html == catalogue_page(cat).html  # the method is the function


def test_page_refuses_what_is_not_a_catalogue(cat, tmp_path):
    with pytest.raises(TypeError, match="expects a headwise Catalogue"):
        catalogue_page({"heads": []})
    with pytest.raises(ValueError, match="must end in .html"):
        catalogue_page(cat, tmp_path / "c.txt")
