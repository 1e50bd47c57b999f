#!/usr/bin/env python3
"""Many objects: tracking seconds per frame for 1, 4, 16 and 64 objects, segpipe in one
process, segpipe on `--workers 2` (the objects in one group per worker, side by side),
segpipe with `--object-batch N` (every object of a frame in one batch of SAM 2's step, one
process), beside SAM 2's own predictor, with peak RSS, and whether the masks and scores are
the predictor's bit for bit at the thread count each ran with (for the batched run, which is
not exact: the differing pixels, the largest score difference and its J&F with SAM 2's masks
as the truth).

Every configuration runs in a fresh process started as a new user's shell starts it (no
OMP_NUM_THREADS: torch at the cores' count), on the same frames (a store encoded in one
process for it and for SAM 2, one encoded on the 2 workers for them), weights (SAM 2.1 tiny,
seeded random) and prompts (a point per object on frame 0),
forward. segpipe `track` (one process): prompts, reading embeddings, tracking, writing
masks, scores and memory (the model's build not counted); `--workers 2`: the command less
its cluster's start (measured by the same command again, with nothing left to track: the
cluster, its checks, the probe), the workers' model builds counted; SAM 2:
`propagate_in_video` less its image encoder. `--workers 2`
runs each worker at cores // 2 threads (started so), so its bits are checked against SAM 2's
predictor in a process started with that OMP_NUM_THREADS (up to 16 objects: the check at 64
would double the run). RSS: each process's peak (ru_maxrss); segpipe's before it reads the
masks back for the check; for `--workers 2` the client's (the workers' are not counted)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import measure, python, segpipe, table  # noqa: E402

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
WIDTH, HEIGHT = 320, 240

OURS = """
import json, resource, sys, time, numpy as np
import segpipe as api
store, prompts, workers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
object_batch = int(sys.argv[5])
cluster_s = 0.0
import torch, distributed, segpipe.dask.client  # imports before any timing
if workers:
    start = time.perf_counter()
    forward = api.Tracking(direction="forward")
    again = api.Execution(progress=False, workers=workers)
    api.track(store, prompts, tracking=forward, execution=api.Execution(progress=False, force=True, workers=workers))
    total = time.perf_counter() - start
    start = time.perf_counter()  # again: nothing left to track, the cluster's start alone
    api.track(store, prompts, tracking=forward, execution=again)
    cluster_s = time.perf_counter() - start
else:
    from segpipe.model import Weights, build_model
    from segpipe.stages.track.stage import track
    from segpipe.settings import Execution, Tracking
    group = __import__("zarr").open_group(store, mode="r")
    model = build_model("sam2.1_hiera_t", group.attrs["decoding"]["image_size"], Weights(random_seed=0))
    start = time.perf_counter()
    quietly_again = Execution(progress=False, force=True)
    track(store, prompts, Tracking("forward", object_batch=object_batch), execution=quietly_again, predictor=model)
    total = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the check's read-back
run = api.Run(store)
np.savez(out, masks=np.packbits(run.masks(), axis=-1), scores=run.scores)
print(json.dumps({"track_s": total, "cluster_s": cluster_s, "rss_mib": rss}))
"""

OFFICIAL = """
import json, sys, tempfile, time, numpy as np, torch, zarr
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
        model.add_new_points_or_box(state, p.frame, p.object_id,
            points=np.array(p.points, np.float32), labels=np.array(p.labels, np.int32))
    ids = pf.object_ids(prompts)
    masks = np.zeros((T, len(ids), H, W), bool)
    enc[0] = 0.0
    start = time.perf_counter()
    with torch.inference_mode():
        for t, _, video_res in model.propagate_in_video(state):
            masks[t] = (video_res[:, 0] > 0).numpy()
    total = time.perf_counter() - start
scores = np.full((T, len(ids)), np.nan, np.float32)
for o in range(len(ids)):
    outs = state["output_dict_per_obj"][o]
    for t in range(T):
        out = outs["cond_frame_outputs"].get(t) or outs["non_cond_frame_outputs"][t]
        scores[t, o] = out["object_score_logits"].float().reshape(()).item()
