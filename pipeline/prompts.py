"""Prompts: validated in full before anything is written.

They come as a file, as the file's entries (a list of dicts) or as `Prompt` objects:
{"prompts": [{"object": 1, "frame": 3, "points": [[x, y], ...], "labels": [1, 0, ...]},
             {"object": 2, "frame": 9, "box": [x0, y0, x1, y1]},
             {"object": 3, "frame": 12, "mask": "obj3.png"},
             {"frame": 0, "id_mask": "annotations/00000.png"}],
 "objects": [{"id": 1, "name": "left mouse", "class": "mouse"}]}
Pixel coordinates of the original video; labels 1 positive / 0 negative; a mask is a PNG
the size of the video (non-zero = object), relative to the prompts file, or inline as a
`data:image/png;base64,...` URI (what segpipe studio saves; in Python also a numpy
array). An `id_mask` is a single-channel PNG whose pixel values are object ids (a DAVIS
annotation): one mask prompt per non-zero id on it, lowest id first, as SAM 2's
vos_inference adds them; ids are read at the image's depth (`read_id_mask`: 8-bit palette
or grey, 1..255; 16-bit grey, 1..65535). Applied in order. "objects", optional, names
the objects (`segpipe.labels`; not part of what is tracked).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from segpipe.errors import BadInput
from segpipe.fsutil import regular_file
from segpipe.labels import parse as parse_labels
from segpipe.limits import (
    MAX_MASK_PIXELS,
    MAX_OBJECT_ID,
    MAX_POINTS,
    MAX_PROMPTS,
    TooLarge,
    read_json_file,
)

ENTRY_KEYS = {"object", "frame", "points", "labels", "box", "mask", "id_mask"}


@dataclass(frozen=True, eq=False)
class Prompt:
    """One prompt for one object on one frame, as SAM 2's `add_new_points_or_box` or
    `add_new_mask` takes it. Coordinates are pixels of the original video.

    Example:
        >>> segpipe.Prompt(1, frame=3, points=[[120.5, 80], [30, 40]], labels=[1, 0])
        >>> segpipe.Prompt(2, frame=9, box=[10, 20, 110, 140])
        >>> segpipe.Prompt(3, frame=12, mask=mask)  # (H, W) array, non-zero = object
    """

    object_id: int
    frame: int
    points: tuple | None = None  # ((x, y), ...)
    labels: tuple | None = None  # (1, 0, ...)
    box: tuple | None = None  # (x0, y0, x1, y1)
    mask: np.ndarray | None = None  # (H, W) bool

    def as_entry(self) -> dict:
        """The prompt as a prompts-file entry (the mask stays an array)."""
        entry = {"object": self.object_id, "frame": self.frame}
        for key in ("points", "labels", "box", "mask"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        return entry


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
        entry = _entry(p)
        if p.mask is not None:
            entry["mask"] = len(masks)
            masks.append(p.mask)
        entries.append(entry)
    return entries, np.array(masks, dtype=bool)


def to_file(prompts: list[Prompt]) -> list[dict]:
    """The prompts as a prompts file's entries, masks inline (`mask_data_uri`): a file that
    stands alone (what segpipe studio saves and downloads)."""
    entries = []
    for p in prompts:
        entry = _entry(p)
        if p.mask is not None:
            entry["mask"] = mask_data_uri(p.mask)
        entries.append(entry)
    return entries


def _entry(p: Prompt) -> dict:
    """A prompt's entry as JSON takes it, but for its mask."""
    entry = {"object": p.object_id, "frame": p.frame}
    if p.points is not None:
        entry.update(points=[list(q) for q in p.points], labels=list(p.labels))
    if p.box is not None:
        entry["box"] = list(p.box)
    return entry


def from_record(entries: list[dict], masks) -> list[Prompt]:
    return [
        Prompt(
            e["object"],
            e["frame"],
            tuple(map(tuple, e["points"])) if "points" in e else None,
            tuple(e["labels"]) if "labels" in e else None,
            tuple(e["box"]) if "box" in e else None,
            masks[e["mask"]] if "mask" in e else None,
        )
        for e in entries
    ]


def object_ids(prompts: list[Prompt]) -> list[int]:
    """Object slot order: order of first appearance, as SAM 2 assigns its object indices."""
    return list(dict.fromkeys(p.object_id for p in prompts))


