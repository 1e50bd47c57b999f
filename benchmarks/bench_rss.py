#!/usr/bin/env python3
"""Peak RSS of a whole `segpipe run` at two video lengths (40 and 160 frames by default),
under `--keep all` and `--keep masks`: with the writes and the decoding read-ahead running
behind the tracking, memory must stay bounded by chunks, not grow with the video (the
ratio of the long run's peak to the short one's stays at 1.00)."""

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import looped_clip, measure, segpipe, table  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs=2, default=[40, 160])
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--model", default="sam2.1_hiera_t")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base, masks = make_sample.make_clip(num_frames=24, width=320, height=240, seed=1)
        make_sample.write_prompts(tmp, masks, frames=(0, 2, 4))
        peaks = {}
        for keep in ("all", "masks"):
            for n in args.lengths:
                video = looped_clip(tmp / f"clip{n}.mp4", base, n)
                store = tmp / f"{keep}{n}.zarr"
                seconds, rss, _ = measure(
                    segpipe(
                        "run",
                        video,
                        "--store",
                        store,
                        "--prompts",
                        tmp / "prompts.json",
                        "--model",
                        args.model,
                        "--random-weights",
                        0,
                        "--image-size",
                        args.image_size,
                        "--chunk-size",
                        args.chunk_size,
                        "--keep",
                        keep,
                        "--export",
                        "davis",
                    )
                )
                peaks[keep, n] = rss
                rows.append([keep, n, round(seconds, 1), round(rss)])
        short, long = args.lengths
        print(table(["--keep", "frames", "seconds", "peak RSS MiB"], rows))
        for keep in ("all", "masks"):
            ratio = peaks[keep, long] / peaks[keep, short]
            print(f"--keep {keep}: peak RSS {long} / {short} frames = {ratio:.2f}")


if __name__ == "__main__":
    main()
