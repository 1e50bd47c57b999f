"""`segpipe frame`: frame N of a video, a frame folder or a store's source, at the video's own
size and upright, with a labelled pixel grid to read prompt coordinates off.

The coordinates are those of the prompts file: x to the right, y down, in pixels of the
upright frame at the video's own size (what `track` checks prompts against).
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from segpipe.errors import BadInput
from segpipe.sources.registry import iter_frames, probe
from segpipe.store.runstore import RunStore
from segpipe.store.source import SourceReader, stored_source


def frame_image(path, at: int, stream: int | None = None) -> tuple[Image.Image, str]:
    """Frame `at` as an upright RGB image at the video's size, and where it came from: a
    store's source (or, where the source is gone or changed, its stored model-input frame
    scaled back), else the video file or frame folder itself."""
    path = Path(path)
    if RunStore.exists(path):
        return _from_store(RunStore.open(path, read_only=True), at)
    if not path.exists():
        raise BadInput(f"no video, frame folder, TIFF stack or store at {path}")
    info = probe(path, stream)  # refuses what is not a readable video, in one line
    if at < 0:
        raise BadInput(f"--at must be a frame index >= 0, got {at}")
    for _, _, picture in iter_frames(path, at, info.as_attrs()):
        return picture().convert("RGB"), f"frame {at} of {path}"
    raise BadInput(f"{path} has fewer than {at + 1} frames: no frame {at}")


def _from_store(store: RunStore, at: int) -> tuple[Image.Image, str]:
    attrs = store.attrs
    if "frame_count" not in attrs:
        raise BadInput(f"store {store.path} is not fully decoded yet: give the video itself")
    T = attrs["frame_count"]
    if not 0 <= at < T:
        raise BadInput(f"--at {at} is out of range: the video has frames 0..{T - 1}")
    try:
        source = stored_source(store)
    except BadInput:  # the source is gone or changed: the model's input, scaled back
        size = (attrs["video"]["width"], attrs["video"]["height"])
        frame = store.read("frames", at, at + 1)[0]
        return (
            Image.fromarray(frame).resize(size),
            f"frame {at} of store {store.path} (its {frame.shape[0]}x{frame.shape[1]} "
            f"model input scaled back: the source is not there unchanged)",
        )
    ((_, _, picture),) = SourceReader(store, source).frames(at, 1)
    return picture().convert("RGB"), f"frame {at} of {source}"


def grid_step(width: int, height: int) -> int:
    """About ten grid lines across the shorter side, at a round step."""
    target = min(width, height) / 10
    return next((s for s in (10, 20, 25, 50, 100, 200, 250, 500) if s >= target), 1000)


def with_grid(image: Image.Image, step: int) -> Image.Image:
    """`image` with a line every `step` pixels, labelled with its x (top) or y (left)."""
    if step <= 0:
        return image
    out = image.convert("RGBA")
    layer = Image.new("RGBA", out.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    w, h = out.size
    for x in range(step, w, step):
        draw.line([(x, 0), (x, h - 1)], fill=(255, 255, 0, 110))
        draw.text(
            (x + 2, 1), str(x), fill=(255, 255, 0, 255), stroke_width=1, stroke_fill=(0, 0, 0, 255)
        )
    for y in range(step, h, step):
        draw.line([(0, y), (w - 1, y)], fill=(255, 255, 0, 110))
        draw.text(
            (2, y + 1), str(y), fill=(255, 255, 0, 255), stroke_width=1, stroke_fill=(0, 0, 0, 255)
        )
    return Image.alpha_composite(out, layer).convert("RGB")


def save_frame(
    path, at: int, out: Path | None = None, grid: int | None = None, stream: int | None = None
) -> tuple[Path, str]:
    """Write frame `at` of `path` as a PNG (default `<name>_frame<at>.png` here) with a grid
    every `grid` pixels (None: a round step; 0: none). Returns the file and a line saying
    what it shows."""
    image, what = frame_image(path, at, stream)
    step = grid_step(*image.size) if grid is None else grid
    if step < 0:
        raise BadInput(f"--grid must be 0 (none) or a step in pixels, got {grid}")
    out = Path(out) if out is not None else Path(f"{Path(path).name.split('.')[0]}_frame{at}.png")
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: give a file name ending in .png")
    out.parent.mkdir(parents=True, exist_ok=True)
    with_grid(image, step).save(out, format="PNG")
    lines = f", grid every {step} px" if step else ""
    return out, f"{out}: {what}, {image.size[0]}x{image.size[1]} (x right, y down{lines})"
