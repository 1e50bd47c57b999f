#!/usr/bin/env python3
"""Where the host's time goes, per frame, outside SAM 2's networks: `segpipe run` (`--keep
all` and `--keep masks`) beside SAM 2's own predictor (`init_state` from a JPEG folder, then
`propagate_in_video`), each in a fresh process at the same thread count.

Every step is timed where it runs: a timer around each host step of segpipe (decode, resize,
frame writes and reads, preprocessing, feature conversions, writes and reads, the tracker's
bookkeeping, mask upsampling and packing, memory snapshots, fsyncs and ledger, exports) and
forward hooks around each of SAM 2's networks (image encoder, memory attention, memory
encoder, prompt encoder, mask decoder, pointer projections). A step's time is its own
(exclusive): the steps and networks it calls are counted apart. Only the main thread is on
the critical path; work on other threads (read-ahead, writes behind) is overlapped with it
and shown apart.

"host on the critical path" is the main thread's wall time less its time inside the
networks: what a GPU's 50-100x faster networks would leave. Timings start after the model
is built (both sides), so start-up is not in them. Random weights: the host's work does not
depend on them.

    python benchmarks/bench_host.py                    # 1024, 24 frames, chunks of 8
    python benchmarks/bench_host.py --size 256 --frames 16 --json host.json
    python benchmarks/bench_host.py --repeat 3         # each figure the median of 3 runs

On two cores the threads behind the tracking take cores from the main thread now and then,
so one run's figures scatter by tens of ms a frame; `--repeat N` runs every side N times,
interleaved (side after side, so a slow spell of the machine falls on all of them), and
reports each figure's median over the runs, with every run's host figure beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "data"))
from measure import table  # noqa: E402

NETWORKS = (
    "image_encoder",
    "memory_attention",
    "memory_encoder",
    "sam_prompt_encoder",
    "sam_mask_decoder",
    "obj_ptr_proj",
    "obj_ptr_tpos_proj",
    "mask_downsample",
    # forward_image calls these two of the mask decoder's convolutions itself
    "sam_mask_decoder.conv_s0",
    "sam_mask_decoder.conv_s1",
)


class Timers:
    """Exclusive time per label, on the main thread (the critical path) and off it."""

    def __init__(self):
        self.main = threading.main_thread().ident
        self.own = defaultdict(float)  # label -> exclusive seconds on the main thread
        self.off = defaultdict(float)  # label -> inclusive seconds on other threads
        self.calls = defaultdict(int)
        self.stack: list[list] = []  # [label, start, children's seconds]

    def enter(self, label: str) -> None:
        if threading.get_ident() == self.main:
            self.stack.append([label, time.perf_counter(), 0.0])

    def leave(self, label: str, began: float | None = None) -> None:
        now = time.perf_counter()
        if threading.get_ident() != self.main:
            self.off[label] += now - began
            return
        name, start, children = self.stack.pop()
        assert name == label, (name, label)
        spent = now - start
        self.own[label] += spent - children
        self.calls[label] += 1
        if self.stack:
            self.stack[-1][2] += spent

    def wrap(self, func, label: str):
        timers = self

        def timed(*args, **kwargs):
            began = time.perf_counter()
            timers.enter(label)
            try:
                return func(*args, **kwargs)
            finally:
                timers.leave(label, began)

        timed.__wrapped__ = func
        return timed

    def patch(self, owner, name: str, label: str) -> None:
        """Time `owner.name` (a class's method or a module's function), and the same
        function wherever a segpipe or sam2 module imported it by name."""
        func = getattr(owner, name)
        timed = self.wrap(func, label)
        setattr(owner, name, timed)
        for module in list(sys.modules.values()):
            mname = getattr(module, "__name__", "")
            if mname.startswith(("segpipe", "sam2")) and getattr(module, name, None) is func:
                setattr(module, name, timed)

    def hook_networks(self, model) -> None:
        for name in NETWORKS:
            module = model
            for part in name.split("."):
                module = getattr(module, part, None)
            if module is None or not hasattr(module, "register_forward_pre_hook"):
                continue
            label = f"network: {name}"
            starts: list[float] = []

            def pre(mod, args, label=label, starts=starts):
                starts.append(time.perf_counter())
                self.enter(label)

            def post(mod, args, out, label=label, starts=starts):
                self.leave(label, starts.pop())

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)


def segpipe_steps(timers: Timers) -> None:
    """Timers around segpipe's host steps."""
    from segpipe import fsutil
    from segpipe.models.sam2 import frames as sam2_frames
    from segpipe.sources import frames
    from segpipe.stages import alongside, decode, encode
    from segpipe.stages.export import as_tracked
    from segpipe.stages.track import memory, stage, supply, tracker
    from segpipe.store import features, masks, runstore

    steps = [
        (decode, "_decode_chunks", "decode: first pass (before the tracking or alongside it)"),
        (alongside.Alongside, "wait", "waiting for a chunk to be decoded (alongside)"),
        (decode.Redecoder, "frames", "decode again (--keep masks: into memory)"),
        (decode.Redecoder, "chunk", "decode again, written (repair)"),
        (frames, "model_input", "resize to the model's input"),
        (frames, "digested_input", "frame prepared (other)"),
        (frames, "frame_digests", "frame digests"),
        (encode.FramesOnDisk, "__call__", "frames read from the store"),
        (sam2_frames, "preprocess", "preprocess (normalise)"),
        (features, "to_storage", "features to host, stored dtype"),
        (encode, "write_features", "features written"),
        (supply.ChunkSupply, "ensure", "supply: encode where missing (other)"),
        (tracker.StoredFeatures, "_read", "features read (host)"),
        (tracker.StoredFeatures, "load", "features to the device"),
        (tracker.Tracker, "restore", "memory restored / prompts applied"),
        (tracker.Tracker, "sync_state", "tracker state sync"),
        (tracker.Tracker, "track_frame", "SAM 2 step outside networks"),
        (tracker, "pack_bits", "masks packed"),
        (tracker, "chunk_scores", "scores to host"),
        (tracker, "chunk_areas", "areas to host"),
        (masks, "write_packed", "masks written"),
        (memory.MemoryStore, "write_snapshot", "memory snapshot written"),
        (runstore.RunStore, "commit_objects", "chunk committed (fsync, ledger)"),
        (runstore.RunStore, "commit", "chunk committed (fsync, ledger)"),
        (fsutil, "fsync_entry", "fsync"),
        (fsutil, "fsync_path", "fsync"),
        (tracker.Tracker, "write", "chunk write (other)"),
        (as_tracked.ExportsAsTracked, "committed", "exports as tracked"),
        (stage, "run_passes", "tracking passes (other)"),
    ]
    for owner, name, label in steps:
        if hasattr(owner, name):
            timers.patch(owner, name, label)
    from sam2.sam2_video_predictor import SAM2VideoPredictor

    timers.patch(SAM2VideoPredictor, "_get_orig_video_res_output", "masks upsampled")


