#!/usr/bin/env python3
"""`make demo`: the sample clip through every stage with the best weights this machine has.

Weights, in order: `--checkpoint` (or $SEGPIPE_CHECKPOINT) as given; SAM 2.1 tiny from the
Hugging Face cache or downloaded (hf:facebook/sam2.1-hiera-tiny); else, offline, segpipe's own
`segpipe_tiny`, trained on synthetic clips (data/train_tiny.py, weights shipped in the package,
pipeline/weights/). It says
which it used, runs `segpipe run` (exports: DAVIS PNGs, YouTube-VIS JSON, overlay MP4) and
scores the masks against the clip's ground truth (J&F, DAVIS definitions).

    python data/demo.py --out build/demo
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO, FILE = "facebook/sam2.1-hiera-tiny", "sam2.1_hiera_tiny.pt"


def sam2_reachable() -> str | None:
    """The cached or downloaded SAM 2.1 tiny checkpoint, or None (offline and not cached):
    segpipe's own `hf:` resolution, which asks the cache first and the network only when the
    hub answers, so an offline machine does not wait for huggingface_hub's retries."""
    from segpipe.errors import BadInput
    from segpipe.model import resolve_weights

    try:
        return str(resolve_weights("sam2.1_hiera_t", f"hf:{REPO}", None).checkpoint)
    except BadInput:  # offline, refused, failed: use the shipped model
        return None


def pick_weights(checkpoint: str | None) -> tuple[list[str], str]:
    """`segpipe run` options for the weights (and image size), and a line saying which they
    are. SAM 2 runs at 512 here (its own size, 1024, takes minutes a clip on a CPU)."""
    if checkpoint:
        return (
            ["--checkpoint", checkpoint, "--image-size", "512"],
            f"the checkpoint you gave ({checkpoint})",
        )
    if sam2_reachable():
        return (
            ["--model", "sam2.1_hiera_t", "--checkpoint", f"hf:{REPO}", "--image-size", "512"],
            f"SAM 2.1 tiny, Meta's weights (hf:{REPO})",
        )
    from segpipe.model import Weights, trained_size
    from segpipe.models.sam2.catalog import SHIPPED

    size = trained_size(Weights(checkpoint=SHIPPED["segpipe_tiny"][1])) or 128  # missing: run says
    return (
        ["--model", "segpipe_tiny", "--image-size", str(size)],
        "segpipe_tiny, segpipe's small SAM 2 trained on synthetic clips (weights "
        f"{SHIPPED['segpipe_tiny'][1]}): SAM 2's weights are not cached and huggingface.co "
        "is not reachable",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/demo"))
    parser.add_argument("--checkpoint", default=os.environ.get("SEGPIPE_CHECKPOINT") or None)
    args = parser.parse_args()
    segpipe = Path(sys.executable).with_name("segpipe")
    made = subprocess.run([sys.executable, str(HERE / "make_sample.py"), "--out", str(args.out)])
    if made.returncode:
        return made.returncode
    options, which = pick_weights(args.checkpoint)
    print(f"demo weights: {which}", flush=True)
    store = args.out / "sample.zarr"
    # --force: the demo starts over (an earlier demo's store may hold other weights' work)
    for command in (
        [
            "run",
            str(args.out / "sample.mp4"),
            "--store",
            str(store),
            "--prompts",
            str(args.out / "prompts.json"),
            "--chunk-size",
            "16",
            "--force",
            *options,
        ],
        ["status", "--store", str(store)],
    ):
        done = subprocess.run([str(segpipe), *command])
        if done.returncode:
            return done.returncode
    print(f"demo weights: {which}")
    print(
        f"J&F against the clip's ground truth: {jf(store, args.out / 'gt_masks.npz'):.3f} "
        f"(1 is perfect; random weights score near 0)"
    )
    print(
        f"demo results: store {store}, exports in {args.out / 'sample.export'}/ "
        f"(overlay.mp4 shows the masks)"
    )
    return 0


def jf(store: Path, truth_file: Path) -> float:
    """Mean J&F over the clip's objects, each against its own ground truth; first and last
    frames not scored (DAVIS)."""
    import segpipe
    from segpipe.vos.davis import score_masks

    masks = segpipe.open(store).masks()
    return score_masks("sample", np.load(truth_file)["masks"], masks).jf_mean


if __name__ == "__main__":
    sys.exit(main())
