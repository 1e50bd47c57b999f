#!/usr/bin/env python3
"""Peak RSS at 4K with many objects: `segpipe run` of a synthetic 3840x2160 clip with 8 objects
(box prompts on frame 0, model input 256, random weights, davis and overlay exports), and of
track and the two exports on their own; this code beside another checkout (`--base`, e.g. a
worktree of the commit before the masks were chunked per object), each process measured
alone (`measure`). "this" is the segpipe the running Python imports; `--base-path DIR` is a
PYTHONPATH entry under which `import segpipe` gives the other code (a folder holding a
`segpipe` link to that checkout's `pipeline/`, whose `stages` links to `../stages`):

    python benchmarks/bench_4k.py --base-path /tmp/basepath
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import measure, segpipe, table  # noqa: E402

W, H, OBJECTS = 3840, 2160, 8


def make_4k_clip(folder: Path, frames: int) -> tuple[Path, Path]:
    """8 discs drifting over a textured background (cheaper than `make_clip` at this size),
    and a prompts file with each disc's box on frame 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    yy, xx = np.ogrid[0:H, 0:W]
    background = rng.integers(0, 40, (H, W, 3), dtype=np.uint8) + (90 + 40 * np.sin(xx / 61.0))[
        ..., None
    ].astype(np.uint8)
    centres = [(W * (0.12 + 0.25 * (i % 4)), H * (0.3 + 0.4 * (i // 4))) for i in range(OBJECTS)]
    r = 160
    video = np.empty((frames, H, W, 3), np.uint8)
    for t in range(frames):
        img = background.copy()
        for i, (cx, cy) in enumerate(centres):
            x, y = cx + 12 * t * (1 if i % 2 else -1), cy + 6 * t
            img[(xx - x) ** 2 + (yy - y) ** 2 <= r * r] = (40 + 25 * i, 200 - 20 * i, 90 + 15 * i)
        video[t] = img
    clip = folder / "clip4k.mp4"
    make_sample.write_video(clip, video)
    prompts = folder / "prompts.json"
    prompts.write_text(
        json.dumps(
            {
                "prompts": [
                    {"object": i + 1, "frame": 0, "box": [cx - r, cy - r, cx + r, cy + r]}
                    for i, (cx, cy) in enumerate(centres)
                ]
            }
        )
    )
    return clip, prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--chunk-size", type=int, default=32)  # segpipe's default
    parser.add_argument(
        "--base-path",
        type=Path,
        help="PYTHONPATH entry importing the segpipe to measure beside this one",
    )
    args = parser.parse_args()
    codes = [("this", {})]
    if args.base_path:
        codes.append(("base", {"PYTHONPATH": str(args.base_path.resolve())}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        clip, prompts = make_4k_clip(tmp, args.frames)
        common = ("--chunk-size", args.chunk_size, "--image-size", 256, "--random-weights", 0)
        encoded = tmp / "encoded.zarr"  # decode and encode are the same code in both
        measure(segpipe("decode", clip, "--store", encoded, *common[:4]))
        measure(segpipe("encode", "--store", encoded, "--random-weights", 0))
        for label, env in codes:
            where = measure([sys.executable, "-c", "import segpipe; print(segpipe.__file__)"], env)[
                2
            ]
            print(f"{label}: {where.strip()}", flush=True)
            store = tmp / f"{label}_run.zarr"
            seconds, rss, _ = measure(
                segpipe(
                    "run",
                    clip,
                    "--store",
                    store,
                    "--prompts",
                    prompts,
                    *common,
                    "--export",
                    "davis,overlay",
                ),
                env,
            )
            rows.append([label, "run --export davis,overlay", seconds, round(rss)])
            store = shutil.copytree(encoded, tmp / f"{label}_stages.zarr")
            seconds, rss, _ = measure(segpipe("track", "--store", store, "--prompts", prompts), env)
            rows.append([label, "track", seconds, round(rss)])
            for fmt, out in (("davis", "davis"), ("overlay", "o.mp4")):
                seconds, rss, _ = measure(
                    segpipe(
                        "export", "--store", store, "--format", fmt, "--out", tmp / f"{label}_{out}"
                    ),
                    env,
                )
                rows.append([label, f"export {fmt}", seconds, round(rss)])
            shutil.rmtree(store)
    print(
        f"{W}x{H}, {OBJECTS} objects, {args.frames} frames, chunk {args.chunk_size}, image size "
        f"256, random weights, {os.cpu_count()} CPUs (process start included)"
    )
    print(table(["code", "command", "seconds", "peak RSS MiB"], rows))
    run = rows[0][3]
    print(f"this code's run: {run} MiB, {'under' if run < 2048 else 'NOT under'} 2 GiB")


if __name__ == "__main__":
    main()
