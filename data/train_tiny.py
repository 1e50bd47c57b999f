#!/usr/bin/env python3
"""Train segpipe's demo model (`--model segpipe_tiny`) on synthetic clips, on the CPU or a GPU.

SAM 2's own modules do the forward pass, as SAM 2's training does it: the image encoder over
the clip's frames, then per frame `_track_step` (memory attention over the memories of
earlier frames, the SAM heads) and `_encode_memory_in_output`; frame 0 is prompted with
masks, boxes or clicks, the others are tracked. A step's clips (`--batch N`) go through
together (`step_loss`): their frames are one batch of the image encoder, their objects one
batch of each frame's `_track_step` (SAM 2 tracks each object alone, so a batch of objects
from several clips is each clip's tracking; frame 0's go in one call per kind of prompt),
and the loss is the mean of the clips' own (`tests/test_train.py` checks it, and its
gradients, against each clip's step alone). The clips and every random draw of their step
(prompts, picked frames) are drawn ahead by DataLoader worker processes (`--workers`;
`draw`, `batches`), from clip k's own seed: whatever the count, clip k is clip k. Losses are
SAM 2's: focal (x20) + dice on the best of the multimask outputs, L1 between the predicted
and the real IoU of that mask, and binary cross-entropy on the object score; masks are only
supervised where the object is visible. Departures from SAM 2's recipe, each measured on
short runs: the focal loss weighs positives 0.75 (`frame_losses`), memory attention starts
out local (`look_where_it_was`; `--locality` loosens it, `--speed` makes the clips' motion
faster), the learning rate is 3e-4 (1e-3 and 3e-3 learned slower); and, unmeasured, clicks
sit at pixel centres (SAM 2's prompt encoder adds its own half pixel). The IoU head learns
the chosen mask's IoU only unless `--all-iou` (SAM 2.1's config supervises all three).

`--prompt-frames N` adds SAM's image-level task (`prompt_losses`): on N frames of each clip
every visible object is prompted alone by a box, a click, and a click with an outside one,
through SAM 2's path for a first prompt, with the same losses (`--prompt-only`: that task
alone). Without it the decoder barely learned boxes and clicks (frame 0 of a quarter of the
clips each); the shipped weights add two runs of it to the first one (docs/demo-model.md).

Reproducible: clip k is `data/synthetic.py`'s seed k, the weights start from torch seed 0,
and CPU arithmetic repeats bit for bit at a fixed thread count (`--threads`, 1 by default;
two 30-step runs gave identical weights). The shipped `pipeline/weights/segpipe_tiny.pt`
(package data: `segpipe/weights/` in an installed segpipe) holds the tensors of three runs:
the default arguments, then the two in docs/demo-model.md (the last saved under another name
and copied, so the file's bytes, and the sha256 stores record, differ from a rerun's). They
ran in the loop of one clip at a time, before the batched step. On the same clip, a step now
gives that loop's loss bit for bit and its gradients within 6e-8 (checked once, on six
clips); over thousands of steps such differences grow, so a rerun would not give the
shipped tensors. The
run's full state (weights, optimiser, schedule, step, torch's random state, the
time spent) is saved beside this script, to `data/<out's stem>.state.pt`, every `--log-every`
steps; run the same command again after a kill, or in a later sitting, and it continues from
there, with the same result as a run never stopped (on the CPU, bit for bit; CUDA's
kernels need not repeat). `--out` is written when a sitting ends (the run's end,
`--stop-after`, `--minutes`), with the steps and hours of every run that led to it
(`--init` continues from earlier weights on clips they never saw).

On a GPU (`--device cuda`) the forward pass runs under bfloat16 autocast, as SAM 2 trains
(`--precision`; the weights, the optimiser and the losses stay float32), `--batch N` takes N
clips a step, and `--minutes M` ends a sitting in time (a lent GPU is lent for minutes):
the weights are written as float32 CPU tensors, so they load on any machine, and the same
command continues the run. `benchmarks/bench_train.py` measures clips a second.

    python data/train_tiny.py --out data/first.pt      # the first of the shipped runs
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import make_clip  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "pipeline" / "configs" / "segpipe_tiny.yaml"
WEIGHTS = (
    HERE.parent / "pipeline" / "weights" / "segpipe_tiny.pt"
)  # segpipe.models.sam2.catalog.SHIPPED's
SIZE = 128  # the image size it trains at (the shipped weights record it)
SPEED = (0.5, 1.5)  # the range of the clips' motion scale (`--speed`)
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@dataclass(frozen=True)
class Losses:
    """How the losses are weighed. `alpha`: the focal loss's weight of positives: SAM 2 uses
    0.25 (its masks are large); on these small objects 0.25 trains every mask to empty first,
    while 0.75 does not. `all_iou`: the IoU head learns every mask's IoU (SAM 2.1's
    `supervise_all_iou`), not only the chosen one's: while tracking (multimask), the mask it
    rates best is the one carried on."""

    alpha: float = 0.75
    all_iou: bool = False


def build(seed: int, size: int = SIZE):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    torch.manual_seed(seed)
    config = OmegaConf.load(CONFIG).model
    config.image_size = size
    return instantiate(config, _recursive_=True)


# The bias entries that queries and keys share in `look_where_it_was`: the first element of
# RoPE's pairs 0, 1 (x) and 16, 17 (y), its fastest frequencies.
SHARED_BIAS = [0, 2, 32, 34]


def look_where_it_was(model, strength: float = 100.0) -> None:
    """Start memory attention looking at the same place in the memory frames. Its cross-
    attention applies RoPE to queries and keys, so a vector that queries and keys share scores
    a memory token by the cosine of its offset: put into their biases on the fastest x and y
    frequencies (pairs 0, 1 and 16, 17 of the 64 dims), it makes attention local from the start,
    and a frame first sees where the object was. From random attention, which sees every place
    alike, the model first learns to segment every object at once and is slow to leave that."""
    with torch.no_grad():
        for layer in model.memory_attention.layers:
            layer.cross_attn_image.q_proj.bias.zero_()
            layer.cross_attn_image.k_proj.bias.zero_()
    set_locality(model, strength)


def set_locality(model, strength: float) -> None:
    """Set how strongly memory attention keeps looking where the object was: each of the four
    shared entries of `look_where_it_was` in the q and k biases to sqrt(strength) (the
    biases' other, learned entries are kept). At 100, where a fresh run starts, a memory token
    one step off scores 7.7 logits below the one in place, and trained from there attention
    stayed in place: the shipped weights' entries moved from 10.0 to 9.9, and 98.7% of
    their memory attention lands on the query's own position (docs/demo-model.md; about 42%
    after 5,000 steps from them with `--locality 10`)."""
    with torch.no_grad():
        for layer in model.memory_attention.layers:
            attention = layer.cross_attn_image
            for proj in (attention.q_proj, attention.k_proj):
                proj.bias[SHARED_BIAS] = strength**0.5


def normalised(frames: torch.Tensor) -> torch.Tensor:
    """Frames (uint8, or in [0, 1]) as SAM 2's image encoder takes them (ImageNet mean and std)."""
    if frames.dtype == torch.uint8:
        frames = frames.float() / 255
    return (frames - MEAN.to(frames.device)) / STD.to(frames.device)