def load(source, frame_count: int, width: int, height: int) -> list[Prompt]:
    """Validated prompts from a prompts file path, a list of its entries (dicts) or a list of
    `Prompt` objects. Relative mask paths are relative to the file (else to the working
    directory)."""
    if isinstance(source, (str, Path)):
        return _load_file(Path(source), frame_count, width, height)
    if isinstance(source, Prompt) or isinstance(source, dict):
        source = [source]
    if not isinstance(source, (list, tuple)) or not source:
        raise BadInput("prompts must be a prompts file path or a non-empty list of prompts")
    entries = [e.as_entry() if isinstance(e, Prompt) else e for e in source[: MAX_PROMPTS + 1]]
    return _parsed(entries, Path.cwd(), frame_count, width, height)


def _load_file(path: Path, frame_count: int, width: int, height: int) -> list[Prompt]:
    doc = read_json_file(path, "prompts file")
    if not isinstance(doc, dict) or set(doc) - {"objects"} != {"prompts"}:
        raise BadInput(
            f'prompts file {path} must be an object with the key "prompts" '
            f'(and, naming the objects, "objects")'
        )
    entries = doc["prompts"]
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"prompts file {path} has an empty prompt list")
    parse_labels(doc.get("objects", []), f"prompts file {path}")  # checked before any write
    return _parsed(entries, path.parent, frame_count, width, height)


def _parsed(entries: list, base: Path, frame_count: int, width: int, height: int) -> list:
    """The entries' prompts (an id mask split into one per id), within `Budget`."""
    if len(entries) > MAX_PROMPTS:
        raise TooLarge(f"{len(entries):,} prompts: segpipe takes at most {MAX_PROMPTS:,}")
    budget = Budget(width * height)
    return [
        p
        for i, e in enumerate(entries)
        for p in _parse(i, e, base, frame_count, width, height, budget)
    ]


class Budget:
    """What the prompts may hold, taken as they are parsed, before each is made: at most
    `MAX_PROMPTS` prompts (an id mask's ids each count) and `MAX_MASK_PIXELS` pixels of
    masks in all (each mask is a frame-sized array in memory)."""

    def __init__(self, frame_pixels: int):
        self.frame_pixels, self.prompts, self.pixels = frame_pixels, 0, 0

    def take(self, prompts: int, masks: int = 0) -> None:
        self.prompts += prompts
        self.pixels += masks * self.frame_pixels
        if self.prompts > MAX_PROMPTS:
            raise TooLarge(
                f"more than {MAX_PROMPTS:,} prompts: segpipe takes at most {MAX_PROMPTS:,}"
            )
        if self.pixels > MAX_MASK_PIXELS:
            raise TooLarge(
                f"the mask prompts hold over {MAX_MASK_PIXELS:,} pixels in all "
                f"({self.pixels // self.frame_pixels:,} frame-sized masks): segpipe holds at "
                f"most {MAX_MASK_PIXELS // self.frame_pixels:,} masks of this video's size"
            )


def _parse(i, entry, base: Path, frame_count, width, height, budget: Budget) -> list[Prompt]:
    where = f"prompt #{i}"

    def fail(message):
        raise BadInput(f"{where}: {message}")

    if not isinstance(entry, dict):
        fail("must be an object")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        fail(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(ENTRY_KEYS))})")
    if "id_mask" in entry:
        return _parse_id_mask(entry, base, frame_count, width, height, budget, fail)
    obj, frame = entry.get("object"), entry.get("frame")
    obj, frame = _plain_int(obj), _plain_int(frame)
    if not _is_int(obj) or not 0 <= obj <= MAX_OBJECT_ID:
        fail(f'"object" must be an integer id in 0..{MAX_OBJECT_ID}, got {_short(obj)}')
    where = f"prompt #{i} (object {obj})"
    if not _is_int(frame):
        fail(f'"frame" must be an integer, got {_short(frame)}')
    if not 0 <= frame < frame_count:
        fail(f"frame {_short(frame)} is out of range: the video has frames 0..{frame_count - 1}")
    if not ({"points", "box", "mask"} & set(entry)):
        fail('needs "points" (with "labels"), "box" or "mask"')
    if "mask" in entry and ({"points", "labels", "box"} & set(entry)):
        fail("a mask prompt cannot carry points or a box; give them as separate entries")
    if ("points" in entry) != ("labels" in entry):
        fail('"points" and "labels" must be given together')

    points = labels = box = mask = None
    if "points" in entry:
        points, labels = _points(entry, width, height, fail)
    if "box" in entry:
        box = _box(entry, width, height, fail)
    if "mask" in entry:
        budget.take(1, 1)  # before its mask is decoded
        mask = _load_mask(entry["mask"], base, width, height, fail)
    else:
        budget.take(1)
    return [Prompt(obj, frame, points, labels, box, mask)]


