#!/usr/bin/env python3
"""The encoder's batch size: `segpipe encode --batch-size B` for B = 1, 2, 4, 8, each a fresh
process on the same decoded store (copied), at each image size and torch thread count asked
for; seconds per frame, and whether every feature level is bit for bit batch 1's.

Each thread count runs with OMP_NUM_THREADS set to it, and also (the last column's rows
marked "unset") without OMP_NUM_THREADS, as a new user's shell starts it.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
sys.path.insert(0, str(HERE.parent))
import make_sample  # noqa: E402
from measure import measure, segpipe, table  # noqa: E402

LEVELS = ("features/level0", "features/level1", "features/level2")


def features(store: Path) -> list:
    import zarr

    group = zarr.open_group(str(store), mode="r")
    return [group[name][...] for name in LEVELS]


def same(a, b) -> bool:
    import numpy as np

    return all(
        x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8))
        for x, y in zip(a, b)
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--image-sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--threads", nargs="+", default=["1", "2", "unset"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    if "OMP_NUM_THREADS" in os.environ:  # the "unset" rows start without it
        sys.exit("run this benchmark without OMP_NUM_THREADS set (env -u OMP_NUM_THREADS ...)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        frames, _ = make_sample.make_clip(num_frames=args.frames, width=320, height=240)
        clip = tmp / "clip.mp4"
        make_sample.write_video(clip, frames)
        for size in args.image_sizes:
            decoded = tmp / f"d{size}.zarr"
            measure(
                segpipe("decode", clip, "--store", decoded, "--image-size", size, "--chunk-size", 8)
            )
            for threads in args.threads:
                env = {} if threads == "unset" else {"OMP_NUM_THREADS": threads}
                reference = None
                for batch in args.batch_sizes:
                    store = tmp / f"e{size}_{threads}_{batch}.zarr"
                    shutil.copytree(decoded, store)
                    began = time.monotonic()
                    seconds, rss, _ = measure(
                        segpipe(
                            "encode", "--store", store, "--random-weights", 0, "--batch-size", batch
                        ),
                        env=env,
                    )
                    got = features(store)
                    reference = got if reference is None else reference
                    rows.append(
                        [size, threads, batch, seconds / args.frames, same(got, reference), rss]
                    )
                    shutil.rmtree(store)
                    print(
                        f"  {size} {threads} {batch}: {time.monotonic() - began:.1f} s",
                        file=sys.stderr,
                    )
    print(
        f"segpipe encode, sam2.1_hiera_t (seeded random weights), {args.frames} frames, chunks "
        f"of 8, CPU ({os.cpu_count()} cores); s/frame includes process start and model build"
    )
    print(table(["size", "threads", "batch", "s/frame", "= batch 1", "RSS MiB"], rows))


if __name__ == "__main__":
    main()
