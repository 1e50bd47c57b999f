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
from segpipe.sources.base import SourceKind
from segpipe.sources.info import VideoInfo

JPEG = {".jpg", ".jpeg", ".JPG", ".JPEG"}  # exactly what SAM 2's loader lists
PNG = {".png", ".PNG"}
DEFAULT_FPS = 24.0


def frame_files(folder: Path) -> list[Path]:
    """The folder's frame files in SAM 2's order: its JPEGs, as SAM 2 lists them (other
    files, PNG masks among them, ignored), or, in a folder without JPEGs, its PNGs."""
    entries = files_in(folder)
    files = [p for p in entries if p.suffix in JPEG] or [p for p in entries if p.suffix in PNG]
    if not files:
        raise BadInput(f"no frames in folder {folder} (JPEG, PNG or TIFF files named by number)")
    return numbered(files)


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_file()]


def numbered(files: list[Path]) -> list[Path]:
    """Frame files ordered as SAM 2 orders them: by the integer value of the name; a name
    that is not a number, or two files of one number, refused."""
    for p in files:
        if not (p.stem.isascii() and p.stem.isdecimal()):
            raise BadInput(
                f"frame file {p} is not named by its number (SAM 2 orders frames "
                f"by the number in the name, e.g. 00042.jpg)"
            )
    files = sorted(files, key=lambda p: int(p.stem))
    for a, b in zip(files, files[1:]):
        if int(a.stem) == int(b.stem):
            raise BadInput(f"frame files {a.name} and {b.name} have the same number")
    return files


def probe(folder: Path, fps: float | None):
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
    return counted_info(size, fps, len(files), FrameFolder.name)


def counted_info(size: tuple[int, int], fps: float | None, count: int, kind: str, **more):
    """A `VideoInfo` for frames without a clock: frame t at t / fps (`--fps`, else 24)."""
    fps = float(fps or DEFAULT_FPS)
    if fps <= 0:
        raise BadInput(f"--fps must be positive, got {fps}")
    rate = Fraction(fps).limit_denominator(1001)
    return VideoInfo(size[0], size[1], fps, str(rate), str(1 / rate), count, kind=kind, **more)


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


def identity(files: list[Path]) -> dict:
    """How a store recognises a frame folder: the listing (each frame's name, size and
    mtime, hashed: a renamed or replaced frame changes it) and a sha256 of the frames' names
    and contents (decides when the listing changed but the frames may not have)."""
    digest, size = hashlib.sha256(), 0
    for p in files:
        size += p.stat().st_size
        digest.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return {"size": size, "listing": listing(files), "sha256": digest.hexdigest()}


def listing(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in files:
        stat = p.stat()
        digest.update(f"{p.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


class NumberedFiles(SourceKind):
    """A folder of frame files named by their number: its identity is its listing."""

    folder = True
    named_frames = True

    def files(self, folder: Path) -> list[Path]:
        raise NotImplementedError

    def identity(self, path: Path) -> dict:
        return identity(self.files(Path(path)))

    def same(self, recorded: dict, path: Path) -> bool:
        files = self.files(Path(path))
        return listing(files) == recorded.get("listing") or (
            identity(files)["sha256"] == recorded["sha256"]
        )

    def frame_names(self, path: Path) -> list[str] | None:
        """The frame files' stems; None where the folder is gone (outputs are numbered)."""
        return [p.stem for p in self.files(Path(path))] if Path(path).is_dir() else None


class FrameFolder(NumberedFiles):
    """JPEG (or PNG) frames, SAM 2's own input."""

    name, what = "frames", "a frame folder"

    def claims(self, path: Path) -> bool:
        return path.is_dir()

    def files(self, folder: Path) -> list[Path]:
        return frame_files(folder)

    def probe(self, path, stream, fps):
        return probe(Path(path), fps)

    def frames(self, path, start, video=None, before_pts=None, is_before=None):
        return iter_frames(Path(path), start)