def _points(entry: dict, width: int, height: int, fail) -> tuple[tuple, tuple]:
    """An entry's points and labels, checked."""
    points, labels = _plain(entry["points"]), _plain(entry["labels"])
    if isinstance(points, list) and len(points) > MAX_POINTS:
        fail(f"{len(points)} points: a prompt takes at most {MAX_POINTS}")
    if (
        not isinstance(points, list)
        or not points
        or not all(
            isinstance(p, list) and len(p) == 2 and all(_is_num(c) for c in p) for p in points
        )
    ):
        fail('"points" must be a non-empty list of [x, y] pairs')
    if not isinstance(labels, list) or len(labels) != len(points):
        fail(f'"labels" must be a list of {len(points)} labels, one per point')
    if any(not _is_int(v) or v not in (0, 1) for v in labels):
        fail(f"labels must be 1 (positive) or 0 (negative), got {_short(labels)}")
    for x, y in points:
        if not (0 <= x <= width and 0 <= y <= height):
            fail(f"point ({_short(x)}, {_short(y)}) is outside the {width}x{height} frame")
    return tuple(tuple(float(c) for c in p) for p in points), tuple(labels)


def _box(entry: dict, width: int, height: int, fail) -> tuple:
    """An entry's box, checked."""
    box = _plain(entry["box"])
    if not isinstance(box, list) or len(box) != 4 or not all(_is_num(c) for c in box):
        fail('"box" must be [x0, y0, x1, y1]')
    x0, y0, x1, y1 = box
    if not (0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height):
        fail(f"box {_short(box)} is not an ordered box inside the {width}x{height} frame")
    return tuple(float(c) for c in box)


def _parse_id_mask(
    entry, base: Path, frame_count, width, height, budget: Budget, fail
) -> list[Prompt]:
    if set(entry) != {"frame", "id_mask"}:
        fail('an "id_mask" entry holds only "frame" and "id_mask" (its ids are the objects)')
    frame = _plain_int(entry["frame"])
    if not _is_int(frame) or not 0 <= frame < frame_count:
        fail(f"frame {_short(frame)} is out of range: the video has frames 0..{frame_count - 1}")
    name = entry["id_mask"]

    def read(source, shown):
        try:
            return read_id_mask(source, f"id_mask {shown}")
        except BadInput as e:
            message = e.message
        fail(message)  # named by its entry

    if isinstance(name, np.ndarray):
        ids, name = name, "array"
        if ids.dtype.kind not in "biu":
            fail(f"an id_mask array holds integer object ids, not {ids.dtype} values")
        if ids.size and ids.min() < 0:
            fail(f"an id_mask array holds object ids, never negative; it holds {ids.min()}")
    elif isinstance(name, str) and name.startswith(DATA_URI):
        data = io.BytesIO(_base64(name[len(DATA_URI) :], fail))
        ids, name = read(data, "(inline data)"), "(inline data)"
    elif isinstance(name, str):
        regular_file(base / name, "id_mask file", "a PNG", fail)
        ids = read(base / name, base / name)
    else:
        fail('"id_mask" must be a PNG path (relative to the prompts file) or an (H, W) array')
    if ids.ndim != 2:
        fail(f"id_mask {name} is not a single-channel (indexed) image")
    if ids.shape != (height, width):
        fail(f"id_mask {name} is {ids.shape[1]}x{ids.shape[0]}, the video is {width}x{height}")
    objects = [int(v) for v in np.unique(ids) if v > 0]
    if not objects:
        fail(f"id_mask {name} holds no object (every pixel is 0)")
    budget.take(len(objects), len(objects))  # before a mask is made
    return [Prompt(obj, frame, mask=ids == obj) for obj in objects]


