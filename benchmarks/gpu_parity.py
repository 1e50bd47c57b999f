#!/usr/bin/env python3
"""segpipe against SAM 2's own predictor on a GPU, bit for bit: `segpipe run` (both
directions) of a synthetic clip, three objects prompted by points, a box and a mask, beside
`SAM2VideoPredictor` built with `sam2.build_sam` (tests/oracle.py) on the same frames,
weights and prompts, under the same precision. The cases: bfloat16 in chunks of 4,
bfloat16 in chunks of 16 under `--keep masks`, float32 in chunks of 4, and bfloat16 in
chunks of 4 killed (-9) mid-run, with its writes queued behind the tracking, then resumed.
Prints one line per case (differing mask pixels and object scores) and writes them as JSON.

    python benchmarks/gpu_parity.py --json parity.json        # on the GPU machine
    python benchmarks/gpu_parity.py --device cpu --size 128 --frames 12   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "data"))
sys.path.insert(0, str(ROOT / "tests"))


def differing(store: Path, oracle) -> tuple[int, int, int]:
    """(mask pixels, object scores differing from the oracle's `both`, scores compared)."""
    import numpy as np
    import zarr

    group = zarr.open_group(str(store), mode="r")
    masks, scores = group["masks"][...], group["object_scores"][...]
    a = np.ascontiguousarray(scores, np.float32).view(np.uint32)
    b = np.ascontiguousarray(oracle.scores["both"], np.float32).view(np.uint32)
    return int((masks != oracle.masks["both"]).sum()), int((a != b).sum()), int(a.size)


def args_of(work: Path, store: Path, size: int, chunk: int, precision: str, device: str):
    return [
        "run",
        str(work / "clip.mp4"),
        "--store",
        str(store),
        "--prompts",
        str(work / "prompts.json"),
        "--image-size",
        str(size),
        "--chunk-size",
        str(chunk),
        "--precision",
        precision,
        "--device",
        device,
        "--random-weights",
        "0",
        "--export",
        "none",
        "--quiet",
    ]


def forward_done(store: Path) -> list[int]:
    """The chunks the forward pass has committed (none while there is no store yet)."""
    import numpy as np

    from segpipe.store.runstore import RunStore

    try:
        return np.nonzero(RunStore.open(store).pass_ledger("forward").done())[0].tolist()
    except Exception:  # noqa: BLE001 - no store, or no tracking recorded yet
        return []


def killed_mid_run(argv: list[str], store: Path) -> str:
    """Run `segpipe` with `argv` in a child, kill it -9 once the forward pass has committed
    two chunks and gone on; say where it landed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "segpipe.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(forward_done(store)) >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return f"killed with forward chunks {forward_done(store)} committed"


def oracle_of(store: Path, prompts: Path, args, precision: str):
    """SAM 2's predictor (`tests/oracle.py`: built by `sam2.build_sam`, seed-0 weights) on the
    device, over the store's frames; with the documented memory cast only where SAM 2
    crashes without it (float32: an object tracked before its first prompt)."""
    from oracle import memory_cast, oracle_tracking, sam2_predictor

    predictor = sam2_predictor("sam2.1_hiera_t", args.size, 0).to(args.device)
    try:
        return oracle_tracking(store, prompts, predictor, precision=precision)
    except RuntimeError as e:
        if "dtype" not in str(e):
            raise
    handle = memory_cast(predictor)
    try:
        return oracle_tracking(store, prompts, predictor, precision=precision)
    finally:
        handle.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=41)
    parser.add_argument("--cases", default="bf16-4,bf16-16-masks,fp32-4,bf16-4-kill")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import make_sample
    import torch

    import segpipe.cli

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        frames, masks = make_sample.make_clip(num_frames=args.frames, width=640, height=480)
        make_sample.write_video(work / "clip.mp4", frames)
        make_sample.write_prompts(work, masks, frames=(3, 9, 15) if args.frames > 20 else (1, 2, 3))
        oracles = {}
        for case in args.cases.split(","):
            precision = "bfloat16" if case.startswith("bf16") else "float32"
            chunk = int(case.split("-")[1])
            store = work / f"{case}.zarr"
            argv = args_of(work, store, args.size, chunk, precision, args.device)
            if "masks" in case:
                argv += ["--keep", "masks"]
            began, note = time.perf_counter(), ""
            if "kill" in case:
                note = killed_mid_run(argv, store)
            segpipe.cli.cli.main(argv, standalone_mode=False)
            seconds = time.perf_counter() - began
            if precision not in oracles:
                oracles[precision] = oracle_of(store, work / "prompts.json", args, precision)
            pixels, scores, compared = differing(store, oracles[precision])
            row = dict(
                case=case,
                device=torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                frames=args.frames,
                size=args.size,
                mask_pixels_differing=pixels,
                scores_differing=scores,
                scores_compared=compared,
                seconds=round(seconds, 1),
                note=note,
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(store, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if any(r["mask_pixels_differing"] or r["scores_differing"] for r in rows):
        sys.exit("parity: some case differs from SAM 2's predictor")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
