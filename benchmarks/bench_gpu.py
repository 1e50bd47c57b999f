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
    from segpipe.settings import Decoding, Encoding, Execution, Tracking
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
    if args.runs_only:
        row = dict(model=name, device=device, precision=precision, size=args.size)
        return dict(row, frames=args.frames, **whole_runs(name, args, root, device, precision))
    model = build_model(name, args.size, weights, device)
    store = root / f"{name}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    seed = None if args.checkpoint else 0

    start = time.perf_counter()
    decode(root / "clip.mp4", store, Decoding(args.chunk_size, args.size), quiet=True)
    decoded = time.perf_counter()
    peak_reset(device)
    encoding = Encoding(name, args.checkpoint, seed, args.batch_size, precision=precision)
    encode(store, encoding, Execution(device=device, progress=False), predictor=model)
    encoded = time.perf_counter()
    track(
        store,
        prompts,
        Tracking("forward"),
        encoding=Encoding(checkpoint=args.checkpoint),
        execution=Execution(device=device, progress=False),
        predictor=model,
    )
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

            from segpipe.models.sam2.catalog import OFFICIAL

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
    if args.runs != "none":
        del model  # (one model resident in each peak below)
        row.update(whole_runs(name, args, root, device, precision))
    else:
        del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def whole_runs(name: str, args, root: Path, device: str, precision: str) -> dict:
    """`segpipe run` (`segpipe.run`, the call the command makes) from the video file, forward,
    no exports, under `--keep masks` and `--keep all`, beside SAM 2's predictor from a JPEG
    folder of the same clip with its frame loading (`init_state`) timed too: what each takes
    from a user's input to masks. The model is built before either is timed (segpipe takes
    this thread's kept one), so neither includes start-up; one model is resident in each
    peak of accelerator memory. Before anything is timed, a short `segpipe.run` (12 frames
    of the clip, chunks of 8, untimed) warms the device: the first CUDA calls of a process
    load kernels and make library handles (a visit measured the process's first run at 0.62x
    of the predictor, a second run at 1.13x); warmed, neither side pays for them. It also
    takes segpipe's one-time host costs (imports, thread pools) out of the timed runs, as
    the predictor's are out of its run: a warm process on both sides (the command's own
    start-up is `bench_startup.py`'s)."""
    import make_sample
    import torch
    from PIL import Image

    import segpipe
    from segpipe.model import Weights, release_predictors, resolve_weights, shared_predictor
    from segpipe.prompts import load

    out = {}
    seed = None if args.checkpoint else 0
    weights = (
        resolve_weights(name, args.checkpoint, None) if args.checkpoint else Weights(random_seed=0)
    )
    kept = shared_predictor(name, args.size, weights, device)  # built now: the runs take it
    warm_up(root, args, name, weights, device, precision)
    keeps = args.runs.split(",")
    runs = [k if keeps[:i].count(k) == 0 else f"{k} (again)" for i, k in enumerate(keeps)]
    for keep, label in zip(keeps, runs):
        store = root / f"{name}-run-{keep}.zarr"
        shutil.rmtree(store, ignore_errors=True)
        peak_reset(device)
        began = time.perf_counter()
        segpipe.run(
            root / "clip.mp4",
            store,
            root / "prompts.json",
            decoding=segpipe.Decoding(chunk_size=args.chunk_size, image_size=args.size),
            encoding=segpipe.Encoding(
                model=name, checkpoint=args.checkpoint, random_weights=seed, precision=precision
            ),
            execution=segpipe.Execution(device=device, progress=False),
            tracking=segpipe.Tracking(direction="forward"),
            output=segpipe.Output(keep=keep, exports=[]),
        )
        out[f"segpipe run --keep {label} fps"] = args.frames / (time.perf_counter() - began)
        out[f"segpipe run --keep {label} peak MiB"] = peak_mib(device)
        shutil.rmtree(store, ignore_errors=True)
    jpegs = root / "jpegs"
    if not jpegs.is_dir():
        jpegs.mkdir()
        frames, _ = make_sample.make_clip(num_frames=args.frames, width=640, height=480)
        for t, frame in enumerate(frames):
            Image.fromarray(frame).save(jpegs / f"{t:05d}.jpg", quality=95)
    prompts = load(root / "prompts.json", args.frames, 640, 480)
    from sam2.build_sam import build_sam2_video_predictor

    from segpipe.models.sam2.catalog import OFFICIAL

    official = build_sam2_video_predictor(  # as SAM 2's README builds it, our weights
        OFFICIAL[name][0], device=device, hydra_overrides_extra=[f"++model.image_size={args.size}"]
    )
    official.load_state_dict(kept.state_dict())
    del kept
    release_predictors()
    if device == "cuda":
        torch.cuda.empty_cache()
    model = official
    from oracle import add_prompts, memory_cast

    if precision == "float32":  # SAM 2 crashes without its documented cast (tests/oracle.py)
        memory_cast(model)
    peak_reset(device)
    began = time.perf_counter()
    with (
        torch.inference_mode(),
        torch.autocast(device, torch.bfloat16, enabled=precision == "bfloat16"),
    ):
        state = model.init_state(video_path=str(jpegs))
        add_prompts(model, state, prompts)
        for _, _, video_res in model.propagate_in_video(state):
            (video_res[:, 0] > 0.0).cpu().numpy()
    seconds = time.perf_counter() - began
    del state, official, model
    if device == "cuda":
        torch.cuda.empty_cache()
    out["official with frame loading fps"] = args.frames / seconds
    out["official with frame loading peak MiB"] = peak_mib(device)
    for label in runs:
        out[f"run --keep {label} / official (with loading)"] = (
            out[f"segpipe run --keep {label} fps"] / out["official with frame loading fps"]
        )
    return out


def warm_up(root: Path, args, name: str, weights, device: str, precision: str) -> None:
    """An untimed `segpipe.run` of a 12-frame clip (two chunks of 8: a memory saved and
    restored, the prompts of the clip's first frames) with the model already built (this
    thread's kept one)."""
    import make_sample

    import segpipe

    warm = root / "warm"
    shutil.rmtree(warm, ignore_errors=True)
    warm.mkdir()
    frames, masks = make_sample.make_clip(num_frames=12, width=640, height=480)
    make_sample.write_video(warm / "clip.mp4", frames)
    make_sample.write_prompts(warm, masks, frames=(0, 1, 2))
    segpipe.run(
        warm / "clip.mp4",
        warm / "store.zarr",
        warm / "prompts.json",
        decoding=segpipe.Decoding(chunk_size=8, image_size=args.size),
        encoding=segpipe.Encoding(
            model=name,
            checkpoint=args.checkpoint,
            random_weights=None if args.checkpoint else weights.random_seed,
            precision=precision,
        ),
        execution=segpipe.Execution(device=device, progress=False),
        tracking=segpipe.Tracking(direction="forward"),
        output=segpipe.Output(keep="masks", exports=[]),
    )
    shutil.rmtree(warm, ignore_errors=True)


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
    parser.add_argument(
        "--runs",
        default="masks,all",
        help="the `segpipe run --keep` rows beside the predictor with its frame loading "
        "(comma list of masks, all; 'none' leaves them out)",
    )
    parser.add_argument(
        "--runs-only",
        action="store_true",
        help="only those rows: no staged stages, no parity (gpu_parity.py checks that)",
    )
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
