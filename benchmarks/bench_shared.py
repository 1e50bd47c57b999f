#!/usr/bin/env python3
"""A frame's object-independent steps done once (`stages.track.shared`): segpipe's tracking of
16 objects with them shared, beside the same tracking with every object computing its own
(as SAM 2's predictor does), in one process, alternating, on the same stored embeddings
(SAM 2.1 tiny, seeded random weights, 20 frames of 320x240 at 256, a point per object on
frame 0, forward), and whether the two give the same masks and scores bit for bit. Times
are the process's CPU seconds of each `track` (the model's build not counted); the
minimum of the repeats.

    python benchmarks/bench_shared.py --objects 16 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import table  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    import segpipe
    from segpipe.model import Weights, build_model
    from segpipe.settings import Decoding, Encoding, Execution, Tracking
    from segpipe.stages.decode import decode
    from segpipe.stages.encode import encode
    from segpipe.stages.track import shared
    from segpipe.stages.track.stage import track

    folder = Path(tempfile.mkdtemp(prefix="bench_shared"))
    try:
        frames, _ = make_sample.make_clip(num_frames=args.frames, width=320, height=240, seed=3)
        make_sample.write_video(folder / "clip.mp4", frames)
        model = build_model("sam2.1_hiera_t", args.image_size, Weights(random_seed=0))
        base = folder / "base.zarr"
        decode(folder / "clip.mp4", base, Decoding(8, args.image_size), quiet=True)
        encode(base, Encoding(random_weights=0), Execution(progress=False), predictor=model)
        points = [
            {"object": i + 1, "frame": 0, "points": [[8 + (i % 8) * 38, 20 + (i // 8) * 40]]}
            for i in range(args.objects)
        ]
        prompts = folder / "prompts.json"
        prompts.write_text(json.dumps({"prompts": [{**p, "labels": [1]} for p in points]}))
        real = shared.PerFrame.frame
        seconds, results = {True: [], False: []}, {}
        for r in range(args.repeats):
            for on in (True, False):
                shared.PerFrame.frame = real if on else (lambda self: contextlib.nullcontext())
                store = shutil.copytree(base, folder / f"{on}{r}.zarr")
                began, wall = cpu_seconds(), time.perf_counter()
                track(
                    store,
                    prompts,
                    Tracking("forward"),
                    execution=Execution(progress=False, force=True),
                    predictor=model,
                )
                seconds[on].append(cpu_seconds() - began)
                print(
                    f"{'shared' if on else 'each object'}: {seconds[on][-1]:.2f} CPU s "
                    f"({time.perf_counter() - wall:.2f} s)",
                    flush=True,
                )
                run = segpipe.Run(store)
                results[on] = (run.masks(), run.scores)
        shared.PerFrame.frame = real
        same = np.array_equal(results[True][0], results[False][0]) and np.array_equal(
            results[True][1].view(np.uint32), results[False][1].view(np.uint32)
        )
        best = {on: min(s) / args.frames for on, s in seconds.items()}
        print(
            table(
                ["objects", "threads", "each object s/frame", "shared s/frame", "saved", "same"],
                [
                    [
                        args.objects,
                        torch.get_num_threads(),
                        best[False],
                        best[True],
                        f"{100 * (1 - best[True] / best[False]):.1f}%",
                        "same" if same else "DIFFER",
                    ]
                ],
            )
        )
        return 0 if same else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
