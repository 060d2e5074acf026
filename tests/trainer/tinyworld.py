"""A tiny, fully local world for the trainer's tests and benchmark.

A byte-level BPE tokenizer trained here on generated text, a Qwen3-format chat template, and
a small Qwen3 target (8 layers) built from a config. The target can be taught a low-entropy
language in a few seconds: "repeat bak lim tox gup" is answered by that cycle of words, again
and again. Its greedy decoding is then predictable from the context (the cycle is in the
prompt) but not from the last token alone, so a drafter only does well if it reads the
target's hidden states. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (not special) like Qwen3's: they stay in decoded text.
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
         "</tool_response>"]
# 24 made-up words, letters only (byte-level BPE never merges across letters and digits).
WORDS = [c + v + e for c, v, e in zip("bdfgklmnprstvzbdfgklmnpr", "aeiou" * 5,
                                      "nmtxkrlpsgnmtxkrlpsgnmtx", strict=False)]
assert len(set(WORDS)) == len(WORDS) == 24
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CYCLE = 4
REPEATS = 10
# Rows of the embedding table past the tokenizer's vocabulary, as Qwen3 pads its own; the
# first of them is the drafter's mask token (151669 for Qwen3 is exactly that row).
PAD_ROWS = 8
# What makes a tiny 8-layer Qwen3 learn the language in ~100 steps, reliably across seeds:
# attention biases (a query that does not depend on the token) and a short RoPE wavelength.
TEACH_LR = 3e-3
ROPE_THETA = 30.0
NO_THINKING: dict[str, Any] = {"enable_thinking": False}
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]


# The k-th word of a cycle comes from group k: which word follows which is then found by
# content (the word of the next group in the prompt), a lookup a transformer learns fast,
# while the words themselves are the prompt's choice, unknowable from the last one alone.
GROUPS = [WORDS[g::CYCLE] for g in range(CYCLE)]


def cycle_prompt(rng: random.Random) -> list[dict[str, Any]]:
    words = [rng.choice(group) for group in GROUPS]
    return [{"role": "user", "content": "repeat " + " ".join(words)}]


def cycle_answer(messages: list[dict[str, Any]]) -> str:
    words = messages[-1]["content"].split()[1:]
    return " ".join(words * REPEATS)


def _corpus(rng: random.Random, tok_template: PreTrainedTokenizerFast | None = None) -> list[str]:
    lines = []
    for _ in range(3000):
        msgs = cycle_prompt(rng)
        lines.append(msgs[0]["content"] + "\n\n" + cycle_answer(msgs))
    lines += [w + "\n" for w in WORDS] * 100
    lines += ["hello there, how are you? fine thanks.\n", "<think>\n\n</think>\n\n",
              "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>system\n",
              '{"name": "lookup", "arguments": {"word": "bak"}}', "# Tools\n\nYou may call"] * 50
    return lines


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE whose merges make every test word (with or without its space) one
    token; checked, because the test language relies on it."""
    rng = random.Random(seed)
    tok = Tokenizer(models.BPE())
    # Qwen2/3's own split: a run of newlines is one piece whatever follows it.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=SPECIALS + ADDED, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(rng), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    for w in WORDS:
        for form in (w, " " + w):
            ids = fast.encode(form, add_special_tokens=False)
            assert len(ids) == 1, f"test tokenizer splits {form!r} into {ids}"
    return fast


def tiny_config(vocab_size: int, layers: int = 8, hidden: int = 64) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden // 4, max_position_embeddings=1024, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        rms_norm_eps=1e-6, attention_bias=True, eos_token_id=None, pad_token_id=None,
        bos_token_id=None,
    )


def random_target(tok: PreTrainedTokenizerFast, seed: int = 0, layers: int = 8,
                  hidden: int = 64) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = tiny_config(len(tok) + PAD_ROWS, layers, hidden)
    return Qwen3ForCausalLM(cfg).eval()


def _render_ids(tok: PreTrainedTokenizerFast, messages: list[dict[str, Any]],
                answer: str) -> tuple[list[int], int]:
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                     **NO_THINKING)
    # Tokenised the way a server sees it: the prompt alone, then what was generated.
    p_ids = tok.encode(prompt, add_special_tokens=False)
    a_ids = tok.encode(answer + "<|im_end|>", add_special_tokens=False)
    return p_ids + a_ids, len(p_ids)


