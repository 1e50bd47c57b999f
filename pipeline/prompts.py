"""The prompts file: validated in full before anything is written.

{"prompts": [{"object": 1, "frame": 3, "points": [[x, y], ...], "labels": [1, 0, ...]},
             {"object": 2, "frame": 9, "box": [x0, y0, x1, y1]},
             {"object": 3, "frame": 12, "mask": "obj3.png"}]}
Pixel coordinates of the original video; labels 1 positive / 0 negative; a mask is a PNG
the size of the video (non-zero = object), relative to the prompts file. Applied in file order.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import BadInput

ENTRY_KEYS = {"object", "frame", "points", "labels", "box", "mask"}


@dataclass(frozen=True)
class Prompt:
    object_id: int
    frame: int
    points: tuple | None = None  # ((x, y), ...)
    labels: tuple | None = None  # (1, 0, ...)
    box: tuple | None = None  # (x0, y0, x1, y1)
    mask: np.ndarray | None = None  # (H, W) bool


def digest(prompts: list[Prompt]) -> str:
    """Identity of a prompt set: re-tracking is needed exactly when this changes."""
    entries, masks = to_record(prompts)
    for entry in entries:
        if "mask" in entry:
            entry["mask"] = hashlib.sha256(np.packbits(masks[entry["mask"]]).tobytes()).hexdigest()
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def to_record(prompts: list[Prompt]) -> tuple[list[dict], np.ndarray]:
    """The prompts as stored with the tracking results: JSON entries (a mask entry holds an
    index into the returned (N, H, W) mask stack), so a store can retrack on its own."""
    entries, masks = [], []
    for p in prompts:
        entry = {"object": p.object_id, "frame": p.frame}
        if p.points is not None:
            entry.update(points=[list(q) for q in p.points], labels=list(p.labels))
        if p.box is not None:
            entry["box"] = list(p.box)
        if p.mask is not None:
            entry["mask"] = len(masks)
            masks.append(p.mask)
        entries.append(entry)
    return entries, np.array(masks, dtype=bool)


def from_record(entries: list[dict], masks) -> list[Prompt]:
    return [Prompt(e["object"], e["frame"],
                   tuple(map(tuple, e["points"])) if "points" in e else None,
                   tuple(e["labels"]) if "labels" in e else None,
                   tuple(e["box"]) if "box" in e else None,
                   masks[e["mask"]] if "mask" in e else None) for e in entries]


def object_ids(prompts: list[Prompt]) -> list[int]:
    """Object slot order: order of first appearance, as SAM 2 assigns its object indices."""
    return list(dict.fromkeys(p.object_id for p in prompts))


def load(path, frame_count: int, width: int, height: int) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"prompts file not found: {path}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"prompts file {path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"prompts"}:
        raise BadInput(f"prompts file {path} must be an object with the single key \"prompts\"")
    entries = doc["prompts"]
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"prompts file {path} has an empty prompt list")
    return [_parse(i, e, path.parent, frame_count, width, height) for i, e in enumerate(entries)]


def _parse(i, entry, base: Path, frame_count, width, height) -> Prompt:
    where = f"prompt #{i}"

    def fail(message):
        raise BadInput(f"{where}: {message}")

    if not isinstance(entry, dict):
        fail("must be an object")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        fail(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(ENTRY_KEYS))})")
    obj, frame = entry.get("object"), entry.get("frame")
    if not _is_int(obj) or obj < 0:
        fail(f"\"object\" must be a non-negative integer id, got {obj!r}")
    where = f"prompt #{i} (object {obj})"
    if not _is_int(frame):
        fail(f"\"frame\" must be an integer, got {frame!r}")
    if not 0 <= frame < frame_count:
        fail(f"frame {frame} is out of range: the video has frames 0..{frame_count - 1}")
    if not ({"points", "box", "mask"} & set(entry)):
        fail("needs \"points\" (with \"labels\"), \"box\" or \"mask\"")
    if "mask" in entry and ({"points", "labels", "box"} & set(entry)):
        fail("a mask prompt cannot carry points or a box; give them as separate entries")
    if ("points" in entry) != ("labels" in entry):
        fail("\"points\" and \"labels\" must be given together")

    points = labels = box = mask = None
    if "points" in entry:
        points, labels = entry["points"], entry["labels"]
        if not isinstance(points, list) or not points or not all(
                isinstance(p, list) and len(p) == 2 and all(_is_num(c) for c in p) for p in points):
            fail("\"points\" must be a non-empty list of [x, y] pairs")
        if not isinstance(labels, list) or len(labels) != len(points):
            fail(f"\"labels\" must be a list of {len(points)} labels, one per point")
        if any(not _is_int(v) or v not in (0, 1) for v in labels):
            fail(f"labels must be 1 (positive) or 0 (negative), got {labels}")
        for x, y in points:
            if not (0 <= x <= width and 0 <= y <= height):
                fail(f"point ({x}, {y}) is outside the {width}x{height} frame")
        points, labels = tuple(tuple(float(c) for c in p) for p in points), tuple(labels)
    if "box" in entry:
        box = entry["box"]
        if not isinstance(box, list) or len(box) != 4 or not all(_is_num(c) for c in box):
            fail("\"box\" must be [x0, y0, x1, y1]")
        x0, y0, x1, y1 = box
        if not (0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height):
            fail(f"box {box} is not an ordered box inside the {width}x{height} frame")
        box = tuple(float(c) for c in box)
    if "mask" in entry:
        mask = _load_mask(entry["mask"], base, width, height, fail)
    return Prompt(obj, frame, points, labels, box, mask)


def _load_mask(name, base: Path, width, height, fail) -> np.ndarray:
    if not isinstance(name, str) or not name:
        fail("\"mask\" must be a PNG path relative to the prompts file")
    path = base / name
    if not path.is_file():
        fail(f"mask file not found: {path}")
    try:
        with Image.open(path) as img:
            mask = np.asarray(img.convert("L")) > 0
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        fail(f"mask {path} is not a readable image ({type(e).__name__})")
    if mask.shape != (height, width):
        fail(f"mask {path} is {mask.shape[1]}x{mask.shape[0]}, the video is {width}x{height}")
    return mask


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