def official_steps(timers: Timers) -> None:
    from sam2 import sam2_video_predictor
    from sam2.sam2_video_predictor import SAM2VideoPredictor

    timers.patch(sam2_video_predictor, "load_video_frames", "load frames (JPEG folder)")
    timers.patch(SAM2VideoPredictor, "_get_orig_video_res_output", "masks upsampled")
    timers.patch(SAM2VideoPredictor, "_run_single_frame_inference", "SAM 2 step outside networks")


def child(args) -> dict:
    """One measured run in this process."""
    import numpy as np
    import torch

    from segpipe.model import Weights, pick_device, shared_predictor

    device = pick_device(args.device)
    work = Path(args.work)
    timers = Timers()
    if args.side == "official":
        from sam2.build_sam import build_sam2_video_predictor

        from segpipe.models.sam2.catalog import OFFICIAL

        predictor = build_sam2_video_predictor(
            OFFICIAL[args.model][0],
            device=device,
            hydra_overrides_extra=[f"++model.image_size={args.size}"],
        )
        ours = shared_predictor(args.model, args.size, Weights(random_seed=0), device)
        predictor.load_state_dict(ours.state_dict())
        official_steps(timers)
        timers.hook_networks(predictor)
        prompt = json.loads((work / "prompts.json").read_text())["prompts"][0]
        bf16 = (args.precision or ("bfloat16" if device == "cuda" else "float32")) == "bfloat16"
        autocast = torch.autocast(torch.device(device).type, torch.bfloat16, enabled=bf16)
        began = time.perf_counter()
        with torch.inference_mode(), autocast:
            state = predictor.init_state(video_path=str(work / "jpegs"))
            predictor.add_new_points_or_box(
                state,
                prompt["frame"],
                prompt["object"],
                points=np.array(prompt["points"], np.float32),
                labels=np.array(prompt["labels"], np.int32),
            )
            for _, _, video_res in predictor.propagate_in_video(state):
                (video_res[:, 0] > 0.0).cpu().numpy()
        wall = time.perf_counter() - began
    else:
        from segpipe.cli import cli

        # the model built before timing (the run takes this thread's kept one), as above
        shared_predictor(args.model, args.size, Weights(random_seed=0), device)
        segpipe_steps(timers)
        from segpipe.model import shared_predictor as kept

        timers.hook_networks(kept(args.model, args.size, Weights(random_seed=0), device))
        store = work / f"{args.side}.zarr"
        argv = [
            "run",
            str(work / "clip.mp4"),
            "--store",
            str(store),
            "--prompts",
            str(work / "prompts.json"),
            "--model",
            args.model,
            "--random-weights",
            "0",
            "--image-size",
            str(args.size),
            "--chunk-size",
            str(args.chunk_size),
            "--direction",
            "forward",
            "--keep",
            args.side,
            "--device",
            args.device,
            "--quiet",
        ]
        if args.precision:
            argv += ["--precision", args.precision]
        began = time.perf_counter()
        try:
            cli.main(argv, standalone_mode=False)
        finally:
            wall = time.perf_counter() - began
    network = sum(v for k, v in timers.own.items() if k.startswith("network"))
    return {
        "wall": wall,
        "network": network,
        "own": dict(timers.own),
        "off": dict(timers.off),
        "frames": int(args.frames),
    }


