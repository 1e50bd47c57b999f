#!/usr/bin/env python3
"""Many objects through a whole run: `segpipe run` with 100 objects (a point each on frame 0,
on a grid) at image size 256, on clips of 50 and 200 frames, exporting DAVIS PNGs and
YouTube-VIS JSON: wall time, peak RSS (each run a fresh process), and whether the exports
carry every object (the PNGs' ids within 1..100, the JSON one entry per object). Bounded RAM
means the peak does not grow with the clip's length: the 200-frame run's peak is compared
with the 50-frame run's.

SAM 2.1 tiny with seeded random weights (RAM and exports do not depend on the weights),
chunk 16, forward, no thread variables (torch at the cores' count). The script exits 1 if
an export misses an object or the peak grows by more than 10% with the length.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from bench_objects import point_prompts  # noqa: E402
from measure import ROOT, looped_clip, measure, segpipe, table  # noqa: E402

WIDTH, HEIGHT = 320, 240


def main() -> int:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.pop(name, None)  # each run as a new user's shell starts it
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--frames", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=16)
    a = parser.parse_args()
    from PIL import Image

    rows, peaks, fine = [], [], True
    with tempfile.TemporaryDirectory(
        dir=ROOT / "build" if (ROOT / "build").is_dir() else None
    ) as tmp:
        work = Path(tmp)
        base, _ = make_sample.make_clip(num_frames=48, width=WIDTH, height=HEIGHT)
        prompts = point_prompts(work, a.objects, WIDTH, HEIGHT)
        for T in a.frames:
            video = looped_clip(work / f"clip{T}.mp4", base, T)
            store = work / f"clip{T}.zarr"
            seconds, rss, _ = measure(
                segpipe(
                    "run",
                    video,
                    "--store",
                    store,
                    "--prompts",
                    prompts,
                    "--image-size",
                    a.image_size,
                    "--chunk-size",
                    a.chunk_size,
                    "--random-weights",
                    0,
                    "--direction",
                    "forward",
                    "--export",
                    "davis,vis-json",
                ),
            )
            export = work / f"clip{T}.export"
            pngs = sorted((export / "davis").rglob("*.png"))
            ids = set()
            for png in pngs:
                ids |= set(np.unique(np.asarray(Image.open(png))).tolist())
            vis = json.loads((export / "masks.json").read_text())
            annotations = vis["annotations"] if isinstance(vis, dict) else vis
            carried = len(annotations)
            ok = len(pngs) == T and ids <= set(range(a.objects + 1)) and carried == a.objects
            fine &= ok
            peaks.append(rss)
            print(
                f"{T} frames: {seconds:.0f} s, peak RSS {rss:.0f} MiB, exports whole: {ok}",
                flush=True,
            )  # each run as it ends: a long run stopped still says something
            rows.append(
                [
                    T,
                    a.objects,
                    round(seconds, 1),
                    round(seconds / T, 2),
                    round(rss),
                    len(pngs),
                    max(ids),
                    carried,
                    "yes" if ok else "NO",
                ]
            )
    grows = peaks[-1] > 1.1 * peaks[0]
    fine &= not grows
    print(
        f"{a.objects} objects at {a.image_size}, chunk {a.chunk_size}, forward, random "
        f"weights, {WIDTH}x{HEIGHT}; `segpipe run` in a fresh process, exports davis,vis-json"
    )
    header = [
        "frames",
        "objects",
        "s",
        "s/frame",
        "peak RSS MiB",
        "PNGs",
        "max PNG id",
        "vis-json objects",
        "exports whole",
    ]
    print(table(header, rows))
    print(
        f"peak RSS {'grows' if grows else 'does not grow'} with the clip's length "
        f"({peaks[0]:.0f} -> {peaks[-1]:.0f} MiB)"
    )
    return 0 if fine else 1


if __name__ == "__main__":
    sys.exit(main())
