"""The dataset oracle: what SAM 2's `tools/vos_inference.py` writes, as its documentation and
options describe it, computed with SAM 2's own `SAM2VideoPredictor` holding whole videos in
memory (written for the tests; the tool's code is not copied into the project).

- The predictor is built with `apply_postprocessing` as asked and `non_overlap_masks` on
  unless per-object PNGs.
- Frames: `init_state(video_folder)` (SAM 2 lists and loads the JPEGs itself).
- Prompts: the first frame's annotation (every annotated frame with `use_all_masks`) through
  `add_new_mask`, one call per object id; forward `propagate_in_video`; mask = logits >
  score threshold.
- With `later`: every object alone in a fresh state from its first non-empty mask, logits of
  frames before it at -1024, SAM 2's non-overlap constraint across objects (not per-object
  PNGs), then the threshold.
- Outputs: `<video>/<frame>.png` composed so that the lowest id wins, or
  `<video>/<obj:03d>/<frame>.png` holding 0/1, with the input PNGs' palette (else DAVIS's).
A video the tool stops on (a missing first mask, an object new on a later frame) raises
`ToolError` and writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from segpipe.models.sam2.build import install_memory_cast
from segpipe.models.sam2.catalog import OFFICIAL


class ToolError(Exception):
    pass


def voc_palette() -> list[int]:
    """The DAVIS (PASCAL VOC) colour map, from its usual bit-interleaving definition."""
    out = []
    for i in range(256):
        r = g = b = 0
        for bit in range(8):
            r |= ((i >> (3 * bit)) & 1) << (7 - bit)
            g |= ((i >> (3 * bit + 1)) & 1) << (7 - bit)
            b |= ((i >> (3 * bit + 2)) & 1) << (7 - bit)
        out += [r, g, b]
    return out


def oracle_predictor(image_size: int, seed: int, postprocessing: bool, per_obj: bool):
    """SAM 2's predictor built as the tool builds it, with seeded random weights (the
    weights segpipe's `--random-weights SEED` makes) and the documented CPU float32 cast
    (README, Tracking semantics)."""
    from sam2.build_sam import build_sam2_video_predictor

    torch.manual_seed(seed)
    predictor = build_sam2_video_predictor(
        OFFICIAL["sam2.1_hiera_t"][0],
        ckpt_path=None,
        device="cpu",
        apply_postprocessing=postprocessing,
        hydra_overrides_extra=[
            f"++model.image_size={image_size}",
            "++model.non_overlap_masks=" + ("false" if per_obj else "true"),
        ],
    )
    install_memory_cast(predictor)
    return predictor.eval()


def frame_stems(folder: Path) -> list[str]:
    stems = [
        os.path.splitext(p)[0]
        for p in os.listdir(folder)
        if os.path.splitext(p)[1] in (".jpg", ".jpeg", ".JPG", ".JPEG")
    ]
    return sorted(stems, key=int)


def read_png(path: Path):
    img = Image.open(path)
    return np.array(img).astype(np.uint8), img.getpalette()


def load_frame_masks(mask_dir: Path, video: str, stem: str, per_obj: bool, missing_ok: bool):
    """({id: bool mask}, palette) of one frame's annotation; ({}, None) where missing and
    `missing_ok`."""
    if not per_obj:
        path = mask_dir / video / f"{stem}.png"
        if not path.exists():
            if missing_ok:
                return {}, None
            raise ToolError(f"missing {path}")
        ids, palette = read_png(path)
        return {int(i): ids == i for i in np.unique(ids) if i > 0}, palette
    masks, palette = {}, None
    for name in os.listdir(mask_dir / video):
        path = mask_dir / video / name / f"{stem}.png"
        if not path.exists():
            if missing_ok:
                continue
            raise ToolError(f"missing {path}")
        values, palette = read_png(path)
        masks[int(name)] = values > 0
    return masks, palette


def save_png(path: Path, values: np.ndarray, palette) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(values)
    img.putpalette(palette)
    img.save(path)


def write_outputs(out: Path, video: str, stems, per_frame: dict, height, width, per_obj, palette):
    palette = palette or voc_palette()
    for t, masks in per_frame.items():
        if per_obj:
            for obj, m in masks.items():
                save_png(
                    out / video / f"{obj:03d}" / f"{stems[t]}.png",
                    m.reshape(height, width).astype(np.uint8),
                    palette,
                )
        else:
            composed = np.zeros((height, width), np.uint8)
            for obj in sorted(masks, reverse=True):  # the lowest id painted last: it wins
                composed[masks[obj].reshape(height, width)] = obj
            save_png(out / video / f"{stems[t]}.png", composed, palette)


@torch.inference_mode()
def oracle_video(
    predictor,
    frames_dir: Path,
    mask_dir: Path,
    out: Path,
    video: str,
    score_thresh=0.0,
    use_all_masks=False,
    per_obj=False,
    later=False,
) -> None:
    folder = frames_dir / video
    stems = frame_stems(folder)
    state = predictor.init_state(video_path=str(folder))
    H, W = state["video_height"], state["video_width"]
    if later:
        return _later(
            predictor,
            state,
            stems,
            mask_dir,
            out,
            video,
            score_thresh,
            use_all_masks,
            per_obj,
            H,
            W,
        )
    if not use_all_masks:
        frames = [0]
    elif not per_obj:
        frames = [t for t, s in enumerate(stems) if (mask_dir / video / f"{s}.png").exists()]
    else:
        frames = sorted(
            {
                t
                for name in os.listdir(mask_dir / video)
                for t, s in enumerate(stems)
                if (mask_dir / video / name / f"{s}.png").exists()
            }
        )
    if not frames:
        raise ToolError("no input masks")
    objects, palette = None, None
    for t in frames:
        masks, palette = load_frame_masks(mask_dir, video, stems[t], per_obj, missing_ok=False)
        if objects is None:
            objects = set(masks)
        for obj, m in masks.items():
            if obj not in objects:
                raise ToolError(f"object {obj} new on frame {t}")
            predictor.add_new_mask(state, t, obj, m)
    if not objects:
        raise ToolError("no objects")
    results = {}
    for t, ids, logits in predictor.propagate_in_video(state):
        results[t] = {obj: (logits[i] > score_thresh).cpu().numpy() for i, obj in enumerate(ids)}
    write_outputs(out, video, stems, results, H, W, per_obj, palette)


def _later(
    predictor, state, stems, mask_dir, out, video, score_thresh, use_all_masks, per_obj, H, W
):
    inputs, palette = {}, None
    for t, s in enumerate(stems):
        if not per_obj and not (mask_dir / video / f"{s}.png").exists():
            continue
        masks, palette = load_frame_masks(mask_dir, video, s, per_obj, missing_ok=True)
        for obj, m in masks.items():
            if m.any() and (use_all_masks or obj not in inputs):
                inputs.setdefault(obj, {})[t] = m
    ids = sorted(inputs)
    logits = {obj: {} for obj in ids}
    for obj in ids:
        predictor.reset_state(state)
        for t, m in sorted(inputs[obj].items()):
            predictor.add_new_mask(state, t, obj, m)
        for t, _, video_res in predictor.propagate_in_video(
            state, start_frame_idx=min(inputs[obj]), reverse=False
        ):
            logits[obj][t] = video_res.cpu().numpy()
    results = {}
    for t in range(len(stems)):
        scores = torch.full((len(ids), 1, H, W), -1024.0, dtype=torch.float32)
        for i, obj in enumerate(ids):
            if t in logits[obj]:
                scores[i] = torch.from_numpy(logits[obj][t])
        if not per_obj:
            scores = predictor._apply_non_overlapping_constraints(scores)
        results[t] = {obj: (scores[i] > score_thresh).numpy() for i, obj in enumerate(ids)}
    write_outputs(out, video, stems, results, H, W, per_obj, palette)
