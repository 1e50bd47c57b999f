#!/usr/bin/env python3
"""Decode stage beside bare PyAV decoding of the same 640x480 H.264 file, in one run.

Bare = PyAV decode + conversion to RGB arrays (what any consumer of frames pays).
Prints frames/s of both, their ratio, and peak RSS at each clip length.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_sample  # noqa: E402
from measure import looped_clip, measure, python, segpipe, table  # noqa: E402

BARE = """
import av, sys
with av.open(sys.argv[1]) as c:
    s = c.streams.video[0]; s.thread_type = "AUTO"
    n = sum(1 for f in c.decode(s) if f.to_ndarray(format="rgb24") is not None)
"""
# The least work that gives SAM 2's input: decode, RGB, PIL resize (one thread, no storage).
RESIZE = """
import av, sys
import numpy as np
S = int(sys.argv[2])
with av.open(sys.argv[1]) as c:
    s = c.streams.video[0]; s.thread_type = "AUTO"
    n = sum(1 for f in c.decode(s) if np.asarray(f.to_image().resize((S, S))) is not None)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[300, 3000])
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=32)
    args = parser.parse_args()
    rows = []
    base, _ = make_sample.make_clip(num_frames=100, width=640, height=480)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lengths:
            clip = Path(tmp) / f"clip{n}.mp4"
            looped_clip(clip, base, n)
            bare_s, bare_rss, _ = measure(python(BARE) + [str(clip)])
            resize_s, _, _ = measure(python(RESIZE) + [str(clip), str(args.image_size)])
            ours_s, ours_rss, _ = measure(
                segpipe(
                    "decode",
                    clip,
                    "--store",
                    Path(tmp) / f"s{n}.zarr",
                    "--image-size",
                    args.image_size,
                    "--chunk-size",
                    args.chunk_size,
                )
            )
            rows.append(
                [
                    n,
                    n / bare_s,
                    n / resize_s,
                    n / ours_s,
                    bare_s / ours_s,
                    resize_s / ours_s,
                    bare_rss,
                    ours_rss,
                ]
            )
    print(
        f"decode, 640x480 H.264 -> {args.image_size}x{args.image_size}, chunk {args.chunk_size} "
        f"(process start included)"
    )
    print(
        table(
            [
                "frames",
                "bare fps",
                "bare+resize fps",
                "segpipe fps",
                "ratio to bare",
                "ratio to bare+resize",
                "bare RSS MiB",
                "segpipe RSS MiB",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
