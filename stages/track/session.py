"""A tracker hosted by Hugging Face transformers (EdgeTAM, SAM 3's tracker) driven one chunk at
a time: transformers' own model steps its own inference session frame by frame, as its
`propagate_in_video_iterator` does, but the session holds only the chunk's stored features
and, per object, what later frames read (the prompted frames' outputs, and the mask
memories and object pointers still in reach); that memory is saved at each chunk's end and
put back at the next chunk's start, here or after a restart.

The prompts go in as transformers' own usage adds them, one `add_inputs_to_inference_session`
and one model call on the prompt's frame per prompt, in file order (that call also steps the
objects already known on that frame, which a reverse pass later reads: kept as memory)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from segpipe import prompts as prompt_file
from segpipe.plan import ChunkPlan, Span
from segpipe.stages.track.passes import Pass
from segpipe.stages.track.supply import ChunkSupply
from segpipe.stages.track.tracker import chunk_areas, chunk_scores, pack_bits
from segpipe.store.masks import packed_size
from segpipe.store.runstore import RunStore

# what a tracked frame's output holds that later frames read (pred_masks: a prompted
# frame's, given back when the pass reaches it)
READ = ("object_pointer", "object_score_logits", "maskmem_features", "maskmem_pos_enc")
PROMPTED = (*READ, "pred_masks")


class VideoLength:
    """Stands in for a session's frames: its length is the video's (transformers reads the
    frame count from it), and no frame is held: the image encoder is never called."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, frame):
        raise RuntimeError(f"frame {frame} has no stored features loaded")


class StoredCache:
    """Stands in for a session's vision-feature cache: each frame's levels from the stored
    features (`StoredFeatures`, a chunk at a time), flattened as `get_image_features` gives
    them, with the positional encodings computed once."""

    def __init__(self, features, pos: list[torch.Tensor]):
        self.features, self.pos = features, pos

    def get_vision_features(self, frame_idx: int) -> dict:
        i = frame_idx - self.features.lo
        if not self.features.levels or not 0 <= i < len(self.features.levels[0]):
            self.features.load(frame_idx, frame_idx + 1)
            i = 0
        feats = [lvl[i : i + 1].flatten(2).permute(2, 0, 1) for lvl in self.features.levels]
        return {"vision_feats": feats, "vision_pos_embeds": list(self.pos)}

    def cache_vision_features(self, frame_idx: int, features: dict) -> None:
        raise RuntimeError("the session computed features: a stored frame was missing")

    def clear_all(self) -> None:
        pass


def positional_encodings(predictor) -> list[torch.Tensor]:
    """The vision levels' positional encodings as `get_image_features` gives them for one
    frame: the neck's sine encoding at each level's size, flattened (they depend on shapes
    alone)."""
    model = predictor.model
    width = model.config.vision_config.fpn_hidden_size
    out = []
    for h, w in predictor.segpipe_family.feature_sizes(predictor):
        shape = torch.Size((1, width, h, w))
        pe = model.vision_encoder.neck.position_encoding(shape, predictor.device, torch.float32)
        out.append(pe.to(torch.float32).flatten(2).permute(2, 0, 1))
    return out


def processor_for(family, image_size: int):
    """transformers' video processor for prompts alone (its coordinate and mask handling),
    made without its image and video processors, which need torchvision."""
    cls = family.processor_class()
    processor = cls.__new__(cls)
    processor.point_pad_value, processor.target_size = -10, image_size
    return processor