def frame0_inputs(rng, masks0: np.ndarray):
    """Frame 0's prompts for all objects, one kind per clip: masks (half the clips), boxes or
    clicks (a positive one, with a negative one outside in half of those), as SAM 2's
    predictor passes them (coordinates in model-input pixels). Returns (points, mask)."""
    kind = rng.choice(["mask", "box", "points"], p=[0.5, 0.25, 0.25])
    if kind == "mask":
        return None, torch.from_numpy(masks0[:, None]).float()
    coords, labels = [], []
    negative = rng.random() < 0.5
    for m in masks0:
        ys, xs = np.nonzero(m)
        if kind == "box":
            box = np.array([xs.min(), ys.min(), xs.max(), ys.max()], np.float32) + rng.normal(
                0, 2, 4
            )
            coords.append(box.reshape(2, 2))
            labels.append([2, 3])
            continue
        i = rng.integers(len(xs))
        pts, lab = [[xs[i] + 0.5, ys[i] + 0.5]], [1]
        if negative:
            oy, ox = np.nonzero(~m)
            j = rng.integers(len(ox))
            pts.append([ox[j] + 0.5, oy[j] + 0.5])
            lab.append(0)
        coords.append(np.array(pts, np.float32))
        labels.append(lab)
    return {
        "point_coords": torch.from_numpy(np.stack(coords)).float(),
        "point_labels": torch.tensor(labels, dtype=torch.int32),
    }, None


