"""A VOS dataset as SAM 2's `tools/vos_inference.py` reads it: which videos, which frames,
which annotation masks become prompts, which objects, which palette the outputs get.

Layout: `<base_video_dir>/<video>/<frame>.jpg` (frames named by number) and annotations in
`<input_mask_dir>/<video>/<frame>.png`, indexed PNGs whose non-zero values are object ids
(DAVIS, YouTube-VOS, MOSE), or with per-object PNGs `<input_mask_dir>/<video>/<obj>/<frame>.png`
holding 0 / non-zero (SA-V). The rules below are the tool's, read from its source; where the
tool stops with an error, this raises `BadInput` with the same reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from segpipe.errors import BadInput
from segpipe.prompts import Prompt, read_id_mask
from segpipe.sources.folder import frame_files

LATER_HINT = (
    "add --track-object-appearing-later-in-video for datasets whose objects do not "
    "all appear in the first frame (such as LVOS or YouTube-VOS)"
)


@dataclass(frozen=True)
class Layout:
    """Where a dataset's frames and annotations are, and how the annotations are stored."""

    base_video_dir: Path
    input_mask_dir: Path
    per_obj_png_file: bool = False

    def masks_dir(self, video: str) -> Path:
        return self.input_mask_dir / video


@dataclass
class VideoInputs:
    """One video's frames and the prompts vos_inference would add."""

    name: str
    frames: Path  # the JPEG folder
    frame_names: list[str]  # file stems in SAM 2's order: the output PNGs' names
    prompts: list[Prompt]  # object slots in ascending id order, each object's frames ascending
    palette: list[int] | None  # the last input PNG's palette (None: the DAVIS palette)
    first_output: int  # outputs begin here: the first input frame, or 0 tracking late objects

    @property
    def object_ids(self) -> list[int]:
        return list(dict.fromkeys(p.object_id for p in self.prompts))


def video_names(base_video_dir: Path, video_list_file: Path | None) -> list[str]:
    """The list file's lines (stripped), else every subfolder, as the tool takes them (in the
    tool, in `os.listdir` order; here sorted, so runs and summaries are repeatable)."""
    if video_list_file is not None:
        if not video_list_file.is_file():
            raise BadInput(f"video list file not found: {video_list_file}")
        return [line.strip() for line in video_list_file.read_text().splitlines() if line.strip()]
    if not base_video_dir.is_dir():
        raise BadInput(f"base video folder not found: {base_video_dir}")
    return sorted(p.name for p in base_video_dir.iterdir() if p.is_dir())


def read_inputs(
    layout: Layout, video: str, use_all_masks: bool, later_objects: bool
) -> VideoInputs:
    folder = layout.base_video_dir / video
    if not folder.is_dir():
        raise BadInput(f"no frame folder {folder}")
    names = [p.stem for p in frame_files(folder)]
    if not layout.masks_dir(video).is_dir():
        raise BadInput(f"no annotation folder {layout.masks_dir(video)}")
    if later_objects:
        prompts, palette, first = _each_from_its_first_mask(layout, video, names, use_all_masks)
        if not prompts and not layout.per_obj_png_file:
            # the tool fails there (its non-overlap step gets no object); per object it
            # writes no PNG
            raise BadInput(f"video {video}: no object in any annotation")
    else:
        prompts, palette, first = _all_from_the_first_frame(layout, video, names, use_all_masks)
    _check_sizes(video, folder, names, prompts)
    return VideoInputs(video, folder, names, prompts, palette, first)


def _check_sizes(video: str, folder: Path, names: list[str], prompts: list[Prompt]) -> None:
    """Annotations must be the frames' size (vos_inference would resize others to the
    model's input, a rescaling segpipe does not reproduce)."""
    from PIL import Image

    with Image.open(frame_files(folder)[0]) as first:
        width, height = first.size
    for p in prompts:
        if p.mask.shape != (height, width):
            raise BadInput(
                f"video {video}: the annotation of frame {names[p.frame]} is "
                f"{p.mask.shape[1]}x{p.mask.shape[0]}, the frames are {width}x{height}"
            )


