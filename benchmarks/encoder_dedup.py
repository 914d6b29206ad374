"""Encoder deduplication benchmark: duplicated against deduplicated multimodal encoding, side by side.

One GRPO mini-batch (group size 16, 4 images per sample) trains a ViT-like encoder and a decoder-only
backbone (``knittrans.demo.model``) two ways, each in a fresh child process so peak memory is its own:

- ``duplicated``: the baseline. Every backbone micro-batch encodes a private copy of every image its
  trajectories reference (group_size × images_per_sample encodings per sample) and backpropagates through it;
- ``deduplicated``: ``knittrans.train`` (paper §5.3, Listing 1). Each unique image is encoded once per
  mini-batch in encoder micro-batches of its own, its gradient accumulated over every consuming micro-batch,
  and the encoder backward runs once.

Per variant it reports, for the fastest measured step (``mean`` holds the averages, since other processes
share the CPU): encoder forward+backward seconds, backbone seconds, whole-step seconds (AdamW step
included), peak memory (CPU: the child's peak RSS and its increase during the steps; CUDA:
``torch.cuda.max_memory_allocated``) and the images encoded per step. It also reports the encoder time
reduction (target ≥ 10× at group size 16) and the largest relative gradient difference between the two
variants after the first step (target: float32 round-off).

The duplicated path times its encoder by running the encoder backward right after each micro-batch's
backbone backward, from the gradient of a detached copy of the encoder output; that is the same arithmetic
as one joint backward.

    python benchmarks/encoder_dedup.py                    # CPU, about a minute on two cores
    python benchmarks/encoder_dedup.py --device cuda --image-size 224 --patch-size 14 --encoder-dim 512
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    device: str
    samples: int
    group_size: int
    images_per_sample: int
    trajectories_per_micro_batch: int
    images_per_encoder_micro_batch: int
    image_size: int
    patch_size: int
    encoder_dim: int
    encoder_depth: int
    backbone_dim: int
    backbone_depth: int
    vocab_size: int
    warmup_steps: int
    steps: int
    threads: int
    seed: int


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--samples", type=int, default=2, help="samples (prompts) per mini-batch")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--images-per-sample", type=int, default=4)
    parser.add_argument("--trajectories-per-micro-batch", type=int, default=4)
    parser.add_argument("--images-per-encoder-micro-batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--encoder-dim", type=int, default=96)
    parser.add_argument("--encoder-depth", type=int, default=3)
    parser.add_argument("--backbone-dim", type=int, default=96)
    parser.add_argument("--backbone-depth", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="measured steps; figures are the fastest step's")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return BenchConfig(**{k: v for k, v in vars(args).items()})


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_variant(config: BenchConfig, variant: str) -> dict[str, Any]:
    """One variant in this (child) process: warm-up, measured steps, first-step gradients."""
    import torch

    from knittrans.demo.model import Backbone, BackboneConfig, EncoderConfig, VisionEncoder
    from knittrans.demo.multimodal_batch import (
        chunk,
        duplicated_features,
        feature_positions,
        make_grpo_minibatch,
        micro_batch_loss,
        pack_micro_batch,
        unique_keys,
    )
    from knittrans.train import EncodingSchedule
    from knittrans.train.reuse import GatheredEncodings, MinibatchEncodingReuse

    if config.threads:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device)
    cuda = device.type == "cuda"

    def sync() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    encoder_config = EncoderConfig(
        image_size=config.image_size,
        patch_size=config.patch_size,
        dim=config.encoder_dim,
        depth=config.encoder_depth,
        heads=4,
        merge=2,
        out_dim=config.backbone_dim,
    )
    backbone_config = BackboneConfig(
        vocab_size=config.vocab_size, dim=config.backbone_dim, depth=config.backbone_depth, heads=4, max_positions=2048
    )
    batch = make_grpo_minibatch(
        num_samples=config.samples,
        group_size=config.group_size,
        images_per_sample=config.images_per_sample,
        rows_per_image=encoder_config.num_rows,
        image_shape=(3, config.image_size, config.image_size),
        vocab_size=config.vocab_size,
        text_tokens=(4, 12),
        response_tokens=(16, 48),
        seed=config.seed,
    )
    images = {key: image.to(device) for key, image in batch.images.items()}
    ids = [t.trajectory_id for t in batch.trajectories]
    per_micro = config.trajectories_per_micro_batch
    micros = [pack_micro_batch(batch, ids[i : i + per_micro]).to(device) for i in range(0, len(ids), per_micro)]
    keys = unique_keys(micros)
    schedule = EncodingSchedule.single_process(
        encoder_micro_batches=chunk(keys, config.images_per_encoder_micro_batch),
        backbone_micro_batches=[m.uses for m in micros],
        num_rows=dict.fromkeys(keys, encoder_config.num_rows),
    )
    normalizer = batch.loss_tokens

    torch.manual_seed(config.seed)
    encoder = VisionEncoder(encoder_config).to(device)
    backbone = Backbone(backbone_config).to(device)
    parameters = [*encoder.parameters(), *backbone.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)

    def duplicated_step() -> dict[str, float]:
        encoder_s = backbone_s = 0.0
        for micro in micros:
            t0 = sync()
            encoded = duplicated_features(encoder, batch, micro.uses, device) if micro.uses else None
            t1 = sync()
            features = encoded.detach().requires_grad_(True) if encoded is not None else None
            positions = feature_positions(micro.uses, device)
            micro_batch_loss(backbone, micro, features, positions, normalizer).backward()
            t2 = sync()
            if encoded is not None:
                encoded.backward(features.grad)
            t3 = sync()
            encoder_s += (t1 - t0) + (t3 - t2)
            backbone_s += t2 - t1
        return {"encoder_fwd_bwd_s": encoder_s, "backbone_s": backbone_s, "encoded_images": float(schedule.num_uses)}

    def deduplicated_step() -> dict[str, float]:
        def step(gathered: GatheredEncodings) -> torch.Tensor:
            micro = micros[gathered.micro_batch]
            return micro_batch_loss(backbone, micro, gathered.features, gathered.positions, normalizer)

        run = MinibatchEncodingReuse(
            encoder=encoder,
            encoder_inputs=lambda m: torch.stack([images[k] for k in m.keys]),
            schedule=schedule,
            device=device,
        )
        t0 = sync()
        run.encode()
        t1 = sync()
        run.distribute()
        t2 = sync()
        run.run_backbone(step)
        t3 = sync()
        run.backward_encoder()
        t4 = sync()
        return {
            "encoder_fwd_bwd_s": (t1 - t0) + (t4 - t3),
            "backbone_s": t3 - t2,
            "cache_s": t2 - t1,
            "encoded_images": float(len(schedule.routes)),
        }

    step_fn: Callable[[], dict[str, float]] = duplicated_step if variant == "duplicated" else deduplicated_step
    baseline_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    measured: list[dict[str, float]] = []
    first_grads: list[np.ndarray] = []
    for step in range(config.warmup_steps + config.steps):
        optimizer.zero_grad(set_to_none=True)
        start = sync()
        figures = step_fn()
        if step == 0:
            first_grads = [p.grad.detach().cpu().numpy().copy() for p in parameters]
        optimizer.step()
        figures["step_s"] = sync() - start
        if step >= config.warmup_steps:
            measured.append(figures)
    # Other processes share the CPU: the fastest step is the least disturbed one, the mean is shown as well.
    names = [name for name in measured[0] if name != "encoded_images"]
    result: dict[str, Any] = {name: float(min(m[name] for m in measured)) for name in names}
    result["mean"] = {name: float(np.mean([m[name] for m in measured])) for name in names}
    result["encoded_images_per_step"] = int(measured[0]["encoded_images"])
    result["encoder_share_of_step"] = result["encoder_fwd_bwd_s"] / result["step_s"]
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["peak_rss_bytes"] = peak_rss
    result["step_peak_rss_increase_bytes"] = peak_rss - baseline_rss
    if cuda:
        result["peak_cuda_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    result["_encoder_parameters"] = len(list(encoder.parameters()))
    result["_grads"] = first_grads
    result["_figures"] = {
        "micro_batches": len(micros),
        "encoder_micro_batches": len(schedule.ranks[0].encoder_micro_batches),
        "uses": schedule.num_uses,
        "unique_images": len(schedule.routes),
        "rows_per_image": encoder_config.num_rows,
        "patches_per_image": encoder_config.patches_per_side**2,
        "backbone_tokens": int(sum(m.input_ids.numel() for m in micros)),
    }
    return result


def _child(config: BenchConfig, variant: str, queue: multiprocessing.Queue) -> None:
    try:
        queue.put(("ok", run_variant(config, variant)))
    except BaseException as exc:  # report any failure to the parent instead of hanging it
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def run_in_child(config: BenchConfig, variant: str) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(config, variant, queue))
    process.start()
    status, payload = queue.get()
    process.join()
    if status != "ok":
        raise RuntimeError(f"{variant} failed: {payload}")
    return payload


def max_relative_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """Per tensor max|got − want| / max|want|, then the maximum over tensors."""
    return max(float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30)) for g, w in zip(got, want, strict=True))


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for variant in ("duplicated", "deduplicated"):
        log(f"encoder_dedup: running {variant} on {config.device} ...")
        started = time.perf_counter()
        results[variant] = run_in_child(config, variant)
        log(f"encoder_dedup: {variant} done in {time.perf_counter() - started:.1f} s")
    dup, dedup = results["duplicated"], results["deduplicated"]
    split = dup["_encoder_parameters"]
    grad_difference = {
        "encoder": max_relative_difference(dedup["_grads"][:split], dup["_grads"][:split]),
        "backbone": max_relative_difference(dedup["_grads"][split:], dup["_grads"][split:]),
    }
    figures = dup["_figures"]
    for result in results.values():
        for private in ("_grads", "_encoder_parameters", "_figures"):
            result.pop(private)
    reduction = dup["encoder_fwd_bwd_s"] / dedup["encoder_fwd_bwd_s"]
    report = {
        "benchmark": "encoder_dedup",
        "config": asdict(config),
        "workload": figures,
        "duplicated": dup,
        "deduplicated": dedup,
        "encoder_time_reduction": reduction,
        "step_speedup": dup["step_s"] / dedup["step_s"],
        "max_relative_gradient_difference": grad_difference,
        "targets": {
            "encoder_time_reduction_at_least": 10.0,
            "encoder_time_reduction_met": reduction >= 10.0,
            "gradient_difference_at_most": 1e-5,
            "gradient_difference_met": max(grad_difference.values()) <= 1e-5,
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