np.savez(sys.argv[3], masks=np.packbits(masks, axis=-1), scores=scores)
print(json.dumps({"track_s": total - enc[0], "threads": torch.get_num_threads()}))
"""


def point_prompts(folder: Path, n: int, width: int, height: int) -> Path:
    """A positive point per object on frame 0, on a grid over the frame."""
    cols = int(n**0.5 + 0.999)
    rows = -(-n // cols)
    entries = [
        {
            "object": i + 1,
            "frame": 0,
            "points": [
                [(i % cols + 0.5) * width / cols, (i // cols + 0.5) * height / rows],
            ],
            "labels": [1],
        }
        for i in range(n)
    ]
    path = folder / f"prompts{n}.json"
    path.write_text(json.dumps({"prompts": entries}))
    return path


def agreement(a: Path, b: Path, quality: bool = False) -> str:
    """'same' where masks and scores are bit for bit equal, else how they differ (with
    `quality`: also the J&F of `a`'s masks against `b`'s, DAVIS definitions)."""
    import numpy as np

    x, y = np.load(a), np.load(b)
    pixels = int(np.unpackbits(x["masks"] ^ y["masks"]).sum())
    s, t = x["scores"], y["scores"]
    if pixels == 0 and np.array_equal(s.view(np.uint32), t.view(np.uint32)):
        return "same"
    said = f"{pixels} px of {int(np.unpackbits(y['masks']).sum())}"
    said += f", max score diff {float(np.nanmax(np.abs(s - t))):.2g}"
    if quality:  # b's masks as the truth (DAVIS leaves out the first and last frames)
        from segpipe.vos.davis import score_masks

        def unpacked(saved):
            return np.unpackbits(saved["masks"], axis=-1)[..., :WIDTH].astype(bool)

        said += f", J&F {score_masks('clip', unpacked(y), unpacked(x)).jf_mean:.4f}"
    return said


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--check-up-to", type=int, default=16, help="objects; see above")
    args = parser.parse_args()
    unset = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        frames, _ = make_sample.make_clip(num_frames=args.frames, width=WIDTH, height=HEIGHT)
        make_sample.write_video(tmp / "clip.mp4", frames)
        # features made as each side makes them: in one process at the cores' count, and on
        # the 2 workers at their share (SAM 2 computes its own, at its process's count)
        store, spread = tmp / "s.zarr", tmp / "spread.zarr"
        for where, extra in ((store, ()), (spread, ("--workers", 2))):
            common = ("--store", where, "--image-size", args.image_size, "--random-weights", 0)
            _run(segpipe("run", tmp / "clip.mp4", *common, "--chunk-size", 8, *extra), unset, {})
        _, _, out = _run(python("import torch; print(torch.get_num_threads())"), unset, {})
        cores = int(out.split()[-1])
        share = max(1, cores // 2)
        for n in args.objects:
            prompts = point_prompts(tmp, n, WIDTH, HEIGHT)
            res = {}
            for name, argv, env in (
                ("sam2", python(OFFICIAL) + [store, prompts, tmp / "sam2.npz"], {}),
                ("one", python(OURS) + [store, prompts, 0, tmp / "one.npz", 1], {}),
                ("two", python(OURS) + [spread, prompts, 2, tmp / "two.npz", 1], {}),
                ("batch", python(OURS) + [store, prompts, 0, tmp / "batch.npz", n], {}),
            ):
                seconds, rss, out = _run(argv, unset, env)
                res[name] = (json.loads(out.strip().splitlines()[-1]), rss)
            check = "not checked"
            if n <= args.check_up_to:
                share_env = {k: str(share) for k in THREAD_VARIABLES}
                _run(python(OFFICIAL) + [store, prompts, tmp / "sam2_share.npz"], unset, share_env)
                check = agreement(tmp / "two.npz", tmp / "sam2_share.npz")
            one, sam2, batch = (
                res[k][0]["track_s"] / args.frames for k in ("one", "sam2", "batch")
            )
            # the command's second cluster start, measured by the first (a run with nothing
            # to track), taken off
            two = (res["two"][0]["track_s"] - res["two"][0]["cluster_s"]) / args.frames
            rows.append(
                [
                    n,
                    sam2,
                    one,
                    two,
                    res["two"][0]["cluster_s"],
                    one / two,
                    batch,
                    one / batch,
                    res["sam2"][1],
                    res["one"][0]["rss_mib"],
                    res["two"][0]["rss_mib"],
                    res["batch"][0]["rss_mib"],
                    agreement(tmp / "one.npz", tmp / "sam2.npz"),
                    check,
                    agreement(tmp / "batch.npz", tmp / "sam2.npz", quality=True),
                ]
            )
            print(rows[-1], flush=True)
    print(
        f"\ntracking, sam2.1_hiera_t at {args.image_size}, {args.frames} frames, forward, CPU: "
        f"{cores} torch threads in one process, 2 workers x {share}"
    )
    print(
        table(
            [
                "objects",
                "SAM 2 s/frame",
                "segpipe s/frame",
                "--workers 2 s/frame",
                "cluster start s",
                "speed-up",
                "--object-batch N s/frame",
                "speed-up",
                "SAM 2 RSS MiB",
                "segpipe RSS MiB",
                "--workers 2 client RSS MiB",
                "--object-batch RSS MiB",
                "segpipe vs SAM 2",
                f"--workers 2 vs SAM 2 at {share} thread(s)",
                "--object-batch N vs SAM 2",
            ],
            rows,
        )
    )
    print(
        "--workers 2 s/frame: the command's time less a cluster start (given apart: a run "
        "with nothing to track); it counts the workers building their models. "
        "--object-batch N: every object of a frame in one batch of SAM 2's step (one "
        "process), as SAM 2's legacy predictor; speed-ups are against segpipe in one process"
    )


def _run(argv, unset: dict, env: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(unset)
    try:
        return measure(argv, env=env)
    finally:
        os.environ.clear()
        os.environ.update(saved)


if __name__ == "__main__":
    main()
