"""SAM 2's video predictor driven one chunk at a time: its state built from the stored
features, the memory injected at the chunk's start and saved at its end, so the masks are
those of the predictor tracking the whole video in memory."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from segpipe import prompts as prompt_file
from segpipe.errors import BadInput
from segpipe.plan import ChunkPlan, Span
from segpipe.stages.track.batch import batches, one_of, stacked
from segpipe.stages.track.memory import FrameOutput, MemoryStore, ObjectMemory, Reach, TrackerMemory
from segpipe.stages.track.passes import Pass
from segpipe.stages.track.shared import PerFrame
from segpipe.stages.track.supply import ChunkSupply
from segpipe.store.features import (
    LEVELS,
    Batches,
    from_storage,
    level_kind,
    restore_layout,
    stored_levels,
)
from segpipe.store.masks import packed_size
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import ABSENT_LOGIT, OPTIONS


class StoredFeatures(dict):
    """Stands in for the predictor's `cached_features`: every lookup is a hit, served from the
    chunk of stored embeddings currently loaded, so the image encoder is never called. Each
    level comes back in the dtype and memory layout SAM 2 computed it in; the next chunk is
    read from the store while the current one is tracked. A chunk in `held` (chunk -> its
    `Encoded` levels: encoded in this process) is taken from there, not read back."""

    def __init__(self, store: RunStore, device, pos_enc: list[torch.Tensor], held: dict):
        super().__init__()
        self.store, self.device, self.pos_enc, self.held = store, device, pos_enc, held
        self.lo, self.levels = 0, []
        self.names = stored_levels(store)
        self.kinds = [level_kind(store, n) for n in self.names]
        self.dummy_image = torch.zeros(1, 3, 1, 1, device=device)
        self.reader = ThreadPoolExecutor(1)
        self.ahead = None  # ((lo, hi), future of the host tensors)

    def _read(self, lo: int, hi: int) -> list[torch.Tensor]:
        """Frames lo..hi (of one chunk) of every level, from memory where held (as a read
        back gives them, on the device: `Encoded.read`)."""
        k = self.store.plan.chunk_of(lo)
        held, start = self.held.get(k), self.store.plan.bounds(k)[0]
        if held is not None:
            return held.read(lo - start, hi - start)
        host = []
        for name, (stored, computed, _) in zip(self.names, self.kinds):
            feats = from_storage(self.store.read(name, lo, hi), stored).to(computed)
            host.append(feats.pin_memory() if self.device.type == "cuda" else feats)
        return host

    def read_ahead(self, lo: int, hi: int) -> None:
        self.ahead = ((lo, hi), self.reader.submit(self._read, lo, hi))

    def load(self, lo: int, hi: int) -> None:
        if self.ahead is not None and self.ahead[0] == (lo, hi):
            host = self.ahead[1].result()
        else:
            host = self._read(lo, hi)
        self.ahead, self.lo, self.levels = None, lo, []
        for feats, (_, _, layout) in zip(host, self.kinds):
            if isinstance(feats, Batches):  # held: on the device, in SAM 2's layout already
                self.levels.append(feats)
                continue
            feats = feats.to(self.device, non_blocking=True)
            self.levels.append(restore_layout(feats, layout))

    def get(self, frame_idx, default=None):
        i = frame_idx - self.lo
        if not self.levels or not 0 <= i < len(self.levels[0]):
            self.load(frame_idx, frame_idx + 1)
            i = 0
        backbone = {
            "backbone_fpn": [lvl[i : i + 1] for lvl in self.levels],
            "vision_pos_enc": list(self.pos_enc),
        }
        return self.dummy_image, backbone


def positional_encodings(
    predictor, store: RunStore, precision: str
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The image encoder's and the memory encoder's positional encodings, which depend only
    on feature shapes, computed as `FpnNeck` and `MemoryEncoder` do: cast to the dtype of the
    features they go with (under bfloat16 autocast, bfloat16 for all but one level)."""
    device = predictor.device
    neck_pe = predictor.image_encoder.neck.position_encoding
    vision = []
    for name in LEVELS:
        dtype = level_kind(store, name)[1]
        vision.append(
            neck_pe(torch.zeros(1, *store.array(name).shape[1:], device=device, dtype=dtype)).to(
                dtype
            )
        )
    S = predictor.image_size
    mem_dim = predictor.memory_encoder.out_proj.weight.shape[0]
    mem_dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    dummy = torch.zeros(1, mem_dim, S // 16, S // 16, device=device, dtype=mem_dtype)
    return vision, predictor.memory_encoder.position_encoding(dummy).to(mem_dtype)


def new_state(
    predictor,
    num_frames: int,
    height: int,
    width: int,
    features: StoredFeatures,
    maskmem_pos_enc: torch.Tensor,
) -> dict:
    """An inference state as `SAM2VideoPredictor.init_state` makes it, with no frames held."""
    device = predictor.device
    return {
        "images": None,
        "num_frames": num_frames,
        "offload_video_to_cpu": False,
        "offload_state_to_cpu": False,
        "video_height": height,
        "video_width": width,
        "device": device,
        "storage_device": device,
        "point_inputs_per_obj": {},
        "mask_inputs_per_obj": {},
        "cached_features": features,
        "constants": {"maskmem_pos_enc": [maskmem_pos_enc]},
        "obj_id_to_idx": OrderedDict(),
        "obj_idx_to_id": OrderedDict(),
        "obj_ids": [],
        "output_dict_per_obj": {},
        "temp_output_dict_per_obj": {},
        "frames_tracked_per_obj": {},
    }


def apply_prompts(predictor, state: dict, prompts: list) -> None:
    """Add every prompt in file order through SAM 2's own API, then its preflight (which
    encodes the prompted frames' memories)."""
    for p in prompts:
        if p.mask is not None:
            predictor.add_new_mask(state, p.frame, p.object_id, p.mask)
        else:
            predictor.add_new_points_or_box(
                state,
                p.frame,
                p.object_id,
                points=None if p.points is None else np.array(p.points, dtype=np.float32),
                labels=None if p.labels is None else np.array(p.labels, dtype=np.int32),
                box=None if p.box is None else np.array(p.box, dtype=np.float32),
            )
    predictor.propagate_in_video_preflight(state)


class Tracker(Pass):
    """One pass (forward or reverse) of one group of objects over the chunks, memory carried
    between them. `slots`: the group's objects, contiguous slots of the tracking's objects
    (None: all of them); the group sees only its objects' prompts, as SAM 2 tracks each
    object alone (`stages.track.groups`)."""

    def __init__(
        self,
        predictor,
        store: RunStore,
        plan: ChunkPlan,
        direction: str,
        prompts: list,
        features: StoredFeatures,
        maskmem_pos_enc: torch.Tensor,
        supply: ChunkSupply,
        span: Span,
        options: dict = OPTIONS,
        on_commit=None,
        slots: list[int] | None = None,
    ):
        self.predictor, self.store, self.plan = predictor, store, plan
        self.direction, self.reverse = direction, direction == "reverse"
        every = prompt_file.object_ids(prompts)
        self.slots = list(range(len(every))) if slots is None else list(slots)
        self.ids = [every[s] for s in self.slots]
        prompts = [p for p in prompts if p.object_id in set(self.ids)]
        self.unit = (direction, self.slots[0])  # what the supply counts reads by
        self.prompts, self.features, self.pos = prompts, features, [maskmem_pos_enc]
        video = store.attrs["video"]
        self.height, self.width = video["height"], video["width"]
        self.span = span
        self.start = span.first(direction)
        self.threshold = float(options["score_threshold"])
        # "own": each object is tracked from its own first prompt (forward passes only)
        self.own = options["object_start"] == "own"
        self.object_batch = int(options.get("object_batch", 1))  # `stages.track.batch`
        if self.object_batch > 1 and predictor.non_overlap_masks_for_mem_enc:
            raise BadInput(
                "--object-batch: this model applies non-overlap to the masks it remembers, "
                "which would couple a batch's objects; track without it"
            )
        firsts = {}
        for p in prompts:
            firsts[p.object_id] = min(p.frame, firsts.get(p.object_id, p.frame))
        self.first = [firsts[i] if self.own else 0 for i in self.ids]
        self.on_commit, self.supply = on_commit, supply
        self.reach = Reach.of(predictor, plan.num_frames)
        self.shared = PerFrame.of(predictor)  # a frame's object-independent steps, once
        S = predictor.image_size
        self.memstore = MemoryStore(
            store,
            direction,
            self.reach,
            self.slots,
            plan.num_chunks,
            (maskmem_pos_enc.shape[1], S // 16, S // 16),
            (S // 4, S // 4),
            predictor.hidden_dim,
        )

    def restore(self, before: int | None) -> tuple[dict, TrackerMemory]:
        """A fresh SAM 2 state holding the memory as it was after chunk `before` (None: the
        pass's start, where the prompts are applied)."""
        memory = TrackerMemory(
            self.direction,
            self.plan.num_frames,
            self.start,
            self.start,
            [ObjectMemory(i) for i in self.ids],
        )
        state = new_state(
            self.predictor,
            self.plan.num_frames,
            self.height,
            self.width,
            self.features,
            self.pos[0],
        )
        if before is None:
            for k in self.supply.prompts_of(self.unit):
                self.supply.ensure(k)
            apply_prompts(self.predictor, state, self.prompts)
            self.supply.prompted(self.unit)
            for o, obj in enumerate(memory.objects):
                cond = state["output_dict_per_obj"][o]["cond_frame_outputs"]
                obj.prompted = {
                    t: FrameOutput.from_sam2(out, keep_logits=True) for t, out in cond.items()
                }
            self.memstore.write_prompted(memory)
        else:
            self.memstore.read(memory, before, self.predictor.device)
            lo, hi = self.plan.bounds(before)
            memory.next_frame = lo - 1 if self.reverse else hi
            for i in self.ids:  # object slots in SAM 2's order
                self.predictor._obj_id_to_idx(state, i)
        self.sync_state(state, memory)
        return state, memory

    def sync_state(self, state: dict, memory: TrackerMemory) -> None:
        """Point SAM 2's per-object output dicts at what `memory` holds."""
        for o, obj in enumerate(memory.objects):
            state["output_dict_per_obj"][o] = {
                "cond_frame_outputs": {t: out.as_sam2(self.pos) for t, out in obj.prompted.items()},
                "non_cond_frame_outputs": {
                    t: out.as_sam2(self.pos) for t, out in obj.recent.items()
                },
            }

    @torch.inference_mode()
    def track_chunk(self, k: int, restored: tuple, owned, bar) -> None:
        state, memory = restored
        lo, hi = self.plan.bounds(k)
        frames = self.span.frames_in(self.direction, lo, hi)
        self.load_features(k, lo, hi)
        O = len(memory.objects)
        # Masks are packed to bits on the device and go to a (pinned, on CUDA) host buffer
        # as each frame is done, asynchronously; scores stay on the device: one
        # synchronisation per chunk, none per frame. The buffer is an eighth of the chunk's
        # (C, O, H, W) bool masks, which are never held whole (see `write`).
        cuda = self.predictor.device.type == "cuda"
        host_masks = torch.zeros(
            (hi - lo, O, packed_size(self.height, self.width)), dtype=torch.uint8, pin_memory=cuda
        )
        frame_scores, frame_areas = {}, {}
        mine = np.zeros(hi - lo, bool)
        for f in frames:
            self.writer.failed()  # a failed write behind (disk full, a stop) stops the pass
            scores, logits = self.track_frame(f, state, memory)
            areas = []
            for o, video_res in self.video_res(state, logits):
                above = video_res[:, 0] > self.threshold
                areas.append(above.sum((1, 2)))  # on the device, like the scores
                host_masks[f - lo, o : o + len(above)].copy_(pack_bits(above), non_blocking=cuda)
            frame_scores[f] = torch.cat(scores).float()
            frame_areas[f] = torch.cat(areas)
            mine[f - lo] = owned(f)
            memory.next_frame = f + memory.step
            self.reach.prune(memory)
            self.sync_state(state, memory)
            bar.update(1)
        scores = chunk_scores(frame_scores, frames, lo, hi, O)
        areas = chunk_areas(frame_areas, frames, lo, hi, O)
        if cuda:
            torch.cuda.current_stream(self.predictor.device).synchronize()  # the mask copies
        snapshot = self.memstore.snapshot(memory)  # here: the memory moves on
        self.supply.tracked(self.unit, k)
        self.writer.submit(
            self.write,
            k,
            lo,
            host_masks.numpy(),
            scores,
            areas,
            mine,
            snapshot,
            then=lambda: self.supply.committed(k),
        )

    def track_frame(self, f: int, state: dict, memory: TrackerMemory) -> tuple[list, list]:
        """Every object's SAM 2 step on frame f, one after another as SAM 2 tracks them (a
        prompted frame's output is the stored one; under `--object-batch`, in batches:
        `stages.track.batch`), the frame's object-independent steps done once (`PerFrame`).
        Returns each object's score logits and low-res logits (None where it has not
        started)."""
        device = self.predictor.device
        scores, logits, todo = [], [], []
        for o in range(len(memory.objects)):
            cond = state["output_dict_per_obj"][o]["cond_frame_outputs"]
            if f < self.first[o]:  # not yet started: not tracked
                scores.append(torch.full((1,), float("nan"), device=device))
                logits.append(None)
            elif f in cond:
                scores.append(cond[f]["object_score_logits"].reshape(1))
                logits.append(cond[f]["pred_masks"])
            else:
                scores.append(None)
                logits.append(None)
                todo.append(o)
        with self.shared.frame():
            for objs in batches(todo, state, self.object_batch):
                for o, out, pred in self.step(f, state, objs):
                    state["output_dict_per_obj"][o]["non_cond_frame_outputs"][f] = out
                    memory.objects[o].recent[f] = FrameOutput.from_sam2(out, keep_logits=False)
                    scores[o] = out["object_score_logits"].reshape(1)
                    logits[o] = pred
        return scores, logits

    def step(self, f: int, state: dict, objs: list[int]):
        """SAM 2's step on frame f for the objects `objs` (one: as its predictor runs it;
        more: stacked, `stages.track.batch`); yields (slot, output, low-res logits)."""
        dicts = [state["output_dict_per_obj"][o] for o in objs]
        out, pred = self.predictor._run_single_frame_inference(
            inference_state=state,
            output_dict=dicts[0] if len(objs) == 1 else stacked(dicts, self.pos),
            frame_idx=f,
            batch_size=len(objs),
            is_init_cond_frame=False,
            point_inputs=None,
            mask_inputs=None,
            reverse=self.reverse,
            run_mem_encoder=True,
        )
        if len(objs) == 1:
            yield objs[0], out, pred
            return
        for i, o in enumerate(objs):
            yield o, one_of(out, i, self.pos), pred[i : i + 1]

    def video_res(self, state: dict, logits: list):
        """The frame's mask logits at the video's size, as (first slot, (n, 1, H, W))
        pieces. Objects tracked together go through SAM 2's `_get_orig_video_res_output` as
        its predictor does, one object at a time (bilinear upsampling computes each pixel
        of each object alone, so the logits are the batch's bit for bit; at 4K an object's
        are 33 MB, all objects' O times that); under non-overlap, which compares objects
        pixel by pixel, as one batch. Objects tracked from their own starts go one by one
        (each alone in its own state, as vos_inference tracks them), the absent ones at
        -1024, then non-overlap over all of them."""
        if not self.own:
            if not self.predictor.non_overlap_masks:
                for o, pred in enumerate(logits):
                    yield o, self.predictor._get_orig_video_res_output(state, pred)[1]
                return
            all_logits = torch.cat(logits, dim=0) if len(logits) > 1 else logits[0]
            yield 0, self.predictor._get_orig_video_res_output(state, all_logits)[1]
            return
        device = self.predictor.device
        rows = (
            torch.full((1, 1, self.height, self.width), ABSENT_LOGIT, device=device)
            if pred is None
            else self.predictor._get_orig_video_res_output(state, pred)[1].float()
            for pred in logits
        )
        if not self.predictor.non_overlap_masks:
            yield from enumerate(rows)
            return
        video_res = torch.cat(list(rows), dim=0)
        yield 0, self.predictor._apply_non_overlapping_constraints(video_res)


def chunk_scores(frame_scores: dict, frames: list[int], lo: int, hi: int, O: int) -> np.ndarray:
    """The chunk's (hi - lo, O) object scores on the host: NaN on the frames the pass skips."""
    scores = np.full((hi - lo, O), np.nan, np.float32)
    if frames:
        scores[[f - lo for f in frames]] = (
            torch.stack([frame_scores[f] for f in frames]).cpu().numpy()
        )
    return scores


def chunk_areas(frame_areas: dict, frames: list[int], lo: int, hi: int, O: int) -> np.ndarray:
    """The chunk's (hi - lo, O) mask areas (pixels) on the host: 0 on the frames the pass
    skips."""
    areas = np.zeros((hi - lo, O), np.int64)
    if frames:
        areas[[f - lo for f in frames]] = torch.stack([frame_areas[f] for f in frames]).cpu()
    return areas


def pack_bits(masks: torch.Tensor) -> torch.Tensor:
    """(O, H, W) bool -> (O, ceil(H*W/8)) uint8 on the masks' device, bit for bit
    `numpy.packbits` of each flattened mask (first pixel in the high bit, zero padding)."""
    flat = masks.reshape(masks.shape[0], -1).to(torch.uint8)
    pad = -flat.shape[1] % 8
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    groups = flat.view(flat.shape[0], -1, 8)
    out = groups[..., 0] * 128
    for bit in range(1, 8):
        out += groups[..., bit] * (128 >> bit)  # distinct bits: the sum is their OR
    return out


def shown_by(direction: str, pass_direction: str, start: int):
    """Which frames show this pass's masks: `both` takes reverse before the earliest prompt."""
    if direction != "both":
        return lambda f: True
    return (lambda f: f < start) if pass_direction == "reverse" else (lambda f: f >= start)