def prompt_kinds(rng, masks_t: np.ndarray) -> list[dict]:
    """One frame's prompts for every object, in the three kinds users give: a box (its corners
    a little off), a click inside, and a click inside with one outside. Each is a batch of
    point inputs (O, P, 2) for `_track_step`, coordinates in model-input pixels."""
    boxes, one, two = [], [], []
    for m in masks_t:
        ys, xs = np.nonzero(m)
        box = np.array([xs.min(), ys.min(), xs.max(), ys.max()], np.float32)
        boxes.append((box + rng.normal(0, 1.5, 4)).reshape(2, 2))
        i = rng.integers(len(xs))
        one.append([[xs[i] + 0.5, ys[i] + 0.5]])
        oy, ox = np.nonzero(~m)
        j = rng.integers(len(ox))
        two.append([[xs[i] + 0.5, ys[i] + 0.5], [ox[j] + 0.5, oy[j] + 0.5]])
    O = len(masks_t)
    return [
        {
            "point_coords": torch.from_numpy(np.stack(boxes)),
            "point_labels": torch.tensor([[2, 3]] * O, dtype=torch.int32),
        },
        {
            "point_coords": torch.tensor(np.array(one), dtype=torch.float32),
            "point_labels": torch.ones(O, 1, dtype=torch.int32),
        },
        {
            "point_coords": torch.tensor(np.array(two), dtype=torch.float32),
            "point_labels": torch.tensor([[1, 0]] * O, dtype=torch.int32),
        },
    ]


class Drawn(NamedTuple):
    """One training clip and every random draw its step makes, drawn ahead (in a DataLoader
    worker) from clip k's seeded stream, in the order the per-clip loop drew them: frames
    (T, 3, H, W) uint8 (a quarter of float's bytes between processes), masks (T, O, H, W),
    frame 0's prompts (`frame0_inputs`; None under --prompt-only), and for SAM's image-level
    task the picked frames' prompts: one (frame, the indices of the objects seen there,
    `prompt_kinds`) a picked frame where any is seen. (Indices, not a boolean mask, and
    counts read off shapes: on a GPU the step never waits to learn a size.)"""

    frames: torch.Tensor
    masks: torch.Tensor
    first: tuple | None
    prompted: list


def draw(k: int, frames: int, size: int, speed, prompt_frames: int, prompt_only: bool):
    """Clip k drawn for a step (None: no object seen on its frame 0)."""
    clip = training_clip(k, frames, size, speed)
    if clip is None:
        return None
    x, masks, rng = clip
    first = None if prompt_only else frame0_inputs(rng, masks[0].numpy())
    prompted = []
    if prompt_frames:
        for t in rng.choice(frames, size=min(prompt_frames, frames), replace=False):
            seen = torch.nonzero(masks[t].flatten(1).sum(1) >= 4).flatten()
            if len(seen):
                prompted.append((int(t), seen, prompt_kinds(rng, masks[t][seen].numpy())))
    return Drawn((x * 255).round().to(torch.uint8), masks, first, prompted)


class Clips(torch.utils.data.Dataset):
    """Clip k of the run, drawn (`draw`)."""

    def __init__(self, **drawing):
        self.drawing = drawing

    def __len__(self):
        return 2**62

    def __getitem__(self, k: int):
        return draw(k, **self.drawing)


def as_drawn(item):  # (the DataLoader's collate: a clip as it is)
    return item


