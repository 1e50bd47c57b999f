#!/usr/bin/env python3
"""Make the synthetic sample clip: moving shapes with known ground-truth masks and prompts.

Writes into --out: sample.mp4 (H.264, faststart), gt_masks.npz (T, 3, H, W bool, object ids
1..3), prompts.json (points for object 1, a box for object 2, a mask PNG for object 3, on
different frames) and obj3_mask.png. Usable as a module: `make_clip`, `write_video`.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

OBJECT_IDS = (1, 2, 3)
COLOURS = ((220, 60, 50), (40, 170, 60), (60, 80, 220))


def make_clip(num_frames: int = 48, width: int = 320, height: int = 240, seed: int = 0):
    """Return frames (T, H, W, 3) uint8 and masks (T, 3, H, W) bool for a disc, a square and
    a diamond moving over a textured background."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    background = (
        (
            rng.integers(0, 40, (height, width, 3))
            + np.stack([96 + 40 * np.sin(xx / 23.0), 96 + 40 * np.cos(yy / 17.0), 110 + 0 * xx], -1)
        )
        .clip(0, 255)
        .astype(np.uint8)
    )
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    masks = np.zeros((num_frames, len(OBJECT_IDS), height, width), bool)
    r = min(width, height) / 10
    for t in range(num_frames):
        phase = 2 * np.pi * t / max(num_frames, 1)
        centres = [
            (width * (0.25 + 0.15 * np.sin(phase)), height * (0.35 + 0.1 * np.cos(phase))),
            (width * (0.65 - 0.12 * np.sin(phase)), height * (0.3 + 0.12 * np.sin(2 * phase))),
            (width * (0.5 + 0.2 * np.cos(phase)), height * (0.72 - 0.08 * np.sin(phase))),
        ]
        (x0, y0), (x1, y1), (x2, y2) = centres
        masks[t, 0] = (xx - x0) ** 2 + (yy - y0) ** 2 <= r**2
        masks[t, 1] = (np.abs(xx - x1) <= r) & (np.abs(yy - y1) <= r)
        masks[t, 2] = np.abs(xx - x2) + np.abs(yy - y2) <= 1.3 * r
        img = background.copy()
        for i, colour in enumerate(COLOURS):
            img[masks[t, i]] = colour
        frames[t] = img
    return frames, masks


def write_video(
    path: Path,
    frames: np.ndarray,
    fps: int = 24,
    codec: str = "libx264",
    encoder_options: dict | None = None,
) -> None:
    """Write frames with PyAV; the container follows the suffix (.mp4, .mkv, .ts, .avi ...).
    libx264 gives a faststart MP4, the same bytes on every machine: x264 runs two threads
    (by default it runs as many as the CPUs the process may use, and its output follows
    their number; two is what that default gave on the 2-core machines where the demo's,
    the benchmarks' and the tests' figures were measured, so they stand); ffv1 (in .mkv) is
    lossless RGB; `encoder_options` go to the encoder (e.g.
    {"g": "48", "bf": "2"})."""
    path = Path(path)
    options = {"movflags": "+faststart"} if path.suffix == ".mp4" else {}
    with av.open(str(path), "w", options=options) as out:
        stream = out.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        if codec == "libx264":  # a fixed thread count: x264's default follows the CPUs
            stream.options = {"crf": "18", "preset": "veryfast", "threads": "2"}
        stream.options = {**stream.options, **(encoder_options or {})}
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def centroid(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.mean()), float(ys.mean())]


def bbox(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max())]


def write_prompts(out_dir: Path, masks: np.ndarray, frames=(6, 12, 18)) -> Path:
    """Points on object 1, a box on object 2, a mask on object 3, each on its own frame."""
    f1, f2, f3 = frames
    Image.fromarray(masks[f3, 2].astype(np.uint8) * 255).save(out_dir / "obj3_mask.png")
    outside = [2.0, 2.0]
    prompts = {
        "prompts": [
            {
                "object": 1,
                "frame": f1,
                "points": [centroid(masks[f1, 0]), outside],
                "labels": [1, 0],
            },
            {"object": 2, "frame": f2, "box": bbox(masks[f2, 1])},
            {"object": 3, "frame": f3, "mask": "obj3_mask.png"},
        ]
    }
    path = out_dir / "prompts.json"
    path.write_text(json.dumps(prompts, indent=1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--frames", type=int, default=48, help="at least 1")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    frames, masks = make_clip(args.frames, args.width, args.height)
    write_video(args.out / "sample.mp4", frames)
    np.savez_compressed(args.out / "gt_masks.npz", masks=masks, object_ids=np.array(OBJECT_IDS))
    # the prompts at an eighth, a quarter and three eighths of the clip (6, 12, 18 of 48)
    write_prompts(args.out, masks, frames=tuple(args.frames * k // 8 for k in (1, 2, 3)))
    print(
        f"sample clip: {args.out / 'sample.mp4'} ({args.frames} frames, "
        f"{args.width}x{args.height}), prompts: {args.out / 'prompts.json'}"
    )


if __name__ == "__main__":
    main()