def teach_cycles(model: Qwen3ForCausalLM, tok: PreTrainedTokenizerFast, steps: int = 300,
                 seed: int = 0, batch: int = 32) -> float:
    """Teach the target the repeat language (causal LM loss on the answer); return the last
    loss. Every sequence has the same length, so no padding."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=TEACH_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=TEACH_LR, total_steps=steps,
                                                pct_start=0.1)
    loss_value = float("nan")
    for _ in range(steps):
        rows, starts = [], []
        for _ in range(batch):
            msgs = cycle_prompt(rng)
            ids, start = _render_ids(tok, msgs, cycle_answer(msgs))
            rows.append(ids)
            starts.append(start)
        x = torch.tensor(rows)
        labels = x.clone()
        for r, s in enumerate(starts):
            labels[r, :s] = -100
        loss = model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


@torch.inference_mode()
def greedy_lines(model: Qwen3ForCausalLM, tok: PreTrainedTokenizerFast,
                 prompts: list[list[dict[str, Any]]], max_new_tokens: int = 60,
                 start_index: int = 0) -> list[dict[str, Any]]:
    """The target's own greedy answers, as the engine's batch lines (non-thinking mode).

    Prompts of equal token length are decoded together (no padding, so each row is exactly
    what a batch of one would give)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    encoded = [tok.encode(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True,
                                                  **NO_THINKING), add_special_tokens=False)
               for m in prompts]
    answers: dict[int, list[int]] = {}
    for length in sorted({len(e) for e in encoded}):
        rows = [i for i, e in enumerate(encoded) if len(e) == length]
        ids = torch.tensor([encoded[i] for i in rows])
        gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos,
                             attention_mask=torch.ones_like(ids))
        for r, i in enumerate(rows):
            answers[i] = gen[r, length:].tolist()
    out = []
    for i, msgs in enumerate(prompts):
        new = answers[i]
        finish = "length"
        if eos in new:
            new = new[: new.index(eos)]
            finish = "stop"
        out.append(batch_line(start_index + i, msgs, str(tok.decode(new)), finish,
                              completion_tokens=len(new)))
    return out


def batch_line(index: int, messages: list[dict[str, Any]], content: str | None,
               finish: str = "stop", *, reasoning: str | None = None,
               tool_calls: list[dict[str, Any]] | None = None,
               tools: list[dict[str, Any]] | None = None, attempt: int = 1,
               kwargs: dict[str, Any] | None = None, completion_tokens: int = 0) -> dict[str, Any]:
    return {
        "v": 1, "index": index, "messages": messages, "tools": tools,
        "reasoning_content": reasoning, "content": content, "tool_calls": tool_calls,
        "finish_reason": finish,
        "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens,
                  "reasoning_tokens": 0},
        "chat_template_kwargs": NO_THINKING if kwargs is None else kwargs,
        "attempt": attempt, "model": "tiny",
    }


def write_batches(folder: Path, lines: list[dict[str, Any]], per_file: int = 50) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for b in range(0, len(lines), per_file):
        path = folder / f"completions_{b // per_file:06d}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines[b: b + per_file]))
        paths.append(path)
    return paths


@dataclass
class World:
    """A target folder (weights, config, tokenizer, template) ready for `from_pretrained`."""

    target: Path
    tokenizer: PreTrainedTokenizerFast
    model: Qwen3ForCausalLM
    final_loss: float | None = None


def build_world(folder: Path, teach_steps: int = 0, seed: int = 0, layers: int = 8,
                hidden: int = 64) -> World:
    tok = build_tokenizer(seed)
    model = random_target(tok, seed, layers, hidden)
    loss = teach_cycles(model, tok, teach_steps, seed) if teach_steps else None
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return World(folder, tok, model, loss)


def write_spec(path: Path, data: str, target: Path, run_dir: Path, **train: Any) -> Path:
    """A run.toml of kind "train" with small defaults for the CPU."""
    values: dict[str, Any] = {
        "data": data, "target": str(target), "block_size": 16, "drafter_layers": 1,
        "heldout_share": 0.1, "batch_size": 8, "anchors": 64, "epochs": 50,
        "save_every": 100, "eval_samples": 16, "eval_prompts": 8, "eval_max_new_tokens": 48,
        "dtype": "float32",
    }
    values.update(train)
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items() if v is not None)
    path.write_text(f'[run]\nname = "tiny"\nkind = "train"\ndir = "{run_dir}"\n\n[train]\n{body}\n')
    return path


def word_lines(n: int, seed: int = 0, words: tuple[int, int] = (40, 80)) -> list[dict[str, Any]]:
    """Batch lines with answers of random words: data for the mechanics of training."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = cycle_prompt(rng)
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))
        out.append(batch_line(i, msgs, answer))
    return out
