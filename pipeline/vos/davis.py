"""`segpipe evaluate`: DAVIS 2017 semi-supervised scores of result masks against ground truth,
region similarity J and contour accuracy F, and J&F.

The measures are the DAVIS 2017 evaluation's (github.com/davisvideochallenge/davis2017-evaluation),
written anew here in numpy (no OpenCV, no scikit-image), with the same definitions:

  J (davis2017/metrics.py, db_eval_iou): |R & G| / |R | G| of an object's result mask R and
    ground-truth mask G, both without the frame's void pixels; 1 when the union is empty.
  F (davis2017/metrics.py, f_measure): the F-measure of boundary precision and recall.
    Boundaries are `_seg2bmap`'s one-pixel maps (`boundary_map` below); a boundary pixel of
    one mask counts as matched when a boundary pixel of the other lies within the disk of
    radius ceil(0.008 * image diagonal) around it (a dilation by scikit-image's disk: the
    offsets with dx^2 + dy^2 <= r^2). No result boundary: precision 1, recall 0; no ground
    truth boundary: precision 0, recall 1; neither: both 1. F = 0 when precision + recall = 0.
  Frames (davis2017/evaluation.py, evaluate): the semi-supervised task scores every frame but
    the first (the given annotation) and the last.
  Means (davis2017/evaluation.py and evaluation_method.py): an object's J (F) is the mean over
    the scored frames (utils.db_statistics' M); J-Mean (F-Mean) is the mean over all objects
    of all videos, not over videos; J&F-Mean = (J-Mean + F-Mean) / 2. The per-video figures
    (the mean over a video's objects) are this report's own; DAVIS prints one row per object,
    which `Report.to_dict` gives too.

Layout, as SAM 2's tools/vos_inference.py writes it (and `segpipe export --format davis`, one
video per folder): <dir>/<video>/<frame>.png, indexed (or grayscale) PNGs whose pixel values
are object ids, 0 the background; or, with `per_object_png`, <dir>/<video>/<object id>/<frame>.png
(folders named 001, 002, ...), 0 / non-zero. Results and ground truth share one layout.

Rules, as DAVIS has them unless marked "decision":
  * Frames are the ground truth's PNGs, named by number and sorted by it; a result frame is
    the PNG of the same name (or, failing that, of the same number). Only the scored frames'
    results are read (DAVIS reads `all_masks_id[1:-1]`), and a missing one is an error
    (`BadInput`). Decision: a video needs at least 3 ground-truth frames (DAVIS would score
    it NaN).
  * Objects are the non-zero ids of the first ground-truth frame (davis2017/davis.py,
    get_all_masks, takes ids 1..max of the first frame: the same on DAVIS's annotations,
    numbered 1..N; an id missing in between is no object here). Ground-truth ids that appear
    only in later frames are not scored, as in DAVIS; the report lists them.
  * Void: ground-truth pixels of value 255 (indexed layout) are left out of J and F for every
    object (davis.py's masks_void). The per-object layout has no void label.
  * A result that lacks an object scores it with empty masks (davis2017/evaluation.py,
    _evaluate_semisupervised, pads missing objects with zeros): J and F 0 where the ground
    truth has the object, 1 where it has not. (The void label and this padding are in the
    current davis2017-evaluation; its early versions, e.g. commit 30b698a, stopped on any
    difference in object counts and had no void.)
  * Decision: result ids that are no scored object are ignored, and the report lists them.
    DAVIS stops with "there is an index higher than the number of objects" when a result id
    exceeds the ground truth's object count; such an id cannot change any object's masks, so
    the scores are the ones DAVIS gives once those ids are removed (SAM 2's
    sav_dataset/utils/sav_benchmark.py also ignores them).

Everything here is numpy and Pillow: `import segpipe.vos.davis` does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from segpipe.errors import BadInput

VOID = 255  # DAVIS's void label in ground-truth PNGs
BOUNDARY_FRACTION = 0.008  # f_measure's bound_th: the match radius as a fraction of the diagonal
PNG = {".png", ".PNG"}


# ----------------------------------------------------------------------------------------
# The measures on one frame's masks


def jaccard(gt: np.ndarray, result: np.ndarray, void: np.ndarray | None = None) -> float:
    """Region similarity J of two boolean masks (db_eval_iou): intersection over union of the
    non-void pixels, 1 when the union is empty."""
    gt, result = np.asarray(gt, bool), np.asarray(result, bool)
    if void is not None:
        keep = ~np.asarray(void, bool)
        gt, result = gt & keep, result & keep
    union = np.count_nonzero(gt | result)
    if union == 0:
        return 1.0
    return np.count_nonzero(gt & result) / union


def boundary_map(mask: np.ndarray) -> np.ndarray:
    """The one-pixel boundary of a mask, as DAVIS's `_seg2bmap` (after D. Martin's Berkeley
    benchmark code) draws it: a pixel is on the boundary when it differs from its right,
    lower or lower-right neighbour, pixels past the image counting as background; except
    that in the last row only the right neighbour counts, in the last column only the lower
    one, and the bottom-right pixel never. The boundary so lies half a pixel towards the
    origin from the mask's edge: a square's boundary is the outline of the square one pixel
    larger up and to the left."""
    m = np.asarray(mask, bool)
    if m.ndim != 2:
        raise ValueError(f"a mask has 2 dimensions, got shape {m.shape}")
    padded = np.zeros((m.shape[0] + 1, m.shape[1] + 1), bool)
    padded[:-1, :-1] = m
    right, below, below_right = padded[:-1, 1:], padded[1:, :-1], padded[1:, 1:]
    edge = (m != right) | (m != below) | (m != below_right)
    edge[-1, :] = m[-1, :] != right[-1, :]
    edge[:, -1] = m[:, -1] != below[:, -1]
    edge[-1, -1] = False
    return edge


def boundary_radius(shape) -> int:
    """f_measure's match radius in pixels: ceil(0.008 * the image diagonal) (8 at 480x854)."""
    h, w = int(shape[0]), int(shape[1])
    return math.ceil(BOUNDARY_FRACTION * math.sqrt(h * h + w * w))