class SessionTracker(Pass):
    """One pass (forward or reverse) of every object over the chunks, memory carried between
    them. The objects go together: SAM 3's tracker encodes their memories as one batch."""

    def __init__(
        self,
        predictor,
        store: RunStore,
        plan: ChunkPlan,
        direction: str,
        prompts: list,
        features,
        supply: ChunkSupply,
        span: Span,
        options: dict,
        on_commit=None,
    ):
        self.predictor, self.model, self.store, self.plan = predictor, predictor.model, store, plan
        self.direction, self.reverse = direction, direction == "reverse"
        self.prompts, self.ids = prompts, prompt_file.object_ids(prompts)
        self.slots = list(range(len(self.ids)))
        self.unit = (direction, 0)
        video = store.attrs["video"]
        self.height, self.width = video["height"], video["width"]
        self.span, self.start = span, span.first(direction)
        self.threshold = float(options["score_threshold"])
        self.features, self.supply, self.on_commit = features, supply, on_commit
        self.cache = StoredCache(features, positional_encodings(predictor))
        self.pointers, self.memories = reach(self.model, plan.num_frames)
        self.memstore = SessionMemory(
            store, direction, len(self.ids), plan.num_chunks, self.pointers
        )

    def new_session(self):
        return new_session(
            self.predictor, self.plan.num_frames, self.height, self.width, self.cache
        )

    def restore(self, before: int | None):
        """A session holding the memory as it was after chunk `before` (None: the pass's
        start, where the prompts are added)."""
        session = self.new_session()
        if before is None:
            for k in self.supply.prompts_of(self.unit):
                self.supply.ensure(k)
            add_prompts(self.predictor, session, self.prompts)
            self.supply.prompted(self.unit)
            self.memstore.write_prompted(session)
            self.prune(session, self.start)
            return session
        for i in self.ids:  # the objects in the session's order
            session.obj_id_to_idx(i)
        self.memstore.read(session, before, self.predictor.device)
        return session

    def prune(self, session, next_frame: int) -> None:
        prune(session, next_frame, self.reverse, self.pointers, self.memories)

    @torch.inference_mode()
    def track_chunk(self, k: int, session, owned, bar) -> None:
        lo, hi = self.plan.bounds(k)
        frames = self.span.frames_in(self.direction, lo, hi)
        self.load_features(k, lo, hi)
        O = len(self.ids)
        assert session.obj_ids == self.ids, "the session's objects are not in slot order"
        cuda = self.predictor.device.type == "cuda"
        host_masks = torch.zeros(
            (hi - lo, O, packed_size(self.height, self.width)), dtype=torch.uint8, pin_memory=cuda
        )
        frame_scores, frame_areas = {}, {}
        mine = np.zeros(hi - lo, bool)
        for f in frames:
            self.writer.failed()
            out = self.model(inference_session=session, frame_idx=f, reverse=self.reverse)
            above = video_masks(out, self.height, self.width, self.threshold)
            host_masks[f - lo].copy_(pack_bits(above), non_blocking=cuda)
            frame_scores[f] = out.object_score_logits.float().reshape(O)
            frame_areas[f] = above.sum((1, 2))
            mine[f - lo] = owned(f)
            self.prune(session, f + (-1 if self.reverse else 1))
            bar.update(1)
        scores = chunk_scores(frame_scores, frames, lo, hi, O)
        areas = chunk_areas(frame_areas, frames, lo, hi, O)
        if cuda:
            torch.cuda.current_stream(self.predictor.device).synchronize()
        snapshot = self.memstore.snapshot(session, self.ids)
        self.supply.tracked(self.unit, k)
        self.writer.submit(
            self.write, k, lo, host_masks.numpy(), scores, areas, mine, snapshot,
            then=lambda: self.supply.committed(k),
        )  # fmt: skip


def reach(model, num_frames: int) -> tuple[int, int]:
    """(pointers, memories): how many tracked frames back a frame reads object pointers and
    mask memories from (`max_object_pointers_in_encoder - 1`, `num_maskmem - 1`)."""
    config = model.config
    pointers = max(min(num_frames, config.max_object_pointers_in_encoder) - 1, 1)
    return pointers, max(config.num_maskmem - 1, 1)


