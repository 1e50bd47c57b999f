"""The oracle: SAM 2's own `SAM2VideoPredictor`, tracking the whole video in memory.

It reads the store's decoded frames through SAM 2's own frame loader (the frames are written
losslessly as PNG data under the `NNNNN.jpg` names that loader lists), gets the same weights
and the same prompts through SAM 2's public API, and propagates over the whole video.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr
from PIL import Image

from segpipe import prompts as prompt_file
from segpipe.model import Weights, autocast, build_model

DIRECTIONS = ("both", "forward", "reverse")


@dataclass
class Oracle:
    """Per direction ("forward", "reverse", "both"): `masks` (T, O, H, W) bool and `scores`
    (T, O) float32, each object's score logit (NaN where the pass did not track the frame)."""

    masks: dict[str, np.ndarray]
    scores: dict[str, np.ndarray]
    seconds: float = 0.0  # spent in propagate_in_video (frames are encoded there)


def oracle_tracking(
    store_path,
    prompts_path,
    predictor=None,
    video_dir=None,
    precision: str = "float32",
    directions=("forward", "reverse"),
) -> Oracle:
    """ "forward" and "reverse" each from a fresh state with all prompts added up front, and
    "both" (reverse before the earliest prompt, forward from it on). Masks are what
    `propagate_in_video` yields; scores are read from the predictor's own state after it.
    With `video_dir` (a JPEG folder) SAM 2 loads that folder itself, as `init_state` does,
    instead of the store's frames. `precision="bfloat16"` runs it all under bfloat16
    autocast, SAM 2's documented GPU usage (here on the CPU)."""
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    frames = group["frames"][...]
    T, H, W = attrs["frame_count"], attrs["video"]["height"], attrs["video"]["width"]
    prompts = prompt_file.load(prompts_path, T, W, H)
    ids = prompt_file.object_ids(prompts)
    if predictor is None:
        predictor = build_model(
            "sam2.1_hiera_t",
            attrs["image_size"],
            Weights(random_seed=attrs["model"]["weights"]["random_seed"]),
        )
    masks, scores = {}, {}
    seconds = 0.0  # in propagate_in_video, for benchmarks
    with tempfile.TemporaryDirectory() as tmp, autocast(predictor.device.type, precision):
        if video_dir is None:
            for t, frame in enumerate(frames):
                Image.fromarray(frame).save(Path(tmp) / f"{t:05d}.jpg", format="PNG")
        for direction in directions:
            state = predictor.init_state(video_path=str(video_dir or tmp))
            if video_dir is None:
                state["video_height"], state["video_width"] = H, W  # the original video's size
            assert (state["video_height"], state["video_width"]) == (H, W)
            for p in prompts:
                if p.mask is not None:
                    predictor.add_new_mask(state, p.frame, p.object_id, p.mask)
                else:
                    predictor.add_new_points_or_box(
                        state,
                        p.frame,
                        p.object_id,
                        points=None if p.points is None else np.array(p.points, np.float32),
                        labels=None if p.labels is None else np.array(p.labels, np.int32),
                        box=None if p.box is None else np.array(p.box, np.float32),
                    )
            m = np.zeros((T, len(ids), H, W), bool)
            tracked = []
            began = time.perf_counter()
            with torch.inference_mode():
                for t, obj_ids, video_res in predictor.propagate_in_video(
                    state, reverse=direction == "reverse"
                ):
                    assert list(obj_ids) == ids
                    m[t] = (video_res[:, 0] > 0.0).cpu().numpy()
                    tracked.append(t)
            seconds += time.perf_counter() - began
            s = np.full((T, len(ids)), np.nan, np.float32)
            for o in range(len(ids)):
                outputs = state["output_dict_per_obj"][o]
                for t in tracked:
                    out = (
                        outputs["cond_frame_outputs"].get(t) or outputs["non_cond_frame_outputs"][t]
                    )
                    s[t, o] = out["object_score_logits"].detach().cpu().float().reshape(()).numpy()
            masks[direction], scores[direction] = m, s
    start = min(p.frame for p in prompts)
    for result in (masks, scores):
        if len(result) == 2:
            result["both"] = np.concatenate([result["reverse"][:start], result["forward"][start:]])
    return Oracle(masks, scores, seconds)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality of two float32 arrays (NaNs included, -0.0 differs from 0.0)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
