#!/usr/bin/env python3
"""Disk for hours of video: the pipelined `segpipe run --keep masks` beside the staged
`--keep all` (decode, encode, track, export as four commands, everything kept), on one clip:
wall time, peak bytes of the store during the run (sampled every 0.1 s), final bytes, and the
bound the issue sets for `--keep masks` (final masks + memory + 3 chunks of frames and
features). The results of both must be bit-identical (masks, object scores and tracked read
back verified, a missing chunk raising rather than reading as fill; the DAVIS PNGs byte for
byte); the script exits 1 if they differ or the peak exceeds the bound.

Clip: synthetic (data/make_sample.py), 320x240, image size 256, chunk 32, random weights,
one object boxed on frame 100 (so both passes run), direction both.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import ROOT, looped_clip, table  # noqa: E402

S, C = 256, 32


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def group_bytes(store: Path) -> dict:
    out = {}
    for name in ("frames", "features", "memory", "masks", "object_scores", "tracked"):
        out[name] = tree_bytes(store / name)
    return out


def timed_with_peak(commands: list[list], store: Path) -> tuple[float, int]:
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            if store.exists():
                peak[0] = max(peak[0], tree_bytes(store))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    began = time.perf_counter()
    try:
        for argv in commands:
            subprocess.run(
                [sys.executable, "-m", "segpipe.cli", *map(str, argv), "--quiet"],
                cwd=ROOT,
                check=True,
            )
    finally:
        stop.set()
        sampler.join()
    return time.perf_counter() - began, max(peak[0], tree_bytes(store))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[600, 2000])
    args = parser.parse_args()
    base, masks = make_sample.make_clip(num_frames=48, width=320, height=240, seed=5)
    rows, failed = [], False
    for T in args.frames:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            clip = looped_clip(tmp / "clip.mp4", base, T)
            box = make_sample.bbox(masks[100 % len(base), 1])
            prompts = tmp / "prompts.json"
            prompts.write_text(json.dumps({"prompts": [{"object": 1, "frame": 100, "box": box}]}))
            common = ["--random-weights", 0]
            staged, masks_store = tmp / "staged.zarr", tmp / "masks.zarr"
            staged_s, staged_peak = timed_with_peak(
                [
                    ["decode", clip, "--store", staged, "--chunk-size", C, "--image-size", S],
                    ["encode", "--store", staged, *common],
                    ["track", "--store", staged, "--prompts", prompts],
                    [
                        "export",
                        "--store",
                        staged,
                        "--format",
                        "davis",
                        "--out",
                        tmp / "staged_davis",
                    ],
                ],
                staged,
            )
            ours_s, ours_peak = timed_with_peak(
                [
                    [
                        "run",
                        clip,
                        "--store",
                        masks_store,
                        "--prompts",
                        prompts,
                        "--chunk-size",
                        C,
                        "--image-size",
                        S,
                        *common,
                        "--keep",
                        "masks",
                        "--export",
                        "davis",
                    ],
                ],
                masks_store,
            )
            same = same_results(staged, masks_store) and same_files(
                tmp / "staged_davis", tmp / "masks.export" / "davis"
            )
            final = group_bytes(masks_store)
            full = group_bytes(staged)
            per_chunk = (full["frames"] + full["features"]) / (-(-T // C))
            bound = (
                final["masks"]
                + final["object_scores"]
                + final["tracked"]
                + final["memory"]
                + 3 * per_chunk
            )
            rows.append(
                [
                    T,
                    "staged --keep all",
                    staged_s,
                    staged_peak / 2**20,
                    tree_bytes(staged) / 2**20,
                    "",
                    "",
                ]
            )
            rows.append(
                [
                    T,
                    "run --keep masks",
                    ours_s,
                    ours_peak / 2**20,
                    tree_bytes(masks_store) / 2**20,
                    bound / 2**20,
                    "yes" if same else "NO",
                ]
            )
            failed |= not same or ours_peak > bound
    print(
        table(
            [
                "frames",
                "how",
                "wall s",
                "peak MiB",
                "final MiB",
                "bound MiB (masks+memory+3 chunks)",
                "results identical",
            ],
            rows,
        )
    )
    sys.exit(1 if failed else 0)


def same_results(a: Path, b: Path) -> bool:
    from segpipe.store.runstore import RunStore

    sa, sb = RunStore.open(a, read_only=True), RunStore.open(b, read_only=True)
    return all(
        np.array_equal(sa.read(n), sb.read(n), equal_nan=n == "object_scores")
        for n in ("masks", "object_scores", "tracked")
    )


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    return (
        names == sorted(p.relative_to(b) for p in b.rglob("*.png"))
        and len(names) > 0
        and all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    )


if __name__ == "__main__":
    main()