def prune(session, next_frame: int, reverse: bool, pointers: int, memories: int) -> None:
    """Drop from every object's tracked outputs what no frame from `next_frame` on reads
    (transformers keeps them all): mask memories of the last `memories` frames, object
    pointers of the last `pointers`, nothing else (`reach`)."""
    for outputs in session.output_dict_per_obj.values():
        tracked = outputs["non_cond_frame_outputs"]
        for t in list(tracked):
            back = (t - next_frame) if reverse else (next_frame - t)
            if not 1 <= back <= pointers:
                del tracked[t]
                continue
            keep = READ if back <= memories else POINTER
            tracked[t] = {k: v for k, v in tracked[t].items() if k in keep}


def new_session(predictor, num_frames: int, height: int, width: int, cache: StoredCache):
    """transformers' inference session for a video of `num_frames` frames at height x width,
    holding no frame: its features come from `cache`."""
    session = empty_session(predictor, height, width, VideoLength(num_frames))
    session.cache = cache
    return session


def empty_session(predictor, height: int, width: int, frames):
    """transformers' inference session of the predictor's family at height x width, holding
    no frame: `frames` stands in for them (their count, and what a frame's lookup gives)."""
    session = predictor.session_class(
        video=None,
        video_height=height,
        video_width=width,
        inference_device=predictor.device,
        inference_state_device=predictor.device,
        video_storage_device=predictor.device,
        dtype=torch.float32,
    )
    session.processed_frames = frames
    return session


class OneFrame:
    """Features of one frame (encoded now, not stored), as `StoredFeatures` serves them."""

    def __init__(self, f: int, levels: list[torch.Tensor]):
        self.lo, self.levels = f, levels

    def load(self, lo: int, hi: int) -> None:
        raise RuntimeError(f"only frame {self.lo} is held")


@torch.inference_mode()
def preview(predictor, store: RunStore, prompts: list, features, threshold: float):
    """One object's mask (H, W) bool and score logit on one frame from its prompts there, as
    transformers' session makes it when they are added (each prompt, then the model on the
    frame); `features`: the stored ones (`StoredFeatures`) or the frame's (`OneFrame`)."""
    video = store.attrs["video"]
    H, W = video["height"], video["width"]
    cache = StoredCache(features, positional_encodings(predictor))
    session = new_session(predictor, store.plan.num_frames, H, W, cache)
    processor = processor_for(predictor.segpipe_family, predictor.image_size)
    for p in prompts:
        add_prompt(processor, session, p)
        out = predictor.model(inference_session=session, frame_idx=p.frame)
    mask = video_masks(out, H, W, threshold)[0]
    return mask.cpu().numpy(), float(out.object_score_logits.reshape(-1)[0])


def video_masks(out, height: int, width: int, threshold: float) -> torch.Tensor:
    """Every object's mask (O, H, W) bool from a frame's output, at the video's size as
    transformers' `post_process_masks` makes it."""
    logits = F.interpolate(out.pred_masks, (height, width), mode="bilinear", align_corners=False)
    return logits[:, 0] > threshold


@torch.inference_mode()
def add_prompts(predictor, session, prompts: list) -> None:
    """The prompts added to a session as transformers' own usage adds them: each through
    its processor, then the model on the prompt's frame, in file order."""
    processor = processor_for(predictor.segpipe_family, predictor.image_size)
    for p in prompts:
        add_prompt(processor, session, p)
        predictor.model(inference_session=session, frame_idx=p.frame)
    assert not session.obj_with_new_inputs, "a prompt was not taken"


def add_prompt(processor, session, p) -> None:
    """One segpipe prompt through transformers' `add_inputs_to_inference_session`."""
    if p.mask is not None:
        processor.add_inputs_to_inference_session(
            session, p.frame, p.object_id, input_masks=np.asarray(p.mask, bool)
        )
        return
    processor.add_inputs_to_inference_session(
        session,
        p.frame,
        p.object_id,
        input_points=None if p.points is None else [[[list(map(float, q)) for q in p.points]]],
        input_labels=None if p.labels is None else [[list(map(int, p.labels))]],
        input_boxes=None if p.box is None else [[list(map(float, p.box))]],
    )


