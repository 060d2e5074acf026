"""Writes the real-server tier's model: a tiny random Qwen3 with a tokenizer trained here.

Run by the tier's own interpreter (tests/real/env.py): `python tiny_model.py OUT_DIR`. Nothing
is downloaded. The model is Qwen3ForCausalLM (hidden 128, 2 layers, vocab 2,048) with random
weights, so its answers are noise, but SGLang loads and serves it through the same code as a
real Qwen3: its tokenizer, chat template, scheduler, KV cache and metrics. Random weights
give a natural mix of endings: `<|im_end|>` is one token in 2,048, so some answers stop early
and most run to max_tokens.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>"]
# Qwen3's template, cut to what the tier sends: system/user/assistant turns.
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def build(out: Path, seed: int = 0) -> None:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
             for _ in range(4000)]
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + ADDED,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"), dtype="float32")
    Qwen3ForCausalLM(cfg).save_pretrained(out)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
