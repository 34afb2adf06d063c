"""Run by ``.peers``' interpreter (TransformerLens 4.3, never headwise): TransformerBridge over a
saved model on transformers' eager attention, ``run_with_cache`` of every hook of every layer on
a padded batch, saved with safetensors for tests/reference/lens/test_run.py to compare.

    .peers/bin/python transformer_lens_peer.py MODEL_DIR BATCH.json OUT.safetensors
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import save_file
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoModelForCausalLM, AutoTokenizer

HOOKS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores",
         "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out",
         "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


def main(model_dir: str, batch_file: str, out: str) -> None:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                              dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=tok)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)  # legacy names,
    # the model's own weights (no folding or centering: the values the model computes)
    bridge.set_use_attn_result(True)  # hook_result (TransformerLens computes it on request)
    batch = json.loads(open(batch_file).read())
    ids, mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids, attention_mask=mask)
    got = {"logits": logits}
    for l in range(hf.config.num_hidden_layers):
        for h in HOOKS:
            name = f"blocks.{l}.{h}"
            try:
                got[name] = cache[name]
            except KeyError:
                pass
    save_file({k: v.float().clone().contiguous() for k, v in got.items()}, out)
    print(json.dumps(sorted(got)))


if __name__ == "__main__":
    main(*sys.argv[1:4])
