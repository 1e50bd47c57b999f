"""Concept prompts ("fish", "cell") tracked chunk by chunk with SAM 3's concept model
(transformers' `Sam3VideoModel`): on each frame its detector finds every instance of the
concepts, its tracker follows them, and its own rules (association, hotstart, reconditioning)
decide which instances exist. transformers' own model steps transformers' own inference
session frame by frame, as its `propagate_in_video_iterator` does (forward from frame 0), but
the session holds no frame and only what later frames read: each instance's memory in reach
and the association state. That is saved at each chunk's end and put back at the next
chunk's start, here or after a restart.

A frame's output is final once `hotstart_delay` frames more are tracked (transformers holds
it back as long, and hides the instances its hotstart removed meanwhile): chunk k is
committed (its masks, scores and memory snapshot made durable, then its ledger entry) once
its last frame's output is final, chunks in order. A crash loses what is not committed.

Store layout (besides the results arrays every tracking writes): the object axis grows as
instances first appear in an output, after the columns of the objects clicked beside the
concepts (`clicks`); `masks.attrs["object_ids"]` are the clicked objects' ids, then the
instances' in the order they appeared: transformers' ids + 1 + the largest clicked id
(`concept_ids`: transformers' own). `memory/concepts/<k>` holds
the snapshot after chunk k: every tensor's raw bytes, and in its attributes the association
state and where each tensor lies. `instances` (chunks,) counts the instances output in each
chunk."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from segpipe import log
from segpipe.behind import Behind
from segpipe.stages.track.clicks import ClickedObjects
from segpipe.stages.track.session import dtype_name, empty_session, from_raw, raw_bytes
from segpipe.stages.track.tracker import pack_bits
from segpipe.store.layout import TRACK_ARRAYS
from segpipe.store.masks import packed_size, row_bands, write_packed
from segpipe.store.runstore import RunStore

ROOT = "memory/concepts"
# what a later frame reads of an instance's earlier outputs (transformers' tracker):
# object pointers always, mask memories (with their positional encoding) while in reach
POINTER = ("object_pointer",)
MEMORY = ("object_pointer", "maskmem_features", "maskmem_pos_enc")
# the association state, as the session holds it (all JSON: ids, frames, float scores)
STATE = (
    "obj_ids",
    "obj_id_to_prompt_id",
    "obj_id_to_score",
    "max_obj_id",
    "obj_first_frame_idx",
    "unmatched_frame_inds",
    "trk_keep_alive",
    "removed_obj_ids",
    "hotstart_removed_obj_ids",
)


class FrameIndex:
    """Stands in for a session's frames: its length is the video's, and a frame is its index
    (the stored features' stand-in, `StoredVision`, reads it): no frame is held."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, frame: int) -> torch.Tensor:
        return torch.tensor([frame])


class StoredVision:
    """Stands in for the detector's `get_vision_features` while tracking: the frame's stored
    backbone output (`StoredFeatures`, a chunk at a time) through the detector's own neck, as
    its vision model computes it."""

    def __init__(self, model, features):
        self.vision, self.features = model.detector_model.vision_encoder, features

    def __call__(self, pixel_values: torch.Tensor, **kwargs):
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        f = int(pixel_values.reshape(-1)[0])
        i = f - self.features.lo
        if not self.features.levels or not 0 <= i < len(self.features.levels[0]):
            self.features.load(f, f + 1)
            i = 0
        spatial = self.features.levels[0][i : i + 1]
        fpn, pos = self.vision.neck(spatial)
        hidden = spatial.permute(0, 2, 3, 1).reshape(1, -1, spatial.shape[1])
        return Sam3VisionEncoderOutput(
            last_hidden_state=hidden, fpn_hidden_states=fpn, fpn_position_encoding=pos
        )


def processor_for(predictor):
    """transformers' video processor for its text prompts alone (its tokenizer), made
    without its image and video processors, which need torchvision."""
    cls = predictor.segpipe_family.processor_class()
    processor = cls.__new__(cls)
    processor.tokenizer = predictor.tokenizer
    return processor


def new_session(predictor, num_frames: int, height: int, width: int, concepts: list[str]):
    """transformers' concept session for a video of `num_frames` frames, holding no frame,
    the concepts added as its processor adds them."""
    session = empty_session(predictor, height, width, FrameIndex(num_frames))
    session.obj_with_new_inputs = []  # (transformers makes it at its first new instance)
    processor_for(predictor).add_text_prompt(session, list(concepts))
    return session


def final_output(session, out, height: int, width: int):
    """A frame's output as transformers' `Sam3VideoProcessor.postprocess_outputs` makes it
    when the frame is handed out: (ids, scores, masks (N, H, W) bool) of the instances shown
    (not empty, not suppressed on the frame, not removed by the hotstart so far), each pixel
    kept by the highest tracker score among the instances of its concept."""
    ids = sorted(out.obj_id_to_mask)
    if not ids:
        return [], [], torch.zeros(0, height, width, dtype=torch.bool)
    probs = torch.tensor([out.obj_id_to_score[i] for i in ids])
    tracker = torch.tensor([out.obj_id_to_tracker_score.get(i, 0.0) for i in ids])
    low = torch.cat([out.obj_id_to_mask[i] for i in ids], dim=0)
    masks = F.interpolate(low.unsqueeze(1), (height, width), mode="bilinear", align_corners=False)
    masks = masks.squeeze(1) > 0
    keep = masks.any(dim=(1, 2)).cpu()
    hide = list(out.suppressed_obj_ids or ()) + list(session.hotstart_removed_obj_ids)
    if hide:
        keep &= ~torch.isin(torch.tensor(ids), torch.tensor(hide, dtype=torch.int64))
    idx = torch.nonzero(keep, as_tuple=True)[0]
    ids = [ids[i] for i in idx.tolist()]
    probs, tracker = probs[idx], tracker[idx]
    masks = masks[idx.to(masks.device)]
    if len(ids) > 1:  # pixels to the highest tracker score, concept by concept
        groups = torch.tensor([session.obj_id_to_prompt_id[i] for i in ids])
        for g in groups.unique(sorted=True):
            at = torch.nonzero(groups == g, as_tuple=True)[0]
            if len(at) < 2:
                continue
            scored = torch.where(masks[at], tracker[at, None, None].to(masks.device), 0.0)
            best = scored.argmax(dim=0, keepdim=True)
            masks[at] = (best == torch.arange(len(at), device=masks.device)[:, None, None]) & (
                scored > 0
            )
    return ids, probs.tolist(), masks


class ConceptTracker:
    """The one pass of a concept tracking: forward from frame 0 over every chunk, the
    instances carried between chunks (`snapshot`); and the objects clicked beside the
    concepts (`clicks`, prompts: `clicks.ClickedObjects`), each frame after the instances."""

    def __init__(self, predictor, store: RunStore, concepts: list[str], features, supply,
                 on_commit=None, clicks: list = (), threshold: float = 0.0):  # fmt: skip
        self.predictor, self.model, self.store = predictor, predictor.model, store
        self.plan, self.concepts = store.plan, list(concepts)
        self.features, self.supply, self.on_commit = features, supply, on_commit
        video = store.attrs["video"]
        self.height, self.width = video["height"], video["width"]
        self.delay = self.model.hotstart_delay
        tracker = self.model.tracker_model.config
        self.pointers = max(tracker.max_object_pointers_in_encoder - 1, 1)
        self.memories = max(tracker.num_maskmem - 1, 1)
        self.cond_kept = tracker.max_cond_frame_num
        self.unit = ("forward", 0)
        self.vision = StoredVision(self.model, features)
        self.clicks = None
        if clicks:
            self.clicks = ClickedObjects(predictor, store, list(clicks), self.vision, threshold)
        # the instances' columns follow the clicked objects', their ids past the clicked ones'
        self.first = 0 if self.clicks is None else len(self.clicks.ids)
        self.id_base = 0 if self.clicks is None else max(self.clicks.ids)

    # -- the pass --------------------------------------------------------------------------
    def run(self, quiet: bool) -> None:
        from segpipe.store.ledger import object_stage

        plan = self.plan
        ledger = self.store.ledger(object_stage("forward", 0))
        done = [k for k in range(plan.num_chunks) if ledger.is_done(k)]
        start = len(done)
        assert done == list(range(start)), "concept chunks are committed in order"
        todo = list(range(start, plan.num_chunks))
        frames = plan.num_frames - plan.bounds(start)[0] if todo else 0
        detector = self.model.detector_model
        # outputs held back (the hotstart); final outputs by frame; the chunks tracked whose
        # frames are not all final yet: (chunk, snapshots, clicked objects' results)
        self.held, self.finals, self.waiting = [], {}, []
        with (
            log.progress("track concepts", frames, quiet) as bar,
            Behind("segpipe-concept-writes") as writer,
        ):
            detector.get_vision_features = self.vision
            try:
                sessions = self.restore(start - 1 if start else None)
                for k in todo:
                    self.track_chunk(k, sessions, writer, bar)
            finally:
                del detector.get_vision_features  # the model's own again
        self.supply.finished(self.unit)

    def track_chunk(self, k: int, sessions, writer, bar) -> None:
        """Chunk k tracked, then every chunk whose frames are all final written behind."""
        plan, (session, clicked) = self.plan, sessions
        self.supply.ensure(k)
        lo, hi = plan.bounds(k)
        self.features.load(lo, hi)
        if k + 1 < plan.num_chunks:  # the next chunk's features read, or its frames got,
            if self.supply.has(k + 1):  # behind the work at hand
                self.features.read_ahead(*plan.bounds(k + 1))
            else:
                self.supply.ahead(k + 1)
        clicked_outs = {}
        for f in range(lo, hi):
            writer.failed()
            self.step(session, f)
            if clicked is not None and (got := self.clicks.step(clicked, f)) is not None:
                clicked_outs[f] = got
            self.prune(session, f + 1)
            bar.update(1)
        snaps = (snapshot(session), None if clicked is None else self.clicks.snapshot(clicked))
        self.waiting.append((k, snaps, clicked_outs))
        self.supply.tracked(self.unit, k)
        while self.waiting and all(
            t in self.finals for t in range(*plan.bounds(self.waiting[0][0]))
        ):
            j, snaps, clicked_outs = self.waiting.pop(0)
            outs = {t: self.finals.pop(t) for t in range(*plan.bounds(j))}
            writer.submit(
                self.write, j, outs, snaps, clicked_outs, then=lambda j=j: self.supply.committed(j)
            )

    def step(self, session, f: int) -> None:
        """Frame f tracked; the outputs final now (held back `hotstart_delay` frames, as
        transformers' `propagate_in_video_iterator` does) made as handed out."""
        out = self.model(inference_session=session, frame_idx=f)
        session.hotstart_removed_obj_ids.update(out.removed_obj_ids)
        self.held.append(out)
        if self.delay <= 0 or f == self.plan.num_frames - 1:
            ready, self.held = self.held, []
        elif len(self.held) >= self.delay:
            ready, self.held = self.held[:1], self.held[1:]
        else:
            ready = []
        for r in ready:
            self.finals[r.frame_idx] = final_output(session, r, self.height, self.width)

    def prune(self, session, next_frame: int) -> None:
        """Drop what no frame from `next_frame` on reads (transformers keeps it all): of
        each instance's outputs, mask memories out of reach (the last `num_maskmem - 1`
        frames, and the `max_cond_frame_num` latest conditioning frames), pointers of
        tracked frames out of reach, and every mask; per-frame records of past frames."""
        for outputs in session.output_dict_per_obj.values():
            tracked = outputs["non_cond_frame_outputs"]
            for t in list(tracked):
                back = next_frame - t
                if not 1 <= back <= max(self.pointers, self.memories):
                    del tracked[t]
                    continue
                keep = (MEMORY if back <= self.memories else ()) + (
                    POINTER if back <= self.pointers else ()
                )
                tracked[t] = {k: v for k, v in tracked[t].items() if k in keep}
            cond = outputs["cond_frame_outputs"]
            latest = sorted(cond)[-self.cond_kept :] if self.cond_kept > 0 else list(cond)
            for t in cond:
                near = 1 <= next_frame - t <= self.memories
                keep = MEMORY if t in latest or near else POINTER
                cond[t] = {k: v for k, v in cond[t].items() if k in keep}
        for per_obj in (session.mask_inputs_per_obj, session.point_inputs_per_obj,
                        session.frames_tracked_per_obj):  # fmt: skip
            for o in per_obj:
                per_obj[o] = {}
        for per_frame in (session.obj_id_to_tracker_score_frame_wise, session.suppressed_obj_ids):
            for t in [t for t in per_frame if t < next_frame]:
                del per_frame[t]

    def restore(self, before: int | None):
        """(the concept session, the clicked objects' or None) holding the instances, the
        association state and the clicked objects' memory as they were after chunk
        `before` (None: the start, where the concepts and the clicks are added)."""
        session = new_session(
            self.predictor, self.plan.num_frames, self.height, self.width, self.concepts
        )
        if before is not None:
            arr = self.store.array(f"{ROOT}/{before}")
            restore(session, arr.attrs.asdict(), arr[...], self.predictor.device)
        if self.clicks is None:
            return session, None
        return session, self.clicks.restore(before, self.supply, self.unit, session)

    # -- writing ---------------------------------------------------------------------------
    def write(self, k: int, outs: dict, snaps: tuple, clicked_outs: dict) -> None:
        """Chunk k's final outputs (masks, scores, areas), the clicked objects' and the
        snapshots after it, then its ledger entry; `on_commit` told."""
        store = self.store
        snap, clicked_snap = snaps
        own = [] if self.clicks is None else self.clicks.write(k, clicked_outs, clicked_snap)
        self.write_instances(k, outs)
        name = f"{ROOT}/{k}"
        data = snap.pop("data")
        arr = store.create_array(
            name, data.shape, (max(len(data), 1),), "uint8", overwrite=True, attributes=snap
        )
        if len(data):
            arr[...] = data
        # (an array with nothing but fill so far has no chunk folder yet: nothing to sync)
        written = [a for a in (*TRACK_ARRAYS, "instances") if (store.path / a / "c").is_dir()]
        store.sync_chunk(written + own, k)
        store.commit_array(name)
        store.commit_objects("forward", k, [0], [], [])  # the ledger entry, last
        for old in [n for n in store.group[ROOT].array_keys() if int(n) < k - 1]:
            store.delete(f"{ROOT}/{old}")  # a restart reads the last one committed only
        if self.on_commit is not None:
            self.on_commit("forward", k)

    def write_instances(self, k: int, outs: dict) -> None:
        """Chunk k's instances: masks, scores and areas in their columns, and their count."""
        store, (lo, hi) = self.store, self.plan.bounds(k)
        slots = self.columns(sorted({i for ids, _, _ in outs.values() for i in ids}), lo)
        N, a = len(slots), self.first
        packed = np.zeros((hi - lo, N, packed_size(self.height, self.width)), np.uint8)
        scores = np.full((hi - lo, N), np.nan, np.float32)
        areas = np.zeros((hi - lo, N), np.int64)
        found = set()
        for t, (ids, probs, masks) in outs.items():
            if ids:
                cols = [slots[i] for i in ids]
                packed[t - lo, cols] = pack_bits(masks).cpu().numpy()
                scores[t - lo, cols] = probs
                areas[t - lo, cols] = masks.sum((1, 2)).cpu().numpy()
                found.update(ids)
        if N:
            write_packed(store, lo, hi, packed, a)
            store.array("object_areas")[lo:hi, a : a + N] = areas
            store.array("object_scores")[lo:hi, a : a + N] = scores
            store.array("tracked")[lo:hi, a : a + N] = True
        store.array("instances")[k] = len(found)

    def columns(self, ids: list[int], lo: int) -> dict[int, int]:
        """Each instance's column among the instances' (after the clicked objects'), new
        ones added in the order of their ids: the results arrays grown, the new columns
        written as not shown on the frames before `lo` (committed chunks: every chunk of a
        results array exists) and made durable, then the ids recorded. A kill before the
        record leaves columns no id names yet, which the rerun of the chunk makes again."""
        store = self.store
        known = list(store.array("masks").attrs.get("concept_ids", []))
        new = [i for i in ids if i not in known]
        if not new:
            return {i: c for c, i in enumerate(known)}
        a, b = self.first + len(known), self.first + len(known) + len(new)
        for name in TRACK_ARRAYS:
            arr = store.array(name)
            if arr.shape[1] < b:
                arr.resize((arr.shape[0], b, *arr.shape[2:]))
        if lo:
            masks = store.array("masks")
            for r0, r1 in row_bands(store):
                masks[:lo, a:b, r0:r1] = False
            store.array("object_scores")[:lo, a:b] = np.nan
            store.array("object_areas")[:lo, a:b] = 0
            store.array("tracked")[:lo, a:b] = True
            for j in range(self.plan.chunk_of(lo - 1) + 1):
                store.sync_chunk(TRACK_ARRAYS, j, slice(a, b))
        known += new
        clicked = [] if self.clicks is None else self.clicks.ids
        # (the array as resized: an update of its attributes writes its whole metadata)
        store.array("masks").attrs.update(
            concept_ids=known, object_ids=clicked + [self.id_base + i + 1 for i in known]
        )
        return {i: c for c, i in enumerate(known)}


# -- the snapshot ----------------------------------------------------------------------------
def snapshot(session) -> dict:
    """The session's instances and association state, on the host: tensors as raw bytes
    (`data`) and where each lies (`tensors`), the state as JSON (`state`). The outputs
    transformers holds back (the hotstart) are not in it: a chunk is committed once all its
    frames' outputs are final, and a restart from it hands out each later frame's output
    after the same frames as the whole run does."""
    parts, where, offset = [], [], 0
    for o, obj_id in enumerate(session.obj_ids):
        outputs = session.output_dict_per_obj[session._obj_id_to_idx[obj_id]]
        for kind in ("cond_frame_outputs", "non_cond_frame_outputs"):
            for t, entry in outputs[kind].items():
                for key, value in entry.items():
                    raw = raw_bytes(value)
                    where.append([obj_id, kind, int(t), key, dtype_name(value),
                                  list(value.shape), offset, raw.size])  # fmt: skip
                    parts.append(raw)
                    offset += raw.size
    state = {name: _json(getattr(session, name)) for name in STATE}
    state["overlap_pair_to_frame_inds"] = [
        [a, b, frames] for (a, b), frames in session.overlap_pair_to_frame_inds.items()
    ]
    state["obj_id_to_last_occluded"] = {
        str(i): int(v.reshape(-1)[0]) for i, v in session.obj_id_to_last_occluded.items()
    }
    data = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return {"data": data, "state": state, "tensors": where}


def _json(value):
    if isinstance(value, set):
        return sorted(int(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def restore(session, attrs: dict, data: np.ndarray, device) -> None:
    """Put a snapshot (`snapshot`, as stored) back into a fresh session."""
    state = attrs["state"]
    ids = [int(i) for i in state["obj_ids"]]
    for i in ids:  # the instances in the session's order
        session.obj_id_to_idx(i)
    for obj_id, kind, t, key, dtype, shape, offset, size in attrs["tensors"]:
        value = from_raw(data[offset : offset + size], dtype, shape, device)
        outputs = session.output_dict_per_obj[session._obj_id_to_idx[obj_id]][kind]
        outputs.setdefault(int(t), {})[key] = value
    ints = lambda d: {int(k): v for k, v in d.items()}  # noqa: E731
    session.obj_ids = ids
    session.obj_id_to_prompt_id = ints(state["obj_id_to_prompt_id"])
    session.obj_id_to_score = ints(state["obj_id_to_score"])
    session.max_obj_id = state["max_obj_id"]
    session.obj_first_frame_idx = ints(state["obj_first_frame_idx"])
    session.unmatched_frame_inds = defaultdict(list, ints(state["unmatched_frame_inds"]))
    session.trk_keep_alive = ints(state["trk_keep_alive"])
    session.removed_obj_ids = set(state["removed_obj_ids"])
    session.hotstart_removed_obj_ids = set(state["hotstart_removed_obj_ids"])
    session.overlap_pair_to_frame_inds = defaultdict(
        list, {(a, b): frames for a, b, frames in state["overlap_pair_to_frame_inds"]}
    )
    session.obj_id_to_last_occluded = {
        int(i): torch.tensor([v], dtype=torch.long, device=device)
        for i, v in state["obj_id_to_last_occluded"].items()
    }