def batches(first: int, batch: int, steps: range, workers: int, pin: bool, **drawing):
    """Each of `steps`'s clips (step s: clips first + s * batch .. + batch - 1 of the run),
    drawn ahead by `workers` DataLoader processes, a clip each in turn (so a step's clips are
    drawn side by side), at least two steps ahead; pinned for the GPU with `pin`. The run's
    random state is untouched: the loader's seed comes from its own generator."""
    loader = torch.utils.data.DataLoader(
        Clips(**drawing),
        batch_size=None,
        sampler=range(first + steps.start * batch, first + steps.stop * batch),
        collate_fn=as_drawn,
        generator=torch.Generator(),
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=max(2, -(-2 * batch // workers)) if workers else None,
        persistent_workers=False,
    )
    clips = iter(loader)
    for _ in steps:
        yield [next(clips) for _ in range(batch)]


def to(value, device):
    """Tensors (in dicts, tuples and lists) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        moved = [to(v, device) for v in value]
        return type(value)(*moved) if hasattr(value, "_fields") else type(value)(moved)
    return value


def step_loss(model, drawn: list, losses: Losses = Losses()):
    """The mean over a step's clips (a clip None, with no object seen, counts 0) of each
    clip's SAM 2 losses: tracking its objects from frame 0's prompts (the per-frame mean) plus,
    where drawn, SAM's image-level task (its mean over frames and prompt kinds). All the clips
    go through the networks together: their frames through the image encoder as one batch,
    their objects through each frame's `_track_step` as one batch of objects (SAM 2 tracks
    each object alone: its memories are its own). Returns (loss or None, each clip's parts).
    A training model only: in eval SAM 2's memory encoder makes the batch's masks not overlap,
    which would mix the clips' objects."""
    assert model.training, "step_loss batches clips as a training model may"
    clips = [d for d in drawn if d is not None]
    totals = [0.0] * len(clips)
    parts = [{} for _ in clips]
    tracked = [i for i, d in enumerate(clips) if d.first is not None]
    if tracked:
        for i, (loss, p) in zip(tracked, track_losses(model, [clips[i] for i in tracked], losses)):
            totals[i], parts[i] = totals[i] + loss, p
    prompted = [i for i, d in enumerate(clips) if d.prompted]
    if prompted:
        for i, (loss, iou) in zip(
            prompted, prompt_losses(model, [clips[i] for i in prompted], losses)
        ):
            totals[i], parts[i]["prompted_iou"] = totals[i] + loss, iou
    counted = [t for i, t in enumerate(totals) if i in tracked or i in prompted]
    if not counted:
        return None, []
    return sum(counted) / len(drawn), [
        p for i, p in enumerate(parts) if i in tracked or i in prompted
    ]


def train_step(model, opt, drawn: list, autocast, losses: Losses = Losses()) -> list:
    """One optimiser step on a step's clips (on the model's device): the mean of their losses
    (`step_loss`, under `autocast`), backward, gradients clipped to norm 1, AdamW's step (none
    where no clip had an object seen). Returns the clips' parts, for the log."""
    opt.zero_grad(set_to_none=True)
    with autocast:
        loss, parts = step_loss(model, drawn, losses)
    if loss is None:
        return []
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return parts


def objects_at(feats, pos, frame_of):
    """The features of each object's frame: `frame_of` (N,) indexes the encoded frames."""
    return [f[:, frame_of] for f in feats], [p[:, frame_of] for p in pos]


def track_losses(model, clips: list, losses: Losses) -> list:
    """Each clip's tracking loss and parts: its objects tracked from frame 0's prompts,
    SAM 2's losses summed over frames, over T. On frame 0 the objects go in one
    `_track_step` per prompt kind (a batch needs one kind and one point count), then on."""
    T = clips[0].frames.shape[0]
    backbone = model.forward_image(normalised(torch.cat([c.frames for c in clips])))
    _, feats, pos, sizes = model._prepare_backbone_features(backbone)
    counts = [c.masks.shape[1] for c in clips]
    owner = torch.repeat_interleave(torch.arange(len(clips)), torch.tensor(counts))
    ends = np.cumsum([0, *counts])
    own = [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]
    output = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
    loss = [0.0] * len(clips)
    totals = [dict.fromkeys(("tracked_iou", "focal", "dice", "iou", "score"), 0.0) for _ in clips]
    device = clips[0].frames.device
    for t in range(T):
        cur, cur_pos = objects_at(feats, pos, (owner * T + t).to(device))
        if t == 0:
            out, answers, (high_best, score_logits, points) = first_frame(
                model, clips, own, cur, cur_pos, sizes, T
            )
        else:
            out, sam, _, _ = model._track_step(
                t, False, cur, cur_pos, sizes, None, None, output, T, False, None
            )
            _, high_multi, ious, _, high_best, obj_ptr, score_logits = sam
            out["pred_masks_high_res"], out["obj_ptr"], points = high_best, obj_ptr, None
            answers = [(high_multi[o], ious[o], score_logits[o]) for o in own]
        model._encode_memory_in_output(cur, sizes, points, True, high_best, score_logits, out)
        output["cond_frame_outputs" if t == 0 else "non_cond_frame_outputs"][t] = out
        for b, (high_multi, ious, score_logits) in enumerate(answers):
            parts = frame_losses(high_multi, ious, score_logits, clips[b].masks[t].float(), losses)
            for k, v in parts.items():  # (summed where they are: read once, when logged)
                if t > 0 or k != "tracked_iou":
                    totals[b][k] = totals[b][k] + v.detach()
            loss[b] = loss[b] + 20 * parts["focal"] + parts["dice"] + parts["iou"] + parts["score"]
    return [
        (loss[b] / T, {k: v / (T - 1 if k == "tracked_iou" else T) for k, v in totals[b].items()})
        for b in range(len(clips))
    ]


def first_frame(model, clips, own, cur, cur_pos, sizes, T):
    """Frame 0, every object prompted as its clip's prompts say: one `_track_step` per kind
    of prompt (masks; points by their count: boxes and two clicks are two, a click one),
    the outputs put back in the objects' order. Returns (the frame's output, each clip's
    (multimask logits, their IoUs, object score logits))."""
    groups = {}
    for b, (points, mask) in enumerate(c.first for c in clips):
        key = "mask" if mask is not None else points["point_coords"].shape[1]
        groups.setdefault(key, []).append(b)
    answers, best, ptrs, scores, order = [None] * len(clips), [], [], [], []
    points_any = None
    for key, members in groups.items():
        index = torch.cat([torch.arange(own[b].start, own[b].stop) for b in members])
        firsts = [clips[b].first for b in members]
        if key == "mask":
            points, mask = None, torch.cat([m for _, m in firsts])
        else:
            points = {k: torch.cat([p[k] for p, _ in firsts]) for k in firsts[0][0]}
            mask, points_any = None, points
        device = cur[0].device
        _, sam, _, _ = model._track_step(
            0,
            True,
            [f[:, index.to(device)] for f in cur],
            [p[:, index.to(device)] for p in cur_pos],
            sizes,
            points,
            mask,
            {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}},
            T,
            False,
            None,
        )
        _, high_multi, ious, _, high_best, obj_ptr, score_logits = sam
        at = 0
        for b in members:
            n = own[b].stop - own[b].start
            answers[b] = (high_multi[at : at + n], ious[at : at + n], score_logits[at : at + n])
            at += n
        best.append(high_best), ptrs.append(obj_ptr), scores.append(score_logits)
        order.append(index)
    back = torch.argsort(torch.cat(order)).to(cur[0].device)  # the objects' own order again
    high_best = torch.cat(best)[back]
    out = {"point_inputs": None, "mask_inputs": None, "pred_masks_high_res": high_best,
           "obj_ptr": torch.cat(ptrs)[back]}  # fmt: skip
    # (a training model's memory encoder takes masks from points as it takes the others)
    return out, answers, (high_best, torch.cat(scores)[back], points_any)


def prompt_losses(model, clips: list, losses: Losses) -> list:
    """SAM's image-level task for each clip: on its picked frames every visible object
    prompted alone by a box, a click, and a click with an outside one, through SAM 2's own
    path for a first prompt (`_track_step` on an initial conditioning frame, no memory).
    Every clip's picked frames go through the image encoder together, and each kind of
    prompt through one `_track_step` for all of them. Returns each clip's (mean loss, mean
    IoU of the chosen masks)."""
    frames = torch.cat([c.frames[[t for t, _, _ in c.prompted]] for c in clips])
    backbone = model.forward_image(normalised(frames))
    _, feats, pos, sizes = model._prepare_backbone_features(backbone)
    entries = [
        (b, i, seen) for b, c in enumerate(clips) for i, (_, seen, _) in enumerate(c.prompted)
    ]
    first_of = np.cumsum([0] + [len(c.prompted) for c in clips])
    frame_of = torch.cat(
        [torch.full((len(seen),), int(first_of[b]) + i) for b, i, seen in entries]
    ).to(frames.device)
    cur, cur_pos = objects_at(feats, pos, frame_of)
    loss, ious, n = [0.0] * len(clips), [0.0] * len(clips), [0] * len(clips)
    for kind in range(3):  # box, click, click and an outside one
        points = {
            key: torch.cat([clips[b].prompted[i][2][kind][key] for b, i, _ in entries])
            for key in ("point_coords", "point_labels")
        }
        _, sam, _, _ = model._track_step(
            0,
            True,
            cur,
            cur_pos,
            sizes,
            points,
            None,
            {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}},
            1,
            False,
            None,
        )
        _, high_multi, pred_ious, _, _, _, score_logits = sam
        at = 0
        for b, i, seen in entries:
            target = clips[b].masks[clips[b].prompted[i][0]][seen]
            sl = slice(at, at + len(target))
            at += len(target)
            parts = frame_losses(
                high_multi[sl], pred_ious[sl], score_logits[sl], target.float(), losses
            )
            loss[b] = loss[b] + 20 * parts["focal"] + parts["dice"] + parts["iou"] + parts["score"]
            ious[b], n[b] = ious[b] + parts["tracked_iou"].detach(), n[b] + 1
    return [(loss[b] / n[b], ious[b] / n[b]) for b in range(len(clips))]


