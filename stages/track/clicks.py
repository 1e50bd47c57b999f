"""Clicked objects (points, a box, a mask) tracked beside concept prompts, on a store of SAM 3's
concept model (`sam3-video`): SAM 3's tracker alone follows them, as transformers'
`Sam3TrackerVideoModel` loaded from the same checkpoint does (its weights are the concept
model's tracker, the detector's backbone and the tracker's neck), forward from their earliest
prompt, in a session of their own.

They are stepped in the concept pass (`concepts.ConceptTracker`), each frame after the
instances, whose session computed the frame's tracker features already (the tracker's neck on
the stored backbone output: what `Sam3TrackerVideoModel.get_image_features` computes). They
take no part in the instances' association: a clicked object the detector also finds is an
instance too. Their memory is saved at each chunk's end as any transformers session's
(`session.SessionMemory`, under memory/forward/session/), and they are the first columns of
the results arrays, the instances after them."""

from __future__ import annotations

import numpy as np
import torch

from segpipe import prompts as prompt_file
from segpipe.stages.track.session import (
    SessionMemory,
    add_prompts,
    new_session,
    prune,
    reach,
    video_masks,
)
from segpipe.stages.track.tracker import pack_bits
from segpipe.store.masks import packed_size, write_packed
from segpipe.store.runstore import RunStore


class TrackerFeatures:
    """Stands in for the clicked objects' session's feature cache: a frame's tracker
    features as the concept model computes them for its own tracker
    (`get_vision_features_for_tracker` on the stored backbone output, through `vision`:
    `concepts.StoredVision`), taken from the concept session's cache (`concepts`) when it
    holds the frame."""

    def __init__(self, model, vision):
        self.model, self.vision, self.concepts = model, vision, None

    def get_vision_features(self, frame_idx: int) -> dict:
        if self.concepts is not None:
            held = self.concepts.cache.get_vision_features(frame_idx)
            if held:
                return held
        embeds = self.vision(torch.tensor([frame_idx]))
        feats, pos = self.model.get_vision_features_for_tracker(embeds)
        return {"vision_feats": feats, "vision_pos_embeds": pos}

    def cache_vision_features(self, frame_idx: int, features: dict) -> None:
        raise RuntimeError("the clicked objects' session computed features")

    def clear_all(self) -> None:
        pass


class ClickedObjects:
    """The clicked objects of a concept tracking: their session made or restored, stepped a
    frame at a time, its memory snapshot taken and written with their results."""

    def __init__(self, predictor, store: RunStore, prompts: list, vision, threshold: float):
        self.tracker = predictor.segpipe_family.click_predictor(predictor)
        self.store, self.plan, self.prompts = store, store.plan, prompts
        self.ids = prompt_file.object_ids(prompts)
        self.start = min(p.frame for p in prompts)  # forward from the earliest prompt
        video = store.attrs["video"]
        self.height, self.width, self.threshold = video["height"], video["width"], threshold
        self.features = TrackerFeatures(predictor.model, vision)
        self.pointers, self.memories = reach(self.tracker.model, self.plan.num_frames)
        self.memstore = SessionMemory(
            store, "forward", len(self.ids), self.plan.num_chunks, self.pointers
        )

    def restore(self, before: int | None, supply, unit, concepts):
        """Their session as it was after chunk `before` (None: the start, where the prompts
        are added, their chunks' features got first); `concepts`: the concept session,
        whose cache serves the frames it has stepped."""
        self.features.concepts = None  # (a prompt's frame: computed from the store)
        session = new_session(
            self.tracker, self.plan.num_frames, self.height, self.width, self.features
        )
        if before is None:
            for k in supply.prompts_of(unit):
                supply.ensure(k)
            add_prompts(self.tracker, session, self.prompts)
            supply.prompted(unit)
            self.memstore.write_prompted(session)
            prune(session, self.start, False, self.pointers, self.memories)
        else:
            for i in self.ids:  # the objects in the session's order
                session.obj_id_to_idx(i)
            self.memstore.read(session, before, self.tracker.device)
        self.features.concepts = concepts
        return session

    @torch.inference_mode()
    def step(self, session, f: int):
        """Frame f tracked (after the concepts): (packed masks (O, bytes), score logits
        (O,), areas (O,)) on the device; None before the earliest prompt."""
        if f < self.start:
            return None
        out = self.tracker.model(inference_session=session, frame_idx=f)
        above = video_masks(out, self.height, self.width, self.threshold)
        prune(session, f + 1, False, self.pointers, self.memories)
        return pack_bits(above), out.object_score_logits.float().reshape(-1), above.sum((1, 2))

    def snapshot(self, session) -> dict:
        return self.memstore.snapshot(session, self.ids)

    def write(self, k: int, outs: dict, snapshot: dict) -> list[str]:
        """Chunk k's results in the first columns (its frames before the earliest prompt
        not tracked), then the memory snapshot after it; returns the memory arrays to
        commit."""
        lo, hi = self.plan.bounds(k)
        O = len(self.ids)
        packed = np.zeros((hi - lo, O, packed_size(self.height, self.width)), np.uint8)
        scores = np.full((hi - lo, O), np.nan, np.float32)
        areas = np.zeros((hi - lo, O), np.int64)
        tracked = np.zeros((hi - lo, O), bool)
        for f, (bits, logits, area) in outs.items():
            packed[f - lo] = bits.cpu().numpy()
            scores[f - lo], areas[f - lo] = logits.cpu().numpy(), area.cpu().numpy()
            tracked[f - lo] = True
        write_packed(self.store, lo, hi, packed, 0)
        self.store.array("object_areas")[lo:hi, :O] = areas
        self.store.array("object_scores")[lo:hi, :O] = scores
        self.store.array("tracked")[lo:hi, :O] = tracked
        return self.memstore.write_snapshot(k, snapshot)
