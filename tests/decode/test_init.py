"""headwise.decode: the wing's names resolve lazily, and importing its vouching (what the cache
below it may be told about) loads no model code."""

import subprocess
import sys

import headwise.decode as decode
from headwise.decode.forms import FORMS
from headwise.decode.generation import generate
from headwise.decode.step import DecodeStep


def test_every_public_name_resolves_to_its_submodule():
    assert set(decode.__all__) == {"DecodeStep", "FORMS", "GenerationConfig", "form_of",
                                   "generate", "generate_with_logits", "HeadwiseCache",
                                   "headwise_cache"}
    for name in decode.__all__:
        assert getattr(decode, name) is not None, name
    assert decode.generate is generate and decode.DecodeStep is DecodeStep
    assert decode.FORMS is FORMS


def test_importing_the_vouching_loads_no_model():
    code = ("import sys, headwise.decode.vouch; "
            "print(sorted(m for m in sys.modules if m.startswith(('headwise.models', "
            "'headwise.decode.step', 'headwise.layers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
