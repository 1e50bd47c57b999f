"""TIFF stacks, microscopy's usual format: a multi-page TIFF file (a time-lapse, a z-stack)
or a folder of numbered TIFF files, read with tifffile (and imagecodecs: LZW, deflate and
other compressions); 8 or 16 bits a sample, grey or RGB.

A file holds one image series (a file of several, such as positions or pages of other
sizes, is refused) whose axes are at most one sequence axis (T, Z, I or Q: time, depth or
unnamed, read as time; not C, channels) before a 2-D frame: YX (grey), or YXS or SYX with 3
or 4 samples (RGB; a 4th sample, alpha, is dropped). Frame t is the series' t-th frame: its
page t, or, in a contiguous file (ImageJ's over 4 GB), its t-th plane through a memory map.
A folder's files hold one such frame each and are named by their number, as a JPEG
folder's are. There is no clock: frame t is at t / `--fps` (24 by default).

How a frame becomes the model's input:
- 8 bits: as it is; grey repeated into R, G and B (Pillow's `convert("RGB")`, what SAM 2's
  loader does with a grey JPEG).
- 16 bits: one linear window [lo, hi] for the whole source. lo and hi are the 0.1st and
  99.9th percentiles of all its samples (every frame, every channel used): of the n
  samples sorted, entries floor(0.001 (n - 1)) and ceil(0.999 (n - 1)), counted exactly in
  a 65,536-bin histogram. Where those two are equal (almost every sample one value, as in
  sparse fluorescence), the window is the samples' minimum and maximum instead, and hi is
  lo + 1 where the source is flat. A sample v becomes
  round((clip(v, lo, hi) - lo) * 255 / (hi - lo)), halves rounded up, in integers. The
  window is computed once, when the store is made (`for_store`), and recorded in it
  (`intensity`): every frame, a resume and a repair use the recorded one. One window for
  every frame: a brightness means the same all through the video (per-frame contrast would
  flicker), and a few hot pixels do not darken it.
Other sample types (float, signed, 32-bit) and other layouts are refused in one line.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from segpipe.errors import BadInput
from segpipe.sources.base import SourceKind
from segpipe.sources.folder import JPEG, PNG, NumberedFiles, counted_info, files_in, numbered

SUFFIXES = {".tif", ".tiff", ".TIF", ".TIFF"}
MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # classic and BigTIFF, either byte order
LOW, HIGH = 1, 999  # the window's percentiles, in thousandths
DEPTHS = {np.dtype(np.uint8): 8, np.dtype(np.uint16): 16}


class Stack:
    """A TIFF file's image series, a frame at a time (as read: (H, W) or (H, W, 3))."""

    def __init__(self, path: Path):
        import tifffile

        self.path = Path(path)
        try:
            self.tif = tifffile.TiffFile(str(path))
            series = self.tif.series
            page = series[0].keyframe
        except Exception as e:  # noqa: BLE001 - tifffile raises many kinds on damage
            raise BadInput(f"not a readable TIFF: {path} ({type(e).__name__}: {e})") from None
        try:
            if len(series) > 1:
                raise BadInput(
                    f"{path} holds {len(series)} image series (positions, or pages of "
                    f"different sizes: {', '.join(_shape(s) for s in series[:4])}); segpipe "
                    f"reads a file of one: save each series on its own"
                )
            self.layout, self.dtype, self.count = _layout(self.path, series[0], page)
            self.shape = page.shape
            self.pages = series[0].pages
            self.planes = None  # a contiguous file: its frames through a memory map
            if series[0].dataoffset is not None:
                planes = tifffile.memmap(str(path), series=0, mode="r")
                self.planes = planes.reshape(self.count, *self.shape)
        except BaseException:
            self.tif.close()
            raise

    def frame(self, t: int) -> np.ndarray:
        import tifffile

        try:
            a = np.array(self.planes[t]) if self.planes is not None else self.pages[t].asarray()
        except (ValueError, KeyError, tifffile.TiffFileError) as e:  # damage in the file
            raise BadInput(f"frame {t} of {self.path} does not read ({e})") from None
        if a.shape != self.shape:
            raise BadInput(f"frame {t} of {self.path} is {a.shape}, frame 0 {self.shape}")
        if self.layout == "SYX":
            a = np.moveaxis(a, 0, -1)
        return a[..., :3] if a.ndim == 3 else a

    def close(self) -> None:
        self.planes = None
        self.tif.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shape(series) -> str:
    return f"{series.axes} {'x'.join(map(str, series.shape))}"


def _layout(path: Path, series, page) -> tuple[str, np.dtype, int]:
    """(the frame's axes, its sample type, the frame count), or the refusal of a layout
    segpipe does not read."""
    axes, shape = page.axes, page.shape
    dtype = np.dtype(page.dtype)
    if dtype not in DEPTHS:
        raise BadInput(
            f"{path}: TIFF samples are {dtype}; segpipe reads 8- and 16-bit unsigned "
            f"TIFFs (convert it, e.g. in Fiji: Image > Type > 16-bit)"
        )
    rgb = axes in ("YXS", "SYX") and shape[axes.index("S")] in (3, 4)
    if not (axes == "YX" or rgb) or page.photometric not in (1, 2):  # MINISBLACK, RGB
        raise BadInput(
            f"{path}: a TIFF frame with axes {axes} {tuple(shape)} (photometric "
            f"{int(page.photometric)}); segpipe reads grey (YX) or RGB (YXS) frames"
        )
    leading = series.axes[: len(series.shape) - len(shape)]
    count = math.prod(series.shape[: len(leading)])
    contiguous = series.dataoffset is not None
    if len(leading) > 1 or "C" in leading or not (contiguous or len(series.pages) == count):
        raise BadInput(
            f"{path}: a TIFF with axes {_shape(series)}; segpipe reads one sequence of "
            f"2-D frames (axes like TYX or ZYXS, not channels C): save one Z or channel "
            f"at a time"
        )
    return axes, dtype, count