def make_inputs(work: Path, frames: int) -> None:
    import make_sample
    from PIL import Image

    clip, masks = make_sample.make_clip(num_frames=frames, width=640, height=480)
    make_sample.write_video(work / "clip.mp4", clip)
    (work / "jpegs").mkdir()
    for t, frame in enumerate(clip):  # the predictor's input: a JPEG folder
        Image.fromarray(frame).save(work / "jpegs" / f"{t:05d}.jpg", quality=95)
    x, y = make_sample.centroid(masks[0, 0])
    prompt = {"object": 1, "frame": 0, "points": [[x, y]], "labels": [1]}
    (work / "prompts.json").write_text(json.dumps({"prompts": [prompt]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--frames",
        default="8,24",
        help="N, or A,B: the marginal cost per frame from A to B frames (start-up and "
        "first-chunk costs cancel out)",
    )
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--model", default="sam2.1_hiera_t")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default=None, help="float32 or bfloat16 (the device's)")
    parser.add_argument("--sides", default="all,masks,official")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each side; figures are the medians"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a child: one measured run
        print(json.dumps(child(args)))
        return
    counts = [int(n) for n in str(args.frames).split(",")]
    repeats = []  # per repetition: side -> result (marginal where two counts)
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            (Path(tmp) / str(n)).mkdir()
            make_inputs(Path(tmp) / str(n), n)
        for _ in range(args.repeat):
            runs = {}  # frame count -> side -> result
            for n in counts:
                work = Path(tmp) / str(n)
                for side in args.sides.split(","):
                    runs.setdefault(n, {})[side] = measured(args, side, work, n)
            repeats.append(
                runs[counts[-1]] if len(counts) == 1 else marginal(runs[counts[0]], runs[counts[1]])
            )
    results = median_of(repeats)
    print(report(results, args, repeats))
    if args.json:
        args.json.write_text(json.dumps({"median": results, "runs": repeats}, indent=1))


def measured(args, side: str, work: Path, n: int) -> dict:
    """One side's run in a fresh process, its store and exports made anew (an earlier
    repetition's removed)."""
    for made in work.glob(f"{side}.*"):
        shutil.rmtree(made)
    argv = [sys.executable, __file__, "--side", side, "--work", str(work), "--frames", str(n)]
    for flag in ("size", "chunk_size", "model", "device", "precision"):
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    out = subprocess.run(argv, capture_output=True, text=True, env=os.environ)
    if out.returncode:
        sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def host_of(result: dict) -> float:
    """Host time on the critical path: the main thread's wall less its networks."""
    return result["wall"] - result["network"]


def rest(result: dict) -> float:
    """Host time on the main thread that no timer names."""
    named = sum(v for k, v in result["own"].items() if not k.startswith("network"))
    return host_of(result) - named


def median_of(repeats: list[dict]) -> dict:
    """Per side, each figure's median over the repetitions (a step missing from a run: 0);
    `host` the median of each run's wall less its networks (not the medians' difference)."""
    out = {}
    for side in repeats[0]:
        runs = [r[side] for r in repeats]
        out[side] = {k: statistics.median(r[k] for r in runs) for k in ("wall", "network")}
        out[side]["host"] = statistics.median(host_of(r) for r in runs)
        out[side]["rest"] = statistics.median(rest(r) for r in runs)
        out[side]["frames"] = runs[0]["frames"]
        for part in ("own", "off"):
            keys = set().union(*(r[part] for r in runs))
            out[side][part] = {
                k: statistics.median(r[part].get(k, 0.0) for r in runs) for k in keys
            }
    return out


def how_many(frames: str) -> str:
    counts = str(frames).split(",")
    if len(counts) == 1:
        return f"{counts[0]} frames"
    return f"marginal from {counts[0]} to {counts[1]} frames"


def marginal(a: dict, b: dict) -> dict:
    """Per side, B's figures less A's, over B's frames less A's."""

    def less(x: dict, y: dict) -> dict:
        return {k: x.get(k, 0.0) - y.get(k, 0.0) for k in set(x) | set(y)}

    return {
        side: {
            "wall": b[side]["wall"] - a[side]["wall"],
            "network": b[side]["network"] - a[side]["network"],
            "own": less(b[side]["own"], a[side]["own"]),
            "off": less(b[side]["off"], a[side]["off"]),
            "frames": b[side]["frames"] - a[side]["frames"],
        }
        for side in b
    }


def report(results: dict, args, repeats: list[dict]) -> str:
    names = {"all": "run --keep all", "masks": "run --keep masks", "official": "SAM 2 predictor"}
    sides = list(results)

    def ms(side, seconds):
        return f"{1000 * seconds / results[side]['frames']:.1f}"

    labels = sorted(
        {k for r in results.values() for k in r["own"] if not k.startswith("network")},
        key=lambda k: -max(r["own"].get(k, 0) for r in results.values()),
    )
    rows = [["wall (main thread)"] + [ms(s, results[s]["wall"]) for s in sides]]
    rows.append(["inside SAM 2's networks"] + [ms(s, results[s]["network"]) for s in sides])
    host = {s: results[s]["host"] for s in sides}  # (a median: of each run's own figure)
    rows.append(["HOST ON THE CRITICAL PATH"] + [ms(s, host[s]) for s in sides])
    if len(repeats) > 1:  # each run's own figure, the median above
        rows.append(
            ["  each run"] + [" / ".join(ms(s, host_of(r[s])) for r in repeats) for s in sides]
        )
    for label in labels:
        rows.append(["  " + label] + [ms(s, results[s]["own"].get(label, 0.0)) for s in sides])
    rows.append(["  (untimed: the rest)"] + [ms(s, results[s]["rest"]) for s in sides])
    off = sorted({k for r in results.values() for k in r["off"]})
    for label in off:
        rows.append(
            ["off the main thread: " + label]
            + [ms(s, results[s]["off"].get(label, 0.0)) for s in sides]
        )
    head = (
        f"ms per frame: {args.model} at {args.size}, {how_many(args.frames)} of 640x480, "
        f"chunks of {args.chunk_size}, one object, forward, device {args.device}, "
        + (f"median of {args.repeat} runs, " if args.repeat > 1 else "")
        + f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    return head + "\n" + table(["step"] + [names.get(s, s) for s in sides], rows)


if __name__ == "__main__":
    main()
