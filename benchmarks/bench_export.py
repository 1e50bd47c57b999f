#!/usr/bin/env python3
"""Export frames/s per format for a 640x480 clip with 3 objects, and peak RSS at two lengths.

The store is decoded by segpipe; its masks are the clip's ground truth written in place of
tracking results (tracking 3000 frames on CPU takes far longer than exporting them, and the
export stage reads a store's masks the same whichever way they got there).
"""

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
sys.path.insert(0, str(HERE.parent))
import make_sample  # noqa: E402
from measure import looped_clip, measure, segpipe, table  # noqa: E402


def fake_tracked_store(store: Path, masks_for) -> None:
    """Write ground-truth masks as the tracking results of a decoded store."""
    import numpy as np

    from segpipe.plan import ChunkPlan
    from segpipe.store.runstore import RunStore

    s = RunStore.open(store)
    T, C = s.attrs["frame_count"], s.attrs["decoding"]["chunk_size"]
    H, W = s.attrs["video"]["height"], s.attrs["video"]["width"]
    ids = [1, 2, 3]
    arr = s.create_array(
        "masks",
        (T, 3, H, W),
        (C, 1, H, W),
        "bool",
        fill_value=False,
        attributes={"object_ids": ids},
    )
    for k in ChunkPlan(T, C):
        lo, hi = ChunkPlan(T, C).bounds(k)
        arr[lo:hi] = np.stack([masks_for(t) for t in range(lo, hi)])
        for o in range(3):  # a ledger per object
            s.ledger(f"track_forward/{o}").mark_done(k)
    s.set_attrs(
        track={
            "prompts_sha256": "benchmark",
            "direction": "forward",
            "object_ids": ids,
            "start_frame": 0,
            "prompts": [],
        }
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[300, 3000])
    args = parser.parse_args()
    base, masks = make_sample.make_clip(num_frames=100, width=640, height=480)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lengths:
            clip = Path(tmp) / f"clip{n}.mp4"
            looped_clip(clip, base, n)
            store = Path(tmp) / f"s{n}.zarr"
            measure(
                segpipe("decode", clip, "--store", store, "--image-size", 64, "--chunk-size", 32)
            )
            fake_tracked_store(store, lambda t: masks[t % 100])
            for fmt, out in (("davis", "davis"), ("vis-json", "m.json"), ("overlay", "o.mp4")):
                seconds, rss, _ = measure(
                    segpipe(
                        "export",
                        "--store",
                        store,
                        "--format",
                        fmt,
                        "--out",
                        Path(tmp) / f"{n}_{out}",
                    )
                )
                rows.append([n, fmt, n / seconds, rss])
    print("export, 640x480, 3 objects, chunk 32 (process start included)")
    print(table(["frames", "format", "frames/s", "peak RSS MiB"], rows))


if __name__ == "__main__":
    main()
