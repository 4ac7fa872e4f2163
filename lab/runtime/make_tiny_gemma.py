# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make the lab's tiny Gemma with per-layer embeddings (PLE) offline: never downloaded.

A random (seeded) text-only Gemma 4 (`Gemma4ForCausalLM`, the architecture whose vLLM forward
reads its per-layer embedding table) or Gemma 3n (`Gemma3nForCausalLM`; vLLM 0.32 loads its table
but its text-only forward never reads it), initialised by the `transformers` library of the lab
runtime image and saved as BF16 safetensors, with the tiny Llama's tokenizer (512 tokens) copied
beside it. 4 layers, hidden 128, head_dim 32 (vLLM's CPU attention needs at least 32), per-layer
input 1024 per layer: the table `model.embed_tokens_per_layer.weight` is [512, 4096] BF16 (4 MiB).

Needs torch and transformers (the lab runtime image has both; make_gemma.sh runs it there).
Usage: python3 make_tiny_gemma.py OUT_DIR TOKENIZER_DIR [gemma4|gemma3n]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

HIDDEN = 128
LAYERS = 4
HEADS = 4
HEAD_DIM = 32
KV_HEADS = 2
INTERMEDIATE = 256
PLE_DIM = 1024
MAX_POSITIONS = 2048
SEED = 20240607
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _shared(vocab: int, bos: int, eos: int, arch: str):
    """The settings both tiny models share (sizes, attention layout, special tokens)."""
    return dict(
        vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size_per_layer_input=PLE_DIM,
        max_position_embeddings=MAX_POSITIONS, sliding_window=128,
        layer_types=["sliding_attention"] * (LAYERS - 1) + ["full_attention"], num_kv_shared_layers=0,
        pad_token_id=0, bos_token_id=bos, eos_token_id=eos, architectures=[arch])


def gemma4_config(vocab: int, bos: int, eos: int):
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(per_layer_config={}, tie_word_embeddings=True,
                            **_shared(vocab, bos, eos, "Gemma4ForCausalLM"))


def gemma3n_config(vocab: int, bos: int, eos: int):
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(activation_sparsity_pattern=[0.0] * LAYERS, laurel_rank=8, altup_num_inputs=2,
                             **_shared(vocab, bos, eos, "Gemma3nForCausalLM"))


def make(out_dir: str, tokenizer_dir: str, kind: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(tokenizer_dir, "config.json"), encoding="utf-8") as f:
        tok_cfg = json.load(f)
    vocab, bos, eos = tok_cfg["vocab_size"], tok_cfg["bos_token_id"], tok_cfg["eos_token_id"]
    config = {"gemma4": gemma4_config, "gemma3n": gemma3n_config}[kind](vocab, bos, eos)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        # Random, not the initialiser's constants: every PLE row differs, so a wrong row shows.
        for name, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(
                    SEED + sum(map(ord, name)))) * 0.05)
    os.makedirs(out_dir, exist_ok=True)
    # Write into a temporary folder beside the target, then move the files in: never half-written.
    tmp = tempfile.mkdtemp(prefix=".tiny-gemma.", dir=out_dir)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(tmp, name))
        with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump({"bos_token_id": bos, "eos_token_id": eos}, f, indent=2, sort_keys=True)
            f.write("\n")
        for name in sorted(os.listdir(tmp)):
            os.chmod(os.path.join(tmp, name), 0o644)
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny {kind} written to {out_dir}: vocab {vocab}, {LAYERS} layers, hidden {HIDDEN}, "
          f"per-layer input {PLE_DIM}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    make(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "gemma4")
