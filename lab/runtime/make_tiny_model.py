"""Make the lab's tiny Llama model offline: never downloaded.

2 decoder layers, hidden 128, 4 attention heads of 32 (vLLM's CPU attention needs a head size of
at least 32), 2 KV heads, random weights (seeded), and a byte-level BPE tokenizer trained here on
generated text with the `tokenizers` library. Written: config.json, generation_config.json,
model.safetensors (BF16, written by hand: numpy has no bfloat16), tokenizer.json,
tokenizer_config.json, special_tokens_map.json.

Needs numpy and tokenizers (both are in the lab runtime image, so build.sh runs it there).
Usage: python3 make_tiny_model.py OUT_DIR   (the same seed gives the same weights and tokenizer)
"""

from __future__ import annotations

import json
import os
import random
import struct
import sys
import tempfile

import numpy as np

HIDDEN = 128
LAYERS = 2
HEADS = 4
HEAD_DIM = 32
KV_HEADS = 2
INTERMEDIATE = 256
VOCAB_TARGET = 512
MAX_POSITIONS = 2048
SEED = 20240607
SPECIALS = ["<unk>", "<s>", "</s>"]

WORDS = (
    "spark memory cache token model serve plan budget kernel page block layer weight "
    "tensor graph request queue decode prefill batch length context fleet node pair "
    "unified health metric restart drain watch limit grace image runtime unit socket "
    "the a of to and in is it that for on with as by at from this be are was"
).split()


def corpus(n_lines: int, rng: random.Random):
    """Generated English-like lines: enough structure for BPE to learn merges."""
    for _line in range(n_lines):
        n = rng.randint(4, 16)
        words = [rng.choice(WORDS) for _word in range(n)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 4096)))
        yield " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])


def train_tokenizer(rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus(4000, rng)), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tok


def bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian bytes."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path: str, tensors: dict) -> None:
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        data = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for c in chunks:
            f.write(c)


def weights(vocab: int, nprng: np.random.Generator) -> dict:
    def normal(*shape):
        return nprng.normal(0.0, 0.02, size=shape).astype(np.float32)

    t = {
        "model.embed_tokens.weight": normal(vocab, HIDDEN),
        "model.norm.weight": np.ones(HIDDEN, np.float32),
        "lm_head.weight": normal(vocab, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        t[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        t[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        t[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    return t


def make(out_dir: str) -> None:
    rng = random.Random(SEED)
    tok = train_tokenizer(rng)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}",
    }
    os.makedirs(out_dir, exist_ok=True)
    # Write into a temporary folder beside the target, then move the files in: never half-written.
    tmp = tempfile.mkdtemp(prefix=".tiny-model.", dir=out_dir)
    try:
        write_safetensors(os.path.join(tmp, "model.safetensors"),
                          weights(vocab, np.random.default_rng(SEED)))
        tok.save(os.path.join(tmp, "tokenizer.json"))
        files = {
            "config.json": config,
            "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
            "tokenizer_config.json": tok_config,
            "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>",
                                        "unk_token": "<unk>"},
        }
        for name, body in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                json.dump(body, f, indent=2, sort_keys=True)
                f.write("\n")
        for name in sorted(os.listdir(tmp)):
            os.chmod(os.path.join(tmp, name), 0o644)
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    print(f"tiny Llama written to {out_dir}: vocab {vocab}, {LAYERS} layers, hidden {HIDDEN}, "
          f"head_dim {HEAD_DIM}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    make(sys.argv[1])
