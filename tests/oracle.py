"""The oracle: SAM 2's own `SAM2VideoPredictor`, tracking the whole video in memory.

It reads the store's decoded frames through SAM 2's own frame loader (the frames are written
losslessly as PNG data under the `NNNNN.jpg` names that loader lists), gets the same weights
and the same prompts through SAM 2's public API, and propagates over the whole video.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
import zarr
from PIL import Image

from segpipe import prompts as prompt_file
from segpipe.model import Weights, build_model


def oracle_masks(store_path, prompts_path, predictor=None) -> dict[str, np.ndarray]:
    """Masks (T, O, H, W) per direction: "forward" and "reverse" each from a fresh state with
    all prompts added up front, and "both" (reverse before the earliest prompt, forward on)."""
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    frames = group["frames"][...]
    T, H, W = attrs["frame_count"], attrs["video"]["height"], attrs["video"]["width"]
    prompts = prompt_file.load(prompts_path, T, W, H)
    ids = prompt_file.object_ids(prompts)
    if predictor is None:
        predictor = build_model("sam2.1_hiera_t", attrs["image_size"],
                                Weights(random_seed=attrs["model"]["weights"]["random_seed"]))
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t, frame in enumerate(frames):
            Image.fromarray(frame).save(Path(tmp) / f"{t:05d}.jpg", format="PNG")
        for direction in ("forward", "reverse"):
            state = predictor.init_state(video_path=tmp)
            state["video_height"], state["video_width"] = H, W  # the original video's size
            for p in prompts:
                if p.mask is not None:
                    predictor.add_new_mask(state, p.frame, p.object_id, p.mask)
                else:
                    predictor.add_new_points_or_box(
                        state, p.frame, p.object_id,
                        points=None if p.points is None else np.array(p.points, np.float32),
                        labels=None if p.labels is None else np.array(p.labels, np.int32),
                        box=None if p.box is None else np.array(p.box, np.float32))
            masks = np.zeros((T, len(ids), H, W), bool)
            with torch.inference_mode():
                for t, obj_ids, video_res in predictor.propagate_in_video(
                        state, reverse=direction == "reverse"):
                    assert list(obj_ids) == ids
                    masks[t] = (video_res[:, 0] > 0.0).numpy()
            result[direction] = masks
    start = min(p.frame for p in prompts)
    result["both"] = np.concatenate([result["reverse"][:start], result["forward"][start:]])
    return result