def window(frames) -> tuple[int, int]:
    """The 16-bit window [lo, hi] of all samples of `frames` (see the module's text)."""
    hist = np.zeros(1 << 16, np.int64)
    for a in frames:
        hist += np.bincount(a.ravel(), minlength=1 << 16)
    cum = np.cumsum(hist)
    n1 = int(cum[-1]) - 1
    lo = int(np.searchsorted(cum, n1 * LOW // 1000, side="right"))
    hi = int(np.searchsorted(cum, -(-n1 * HIGH // 1000), side="right"))
    if hi == lo:  # (almost) every sample one value: the whole range instead
        used = np.flatnonzero(hist)
        lo, hi = int(used[0]), int(used[-1])
    return lo, max(hi, lo + 1)


def eight_bit(a: np.ndarray, intensity) -> np.ndarray:
    """A frame's samples as 8 bits: as they are, or through the 16-bit window."""
    if a.dtype == np.uint8:
        return a
    lo, hi = intensity
    v = np.clip(a.astype(np.int64), lo, hi) - lo
    return ((v * 510 + (hi - lo)) // (2 * (hi - lo))).astype(np.uint8)


class TiffPicture:
    def __init__(self, a: np.ndarray, intensity):
        self.a, self.intensity = a, intensity

    def __call__(self) -> Image.Image:
        return Image.fromarray(np.ascontiguousarray(eight_bit(self.a, self.intensity))).convert(
            "RGB"
        )


class _Tiffs:
    """What a TIFF file and a TIFF folder share: frames read as arrays in order, the 16-bit
    window over all of them (computed once per process and state of the source)."""

    def arrays(self, path: Path, start: int):
        raise NotImplementedError

    def first(self, path: Path) -> tuple[np.ndarray, int]:
        raise NotImplementedError  # (frame 0, the frame count)

    def probe(self, path, stream, fps):
        a, count = self.first(Path(path))
        return counted_info((a.shape[1], a.shape[0]), fps, count, self.name, bits=a.itemsize * 8)

    def for_store(self, path, info):
        """With the 16-bit window, computed (a pass over every sample) for the store."""
        if info.bits != 16:
            return info
        return replace(info, intensity=self.intensity(Path(path)))

    def intensity(self, path: Path) -> tuple[int, int]:
        return _window(self, str(path), _state(path))

    def frames(self, path, start, video=None, before_pts=None, is_before=None):
        path = Path(path)
        intensity = (video or {}).get("intensity")
        for t, a in self.arrays(path, start):
            if a.dtype == np.uint16 and intensity is None:  # no store: computed here
                intensity = self.intensity(path)
            yield t, float("nan"), TiffPicture(a, intensity)


@functools.lru_cache(maxsize=8)
def _window(kind: _Tiffs, path: str, state) -> tuple[int, int]:
    return window(a for _, a in kind.arrays(Path(path), 0))


def _state(path: Path):
    """What changes when a file or a folder's files change (the window's cache key)."""
    files = [path] if path.is_file() else sorted(files_in(path))
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)


class TiffStack(_Tiffs, SourceKind):
    """One TIFF file of many pages."""

    name, what = "tiff", "a TIFF stack"

    def claims(self, path: Path) -> bool:
        if not path.is_file():  # a FIFO is never opened: its open would wait for a writer
            return False
        with open(path, "rb") as f:
            return f.read(4) in MAGIC

    def first(self, path):
        with Stack(path) as stack:
            return stack.frame(0), stack.count

    def arrays(self, path, start):
        with Stack(path) as stack:
            for t in range(start, stack.count):
                yield t, stack.frame(t)


class TiffFolder(_Tiffs, NumberedFiles):
    """A folder of numbered TIFF files, one frame each."""

    name, what = "tiff-folder", "a TIFF folder"

    def claims(self, path: Path) -> bool:
        if not path.is_dir():
            return False
        suffixes = {p.suffix for p in files_in(path)}
        return not suffixes & (JPEG | PNG) and bool(suffixes & SUFFIXES)

    def files(self, folder: Path) -> list[Path]:
        return numbered([p for p in files_in(folder) if p.suffix in SUFFIXES])

    def first(self, path):
        files = self.files(path)
        shape = dtype = None
        for p in files:  # every frame must have the first one's shape and type
            with Stack(p) as stack:
                _one_frame(p, stack)
                if shape is None:
                    shape, dtype, a = stack.shape, stack.dtype, stack.frame(0)
                elif (stack.shape, stack.dtype) != (shape, dtype):
                    raise BadInput(
                        f"frame {p} is {stack.shape} {stack.dtype}, the first frame "
                        f"{files[0].name} is {shape} {dtype}: a folder's frames must match"
                    )
        return a, len(files)

    def arrays(self, path, start):
        for t, p in enumerate(self.files(path)[start:], start):
            with Stack(p) as stack:
                _one_frame(p, stack)
                yield t, stack.frame(0)


def _one_frame(path: Path, stack: Stack) -> None:
    if stack.count != 1:
        raise BadInput(f"{path} holds {stack.count} frames; a TIFF folder's files hold one each")