def _all_from_the_first_frame(layout: Layout, video: str, names: list[str], use_all_masks: bool):
    """`vos_inference`: the first frame's masks (or every annotated frame's), all objects
    named on the first input frame, tracked together from it."""
    if not use_all_masks:
        frames = [0]
    else:
        frames = sorted(
            {
                t
                for t, name in enumerate(names)
                for obj_dir in _object_dirs(layout, video)
                if (obj_dir / f"{name}.png").is_file()
            }
            if layout.per_obj_png_file
            else {
                t
                for t, name in enumerate(names)
                if (layout.masks_dir(video) / f"{name}.png").is_file()
            }
        )
        if not frames:
            raise BadInput(f"video {video}: no input masks in {layout.masks_dir(video)}")
    prompts, objects, palette = [], None, None
    for t in frames:
        masks, palette = _load(layout, video, names[t], allow_missing=False)
        if masks is None:
            raise BadInput(
                f"video {video}: no input mask for frame {names[t]} (frame {t}); {LATER_HINT}"
            )
        if objects is None:
            objects = set(masks)
        new = sorted(set(masks) - objects)
        if new:
            raise BadInput(
                f"video {video}: object {new[0]} appears only on a later frame "
                f"({names[t]}), not on the first; {LATER_HINT}"
            )
        prompts += [Prompt(obj, t, mask=masks[obj]) for obj in sorted(masks)]
    if not objects:
        raise BadInput(f"video {video}: no object ids on the input frames; {LATER_HINT}")
    # object slots in ascending id order: SAM 2's own order with indexed PNGs (np.unique);
    # with per-object PNGs the tool adds them in os.listdir order, which changes nothing
    # there (no non-overlap step, and objects are tracked independently)
    order = {obj: i for i, obj in enumerate(sorted(objects))}
    prompts.sort(key=lambda p: (p.frame, order[p.object_id]))
    return prompts, palette, frames[0]


def _each_from_its_first_mask(layout: Layout, video: str, names: list[str], use_all_masks: bool):
    """`vos_separate_inference_per_object`: every object from its first non-empty mask (or
    every non-empty mask of it), each tracked forward on its own from its first."""
    inputs: dict[int, dict[int, np.ndarray]] = {}
    palette = None
    for t, name in enumerate(names):
        if not layout.per_obj_png_file and not (layout.masks_dir(video) / f"{name}.png").is_file():
            continue
        masks, palette = _load(layout, video, name, allow_missing=True)
        for obj, mask in (masks or {}).items():
            if not mask.any() or (inputs.get(obj) and not use_all_masks):
                continue
            inputs.setdefault(obj, {})[t] = mask
    prompts = [
        Prompt(obj, t, mask=mask)
        for obj in sorted(inputs)
        for t, mask in sorted(inputs[obj].items())
    ]
    return prompts, palette, 0


def _object_dirs(layout: Layout, video: str) -> list[Path]:
    """Per-object annotation folders, in `os.listdir` order as the tool reads them (the last
    PNG read gives the palette); each must be named by its object id."""
    folder = layout.masks_dir(video)
    dirs = []
    for name in os.listdir(folder):
        if not (name.isascii() and name.isdecimal()):
            raise BadInput(
                f"video {video}: {folder / name} is not an object folder named by its id (e.g. 001)"
            )
        dirs.append(folder / name)
    return dirs


def _load(layout: Layout, video: str, name: str, allow_missing: bool):
    """({object id: bool mask}, palette) of frame `name`; (None, None) where its annotation
    PNG is missing (per object: where all are missing, unless `allow_missing`), as the
    tool's `load_masks_from_dir`."""
    if not layout.per_obj_png_file:
        path = layout.masks_dir(video) / f"{name}.png"
        if not path.is_file():
            return None, None
        ids, palette = _read(path)
        if ids.max(initial=0) > 255:  # 16 bits: the tool would cut the ids to 8 without a word
            raise BadInput(
                f"annotation {path} holds object id {ids.max()}: vos_inference reads ids "
                f"1..255 (8 bits), as its output PNGs hold them"
            )
        return {int(v): ids == v for v in np.unique(ids) if v > 0}, palette
    masks, palette = {}, None
    for obj_dir in _object_dirs(layout, video):
        path = obj_dir / f"{name}.png"
        if not path.is_file():
            if allow_missing:
                continue
            return None, None
        values, palette = _read(path)
        masks[int(obj_dir.name)] = values > 0
    return masks, palette


def _read(path: Path) -> tuple[np.ndarray, list[int] | None]:
    from PIL import Image

    values = read_id_mask(path)  # exact: uint8 (8 bits), uint16 (16), else BadInput
    with Image.open(path) as img:
        palette = img.getpalette()
    return values, palette