@lru_cache(maxsize=None)
def _disk_half_widths(radius: int) -> tuple[int, ...]:
    """For each row offset dy in -r..r, the largest dx with dx^2 + dy^2 <= r^2: the rows of
    scikit-image's disk(r), which f_measure dilates with."""
    return tuple(math.isqrt(radius * radius - dy * dy) for dy in range(-radius, radius + 1))


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Binary dilation by the disk of `radius` (offsets with dx^2 + dy^2 <= r^2), nothing
    beyond the image, as cv2.dilate with skimage.morphology.disk does it in f_measure. The
    disk is a stack of horizontal runs, so the dilation is the union, over the disk's rows,
    of the mask dilated along x by that row's half width and moved by the row's offset."""
    m = np.asarray(mask, bool)
    h, w = m.shape
    halves = _disk_half_widths(radius)
    along_x = [m]  # along_x[k]: m dilated along x by k pixels each way
    for k in range(1, max(halves) + 1):
        grown = along_x[-1].copy()
        if k < w:
            grown[:, k:] |= m[:, :-k]
            grown[:, :-k] |= m[:, k:]
        along_x.append(grown)
    out = np.zeros_like(m)
    for dy, k in zip(range(-radius, radius + 1), halves):
        if abs(dy) >= h:
            continue
        src = along_x[k]
        if dy >= 0:
            out[: h - dy] |= src[dy:]  # out[y] gets src[y + dy]
        else:
            out[-dy:] |= src[: h + dy]  # out[y] gets src[y - |dy|]
    return out


def boundary_f(gt: np.ndarray, result: np.ndarray, void: np.ndarray | None = None) -> float:
    """Contour accuracy F of two boolean masks (f_measure): the F-measure of the boundary
    precision (result boundary pixels near a ground-truth boundary pixel) and recall
    (ground-truth boundary pixels near a result boundary pixel), "near" meaning within
    `boundary_radius` of the frame."""
    gt, result = np.asarray(gt, bool), np.asarray(result, bool)
    radius = boundary_radius(gt.shape)
    if void is not None:
        keep = ~np.asarray(void, bool)
        gt, result = gt & keep, result & keep
    gt_edge, res_edge = boundary_map(gt), boundary_map(result)
    n_gt, n_res = np.count_nonzero(gt_edge), np.count_nonzero(res_edge)
    if n_res == 0 and n_gt == 0:
        precision, recall = 1.0, 1.0
    elif n_res == 0:
        precision, recall = 1.0, 0.0
    elif n_gt == 0:
        precision, recall = 0.0, 1.0
    else:
        # Only a window around both boundaries matters: cut it out, `radius` wider on every
        # side (within the image), so the dilations see all they would on the whole frame.
        rows = np.flatnonzero((gt_edge | res_edge).any(axis=1))
        cols = np.flatnonzero((gt_edge | res_edge).any(axis=0))
        y0, y1 = max(rows[0] - radius, 0), rows[-1] + radius + 1
        x0, x1 = max(cols[0] - radius, 0), cols[-1] + radius + 1
        g, r = gt_edge[y0:y1, x0:x1], res_edge[y0:y1, x0:x1]
        precision = np.count_nonzero(r & dilate(g, radius)) / n_res
        recall = np.count_nonzero(g & dilate(r, radius)) / n_gt
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


# ----------------------------------------------------------------------------------------
# The report


def _mean(values) -> float:
    # np.mean of float64, as db_statistics' nanmean and evaluation_method.py's np.mean
    return float(np.mean(np.asarray(values, dtype=np.float64))) if len(values) else float("nan")


@dataclass(frozen=True)
class ObjectScore:
    id: int
    j: float  # mean J over the scored frames
    f: float  # mean F over the scored frames


class ObjectMeans:
    """J-Mean, F-Mean and J&F-Mean over `self.objects`: a video's, or (DAVIS's figures)
    all objects of all videos, not a mean of video means."""

    @property
    def j_mean(self) -> float:
        return _mean([o.j for o in self.objects])

    @property
    def f_mean(self) -> float:
        return _mean([o.f for o in self.objects])

    @property
    def jf_mean(self) -> float:
        return (self.j_mean + self.f_mean) / 2


@dataclass(frozen=True)
class VideoScore(ObjectMeans):
    name: str
    frames_scored: int
    objects: tuple[ObjectScore, ...]
    ignored_result_ids: tuple[int, ...] = ()  # result ids that are no scored object
    unscored_gt_ids: tuple[int, ...] = ()  # ground-truth ids absent from the first frame

    @property
    def num_objects(self) -> int:
        return len(self.objects)


@dataclass(frozen=True)
class Report(ObjectMeans):
    videos: tuple[VideoScore, ...]
    layout: str = "indexed"  # or "per-object"

    @property
    def objects(self) -> list[ObjectScore]:
        return [o for v in self.videos for o in v.objects]

    def to_dict(self) -> dict:
        def num(x):
            return None if math.isnan(x) else x

        return {
            "J&F-Mean": num(self.jf_mean),
            "J-Mean": num(self.j_mean),
            "F-Mean": num(self.f_mean),
            "objects": len(self.objects),
            "layout": self.layout,
            "videos": [
                {
                    "video": v.name,
                    "objects": v.num_objects,
                    "frames_scored": v.frames_scored,
                    "J&F-Mean": num(v.jf_mean),
                    "J-Mean": num(v.j_mean),
                    "F-Mean": num(v.f_mean),
                    "per_object": [{"id": o.id, "J": o.j, "F": o.f} for o in v.objects],
                    "ignored_result_ids": list(v.ignored_result_ids),
                    "unscored_gt_ids": list(v.unscored_gt_ids),
                }
                for v in self.videos
            ],
        }

    def table(self) -> str:
        """Printable text: one row per video, then the overall DAVIS figures, then notes."""

        def fmt(x):
            return "-" if math.isnan(x) else f"{x:.3f}"

        rows = [
            (v.name, str(v.num_objects), fmt(v.j_mean), fmt(v.f_mean), fmt(v.jf_mean))
            for v in self.videos
        ]
        total = (
            "all",
            str(len(self.objects)),
            fmt(self.j_mean),
            fmt(self.f_mean),
            fmt(self.jf_mean),
        )
        head = ("video", "objects", "J-Mean", "F-Mean", "J&F-Mean")
        width = max(len(r[0]) for r in [head, total, *rows])
        sizes = [width] + [len(h) for h in head[1:]]

        def line(r):
            cells = [c.rjust(s) for c, s in zip(r[1:], sizes[1:])]
            return "  ".join([r[0].ljust(sizes[0]), *cells])

        out = [line(head), *map(line, rows), "-" * len(line(head)), line(total), ""]
        n, m = len(self.objects), len(self.videos)
        out.append(
            f"DAVIS 2017 semi-supervised: first and last frames not scored; the 'all' row "
            f"is the mean over {n} object{'s' * (n != 1)} of {m} video{'s' * (m != 1)}."
        )
        for v in self.videos:
            if v.ignored_result_ids:
                out.append(
                    f"{v.name}: result id(s) {_ids(v.ignored_result_ids)} not among the "
                    f"objects of the ground truth's first frame: ignored"
                )
            if v.unscored_gt_ids:
                out.append(
                    f"{v.name}: ground-truth id(s) {_ids(v.unscored_gt_ids)} first appear "
                    f"after the first frame: not scored (DAVIS scores the first frame's "
                    f"objects)"
                )
        return "\n".join(out)


def score_masks(name: str, truth: np.ndarray, result: np.ndarray, unscored=()) -> VideoScore:
    """Each object's own masks (T, O, H, W bool) against its own ground truth, as the
    per-object layout scores them: the first and last frames and `unscored` ones left out."""
    T = len(truth)
    frames = [t for t in range(1, T - 1) if t not in unscored]
    objects = tuple(
        ObjectScore(
            o + 1,
            _mean([jaccard(truth[t, o], result[t, o]) for t in frames]),
            _mean([boundary_f(truth[t, o], result[t, o]) for t in frames]),
        )
        for o in range(truth.shape[1])
    )
    return VideoScore(name, len(frames), objects)


def _ids(ids) -> str:
    return ", ".join(map(str, ids))


# ----------------------------------------------------------------------------------------
# Reading the folders


def _png_frames(folder: Path) -> dict[int, Path]:
    """A folder's PNGs by the number in their name."""
    frames = {}
    for p in folder.iterdir():
        if not (p.is_file() and p.suffix in PNG):
            continue
        if not (p.stem.isascii() and p.stem.isdecimal()):
            raise BadInput(f"mask file {p} is not named by its frame number (e.g. 00042.png)")
        n = int(p.stem)
        if n in frames:
            raise BadInput(
                f"mask files {frames[n].name} and {p.name} in {folder} have the same number"
            )
        frames[n] = p
    return frames


