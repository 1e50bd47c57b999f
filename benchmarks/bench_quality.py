#!/usr/bin/env python3
"""Tracking quality: J&F (DAVIS 2017 definitions, `segpipe.vos.davis`) of a model on held-out
synthetic clips, run through the whole pipeline (H.264 video, decode, encode, track).

Held out from `data/train_tiny.py`'s training clips: other seeds (1,000,001-1,000,003;
training clip k has seed k, k < its steps), other motions ("orbit" and "bounce"; training has
"drift" and "wave"), longer clips (48 frames; training clips have 8) drawn at the video's own
size (320x240; training draws squares at the image size), and occlusions: the orbiting objects
pass behind each other and behind distractors, and in the third clip an untracked bar crosses
in front of object 1 half-way through.

Each object is prompted with its ground-truth mask (DAVIS's semi-supervised protocol):
`forward` on frame 0; `both` on the frame of the middle half where the least visible object
shows most (`prompt_frame`), so the reverse pass tracks back to frame 0 and the forward pass on
to the end. Each object's mask is scored against its own visible ground truth; the first and
last frames and the prompted frame are not scored (DAVIS leaves out the annotated frame); means
over all objects of all clips. Every setting runs at chunk sizes 1, 16 and 48 (= T): masks,
object scores and tracked frames must be bit-identical across them (SAM 2's tracking does not
see chunks), and the script exits 1 if they are not.

    python benchmarks/bench_quality.py                      # the shipped segpipe_tiny
    python benchmarks/bench_quality.py --model sam2.1_hiera_t --checkpoint sam2.1_hiera_tiny.pt \
        --image-size 512
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
import synthetic  # noqa: E402

T, WIDTH, HEIGHT = 48, 320, 240
CLIPS = {  # name -> make_clip arguments
    "orbit": dict(seed=1_000_001, motions=("orbit",), num_objects=3, distractors=2),
    "bounce": dict(seed=1_000_002, motions=("bounce",), num_objects=2, distractors=3),
    "occlusion": dict(
        seed=1_000_003, motions=("orbit", "bounce"), num_objects=3, distractors=1, occluder=True
    ),
}
CHUNK_SIZES = (1, 16, T)


def prompt_frame(masks: np.ndarray, direction: str) -> int:
    if direction == "forward":
        return 0
    area = masks.reshape(T, masks.shape[1], -1).sum(-1).min(1)  # the least visible object
    lo, hi = T // 4, 3 * T // 4
    return lo + int(np.argmax(area[lo:hi]))


def write_clip(folder: Path, name: str) -> tuple[Path, np.ndarray]:
    frames, masks = synthetic.make_clip(num_frames=T, height=HEIGHT, width=WIDTH, **CLIPS[name])
    video = folder / f"{name}.mp4"
    make_sample.write_video(video, frames)
    return video, masks


def write_prompts(folder: Path, name: str, masks: np.ndarray, frame: int, direction: str) -> Path:
    entries = []
    for o in range(masks.shape[1]):
        png = folder / f"{name}_{direction}_{o + 1}.png"
        Image.fromarray(masks[frame, o].astype(np.uint8) * 255).save(png)
        entries.append({"object": o + 1, "frame": frame, "mask": png.name})
    path = folder / f"{name}_{direction}.json"
    path.write_text(json.dumps({"prompts": entries}))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="segpipe_tiny")
    parser.add_argument("--checkpoint", default=None, help="default: the model's shipped weights")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="default: the size the weights were trained at, if they say",
    )
    parser.add_argument("--directions", default="forward,both")
    parser.add_argument("--chunk-sizes", default=",".join(map(str, CHUNK_SIZES)))
    parser.add_argument(
        "--non-overlap",
        action="store_true",
        help="each pixel to one object (SAM 2's non_overlap_masks, as vos_inference runs DAVIS)",
    )
    parser.add_argument(
        "--object-batch",
        type=int,
        default=1,
        metavar="K",
        help="also track with --object-batch K (at the first chunk size) and say how it "
        "agrees with the exact tracking: J&F, differing pixels, object scores",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep clips and stores here")
    args = parser.parse_args()
    import segpipe
    from segpipe.model import resolve_weights, trained_size
    from segpipe.vos.davis import Report, score_masks

    size = args.image_size or trained_size(resolve_weights(args.model, args.checkpoint, None))
    if size is None:
        parser.error("these weights do not say their image size: give --image-size")
    chunk_sizes = [int(c) for c in args.chunk_sizes.split(",")]
    failed = False
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        clips = {name: write_clip(folder, name) for name in CLIPS}
        for direction in args.directions.split(","):
            videos, frames, batched = [], [], []
            seconds, same, differ = 0.0, True, [0, 0, 0.0]  # pixels, of, largest score gap
            for name, (video, truth) in clips.items():
                frame = prompt_frame(truth, direction)
                frames.append(f"{name} {frame}")
                prompts = write_prompts(folder, name, truth, frame, direction)
                first = None
                for c in chunk_sizes:
                    store = folder / f"{name}_{direction}_c{c}.zarr"
                    began = time.perf_counter()
                    run = segpipe.run(
                        video,
                        store,
                        prompts,
                        decoding=segpipe.Decoding(chunk_size=c, image_size=size),
                        encoding=segpipe.Encoding(model=args.model, checkpoint=args.checkpoint),
                        tracking=segpipe.Tracking(
                            direction=direction, non_overlap=args.non_overlap
                        ),
                        output=segpipe.Output(exports=[]),
                        execution=segpipe.Execution(progress=False, force=True),
                    )
                    seconds += time.perf_counter() - began
                    got = (run.masks(), run.scores, run.tracked)
                    if first is None:
                        first = got
                        videos.append(score_masks(name, truth, got[0], unscored=(frame,)))
                    elif not all(
                        np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
                        for a, b in zip(first, got)
                    ):
                        print(
                            f"MISMATCH: {name} {direction} chunk {c} differs from chunk "
                            f"{chunk_sizes[0]}",
                            file=sys.stderr,
                        )
                        same = False
                if args.object_batch > 1:  # the first store's frames and features, tracked again
                    batch = folder / f"{name}_{direction}_batch.zarr"
                    shutil.rmtree(batch, ignore_errors=True)
                    shutil.copytree(folder / f"{name}_{direction}_c{chunk_sizes[0]}.zarr", batch)
                    run = segpipe.track(
                        batch,
                        prompts,
                        tracking=segpipe.Tracking(
                            direction=direction,
                            non_overlap=args.non_overlap,
                            object_batch=args.object_batch,
                        ),
                        encoding=segpipe.Encoding(checkpoint=args.checkpoint),
                        execution=segpipe.Execution(progress=False),
                    )
                    masks, scores = run.masks(), run.scores
                    batched.append(score_masks(name, truth, masks, unscored=(frame,)))
                    differ[0] += int((masks != first[0]).sum())
                    differ[1] += int(first[0].sum())
                    gap = np.abs(scores - first[1])
                    differ[2] = max(differ[2], float(np.nanmax(gap)))
            failed = failed or not same
            report = Report(tuple(videos), layout="per-object")
            print(
                f"\n## {args.model} ({args.checkpoint or 'shipped weights'}), {direction}, "
                f"prompt frames: {', '.join(frames)}, image size {size}"
            )
            print(report.table())
            if batched:
                print(
                    f"--object-batch {args.object_batch}: J&F "
                    f"{Report(tuple(batched), layout='per-object').jf_mean:.4f} (exact "
                    f"{report.jf_mean:.4f}); {differ[0]} mask pixels differ from the exact "
                    f"tracking's (its masks: {differ[1]} pixels); object scores by up to "
                    f"{differ[2]:.3g}"
                )
            rows.append(
                (
                    direction,
                    report.j_mean,
                    report.f_mean,
                    report.jf_mean,
                    "identical" if same else "DIFFERENT",
                    seconds,
                )
            )
    print(
        "\n| direction | J | F | J&F | chunk sizes "
        + "/".join(map(str, chunk_sizes))
        + " | pipeline s (all chunk sizes) |\n| --- | --- | --- | --- | --- | --- |"
    )
    for d, j, f, jf, same, s in rows:
        print(f"| {d} | {j:.3f} | {f:.3f} | {jf:.3f} | {same} | {s:.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