ID_MASK_MAX = 65535  # the most a 16-bit PNG holds


def read_id_mask(path, label: str | None = None) -> np.ndarray:
    """An id mask's (annotation's) pixel values, its object ids, exact at the image's depth:
    uint8 from an 8-bit palette or grey image (a 1-bit one: 0/1), uint16 from a 16-bit grey
    one (or a 32-bit integer one whose values all fit 0..65535). Anything else (colour,
    alpha, floats, values out of that range) is a `BadInput`, one line starting with `label`
    (default "annotation PATH"): ids are never cut to 8 bits, as vos_inference's
    `astype(np.uint8)` does, which merges id 257 into 1 and drops 256 without a word."""
    label = label or f"annotation {path}"
    try:
        with Image.open(path) as img:
            mode = img.mode
            values = np.array(img)
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        raise BadInput(f"{label} is not a readable image ({type(e).__name__})") from None
    if values.ndim != 2 or values.dtype.kind not in "biu":
        raise BadInput(
            f"{label} is a {mode} image, not a single-channel indexed (palette) or grey one "
            f"(8 or 16 bits) whose values are object ids"
        )
    if values.dtype.itemsize == 1:  # "1", "L", "P"
        return values.astype(np.uint8)
    if values.size and (values.min() < 0 or values.max() > ID_MASK_MAX):
        bad = int(values.min()) if values.min() < 0 else int(values.max())
        raise BadInput(
            f"{label} holds pixel value {bad}: object ids are 0..{ID_MASK_MAX} (a 16-bit PNG)"
        )
    return values.astype(np.uint16)  # "I;16", "I;16B" (native order now), "I"


def _load_mask(name, base: Path, width, height, fail) -> np.ndarray:
    if isinstance(name, np.ndarray):
        if name.ndim != 2 or name.dtype.kind not in "biuf":
            fail(
                f"a mask array must be 2-D (H, W) numbers or booleans, got {name.dtype} {name.shape}"
            )
        if name.shape != (height, width):
            fail(f"mask array is {name.shape[1]}x{name.shape[0]}, the video is {width}x{height}")
        return name != 0
    if not isinstance(name, str) or not name:
        fail('"mask" must be a PNG path (relative to the prompts file) or an (H, W) array')
    if name.startswith(DATA_URI):
        path, source = "(inline data)", io.BytesIO(_base64(name[len(DATA_URI) :], fail))
    else:
        path = source = base / name
        regular_file(path, "mask file", "a PNG", fail)
    try:
        with Image.open(source) as img:
            if img.size != (width, height):  # said from its header, before it is decoded
                fail(f"mask {path} is {img.width}x{img.height}, the video is {width}x{height}")
            mask = np.asarray(img.convert("L")) > 0
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        fail(f"mask {path} is not a readable image ({type(e).__name__})")
    return mask


DATA_URI = "data:image/png;base64,"


def mask_data_uri(mask: np.ndarray) -> str:
    """A mask as a prompts file's inline `data:` URI (a 0/255 PNG)."""
    out = io.BytesIO()
    Image.fromarray(np.asarray(mask, bool).astype(np.uint8) * 255).save(out, "PNG")
    return DATA_URI + base64.b64encode(out.getvalue()).decode()


def _base64(text: str, fail) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        fail("inline mask data is not base64")


def _plain(v):
    """numpy arrays and scalars as the lists and numbers of a JSON file."""
    return (
        v.tolist()
        if isinstance(v, (np.ndarray, np.generic))
        else ([_plain(x) for x in v] if isinstance(v, (list, tuple)) else v)
    )


def _plain_int(v):
    return int(v) if isinstance(v, np.integer) else v


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    """A finite number a float holds (an integer too large for one is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return bool(np.isfinite(float(v)))
    except OverflowError:
        return False


def _short(v) -> str:
    """A value as a message quotes it: its repr, cut to 40 characters."""
    if isinstance(v, int) and abs(v) >= 10**30:
        return f"an integer of {v.bit_length()} bits"
    try:
        said = repr(v)
    except ValueError:  # an integer inside with more digits than Python writes out
        return "a value too long to show"
    return said if len(said) <= 40 else said[:37] + "..."
