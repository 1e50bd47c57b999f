#!/usr/bin/env python3
"""SAM 2's official video predictor beside segpipe, one run, one table, on the device given:
frames per second of the official predictor (plain, and `vos_optimized` on CUDA), of segpipe's
encode, track and whole pipeline (decode + encode + track), parity (mask pixels and object
scores that differ between the two, forward pass) and peak accelerator memory.

On CUDA the defaults are the issue's measurement: sam2.1_hiera_t and _l at 1024 on a
synthetic 300-frame clip, both under bfloat16 autocast (SAM 2's GPU usage). On the CPU it
runs small (`--size 128 --frames 6`) as the smoke test `make test` runs. Random weights:
speed and parity do not depend on them (`--checkpoint` takes real ones for one model).
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "data"))
sys.path.insert(0, str(ROOT / "tests"))
from measure import table  # noqa: E402


def peak_reset(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device: str) -> float | str:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return "n/a (cpu)"


def bench_model(name: str, args, root: Path) -> dict:
    import make_sample
    import numpy as np
    import torch
    from oracle import oracle_tracking

    from segpipe.model import Weights, build_model, pick_device, pick_precision, resolve_weights
    from segpipe.stages.decode import decode
    from segpipe.stages.encode import encode
    from segpipe.stages.track.stage import track

    device = pick_device(args.device)
    precision = pick_precision(None, device)
    weights = (
        resolve_weights(name, args.checkpoint, None) if args.checkpoint else Weights(random_seed=0)
    )
    frames, masks = make_sample.make_clip(num_frames=args.frames, width=640, height=480)
    make_sample.write_video(root / "clip.mp4", frames)
    make_sample.write_prompts(root, masks, frames=(0, 1, 2))
    prompts = root / "prompts.json"
    model = build_model(name, args.size, weights, device)
    store = root / f"{name}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    seed = None if args.checkpoint else 0

    start = time.perf_counter()
    decode(root / "clip.mp4", store, args.chunk_size, args.size, quiet=True)
    decoded = time.perf_counter()
    peak_reset(device)
    encode(
        store,
        name,
        args.checkpoint,
        seed,
        device,
        args.batch_size,
        quiet=True,
        predictor=model,
        precision=precision,
    )
    encoded = time.perf_counter()
    track(store, prompts, "forward", device, args.checkpoint, quiet=True, predictor=model)
    tracked = time.perf_counter()
    ours_peak = peak_mib(device)

    import zarr

    group = zarr.open_group(str(store), mode="r")
    ours_masks, ours_scores = group["masks"][...], group["object_scores"][...]
    row = {
        "model": name,
        "device": device,
        "precision": precision,
        "size": args.size,
        "frames": args.frames,
        "segpipe encode fps": args.frames / (encoded - decoded),
        "segpipe track fps": args.frames / (tracked - encoded),
        "segpipe end-to-end fps": args.frames / (tracked - start),
        "segpipe peak MiB": ours_peak,
    }
    variants = ["official"]
    if device == "cuda" and not args.no_vos_optimized:
        variants.append("official vos_optimized")
    for label in variants:
        predictor = model
        if label != "official":  # built only now: its weights are not in the plain run's peak
            from sam2.build_sam import build_sam2_video_predictor

            from segpipe.model import OFFICIAL

            torch._dynamo.reset()
            predictor = build_sam2_video_predictor(
                OFFICIAL[name][0],
                device=device,
                vos_optimized=True,
                hydra_overrides_extra=[f"++model.image_size={args.size}"],
            )
            predictor.load_state_dict(model.state_dict())
            # warm-up: torch.compile's first calls compile (minutes), not measured
            oracle_tracking(store, prompts, predictor, precision=precision, directions=("forward",))
        peak_reset(device)
        # the time inside propagate_in_video (it encodes the frames), as SAM 2's own
        # benchmark measures; writing and loading the frame folder is setup
        result = oracle_tracking(
            store, prompts, predictor, precision=precision, directions=("forward",)
        )
        row[f"{label} fps"] = args.frames / result.seconds
        row[f"{label} peak MiB"] = peak_mib(device)
        row[f"{label} mask pixels differing"] = int((result.masks["forward"] != ours_masks).sum())
        a = np.ascontiguousarray(result.scores["forward"], np.float32).view(np.uint32)
        b = np.ascontiguousarray(ours_scores, np.float32).view(np.uint32)
        row[f"{label} scores differing"] = int((a != b).sum())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--models", default="sam2.1_hiera_t,sam2.1_hiera_l")
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--no-vos-optimized", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    import torch

    print(
        f"torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "")
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows.append(bench_model(name, args, Path(tmp)))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print(
        table(
            ["measure"] + [r["model"] for r in rows],
            [[k] + [r.get(k, "") for r in rows] for k in keys if k != "model"],
        )
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
