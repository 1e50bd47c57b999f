#!/usr/bin/env python3
"""Dataset mode beside SAM 2's vos_inference approach (every frame of a video and every
output mask held in memory until the video ends): peak RSS and wall time of both on
synthetic DAVIS-size datasets (854x480 JPEGs, 2 objects, first-frame annotations) of three
videos of 50 and of 200 frames, image size 256, random weights, on this CPU.

The reference is the tests' oracle (`tests/vos_oracle.py`: SAM 2's predictor, `init_state`
on the folder, `add_new_mask`, `propagate_in_video`, outputs collected, then written), run
over the videos one after another in one process, as the tool runs.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import measure, python, segpipe, table  # noqa: E402

THEIRS = """
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from vos_oracle import oracle_predictor, oracle_video
root, out = Path(sys.argv[1]), Path(sys.argv[2])
predictor = oracle_predictor(256, 0, postprocessing=False, per_obj=False)
for video in sorted(p.name for p in (root / "JPEGImages").iterdir()):
    oracle_video(predictor, root / "JPEGImages", root / "Annotations", out, video)
"""


def make_dataset(root: Path, videos: int, frames: int) -> Path:
    base, masks = make_sample.make_clip(num_frames=48, width=854, height=480, seed=3)
    for v in range(videos):
        folder = root / "JPEGImages" / f"video{v}"
        folder.mkdir(parents=True)
        for t in range(frames):
            Image.fromarray(base[t % len(base)]).save(folder / f"{t:05d}.jpg", quality=90)
        ids = np.zeros(masks.shape[2:], np.uint8)
        ids[masks[0, 1]] = 2
        ids[masks[0, 0]] = 1
        (root / "Annotations" / f"video{v}").mkdir(parents=True)
        Image.fromarray(ids).save(root / "Annotations" / f"video{v}" / "00000.png")
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--videos", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for n in args.frames:
        with tempfile.TemporaryDirectory() as tmp:
            root = make_dataset(Path(tmp) / "ds", args.videos, n)
            ours_s, ours_mib, _ = measure(
                segpipe(
                    "dataset",
                    "--base-video-dir",
                    root / "JPEGImages",
                    "--input-mask-dir",
                    root / "Annotations",
                    "--output-mask-dir",
                    Path(tmp) / "ours",
                    "--work-dir",
                    Path(tmp) / "work",
                    "--image-size",
                    256,
                    "--chunk-size",
                    16,
                    "--random-weights",
                    0,
                    "--device",
                    "cpu",
                )
            )
            theirs_s, theirs_mib, _ = measure(python(THEIRS) + [root, Path(tmp) / "theirs"])
            same = all(
                (Path(tmp) / "ours" / p.relative_to(Path(tmp) / "theirs")).read_bytes()
                == p.read_bytes()
                for p in (Path(tmp) / "theirs").rglob("*.png")
            )
            rows.append(
                [
                    f"{args.videos} x {n}",
                    ours_mib,
                    theirs_mib,
                    ours_s,
                    theirs_s,
                    "yes" if same else "NO",
                ]
            )
    print(
        table(
            [
                "dataset",
                "ours peak MiB",
                "vos_inference peak MiB",
                "ours s",
                "vos_inference s",
                "same PNG bytes",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