# -- zarr form -----------------------------------------------------------------------------
# Under memory/<direction>/session/: prompted_frame (O, K) and prompted_<key> (O, K, bytes);
# per chunk boundary recent_frame (chunks, O, W), recent_memory (chunks, O, W: whether the
# mask memory is kept) and recent_<key> (chunks, O, W, bytes) for the keys of `STORED`.
# Tensors are stored as their raw bytes, their dtype and shapes in the array's attributes:
# bit for bit, whatever the family's shapes. A mask memory's positional encoding depends on
# its shape alone: stored with the prompted outputs, and checked equal at every snapshot.
STORED = ("object_pointer", "object_score_logits", "maskmem_features")
POINTER = ("object_pointer", "object_score_logits")


def raw_bytes(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def from_raw(a: np.ndarray, dtype: str, shape: list, device) -> torch.Tensor:
    flat = torch.from_numpy(np.ascontiguousarray(a)).view(getattr(torch, dtype))
    return flat.reshape(shape).to(device)


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class SessionMemory:
    """Reads and writes a pass's session memory under `memory/<direction>/session/`."""

    def __init__(self, store: RunStore, direction: str, objects: int, num_chunks: int, width: int):
        self.store, self.objects, self.num_chunks, self.width = store, objects, num_chunks, width
        self.root = f"memory/{direction}/session"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def write_prompted(self, session) -> None:
        """Every object's prompted outputs, each entry's shape recorded (a mask prompt's
        score has another shape than a click's in EdgeTAM)."""
        conds = [session.output_dict_per_obj[o]["cond_frame_outputs"] for o in range(self.objects)]
        K = max(len(c) for c in conds)
        frame = np.full((self.objects, K), -1, np.int32)
        datas, kinds = {}, {}
        for o, cond in enumerate(conds):
            for j, (t, out) in enumerate(sorted(cond.items())):
                frame[o, j] = t
                for key in PROMPTED:
                    b = raw_bytes(out[key])
                    if key not in datas:
                        datas[key] = np.zeros((self.objects, K, b.size), np.uint8)
                        kinds[key] = {
                            "dtype": dtype_name(out[key]),
                            "shapes": [[None] * K for _ in conds],
                        }
                    assert kinds[key]["dtype"] == dtype_name(out[key]), f"{key}: dtypes differ"
                    datas[key][o, j] = b
                    kinds[key]["shapes"][o][j] = list(out[key].shape)
        self._create("prompted_frame", frame)
        for key, data in datas.items():
            self._create(f"prompted_{key}", data, kinds[key])

    def _create(self, name: str, data: np.ndarray, attrs: dict | None = None) -> None:
        path = self.path(name)
        arr = self.store.create_array(
            path, data.shape, data.shape, data.dtype, overwrite=True, attributes=attrs
        )
        arr[...] = data
        self.store.commit_array(path)

    def snapshot(self, session, ids: list[int]) -> dict:
        """Every object's tracked outputs in reach, on the host (taken on the tracking
        thread: the session moves on)."""
        out = {}
        for o in range(self.objects):
            outputs = session.output_dict_per_obj[o]
            pos = next(iter(outputs["cond_frame_outputs"].values()))["maskmem_pos_enc"]
            entries = {}
            for t, entry in sorted(outputs["non_cond_frame_outputs"].items()):
                if "maskmem_pos_enc" in entry:
                    assert torch.equal(entry["maskmem_pos_enc"], pos), "a frame's own encoding"
                entries[t] = {k: (raw_bytes(v), v) for k, v in entry.items() if k in STORED}
            out[session.obj_idx_to_id(o)] = entries
        return {"objects": [out[i] for i in ids]}

    def write_snapshot(self, chunk: int, snapshot: dict) -> list[str]:
        """Write the snapshot after `chunk`; returns the arrays to commit."""
        objects, W = snapshot["objects"], self.width
        frame = np.full((1, self.objects, W), -1, np.int32)
        memory = np.zeros((1, self.objects, W), bool)
        datas, kinds = {}, {}
        for o, tracked in enumerate(objects):
            assert len(tracked) <= W, "memory in reach wider than its slots"
            for j, (t, entry) in enumerate(tracked.items()):
                frame[0, o, j], memory[0, o, j] = t, "maskmem_features" in entry
                for key, (b, like) in entry.items():
                    kind = {"dtype": dtype_name(like), "shape": list(like.shape)}
                    if key not in datas:
                        datas[key] = np.zeros((1, self.objects, W, b.size), np.uint8)
                        kinds[key] = kind
                    assert kinds[key] == kind, f"{key}: {kinds[key]} then {kind}"
                    datas[key][0, o, j] = b
        written = [
            self._put("recent_frame", chunk, frame),
            self._put("recent_memory", chunk, memory),
        ]
        for key in STORED:  # every array, every chunk: a row with nothing in reach is zeros
            if key not in datas:  # (as wide as a prompted output: the same tensors)
                width = self.store.array(self.path(f"prompted_{key}")).shape[-1]
                datas[key] = np.zeros((1, self.objects, W, width), np.uint8)
            written.append(self._put(f"recent_{key}", chunk, datas[key], kinds.get(key)))
        return written

    def _put(self, name: str, chunk: int, data: np.ndarray, attrs: dict | None = None) -> str:
        """Chunk `chunk`'s row of array `name` (made at its first write; `attrs`, the
        tensors' dtype and shape, recorded once known: before the first row holding one)."""
        path = self.path(name)
        arr = self.store.array(path)
        if arr is None:
            arr = self.store.create_array(
                path,
                (self.num_chunks, *data.shape[1:]),
                (1, *data.shape[1:]),
                data.dtype,
                fill_value=-1 if data.dtype == np.int32 else 0,
                attributes=attrs,
            )
        elif attrs is not None and not arr.attrs.get("dtype"):
            arr.attrs.update(attrs)
        elif attrs is not None and dict(arr.attrs) != attrs:
            raise AssertionError(f"{path}: {dict(arr.attrs)} stored, {attrs} now")
        arr[chunk : chunk + 1] = data
        return path

    def read(self, session, chunk: int, device) -> None:
        """Fill the session's per-object outputs from the prompted outputs and the snapshot
        after `chunk`."""
        frames = self.store.read(self.path("prompted_frame"))
        prompted = {k: self._array(f"prompted_{k}") for k in PROMPTED}
        recent_frame = self.store.read(self.path("recent_frame"), chunk, chunk + 1)[0]
        recent_memory = self.store.read(self.path("recent_memory"), chunk, chunk + 1)[0]
        recent = {
            k: self._array(f"recent_{k}", chunk)
            for k in STORED
            if self.store.array(self.path(f"recent_{k}")) is not None
        }
        for o in range(self.objects):
            outputs = session.output_dict_per_obj[o]
            for j, t in enumerate(frames[o]):
                if t >= 0:
                    outputs["cond_frame_outputs"][int(t)] = {
                        k: from_raw(data[o, j], attrs["dtype"], attrs["shapes"][o][j], device)
                        for k, (data, attrs) in prompted.items()
                    }
            pos = next(iter(outputs["cond_frame_outputs"].values()))["maskmem_pos_enc"]
            for j, t in enumerate(recent_frame[o]):
                if t < 0:
                    continue
                keys = STORED if recent_memory[o, j] else POINTER
                entry = {
                    k: from_raw(
                        recent[k][0][o, j], recent[k][1]["dtype"], recent[k][1]["shape"], device
                    )
                    for k in keys
                }
                if recent_memory[o, j]:
                    entry["maskmem_pos_enc"] = pos
                outputs["non_cond_frame_outputs"][int(t)] = entry

    def _array(self, name: str, chunk: int | None = None):
        path = self.path(name)
        attrs = dict(self.store.array(path).attrs)
        data = (
            self.store.read(path) if chunk is None else self.store.read(path, chunk, chunk + 1)[0]
        )
        return data, attrs
