#!/usr/bin/env python3
"""segpipe beside SAM 2's official video predictor on the same frames, weights and prompts:
peak RSS of the whole `segpipe run` (chunk 16) and of the official predictor, and tracking
seconds per frame (ours: `segpipe track` from stored embeddings; official: propagate_in_video
minus the time inside its image encoder)."""

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import looped_clip, measure, python, segpipe, table  # noqa: E402

OURS = """
import json, sys, time
from segpipe.model import Weights, build_model
from segpipe.stages.track.stage import track
from segpipe.settings import Execution, Tracking
model = build_model("sam2.1_hiera_t", int(sys.argv[3]), Weights(random_seed=0))
start = time.perf_counter()
again = Execution(progress=False, force=True)
track(sys.argv[1], sys.argv[2], Tracking("forward"), execution=again, predictor=model)
print(json.dumps({"track_s": time.perf_counter() - start}))
"""

OFFICIAL = """
import json, sys, tempfile, time, numpy as np, torch, zarr
from pathlib import Path
from PIL import Image
from segpipe import prompts as pf
from segpipe.model import Weights, build_model
group = zarr.open_group(sys.argv[1], mode="r")
a = group.attrs
T, H, W = a["frame_count"], a["video"]["height"], a["video"]["width"]
prompts = pf.load(sys.argv[2], T, W, H)
model = build_model("sam2.1_hiera_t", a["decoding"]["image_size"], Weights(random_seed=0))
enc = [0.0]
def pre(*_): enc.append(time.perf_counter())
def post(*_): enc[0] += time.perf_counter() - enc.pop()
model.image_encoder.register_forward_pre_hook(pre)
model.image_encoder.register_forward_hook(post)
with tempfile.TemporaryDirectory() as tmp:
    for t in range(T):
        Image.fromarray(group["frames"][t]).save(f"{tmp}/{t:05d}.jpg", format="PNG")
    state = model.init_state(video_path=tmp)
    state["video_height"], state["video_width"] = H, W
    for p in prompts:
        if p.mask is not None:
            model.add_new_mask(state, p.frame, p.object_id, p.mask)
        else:
            model.add_new_points_or_box(state, p.frame, p.object_id,
                points=None if p.points is None else np.array(p.points, np.float32),
                labels=None if p.labels is None else np.array(p.labels, np.int32),
                box=None if p.box is None else np.array(p.box, np.float32))
    enc[0] = 0.0
    start = time.perf_counter()
    n = 0
    for t, ids, masks in model.propagate_in_video(state):
        (masks > 0).numpy(); n += 1
    total = time.perf_counter() - start
print(json.dumps({"frames": n, "track_s": total - enc[0], "encoder_s": enc[0]}))
"""


def main():
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 200, 400])
    parser.add_argument("--image-size", type=int, default=256)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base, masks = make_sample.make_clip(num_frames=100, width=320, height=240)
        prompts = make_sample.write_prompts(Path(tmp), masks, frames=(0, 3, 6))
        for n in args.lengths:
            clip = Path(tmp) / f"clip{n}.mp4"
            looped_clip(clip, base, n)
            store = Path(tmp) / f"s{n}.zarr"
            _, run_rss, _ = measure(
                segpipe(
                    "run",
                    clip,
                    "--store",
                    store,
                    "--prompts",
                    prompts,
                    "--chunk-size",
                    16,
                    "--image-size",
                    args.image_size,
                    "--random-weights",
                    0,
                    "--export",
                    "none",
                    "--direction",
                    "forward",
                )
            )
            _, _, out = measure(python(OURS) + [str(store), str(prompts), str(args.image_size)])
            ours = json.loads(out.strip().splitlines()[-1])
            _, off_rss, out = measure(python(OFFICIAL) + [str(store), str(prompts)])
            official = json.loads(out.strip().splitlines()[-1])
            rows.append(
                [
                    n,
                    run_rss,
                    off_rss,
                    ours["track_s"] / n,
                    official["track_s"] / n,
                    official["track_s"] / ours["track_s"],
                ]
            )
    print(f"tracking, sam2.1_hiera_t at {args.image_size}, 3 objects, forward, CPU")
    print(
        table(
            [
                "frames",
                "segpipe run RSS MiB",
                "official RSS MiB",
                "segpipe track s/frame",
                "official track s/frame",
                "speed ratio",
            ],
            rows,
        )
    )
    print(
        "segpipe track: prompts, reading embeddings, tracking, writing masks and memory; "
        "official: propagate_in_video less its image encoder; neither counts model build"
    )


if __name__ == "__main__":
    main()
