"""Tracked results with known failures, to measure segpipe's flags against (`segpipe.flags`;
tests/test_flags.py and benchmarks/bench_flags.py).

The ground truth is `make_sample.make_clip`'s three shapes moving over a long clip; the
"tracked" masks follow it with a pixel of noise on their outline, until a failure of a
known kind starts on a known frame (or never, on a clean clip):

- "swap": object 1's mask jumps onto object 2 and follows it;
- "drift": object 1's mask grows onto the background a pixel a frame (a slow leak);
- "disappear": object 1 is lost: its score falls below zero and its mask empties.

`broke` is where the ground truth says the tracking broke: the first frame whose tracked
mask overlaps the truth by less than half (IoU), or is empty where the object is there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from make_sample import make_clip

from segpipe import flags

KINDS = ("swap", "drift", "disappear")


@dataclass
class Tracked:
    truth: np.ndarray  # (T, O, H, W) bool
    masks: np.ndarray  # (T, O, H, W) bool: the tracked masks
    scores: np.ndarray  # (T, O) float32
    broke: int | None  # the frame where object 1's tracking broke (None: a clean clip)


def grow(mask: np.ndarray, px: int = 1) -> np.ndarray:
    """`mask` dilated by `px` pixels (4-neighbourhood)."""
    out = mask.copy()
    for _ in range(px):
        m = out.copy()
        m[1:] |= out[:-1]
        m[:-1] |= out[1:]
        m[:, 1:] |= out[:, :-1]
        m[:, :-1] |= out[:, 1:]
        out = m
    return out


def shrink(mask: np.ndarray) -> np.ndarray:
    return ~grow(~mask)


def tracked(
    kind: str | None, frames: int = 300, at: int = 120, seed: int = 0, size=(160, 120)
) -> Tracked:
    """A clip of `frames` frames at `size` (width, height), tracked cleanly, or with a failure
    of `kind` starting at frame `at`."""
    rng = np.random.default_rng(seed)
    _, truth = make_clip(num_frames=frames, width=size[0], height=size[1], seed=seed)
    masks = np.empty_like(truth)
    for t in range(frames):  # the outline off by a pixel here and there, as trackers are
        for o in range(truth.shape[1]):
            noise = rng.integers(0, 3)
            m = truth[t, o]
            masks[t, o] = grow(m) if noise == 1 else shrink(m) if noise == 2 else m
    scores = (8 + rng.normal(0, 1, truth.shape[:2])).astype(np.float32)
    if kind == "swap":
        masks[at:, 0] = masks[at:, 1]
    elif kind == "drift":
        for t in range(at, frames):
            masks[t, 0] = grow(truth[t, 0], 1 + (t - at) // 2)
    elif kind == "disappear":
        masks[at:, 0] = False
        scores[at:, 0] = -3.0
    elif kind is not None:
        raise ValueError(kind)
    return Tracked(truth, masks, scores, None if kind is None else broke(truth[:, 0], masks[:, 0]))


def broke(truth: np.ndarray, masks: np.ndarray) -> int | None:
    """The first frame whose mask overlaps the truth by less than half."""
    for t in range(len(truth)):
        inter, union = (truth[t] & masks[t]).sum(), (truth[t] | masks[t]).sum()
        if union and inter / union < 0.5:
            return t
    return None


WITHIN = 3  # frames: a flag this near a break found it


def flagged(clip: Tracked) -> list:
    """The flags of a generated clip, as the store's would be: its areas and measures."""
    T, O, H, W = clip.masks.shape
    measures, _ = flags.measure(clip.masks, None)
    areas = clip.masks.reshape(T, O, -1).sum(-1)
    return flags.detect(clip.scores, areas, measures, [1, 2, 3], H * W)


def found(clip: Tracked, got: list) -> int | None:
    """The offset of the failed object's flag nearest its break (None: none within)."""
    near = [
        f.frame - clip.broke for f in got if f.object == 1 and abs(f.frame - clip.broke) <= WITHIN
    ]
    return min(near, key=abs) if near else None
