#!/usr/bin/env python3
"""Training throughput of `data/train_tiny.py`'s step: clips per second for batches of 1, 8
and 32 clips at image sizes 128 and 256, on the CPU or a GPU.

Each configuration runs the script's own pieces: the clips drawn ahead by DataLoader worker
processes (`batches`), each step's clips through the networks together (`step_loss`), the
backward pass and AdamW's step, as `train_tiny.py` runs them with the shipped recipe's
settings (8-frame clips, `--prompt-frames 2`; on cuda under bfloat16 autocast). The first
step of each is a warm-up, not timed. `data wait` is the time a step waited for its clips:
near zero, the networks (not the host's drawing) set the pace.

    python benchmarks/bench_train.py                       # this CPU
    python benchmarks/bench_train.py --device cuda         # a GPU
"""

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
from measure import table  # noqa: E402


def measure(device: str, batch: int, size: int, steps: int, workers: int, frames: int,
            prompt_frames: int) -> tuple[float, float]:  # fmt: skip
    """(clips a second, the share of the time spent waiting for clips) over `steps` timed
    steps after one warm-up."""
    import torch
    import train_tiny

    model = train_tiny.build(0, size)
    train_tiny.look_where_it_was(model)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    clips = train_tiny.batches(
        0, batch, range(steps + 1), workers, device == "cuda", frames=frames, size=size,
        speed=train_tiny.SPEED, prompt_frames=prompt_frames, prompt_only=False,
    )  # fmt: skip
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    waited, began = 0.0, None
    for step in range(steps + 1):
        asked = time.perf_counter()
        drawn = next(clips)
        if step > 0:
            waited += time.perf_counter() - asked
        train_tiny.train_step(model, opt, train_tiny.to(drawn, device), autocast)
        sync()
        if step == 0:
            began = time.perf_counter()  # (after the warm-up)
    took = time.perf_counter() - began
    return steps * batch / took, waited / took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--sizes", default="128,256")
    parser.add_argument("--steps", type=int, help="timed steps each (default: 3 cpu, 10 cuda)")
    parser.add_argument("--workers", type=int, help="default: 1 on cpu, all cores but 2 on cuda")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: all cores)")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--prompt-frames", type=int, default=2)
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (10 if args.device == "cuda" else 3)
    workers = (
        args.workers
        if args.workers is not None
        else (max(1, (os.cpu_count() or 2) - 2) if args.device == "cuda" else 1)
    )
    rows = []
    for size in map(int, args.sizes.split(",")):
        for batch in map(int, args.batches.split(",")):
            rate, waiting = measure(args.device, batch, size, steps, workers, args.frames,
                                    args.prompt_frames)  # fmt: skip
            rows.append([size, batch, f"{rate:.2f}", f"{100 * waiting:.0f}%"])
            print(rows[-1], file=sys.stderr, flush=True)
    where = (
        torch.cuda.get_device_name() if args.device == "cuda"
        else f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    )  # fmt: skip
    print(
        f"train_tiny's step on {where}, torch {torch.__version__}; {args.frames}-frame clips, "
        f"--prompt-frames {args.prompt_frames}, {workers} drawing workers, "
        f"{'bfloat16 autocast' if args.device == 'cuda' else 'float32'}, {steps} timed steps "
        "each after a warm-up\n"
    )
    print(table(["size", "batch", "clips/s", "data wait"], rows))


if __name__ == "__main__":
    main()
