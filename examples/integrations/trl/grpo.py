"""TRL's GRPOTrainer trained through KnitTrans, on one machine (docs/integrations/trl.md).

    python examples/integrations/trl/grpo.py --write-config trl-stack.yaml
    knittrans up --config trl-stack.yaml &
    python examples/integrations/trl/grpo.py

The first command writes the stack config of this job for ``knittrans up``: its train batch is one TRL
generation batch, its quotas and staleness bound are the KnitTransGRPOSettings below, its schema is what TRL
computes. The second starts the admission service, the store and the trainer rank's sidecar, and writes their
addresses to knittrans-connection.json, where the clients below find them. The last one generates, submits every
generation batch through the store and the admission service, and trains each optimizer step on the packed
mini-batch the sidecar delivers. The model is a random two-layer Qwen2 with a word-level tokenizer, both built
here, so nothing is downloaded; pass --model to train a checkpoint of your own instead.
"""

from __future__ import annotations

import argparse
import os

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloaded unless --model names a hub model

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig

from knittrans.client.admission import AdmissionClient
from knittrans.integrations.trl import (
    KnitTransClients,
    KnitTransGRPOSettings,
    KnitTransGRPOTrainer,
    TrainBatchShape,
    engine_config,
    trajectory_schema,
)
from knittrans.rollout import RolloutClient
from knittrans.trainer import TrainerClient

WORDS = ["<pad>", "<eos>", "<unk>", *(f"w{i}" for i in range(29))]
# The job's quotas and staleness bound: at least a quarter of every train batch from each source.
SETTINGS = KnitTransGRPOSettings(sources={"math": 0.25, "code": 0.25}, source_column="source", staleness_bound=1,
                                 max_batches_ahead=1, namespace="trl-example")


def grpo_config(output_dir: str, steps: int) -> GRPOConfig:
    return GRPOConfig(output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                      max_steps=steps, logging_steps=1, save_steps=2, report_to=[], use_cpu=True, seed=0,
                      learning_rate=0.01, bf16=False, disable_tqdm=True)


def tiny_model_and_tokenizer() -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    core = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    config = Qwen2Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1)
    return Qwen2ForCausalLM(config), tokenizer


def dataset() -> Dataset:
    prompts = [" ".join(f"w{(i * 5 + k) % 29}" for k in range(2 + i % 3)) for i in range(16)]
    return Dataset.from_dict({"prompt": prompts, "source": ["math", "code"] * 8})


def reward(completions: list[str], **_: object) -> list[float]:
    return [0.1 * len(text.split()) + ("w7" in text.split()) for text in completions]


def write_config(path: str, args: GRPOConfig) -> None:
    """The `knittrans up` config of this job: one trainer rank, a file store, the admission service's sections."""
    shape = TrainBatchShape.of(per_device_train_batch_size=args.per_device_train_batch_size,
                               gradient_accumulation_steps=args.gradient_accumulation_steps,
                               steps_per_generation=args.steps_per_generation, num_generations=args.num_generations,
                               world_size=1)
    admission = {"engine": engine_config(SETTINGS, shape), "schema": trajectory_schema(old_logprobs=False),
                 "topology": {"backbone": {"dp": 1, "cp": 1, "max_tokens_per_microbatch": 64}}}
    with open(path, "w") as handle:
        yaml.safe_dump({"job": "trl", "admission": admission}, handle, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-config", default="", help="write the `knittrans up` config of this job here and exit")
    parser.add_argument("--model", default="", help="a causal LM to train (default: a tiny random Qwen2)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output-dir", default="trl-knittrans-out")
    args = parser.parse_args()
    config = grpo_config(args.output_dir, args.steps)
    if args.write_config:
        write_config(args.write_config, config)
        print(f"wrote {args.write_config}")
        return
    if args.model:
        model, tokenizer = AutoModelForCausalLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
    else:
        model, tokenizer = tiny_model_and_tokenizer()

    # The KnitTrans part: the clients of the stack `knittrans up` started (its connection file has the addresses).
    admission = AdmissionClient.from_env()
    rollout = RolloutClient.from_env(namespace=SETTINGS.namespace)
    trainer_client = TrainerClient.from_env(0)
    clients = KnitTransClients(admission=admission, rollout=rollout, trainer=trainer_client)
    trainer = KnitTransGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset(),
                                   processing_class=tokenizer, knittrans=clients, knittrans_settings=SETTINGS)
    trainer.train()

    for entry in trainer.state.log_history:
        if "loss" in entry and "train_runtime" not in entry:
            print(f"step {entry['step']}: loss {entry['loss']:.6f} grad_norm {entry['grad_norm']:.4f} "
                  f"reward {entry['reward']:.3f}")
    status = admission.status()
    print(f"trained {trainer.state.global_step} steps through KnitTrans: policy version {status.policy_version}, "
          f"admitted {status.admitted_total}, last step {trainer.last_step}")
    trainer_client.close()
    admission.close()
    rollout.close()


if __name__ == "__main__":
    main()