def frame_losses(logits, ious, score_logits, target, losses: Losses = Losses()):
    """SAM 2's MultiStepMultiMasksAndIous for one frame: logits (O, M, H, W), ious (O, M),
    score_logits (O, 1), target (O, H, W), weighed as `losses` says."""
    alpha = losses.alpha
    logits, ious, score_logits = logits.float(), ious.float(), score_logits.float()
    O, M = logits.shape[:2]
    present = target.flatten(1).any(1).float()  # (O,)
    tgt = target[:, None].expand(-1, M, -1, -1)
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, tgt, reduction="none")
    p_t = prob * tgt + (1 - prob) * (1 - tgt)
    focal = (
        (ce * (1 - p_t) ** 2 * (alpha * tgt + (1 - alpha) * (1 - tgt))).flatten(2).mean(-1)
    )  # (O, M)
    num = 2 * (prob * tgt).flatten(2).sum(-1)
    dice = 1 - (num + 1) / (prob.flatten(2).sum(-1) + tgt.flatten(2).sum(-1) + 1)  # (O, M)
    best = torch.argmin(20 * focal + dice, dim=1)
    rows = torch.arange(O, device=logits.device)
    with torch.no_grad():
        pred = logits > 0
        inter = (pred & (tgt > 0)).flatten(2).sum(-1).float()
        union = (pred | (tgt > 0)).flatten(2).sum(-1).float()
        real_iou = inter / union.clamp(min=1)
    if losses.all_iou:
        iou = (ious - real_iou).abs().mean(1)
    else:
        iou = (ious[rows, best] - real_iou[rows, best]).abs()
    weight = present / present.sum().clamp(min=1)
    return {
        "tracked_iou": (real_iou[rows, best] * weight).sum(),
        "focal": (focal[rows, best] * weight).sum(),
        "dice": (dice[rows, best] * weight).sum(),
        "iou": (iou * weight).sum(),
        "score": F.binary_cross_entropy_with_logits(score_logits[:, 0], present),
    }


