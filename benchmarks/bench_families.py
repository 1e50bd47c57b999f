#!/usr/bin/env python3
"""The model families side by side on this machine, each at its native input size with seeded
random weights (speed does not depend on them): milliseconds per frame for encode and for
track (one object, forward from a click on frame 0; the model built and the imports done
before the clock starts), the peak RSS of each process, and the features a frame takes on
disk.

    python benchmarks/bench_families.py --frames 8
    python benchmarks/bench_families.py --frames 4 --models sam3-tracker
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import measure, python, segpipe, table  # noqa: E402

# model -> (native input size, licence, where its weights come from)
MODELS = {
    "sam2.1_hiera_t": (1024, "Apache-2.0", "facebook/sam2.1-hiera-tiny (or the .pt)"),
    "edgetam": (1024, "Apache-2.0", "facebook/EdgeTAM (RepViT needs timm + torchvision)"),
    "sam3-tracker": (1008, "SAM License (gated)", "facebook/sam3 (log in first)"),
}

STAGE = """
import json, sys, time
from segpipe.model import Weights, build_model
from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.encode import encode
from segpipe.stages.track.stage import track
store, stage, name, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = build_model(name, size, Weights(random_seed=0))
quiet = Execution(progress=False)
start = time.perf_counter()
if stage == "encode":
    encode(store, Encoding(model=name, random_weights=0), quiet, predictor=model)
else:
    track(store, sys.argv[5], Tracking("forward"), execution=quiet, predictor=model)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def features_per_frame(store: Path) -> float:
    """MiB of stored features a frame (the level arrays' frame shapes and dtypes)."""
    import zarr

    group = zarr.open_group(str(store), mode="r")["features"]
    return sum(a.nbytes / a.shape[0] for _, a in group.arrays()) / 2**20


def bench(name: str, frames: int, work: Path) -> list:
    size, licence, weights = MODELS[name]
    clip = work / "clip.mp4"
    if not clip.exists():
        pictures, _ = make_sample.make_clip(num_frames=frames, width=640, height=480)
        make_sample.write_video(clip, pictures)
        prompts = {"prompts": [{"object": 1, "frame": 0, "points": [[320, 240]], "labels": [1]}]}
        (work / "prompts.json").write_text(json.dumps(prompts))
    store = work / f"{name}.zarr"
    measure(segpipe("decode", clip, "--store", store, "--image-size", size, "--chunk-size", 4))
    out = {}
    for stage in ("encode", "track"):
        args = [store, stage, name, size, work / "prompts.json"]
        _, rss, stdout = measure(python(STAGE) + [str(a) for a in args])
        out[stage] = (json.loads(stdout.strip().splitlines()[-1])["seconds"], rss)
    (enc_s, enc_rss), (trk_s, trk_rss) = out["encode"], out["track"]
    return [
        name, size, 1000 * enc_s / frames, 1000 * trk_s / frames, enc_rss, trk_rss,
        features_per_frame(store), licence, weights,
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows.append(bench(name, args.frames, Path(tmp)))
            print(f"{name}: done", file=sys.stderr)
    header = [
        "model", "size", "encode ms/frame", "track ms/frame", "encode RSS MiB",
        "track RSS MiB", "features MiB/frame", "licence", "weights",
    ]  # fmt: skip
    print(f"{args.frames} frames at 640x480, one object, seeded random weights")
    print(table(header, rows))


if __name__ == "__main__":
    main()
