"""A folder of frames as a source: SAM 2's own input (`SAM2VideoPredictor.init_state(dir)`)
and the layout of DAVIS, YouTube-VOS, MOSE and SA-V.

Frames are JPEG (or PNG) files named by their number, ordered as SAM 2 orders them (by the
integer value of the stem), and read with SAM 2's own loader arithmetic
(`Image.open(p).convert("RGB")`, then the caller's resize), so tracking a folder is
bit-identical to SAM 2's predictor initialised on it. A folder has no timestamps: frame t is
at t / fps.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path

from PIL import Image

from segpipe.errors import BadInput

JPEG = {".jpg", ".jpeg", ".JPG", ".JPEG"}  # exactly what SAM 2's loader lists
PNG = {".png", ".PNG"}
DEFAULT_FPS = 24.0


def frame_files(folder: Path) -> list[Path]:
    """The folder's frame files in SAM 2's order: its JPEGs, as SAM 2 lists them (other
    files, PNG masks among them, ignored), or, in a folder without JPEGs, its PNGs."""
    entries = [p for p in folder.iterdir() if p.is_file()]
    files = [p for p in entries if p.suffix in JPEG] or [p for p in entries if p.suffix in PNG]
    for p in files:
        if not (p.stem.isascii() and p.stem.isdecimal()):
            raise BadInput(
                f"frame file {p} is not named by its number (SAM 2 orders frames "
                f"by the number in the name, e.g. 00042.jpg)"
            )
    if not files:
        raise BadInput(f"no frames in folder {folder} (JPEG or PNG files named by number)")
    files.sort(key=lambda p: int(p.stem))
    for a, b in zip(files, files[1:]):
        if int(a.stem) == int(b.stem):
            raise BadInput(f"frame files {a.name} and {b.name} have the same number")
    return files


def probe(folder: Path, fps: float | None):
    from segpipe.sources.info import VideoInfo

    files = frame_files(folder)
    size = None
    for p in files:  # headers only: every frame must have the first one's size
        try:
            with Image.open(p) as img:
                this = img.size
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds
            raise BadInput(f"unreadable image {p} ({type(e).__name__}: {e})") from None
        if size is None:
            size = this
        elif this != size:
            raise BadInput(
                f"frame {p} is {this[0]}x{this[1]}, the first frame {files[0].name} "
                f"is {size[0]}x{size[1]}: a folder's frames must share one size"
            )
    fps = float(fps or DEFAULT_FPS)
    if fps <= 0:
        raise BadInput(f"--fps must be positive, got {fps}")
    rate = Fraction(fps).limit_denominator(1001)
    return VideoInfo(size[0], size[1], fps, str(rate), str(1 / rate), len(files), kind="frames")


def iter_frames(folder: Path, start: int):
    """(pts, seconds, picture) from frame `start` on: pts is the frame's index, in the time
    base 1/fps that `probe` records (seconds follow from it: the fps is the store's)."""
    files = frame_files(folder)
    for t in range(start, len(files)):
        yield t, float("nan"), FramePicture(files[t])


class FramePicture:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self) -> Image.Image:
        try:
            with Image.open(self.path) as img:
                return img.convert("RGB")
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds
            raise BadInput(f"unreadable image {self.path} ({type(e).__name__}: {e})") from None


def identity(folder: Path) -> dict:
    """How a store recognises its frame folder: the listing (each frame's name, size and
    mtime, hashed: a renamed or replaced frame changes it) and a sha256 of the frames' names
    and contents (decides when the listing changed but the frames may not have)."""
    digest, size = hashlib.sha256(), 0
    for p in frame_files(folder):
        size += p.stat().st_size
        digest.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return {"size": size, "listing": listing(folder), "sha256": digest.hexdigest()}


def listing(folder: Path) -> str:
    digest = hashlib.sha256()
    for p in frame_files(folder):
        stat = p.stat()
        digest.update(f"{p.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()
