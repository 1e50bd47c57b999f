"""Where tracking may have gone wrong: flags per object and frame, as a reviewer would look
for them, from what the store holds (scores, areas and masks).

Each flag marks the frame where a condition starts (not every frame it lasts), comparing a
tracked frame with the tracked frame before it:

- "absent": the object score falls to zero or below (SAM 2 then draws no mask);
- "vanished": the mask empties while the score still says present;
- "area": the area is twice or half the running median of the object's last
  `MEDIAN_WINDOW` present frames (a gradual growth onto the background shows too, not
  only a jump from one frame to the next);
- "jump": the mask's centre moves more than `JUMP_BODY` body lengths (a body length is
  the square root of its mean area over the two frames) from one frame to the next;
- "iou": the mask overlaps the one before it by less than `IOU_MIN` (intersection over
  union);
- "overlap": more than `OVERLAP` of the smaller of two objects' masks is the other's (two
  objects on one target).

Areas are the store's (`object_areas`); centres and overlaps are measured on the masks
seen through a grid of at most `GRID` points a side (`measure`), so that measuring a chunk
costs little beside reading it. Thresholds are module constants, as `benchmarks/bench_flags.py`
chose them on generated clips with known failures."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from segpipe.errors import DamagedStore, StoreNotReady
from segpipe.store.masks import chunk_files, mask_batches, read_masks
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import stored_settings, tracked_ids

MEDIAN_WINDOW = 30  # present frames the running median of an area looks back over
MEDIAN_LEAST = 3  # ... of which at least this many, before an area is compared with it
AREA_RATIO = 1.8
JUMP_BODY = 1.0
IOU_MIN = 0.2
OVERLAP = 0.5
LEAST = 0.0005  # masks under this share of the frame are too small to measure shape by
GRID = 256
KINDS = ("absent", "vanished", "area", "jump", "iou", "overlap")


@dataclass(frozen=True)
class Flag:
    """One flag: `object` (its id), `frame`, `kind` (one of `KINDS`) and `reason`, a
    line that says what was seen."""

    object: int
    frame: int
    kind: str
    reason: str

    def as_dict(self) -> dict:
        return {
            "object": self.object,
            "frame": self.frame,
            "kind": self.kind,
            "reason": self.reason,
        }


@dataclass
class Measures:
    """Per frame and object slot: `centres` (x, y in pixels; NaN where empty), `iou` with
    the frame before (NaN where either is empty), `overlap` (the largest share of the
    smaller mask that another object's mask covers; 0 alone)."""

    centres: np.ndarray  # (n, O, 2) float32
    iou: np.ndarray  # (n, O) float32
    overlap: np.ndarray  # (n, O) float32

    @classmethod
    def empty(cls, n: int, objects: int) -> "Measures":
        return cls(
            np.full((n, objects, 2), np.nan, np.float32),
            np.full((n, objects), np.nan, np.float32),
            np.zeros((n, objects), np.float32),
        )

    @classmethod
    def joined(cls, parts: list["Measures"]) -> "Measures":
        return cls(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("centres", "iou", "overlap"))
        )


