"""A tiny GRPO setup built locally: a word-level tokenizer, a random one-layer Qwen2, a small prompt dataset with
a source column and a deterministic reward. Nothing is downloaded (HF_HUB_OFFLINE=1 before transformers loads)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(29)]


def tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)
    built = Qwen2ForCausalLM(config)
    return built


def dataset(sources: tuple[str, ...] = ()) -> Dataset:
    prompts = [" ".join(f"w{(i * 3 + k) % 29}" for k in range(2 + i % 4)) for i in range(8)]
    columns: dict[str, list[str]] = {"prompt": prompts}
    if sources:
        columns["source"] = [sources[i % len(sources)] for i in range(8)]
    return Dataset.from_dict(columns)


def reward(completions: list[str], **_: object) -> list[float]:
    """Deterministic and varied within a group: longer completions and ones that say w7 score more."""
    return [len(text.split()) * 0.25 + (1.0 if "w7" in text.split() else 0.0) for text in completions]