def _object_folders(video: Path, what: str) -> dict[int, Path]:
    """The per-object layout's object folders of one video, by id."""
    objects = {}
    for p in video.iterdir():
        if not p.is_dir():
            continue
        if not (p.name.isascii() and p.name.isdecimal()):
            raise BadInput(f"{what} folder {p} is not named by an object id (e.g. 001)")
        oid = int(p.name)
        if oid == 0 or oid in objects:
            raise BadInput(f"{what} folder {p}: object id {oid} is 0 or given twice")
        objects[oid] = p
    return objects


def _read_mask(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as img:
            mode = img.mode
            arr = np.array(img)
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        raise BadInput(f"unreadable mask {path} ({type(e).__name__}: {e})") from None
    if arr.ndim != 2:
        raise BadInput(
            f"mask {path} is a {mode} image: masks are single-channel PNGs (indexed or grayscale)"
        )
    return arr


class _ResultFolder:
    """One result folder's PNGs, found by the ground truth frame's file name, or failing
    that by its number."""

    def __init__(self, folder: Path, video: str):
        self.folder, self.video = folder, video
        self.by_number = _png_frames(folder)

    def path(self, gt_file: Path) -> Path:
        exact = self.folder / gt_file.name
        if exact.is_file():
            return exact
        found = self.by_number.get(int(gt_file.stem))
        if found is None:
            raise BadInput(
                f"video {self.video}: no result {exact} for ground-truth frame {gt_file.name}"
            )
        return found


def _check_shape(gt: np.ndarray, res: np.ndarray, res_path: Path, gt_path: Path):
    if gt.shape != res.shape:
        raise BadInput(
            f"result {res_path} is {res.shape[1]}x{res.shape[0]}, its ground truth "
            f"{gt_path} {gt.shape[1]}x{gt.shape[0]}"
        )


def _gt_frames(folder: Path, video: str) -> list[Path]:
    frames = _png_frames(folder)
    if not frames:
        raise BadInput(f"video {video}: no ground-truth PNG frames in {folder}")
    if len(frames) < 3:
        raise BadInput(
            f"video {video} has {len(frames)} ground-truth frame(s): the "
            f"semi-supervised evaluation skips the first and the last, so it needs 3"
        )
    return [frames[n] for n in sorted(frames)]


def _evaluate_indexed(gt_video: Path, res_video: Path, name: str) -> VideoScore:
    entries = list(gt_video.iterdir())
    if not any(p.suffix in PNG for p in entries) and any(p.is_dir() for p in entries):
        raise BadInput(
            f"video {name}: {gt_video} holds folders, not PNG frames: for the "
            f"per-object layout (<video>/<object id>/<frame>.png) pass "
            f"--per-obj-png-file"
        )
    frames = _gt_frames(gt_video, name)
    results = _ResultFolder(res_video, name)
    first = _read_mask(frames[0])
    ids = [int(i) for i in np.unique(first) if i not in (0, VOID)]
    j = {i: [] for i in ids}
    f = {i: [] for i in ids}
    ignored, unscored = set(), set()
    for gt_path in frames[1:-1]:
        res_path = results.path(gt_path)
        gt, res = _read_mask(gt_path), _read_mask(res_path)
        _check_shape(gt, res, res_path, gt_path)
        void = gt == VOID
        void = void if void.any() else None
        unscored.update(int(i) for i in np.unique(gt) if i not in (0, VOID) and i not in j)
        ignored.update(int(i) for i in np.unique(res) if i != 0 and i not in j)
        for i in ids:
            g, r = gt == i, res == i
            j[i].append(jaccard(g, r, void))
            f[i].append(boundary_f(g, r, void))
    objects = tuple(ObjectScore(i, _mean(j[i]), _mean(f[i])) for i in ids)
    return VideoScore(
        name, len(frames) - 2, objects, tuple(sorted(ignored)), tuple(sorted(unscored))
    )


def _evaluate_per_object(gt_video: Path, res_video: Path, name: str) -> VideoScore:
    gt_objects = _object_folders(gt_video, "ground-truth")
    if not gt_objects:
        hint = (
            ": for the indexed layout (<video>/<frame>.png) leave out --per-obj-png-file"
            if any(p.suffix in PNG for p in gt_video.iterdir())
            else ""
        )
        raise BadInput(f"video {name}: no object folders in {gt_video}{hint}")
    res_objects = _object_folders(res_video, "result")
    per_object = {oid: _gt_frames(folder, name) for oid, folder in gt_objects.items()}
    numbers = sorted({int(p.stem) for files in per_object.values() for p in files})
    for oid, files in per_object.items():
        if len(files) != len(numbers):
            missing = sorted(set(numbers) - {int(p.stem) for p in files})
            raise BadInput(
                f"video {name}: ground-truth object folder {gt_objects[oid]} lacks "
                f"frame {missing[0]} that other objects have"
            )
    first = {oid: _read_mask(files[0]) for oid, files in per_object.items()}
    ids = sorted(oid for oid, m in first.items() if m.any())
    later = sorted(set(gt_objects) - set(ids))
    results = {oid: _ResultFolder(res_objects[oid], name) for oid in ids if oid in res_objects}
    j = {i: [] for i in ids}
    f = {i: [] for i in ids}
    unscored = set()
    for t in range(1, len(numbers) - 1):
        for oid in later:
            if oid not in unscored and _read_mask(per_object[oid][t]).any():
                unscored.add(oid)
        for oid in ids:
            gt_path = per_object[oid][t]
            gt = _read_mask(gt_path) != 0
            if oid in results:
                res_path = results[oid].path(gt_path)
                res = _read_mask(res_path)
                _check_shape(gt, res, res_path, gt_path)
                res = res != 0
            else:  # the result lacks the object: empty masks, as DAVIS pads it
                res = np.zeros_like(gt)
            j[oid].append(jaccard(gt, res))
            f[oid].append(boundary_f(gt, res))
    objects = tuple(ObjectScore(i, _mean(j[i]), _mean(f[i])) for i in ids)
    ignored = tuple(sorted(set(res_objects) - set(ids)))
    return VideoScore(name, len(numbers) - 2, objects, ignored, tuple(sorted(unscored)))


def read_video_list(path) -> list[str]:
    """Video names, one a line (blank lines skipped), as SAM 2's --video_list_file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(f"cannot read video list {path}: {e.strerror or e}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def evaluate(results_dir, gt_dir, videos=None, per_object_png: bool = False) -> Report:
    """Score `results_dir` against `gt_dir` as the DAVIS 2017 semi-supervised evaluation does
    (see the module's docstring for the layouts and the rules).

    `videos`: the names to score, default every folder of `gt_dir` (sorted). Raises
    `BadInput` with one line naming the problem (a missing folder or result frame, a size
    mismatch, an unreadable PNG, no objects to score).

    Example:
        >>> report = evaluate("results/", "DAVIS/Annotations/480p", videos=["bear", "dogs"])
        >>> report.jf_mean, report.j_mean, report.f_mean
        >>> print(report.table())
    """
    results_dir, gt_dir = Path(results_dir), Path(gt_dir)
    for what, d in (("ground-truth", gt_dir), ("results", results_dir)):
        if not d.is_dir():
            raise BadInput(f"{what} folder not found: {d}")
    if videos is None:
        videos = sorted(p.name for p in gt_dir.iterdir() if p.is_dir())
        if not videos:
            raise BadInput(f"no video folders in ground-truth folder {gt_dir}")
    else:
        videos = list(videos)
        if not videos:
            raise BadInput("the list of videos is empty")
    scores = []
    for name in videos:
        gt_video, res_video = gt_dir / name, results_dir / name
        if not gt_video.is_dir():
            raise BadInput(f"video {name}: no ground-truth folder {gt_video}")
        if not res_video.is_dir():
            raise BadInput(f"video {name}: no results folder {res_video}")
        run = _evaluate_per_object if per_object_png else _evaluate_indexed
        scores.append(run(gt_video, res_video, name))
    report = Report(tuple(scores), layout="per-object" if per_object_png else "indexed")
    if not report.objects:
        raise BadInput(
            f"no objects to score: the first ground-truth frame of every video in {gt_dir} is empty"
        )
    return report