def stride(height: int, width: int) -> int:
    return max(1, -(-max(height, width) // GRID))


def measure(masks: np.ndarray, before: np.ndarray | None) -> tuple[Measures, np.ndarray]:
    """The measures of (n, O, H, W) masks seen through the grid, and the last frame's masks
    on it (for the next call's `before`, the frame before these: None at the video's start)."""
    n, O, H, W = masks.shape
    s = stride(H, W)
    small = masks[:, :, ::s, ::s]
    out = Measures.empty(n, O)
    ys, xs = np.mgrid[0:H:s, 0:W:s].astype(np.float32)
    for t in range(n):
        frame = small[t]
        counts = frame.reshape(O, -1).sum(1)
        for o in np.nonzero(counts)[0]:
            m = frame[o]
            out.centres[t, o] = xs[m].mean(), ys[m].mean()
        prev = small[t - 1] if t else before
        if prev is not None:
            inter = (prev & frame).reshape(O, -1).sum(1)
            union = (prev | frame).reshape(O, -1).sum(1)
            both = (counts > 0) & (prev.reshape(O, -1).sum(1) > 0)
            out.iou[t, both] = inter[both] / union[both]
        present = np.nonzero(counts)[0]
        for i, a in enumerate(present):
            for b in present[i + 1 :]:
                share = (frame[a] & frame[b]).sum() / min(counts[a], counts[b])
                out.overlap[t, a] = max(out.overlap[t, a], share)
                out.overlap[t, b] = max(out.overlap[t, b], share)
    return out, small[-1]


def measure_chunk(store: RunStore, k: int) -> Measures:
    """Chunk k's measures, from its masks (read in bounded batches) and the last frame of
    the chunk before; frames not written yet measure empty."""
    plan, arr = store.plan, store.array("masks")
    lo, hi = plan.bounds(k)
    O, (H, W) = arr.shape[1], arr.shape[2:]
    slots = list(range(O))
    before = None
    if lo > 0:
        try:
            s = stride(H, W)
            before = read_masks(store, lo - 1, lo, slots, packed=False)[0][:, ::s, ::s]
        except DamagedStore:  # the chunk before is not written yet
            before = None
    parts = []
    try:
        for _, masks in mask_batches(store, lo, hi, slots):
            got, before = measure(masks, before)
            parts.append(got)
    except DamagedStore:  # not written yet (a tracking under way)
        return Measures.empty(hi - lo, O)
    return Measures.joined(parts)


def detect(scores, areas, measures: Measures, ids: list[int], frame_pixels: int) -> list[Flag]:
    """The flags of objects `ids` (slots in order) from (T, O) scores (NaN: untracked) and
    areas, and their `measures` (frames not measured: NaN centres and IoUs, no overlap)."""
    flags = []
    least = LEAST * frame_pixels
    for o, obj in enumerate(ids):
        flags += _object_flags(scores[:, o], areas[:, o], measures, o, obj, least)
    return sorted(flags, key=lambda f: (f.frame, f.object))  # (stable: kinds in order)


def _object_flags(score, area, m: Measures, o: int, obj: int, least: float) -> list[Flag]:
    """One object's flags, at the frames where a condition starts (frames with a tracked
    frame before them), reasons in `KINDS` order within a frame."""
    s, a = score.astype(np.float64), area.astype(np.float64)
    s0, a0 = np.r_[np.nan, s[:-1]], np.r_[0.0, a[:-1]]
    valid = ~np.isnan(s) & ~np.isnan(s0)
    c, c0 = m.centres[:, o].astype(np.float64), np.r_[[[np.nan, np.nan]], m.centres[:-1, o]]
    iou, overlap = m.iou[:, o], m.overlap[:, o]
    median = _running_medians(a, valid & (s > 0) & (a > 0))
    shaped = valid & (np.minimum(a, a0) >= least) & ~np.isnan(c).any(1) & ~np.isnan(c0).any(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        moved = np.hypot(*(c - c0).T) / np.sqrt((a + a0) / 2)
        holds = {
            "absent": valid & (s <= 0) & (s0 > 0),
            "vanished": valid & (s > 0) & (a == 0) & (a0 > 0),
            "area": valid
            & (a >= least)
            & ~np.isnan(median)
            & ((a >= AREA_RATIO * median) | (a <= median / AREA_RATIO)),
            "jump": shaped & (moved > JUMP_BODY),
            "iou": shaped & ~np.isnan(iou) & (iou < IOU_MIN),
            "overlap": valid & (a >= least) & (overlap > OVERLAP),
        }
    reasons = {
        "absent": lambda t: f"its score fell to {score[t]:.2f}",
        "vanished": lambda t: f"its mask emptied with its score at {score[t]:.2f}",
        "area": lambda t: f"its area is {a[t] / median[t]:.1f}x its running median ({a[t]:.0f} px)",
        "jump": lambda t: f"its centre moved {moved[t]:.1f} body lengths",
        "iou": lambda t: f"its mask overlaps the frame before's by {iou[t]:.2f} (IoU)",
        "overlap": lambda t: f"{overlap[t]:.0%} of it is another object's",
    }
    found = []
    for n, kind in enumerate(KINDS):
        cond = holds[kind]
        starts = cond & ~np.r_[False, cond[:-1]]
        found += [
            (int(t), n, Flag(obj, int(t), kind, reasons[kind](t))) for t in np.flatnonzero(starts)
        ]
    return [f for _, _, f in sorted(found, key=lambda x: x[:2])]


def _running_medians(area: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per frame, the median area of the last `MEDIAN_WINDOW` present frames before it (NaN
    with fewer than `MEDIAN_LEAST` of them)."""
    frames = np.flatnonzero(present)
    values = area[frames]
    medians = np.full(len(frames) + 1, np.nan)  # [k]: over the k-th present frame's window
    for k in range(MEDIAN_LEAST, min(MEDIAN_WINDOW, len(frames)) + 1):
        medians[k] = np.median(values[:k])
    if len(frames) >= MEDIAN_WINDOW:
        windows = np.lib.stride_tricks.sliding_window_view(values, MEDIAN_WINDOW)
        medians[MEDIAN_WINDOW:] = np.median(windows, axis=1)
    before = np.searchsorted(frames, np.arange(len(area)), side="left")
    return medians[before]


def written(store: RunStore, name: str, missing) -> np.ndarray | None:
    """The array, chunk by chunk, with `missing` where a chunk is not written yet (a
    tracking under way has not reached it); None where there is no such array (any more)."""
    plan, arr = store.plan, store.array(name)
    if arr is None:
        return None
    out = np.full(arr.shape, missing, arr.dtype)
    for k in range(plan.num_chunks):
        lo, hi = plan.bounds(k)
        try:
            out[lo:hi] = store.read(name, lo, hi)
        except DamagedStore:  # some objects' zarr chunks: groups of objects write apart
            for o in range(arr.shape[1]):
                try:
                    out[lo:hi, o] = store.read(name, lo, hi, cols=slice(o, o + 1))[:, 0]
                except DamagedStore:
                    pass
    return out


class ChunkMeasures:
    """Each chunk's measures, kept while its masks (and the chunk before's) stay as they
    were: a chunk's are measured again once a pass rewrites it. `measured` gives what is
    measured so far; `measure_rest` measures the rest (the studio does it in the
    background, chunk by chunk as they commit)."""

    def __init__(self):
        self.kept: dict[int, tuple] = {}  # chunk -> (key, Measures)

    @staticmethod
    def keys(store: RunStore) -> list:
        """Per chunk, what its measures depend on: its mask files and the chunk before's,
        with their modification times (None: its masks are not written). Each chunk's
        folder is listed once."""
        listed = [chunk_files(store, k) or None for k in range(store.plan.num_chunks)]
        return [
            None if listed[k] is None else (listed[k - 1] if k else None, listed[k])
            for k in range(len(listed))
        ]

    def stale(self, store: RunStore, keys: list | None = None) -> list[int]:
        """The chunks whose masks are written and not measured as they are now."""
        keys = self.keys(store) if keys is None else keys
        return [
            k
            for k, key in enumerate(keys)
            if key is not None and self.kept.get(k, (None,))[0] != key
        ]

    def measure_rest(self, store: RunStore, pause: float = 0.0) -> None:
        """Measure the stale chunks (`pause` seconds between two: a server's requests go
        first)."""
        keys = self.keys(store)
        for k in self.stale(store, keys):
            self.kept[k] = (keys[k], measure_chunk(store, k))
            time.sleep(pause)

    def measured(self, store: RunStore, keys: list | None = None) -> Measures:
        """Every frame's measures: those of chunks not measured (or changed since) empty."""
        keys = self.keys(store) if keys is None else keys
        masks = store.array("masks")
        plan, O = store.plan, 0 if masks is None else masks.shape[1]
        parts = []
        for k in range(plan.num_chunks):
            lo, hi = plan.bounds(k)
            key, got = self.kept.get(k, (None, None))
            fits = got is not None and got.iou.shape == (hi - lo, O) and key == keys[k]
            parts.append(got if fits else Measures.empty(hi - lo, O))
        return Measures.joined(parts)


def of_store(store: RunStore, measures: Measures | None = None) -> list[Flag]:
    """The flags of a tracked store (every chunk's masks read once, unless `measures` are
    given); none before anything is tracked."""
    if store.attrs.get("frame_count") is None:
        raise StoreNotReady(
            f"store {store.path} is not fully decoded yet (run `segpipe run` again to finish)"
        )
    settings = stored_settings(store)
    scores = written(store, "object_scores", np.nan) if settings is not None else None
    areas = written(store, "object_areas", 0) if scores is not None else None
    if settings is None or scores is None or areas is None or store.array("masks") is None:
        return []
    if measures is None:
        cache = ChunkMeasures()
        cache.measure_rest(store)
        measures = cache.measured(store)
    video = store.attrs["video"]
    return detect(
        scores, areas, measures, tracked_ids(store, settings), video["width"] * video["height"]
    )