def training_clip(step: int, frames: int, size: int = SIZE, speed=SPEED):
    rng = np.random.default_rng(10_000_000 + step)
    clip, masks = make_clip(
        step,
        num_frames=frames,
        height=size,
        width=size,
        motions=("drift", "wave"),
        occluder=bool(rng.random() < 0.3),
        speed=float(rng.uniform(*speed)),
    )
    keep = masks[0].reshape(masks.shape[1], -1).sum(1) >= 16  # prompt only objects seen on frame 0
    if not keep.any():
        return None
    x = torch.from_numpy(clip).permute(0, 3, 1, 2).float() / 255
    return x, torch.from_numpy(masks[:, keep]), rng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--frames", type=int, default=8, help="frames per training clip")
    parser.add_argument("--size", type=int, default=SIZE, help="image size (frames drawn at it)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--prompt-frames",
        type=int,
        default=0,
        help="frames of each clip also trained on SAM's image-level task (every object "
        "prompted alone by a box, a click, a click and an outside one; `prompt_losses`)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        nargs=2,
        default=SPEED,
        metavar=("LO", "HI"),
        help="each clip's motion scale (`make_clip`'s speed: velocity, spin, growth and wave "
        "frequency scale with it), drawn uniformly from [LO, HI) (default %(default)s)",
    )
    parser.add_argument(
        "--locality",
        type=float,
        help="set memory attention's pull to where the object was to this strength before "
        "training, after --init (`set_locality`; a fresh run starts at 100)",
    )
    parser.add_argument(
        "--init", type=Path, help="start from these weights (a file this script wrote)"
    )
    parser.add_argument(
        "--state",
        type=Path,
        help="the run's full state, saved every --log-every steps and resumed from when it "
        "exists (default data/<out's stem>.state.pt)",
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        help="end after this many steps of the --steps schedule (its learning rate not yet "
        "decayed), writing --out; the state is kept",
    )
    parser.add_argument(
        "--focal-alpha",
        type=float,
        default=0.75,
        help="the focal loss's weight of positives (SAM 2: 0.25; `frame_losses`)",
    )
    parser.add_argument(
        "--all-iou",
        action="store_true",
        help="the IoU head learns all three masks' IoU (SAM 2.1's supervise_all_iou), not "
        "only the chosen one's (`Losses`)",
    )
    parser.add_argument(
        "--prompt-only",
        action="store_true",
        help="train on SAM's image-level task alone (--prompt-frames frames a clip), no tracking",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to train (cuda: a GPU, under bfloat16 autocast by default)",
    )
    parser.add_argument(
        "--precision",
        choices=("float32", "bfloat16"),
        help="bfloat16: SAM 2's training autocast (weights and losses stay float32); "
        "default: bfloat16 on cuda, float32 on cpu",
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="clips per optimiser step (their losses averaged)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="processes that draw the clips ahead of the steps (default: all cores but 2 on "
        "cuda, 0 on cpu, where the threads take the cores); clip k is clip k whatever the count",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        help="end this sitting after this many minutes (after a step): --out is written, the "
        "state kept, and the same command continues the run",
    )
    args = parser.parse_args()
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.workers is not None and args.workers < 0:
        parser.error("--workers must be at least 0")
    workers = (
        args.workers
        if args.workers is not None
        else (max(1, (os.cpu_count() or 2) - 2) if args.device == "cuda" else 0)
    )
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be more than 0")
    if (args.minutes or args.stop_after) and args.out.resolve() == WEIGHTS.resolve():
        parser.error("--minutes and --stop-after write unfinished weights: give another --out")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    precision = args.precision or ("bfloat16" if args.device == "cuda" else "float32")
    if args.prompt_only and not args.prompt_frames:
        parser.error("--prompt-only needs --prompt-frames")
    if args.stop_after is not None and not 0 < args.stop_after <= args.steps:
        parser.error("--stop-after must be between 1 and --steps")
    if args.locality is not None and args.locality < 0:
        parser.error("--locality must be at least 0")
    if not 0 <= args.speed[0] <= args.speed[1]:
        parser.error("--speed needs 0 <= LO <= HI")
    if args.frames < 2:
        parser.error("--frames must be at least 2 (a prompted frame and a tracked one)")
    # The state goes to a separate file, here in data/ (not in the package): the shipped
    # weights are replaced only when a run ends (a sitting's end may not write them).
    state_path = args.state or HERE / (args.out.stem + ".state.pt")
    torch.set_num_threads(args.threads)
    run = {k: getattr(args, k) for k in ("steps", "frames", "size", "lr", "seed", "threads")}
    if args.prompt_frames:  # recorded only when used: earlier runs' states still resume
        run["prompt_frames"] = args.prompt_frames
    if args.prompt_only:
        run["prompt_only"] = True
    if args.focal_alpha != 0.75:
        run["focal_alpha"] = args.focal_alpha
    if args.all_iou:
        run["all_iou"] = True
    if args.batch != 1:
        run["batch"] = args.batch
    if tuple(args.speed) != SPEED:
        run["speed"] = list(args.speed)
    if args.locality is not None:
        run["locality"] = args.locality
    if args.device != "cpu" or precision != "float32":
        run["device"], run["precision"] = args.device, precision
    losses = Losses(args.focal_alpha, args.all_iou)
    run["init"] = str(args.init) if args.init else None
    model = build(args.seed, args.size)
    look_where_it_was(model)
    history, first_clip = [], 0
    if args.init:
        init = torch.load(args.init, map_location="cpu", weights_only=True)
        model.load_state_dict(init["model"])
        history = list(init.get("history", [{"steps": init.get("steps", 0)}]))
        # clips no earlier run has seen
        first_clip = sum(h.get("clips", h["steps"]) for h in history)
    if args.locality is not None:
        set_locality(model, args.locality)
    model.to(args.device).train()
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=precision == "bfloat16")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = min(200, args.steps // 10)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(args.steps - warmup, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    start, spent = 0, 0.0
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        if state["run"] != run:
            sys.exit(
                f"error: {state_path} holds another run ({state['run']}); "
                "delete it or pass that run's arguments"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"])
        start, spent = state["step"], state["seconds"]
        print(f"resuming at step {start} ({spent / 3600:.2f} h so far): {state_path}", flush=True)
    began, recent = time.time() - spent, []
    sitting, timed_out = time.monotonic(), False
    end = min(args.steps, args.stop_after or args.steps)
    if start > end:
        sys.exit(f"error: {state_path} is at step {start}, past --stop-after {end}")
    steps = batches(  # the clips drawn ahead, in other processes
        first_clip, args.batch, range(start, end), workers, args.device == "cuda",
        frames=args.frames, size=args.size, speed=args.speed,
        prompt_frames=args.prompt_frames, prompt_only=args.prompt_only,
    )  # fmt: skip
    for step, drawn in zip(range(start, end), steps):
        recent.extend(train_step(model, opt, to(drawn, args.device), autocast, losses))
        sched.step()
        if args.minutes and step + 1 < end and time.monotonic() - sitting >= 60 * args.minutes:
            end, timed_out = step + 1, True  # this sitting ends here; the run goes on later
        if (step + 1) % args.log_every == 0 or step + 1 == end:
            if recent:
                keys = dict.fromkeys(k for p in recent for k in p)
                mean = {k: np.mean([float(p[k]) for p in recent if k in p]) for k in keys}
                print(
                    f"step {step + 1}/{args.steps} {time.time() - began:.0f}s "
                    f"lr {sched.get_last_lr()[0]:.2e} "
                    + " ".join(f"{k} {v:.4f}" for k, v in mean.items()),
                    flush=True,
                )
            recent = []
            atomic_save(
                {
                    "run": run,
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    **({"cuda_rng": torch.cuda.get_rng_state()} if args.device == "cuda" else {}),
                    "step": step + 1,
                    "seconds": time.time() - began,
                },
                state_path,
            )
        if timed_out:
            break
    hours = (time.time() - began) / 3600
    history.append({"steps": end, "hours": round(hours, 3), "run": run})
    if args.batch != 1:
        history[-1]["clips"] = end * args.batch
    save(model, args.size, history, args.out)
    if end == args.steps:  # stopped early, the state stays: a later --stop-after goes on
        state_path.unlink(missing_ok=True)
    print(f"trained {end} of {args.steps} steps in {hours:.2f} h: {args.out}")
    if timed_out:
        print("the --minutes bound ended this sitting: run the same command to continue")


def save(model, size: int, history: list, path: Path) -> None:
    """The weights as SAM 2's checkpoints hold them ("model"), with the image size they were
    trained at (segpipe warns when a store's differs), the steps done in all, and each run's
    steps, hours and arguments ("history")."""
    steps = sum(h["steps"] for h in history)
    weights = {k: v.cpu() for k, v in model.state_dict().items()}  # they load on any machine
    atomic_save({"model": weights, "image_size": size, "steps": steps, "history": history}, path)


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary file, fsynced and renamed: `path` is never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
