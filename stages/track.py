"""Track stage: SAM 2 video tracking chunk by chunk, from stored embeddings.

Semantics are exactly `SAM2VideoPredictor` with all prompts added up front: the forward pass
runs from the earliest prompted frame to the last frame, the reverse pass from it back to
frame 0, each from a fresh state; masks are its outputs' logits above the score threshold.
With `object_start="own"` each object is tracked forward from its own first prompt, alone,
as SAM 2's vos_inference tracks objects that appear later in a video. SAM 2's own methods do the work (`add_new_points_or_box`,
`add_new_mask`, `propagate_in_video_preflight`, `_run_single_frame_inference`,
`_get_orig_video_res_output`); segpipe supplies the stored features through the predictor's
feature cache and carries `TrackerMemory` across chunks, so masks are bit-identical to the
predictor tracking the whole video in memory.
"""
from __future__ import annotations

import importlib.util
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from segpipe import log
from segpipe import prompts as prompt_file
from segpipe.chunks import (ChunkPlan, pass_chunks, pass_frame_count_in, pass_frames_in,
                             passes, untracked_chunks)
from segpipe.errors import BadInput, StoreNotReady
from segpipe.model import (autocast, build_model, for_workers, made_by_shipped_weights,
                           pick_device, resolve_weights, tracking_options)
from segpipe.lock import holds_store_lock
from segpipe.maskio import mask_chunks, packed_size, write_fill, write_packed
from segpipe.store import TRACK_ARRAYS, RunStore, reset_from
from segpipe.track_settings import ABSENT_LOGIT, OPTIONS, pick_options, stored_settings
from segpipe.stages.encode import (LEVELS, check_model, from_storage, model_spec, require_decoded,
                           restore_layout)
from segpipe.stages.memory import FrameOutput, MemoryStore, ObjectMemory, Reach, TrackerMemory
from segpipe.stages.decode import stored_source
from segpipe.stages.supply import ChunkSupply, pass_todo, say_cost
from segpipe.retention import on_disk, sweep

DIRECTIONS = ("both", "forward", "reverse")


class StoredFeatures(dict):
    """Stands in for the predictor's `cached_features`: every lookup is a hit, served from the
    chunk of stored embeddings currently loaded, so the image encoder is never called. Each
    level comes back in the dtype and memory layout SAM 2 computed it in; the next chunk is
    read from the store while the current one is tracked."""

    def __init__(self, store: RunStore, device, pos_enc: list[torch.Tensor]):
        super().__init__()
        self.store, self.device, self.pos_enc = store, device, pos_enc
        self.lo, self.levels = 0, []
        self.kinds = [level_kind(store, n) for n in LEVELS]
        self.dummy_image = torch.zeros(1, 3, 1, 1, device=device)
        self.reader = ThreadPoolExecutor(1)
        self.ahead = None  # ((lo, hi), future of the host tensors)

    def _read(self, lo: int, hi: int) -> list[torch.Tensor]:
        host = []
        for name, (stored, computed, _) in zip(LEVELS, self.kinds):
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
            feats = feats.to(self.device, non_blocking=True)
            self.levels.append(restore_layout(feats, layout))

    def get(self, frame_idx, default=None):
        i = frame_idx - self.lo
        if not self.levels or not 0 <= i < len(self.levels[0]):
            self.load(frame_idx, frame_idx + 1)
            i = 0
        backbone = {"backbone_fpn": [lvl[i:i + 1] for lvl in self.levels],
                    "vision_pos_enc": list(self.pos_enc)}
        return self.dummy_image, backbone


def level_kind(store: RunStore, name: str) -> tuple[str, torch.dtype, str]:
    """(stored dtype, dtype SAM 2 computed the level in, memory layout) of a feature level."""
    attrs = store.array(name).attrs
    return (attrs["embedding_dtype"], getattr(torch, attrs.get("torch_dtype", "float32")),
            attrs.get("memory_format", "contiguous"))


def positional_encodings(predictor, store: RunStore, precision: str
                         ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The image encoder's and the memory encoder's positional encodings, which depend only
    on feature shapes, computed as `FpnNeck` and `MemoryEncoder` do: cast to the dtype of the
    features they go with (under bfloat16 autocast, bfloat16 for all but one level)."""
    device = predictor.device
    neck_pe = predictor.image_encoder.neck.position_encoding
    vision = []
    for name in LEVELS:
        dtype = level_kind(store, name)[1]
        vision.append(neck_pe(torch.zeros(1, *store.array(name).shape[1:], device=device,
                                          dtype=dtype)).to(dtype))
    S = predictor.image_size
    mem_dim = predictor.memory_encoder.out_proj.weight.shape[0]
    mem_dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    dummy = torch.zeros(1, mem_dim, S // 16, S // 16, device=device, dtype=mem_dtype)
    return vision, predictor.memory_encoder.position_encoding(dummy).to(mem_dtype)


def new_state(predictor, num_frames: int, height: int, width: int, features: StoredFeatures,
              maskmem_pos_enc: torch.Tensor) -> dict:
    """An inference state as `SAM2VideoPredictor.init_state` makes it, with no frames held."""
    device = predictor.device
    return {
        "images": None, "num_frames": num_frames, "offload_video_to_cpu": False,
        "offload_state_to_cpu": False, "video_height": height, "video_width": width,
        "device": device, "storage_device": device, "point_inputs_per_obj": {},
        "mask_inputs_per_obj": {}, "cached_features": features,
        "constants": {"maskmem_pos_enc": [maskmem_pos_enc]},
        "obj_id_to_idx": OrderedDict(), "obj_idx_to_id": OrderedDict(), "obj_ids": [],
        "output_dict_per_obj": {}, "temp_output_dict_per_obj": {}, "frames_tracked_per_obj": {},
    }


def apply_prompts(predictor, state: dict, prompts: list) -> None:
    """Add every prompt in file order through SAM 2's own API, then its preflight (which
    encodes the prompted frames' memories)."""
    for p in prompts:
        if p.mask is not None:
            predictor.add_new_mask(state, p.frame, p.object_id, p.mask)
        else:
            predictor.add_new_points_or_box(
                state, p.frame, p.object_id,
                points=None if p.points is None else np.array(p.points, dtype=np.float32),
                labels=None if p.labels is None else np.array(p.labels, dtype=np.int32),
                box=None if p.box is None else np.array(p.box, dtype=np.float32))
    predictor.propagate_in_video_preflight(state)


class Tracker:
    """One pass (forward or reverse) over the chunks, memory carried between them."""

    def __init__(self, predictor, store: RunStore, plan: ChunkPlan, direction: str,
                 prompts: list, features: StoredFeatures, maskmem_pos_enc: torch.Tensor,
                 supply: ChunkSupply, options: dict = OPTIONS, on_commit=None):
        self.predictor, self.store, self.plan = predictor, store, plan
        self.direction, self.reverse = direction, direction == "reverse"
        self.prompts, self.features, self.pos = prompts, features, [maskmem_pos_enc]
        video = store.attrs["video"]
        self.height, self.width = video["height"], video["width"]
        self.ids = prompt_file.object_ids(prompts)
        self.start = min(p.frame for p in prompts)
        self.threshold = float(options["score_threshold"])
        # "own": each object is tracked from its own first prompt (forward passes only)
        self.own = options["object_start"] == "own"
        firsts = {}
        for p in prompts:
            firsts[p.object_id] = min(p.frame, firsts.get(p.object_id, p.frame))
        self.first = [firsts[i] if self.own else 0 for i in self.ids]
        self.on_commit, self.supply = on_commit, supply
        self.reach = Reach.of(predictor, plan.num_frames)
        S = predictor.image_size
        self.memstore = MemoryStore(store, direction, self.reach, len(self.ids), plan.num_chunks,
                                    (maskmem_pos_enc.shape[1], S // 16, S // 16), (S // 4, S // 4),
                                    predictor.hidden_dim)
        self.stage = f"track_{direction}"

    def chunks(self) -> list[int]:
        return pass_chunks(self.plan, self.direction, self.start)

    def run(self, owned, quiet: bool) -> None:
        """Track every chunk of the pass not yet done; write masks for the frames
        `owned(frame)` gives to this pass. Chunks left to do need not be contiguous (a
        repair): each starts from the memory snapshot of the chunk before it."""
        chunks = self.chunks()
        todo = self.store.ledger(self.stage).todo(chunks)
        previous = dict(zip(chunks[1:], chunks))  # the chunk the pass visits before each
        self.after = dict(zip(todo, todo[1:]))  # the chunk to read ahead while one is tracked
        total = sum(pass_frame_count_in(self.direction, self.start, *self.plan.bounds(k))
                    for k in todo)
        state = memory = after = None
        with log.progress(f"track {self.direction}", total, quiet) as bar:
            for k in todo:
                self.supply.ensure(k)
                before = previous.get(k)
                if state is None or after != before:
                    state, memory = self.restore(before)
                self.track_chunk(k, state, memory, owned, bar)
                if self.on_commit is not None:  # once the chunk's buffers are freed
                    self.on_commit(self.direction, k)
                after = k
        self.supply.finished(self.direction)

    def restore(self, before: int | None) -> tuple[dict, TrackerMemory]:
        """A fresh SAM 2 state holding the memory as it was after chunk `before` (None: the
        pass's start, where the prompts are applied)."""
        memory = TrackerMemory(self.direction, self.plan.num_frames, self.start, self.start,
                               [ObjectMemory(i) for i in self.ids])
        state = new_state(self.predictor, self.plan.num_frames, self.height, self.width,
                          self.features, self.pos[0])
        if before is None:
            for k in self.supply.prompt_chunks:
                self.supply.ensure(k)
            apply_prompts(self.predictor, state, self.prompts)
            self.supply.prompted(self.direction)
            for o, obj in enumerate(memory.objects):
                cond = state["output_dict_per_obj"][o]["cond_frame_outputs"]
                obj.prompted = {t: FrameOutput.from_sam2(out, keep_logits=True)
                                for t, out in cond.items()}
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
                "non_cond_frame_outputs": {t: out.as_sam2(self.pos) for t, out in obj.recent.items()},
            }

    @torch.inference_mode()
    def track_chunk(self, k: int, state: dict, memory: TrackerMemory, owned, bar) -> None:
        lo, hi = self.plan.bounds(k)
        frames = pass_frames_in(self.direction, self.start, lo, hi)
        self.features.load(lo, hi)
        if k in self.after and self.supply.has(self.after[k]):
            self.features.read_ahead(*self.plan.bounds(self.after[k]))
        O = len(memory.objects)
        # Masks are packed to bits on the device and go to a (pinned, on CUDA) host buffer
        # as each frame is done, asynchronously; scores stay on the device: one
        # synchronisation per chunk, none per frame. The buffer is an eighth of the chunk's
        # (C, O, H, W) bool masks, which are never held whole (see `write`).
        cuda = self.predictor.device.type == "cuda"
        host_masks = torch.zeros((hi - lo, O, packed_size(self.height, self.width)),
                                 dtype=torch.uint8, pin_memory=cuda)
        frame_scores = {}
        mine = np.zeros(hi - lo, bool)
        for f in frames:
            scores = []
            logits = []
            for o, obj in enumerate(memory.objects):
                if f < self.first[o]:  # not yet started: not tracked
                    scores.append(torch.full((1,), float("nan"), device=self.predictor.device))
                    logits.append(None)
                    continue
                out_dict = state["output_dict_per_obj"][o]
                if f in out_dict["cond_frame_outputs"]:
                    out = out_dict["cond_frame_outputs"][f]
                    pred = out["pred_masks"]
                else:
                    out, pred = self.predictor._run_single_frame_inference(
                        inference_state=state, output_dict=out_dict, frame_idx=f, batch_size=1,
                        is_init_cond_frame=False, point_inputs=None, mask_inputs=None,
                        reverse=self.reverse, run_mem_encoder=True)
                    out_dict["non_cond_frame_outputs"][f] = out
                    obj.recent[f] = FrameOutput.from_sam2(out, keep_logits=False)
                scores.append(out["object_score_logits"].reshape(1))
                logits.append(pred)
            for o, video_res in self.video_res(state, logits):
                masks = pack_bits(video_res[:, 0] > self.threshold)
                host_masks[f - lo, o:o + len(masks)].copy_(masks, non_blocking=cuda)
            frame_scores[f] = torch.cat(scores).float()
            mine[f - lo] = owned(f)
            memory.next_frame = f + memory.step
            self.reach.prune(memory)
            self.sync_state(state, memory)
            bar.update(1)
        scores = np.full((hi - lo, O), np.nan, np.float32)
        if frames:
            scores[[f - lo for f in frames]] = torch.stack([frame_scores[f] for f in frames]).cpu().numpy()
        if cuda:
            torch.cuda.current_stream(self.predictor.device).synchronize()  # the mask copies
        self.write(k, lo, host_masks.numpy(), scores, mine, memory)

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
        rows = (torch.full((1, 1, self.height, self.width), ABSENT_LOGIT, device=device)
                if pred is None else
                self.predictor._get_orig_video_res_output(state, pred)[1].float()
                for pred in logits)
        if not self.predictor.non_overlap_masks:
            yield from enumerate(rows)
            return
        video_res = torch.cat(list(rows), dim=0)
        yield 0, self.predictor._apply_non_overlapping_constraints(video_res)

    def write(self, k, lo, packed, scores, mine, memory) -> None:
        """Write the chunk's results (masks from `packed`, unpacked one zarr chunk, so one
        object, at a time) and its memory snapshot, then commit it."""
        self.store.check_lease()  # a Dask task of a run taken over writes nothing
        idx = np.nonzero(mine)[0]
        if len(idx):
            a, b = lo + idx[0], lo + idx[-1] + 1  # owned frames are contiguous
            write_packed(self.store, a, b, packed[idx[0]:idx[-1] + 1])
            self.store.array("object_scores")[a:b] = scores[idx[0]:idx[-1] + 1]
            self.store.array("tracked")[a:b] = True
        written = self.memstore.write_snapshot(k, memory)
        self.store.commit(self.stage, k, list(TRACK_ARRAYS) + written)
        self.supply.release(self.direction, k)


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


def tracking_settings(prompts: list, direction: str, options: dict) -> dict:
    """What the store records of a tracking (`track` attribute): changing any of it tracks
    anew."""
    entries, _ = prompt_file.to_record(prompts)
    return {"prompts_sha256": prompt_file.digest(prompts), "direction": direction,
            "object_ids": prompt_file.object_ids(prompts),
            "start_frame": min(p.frame for p in prompts), "prompts": entries,
            "options": options}


def prepare(store: RunStore, prompts: list, settings: dict, again: bool, quiet: bool) -> None:
    """With `again` (the settings changed, or `force`), discard the old tracking and make
    the arrays. The new settings are recorded last (see `reset_from`)."""
    if not again:
        return
    T, C = store.attrs["frame_count"], store.attrs["chunk_size"]
    _, masks = prompt_file.to_record(prompts)
    if store.attrs.get("track") is not None:
        log.info("track: starting over (prompts, direction or options changed, or --force)", quiet)
    reset_from(store, "track")
    O = len(settings["object_ids"])
    H, W = store.attrs["video"]["height"], store.attrs["video"]["width"]
    # one zarr chunk per object and band of rows: one in RAM is small, whatever the objects
    store.create_array("masks", (T, O, H, W), mask_chunks(C, H, W), "bool", fill_value=False,
                       attributes={"object_ids": settings["object_ids"]})
    store.create_array("object_scores", (T, O), (C, O), "float32", fill_value=np.nan)
    store.create_array("tracked", (T,), (C,), "bool", fill_value=False)
    if len(masks):
        store.create_array("prompt_masks", masks.shape, masks.shape, "bool", fill_value=False)[...] = masks
        store.commit_array("prompt_masks")
    write_untracked(store, untracked_chunks(ChunkPlan(T, C), settings["direction"],
                                            settings["start_frame"]))
    store.set_attrs(track=settings)


def write_untracked(store: RunStore, chunks) -> None:
    """Write the chunks no pass reaches as untracked (no masks, NaN scores): every chunk of
    the results then exists, and reads back as untracked rather than missing. They need no
    ledger: they are written before the tracking settings are recorded (`prepare`)."""
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    scores, tracked = store.array("object_scores"), store.array("tracked")
    for k in chunks:
        lo, hi = plan.bounds(k)
        write_fill(store, lo, hi)  # one zarr chunk (object) at a time
        scores[lo:hi] = np.nan
        tracked[lo:hi] = False
        store.sync_chunk(TRACK_ARRAYS, k)


def stored_prompts(store: RunStore) -> list:
    settings = store.attrs.get("track")
    if settings is None:
        raise StoreNotReady(f"store {store.path} has no prompts yet: pass --prompts")
    masks = store.read("prompt_masks") if store.array("prompt_masks") is not None else None
    return prompt_file.from_record(settings["prompts"], masks)


@holds_store_lock
def track(store_path, prompts=None, direction: str | None = None, device: str = "auto",
          checkpoint: str | None = None, quiet: bool = False, predictor=None,
          force: bool = False, postprocessing: bool | None = None,
          non_overlap: bool | None = None, score_threshold: float | None = None,
          object_start: str | None = None, on_commit=None, batch_size: int = 1,
          cluster=None) -> RunStore:
    """Track from `prompts` (a file path, entries or `Prompt`s), or (without them) from the
    prompts stored by the last track, resuming or repairing whatever is not done.

    Options left None are the store's (else `OPTIONS`). `on_commit(direction, chunk)` is
    called after each chunk a pass commits (`run` and the dataset command export it then).
    Chunks without features on disk (not encoded yet, or dropped under `--keep masks`) are
    encoded as the passes reach them, in `batch_size` frames (see `supply`). With `cluster`
    (`segpipe.cluster`), the passes run on Dask workers (`segpipe.units`)."""
    store = RunStore.open(store_path)
    T = require_decoded(store)
    direction = direction or (store.attrs.get("track") or {}).get("direction", "both")
    if direction not in DIRECTIONS:
        raise BadInput(f"--direction must be one of {', '.join(DIRECTIONS)}")
    plan = ChunkPlan(T, store.attrs["chunk_size"])
    spec = store.attrs.get("model")
    if spec is None:
        raise StoreNotReady(f"store {store.path} is not encoded yet (run `segpipe encode`)")
    video = store.attrs["video"]
    prompts = (stored_prompts(store) if prompts is None
               else prompt_file.load(prompts, T, video["width"], video["height"]))
    seed = spec["weights"].get("random_seed")
    if seed is None and checkpoint is None and not made_by_shipped_weights(spec):
        raise BadInput("the embeddings were made from a checkpoint: pass the same --checkpoint")
    weights = resolve_weights(spec["name"], checkpoint, seed)
    precision = spec.get("precision", "float32")
    check_model(store, model_spec(store, spec["name"], weights, spec["embedding_dtype"], precision))
    options = pick_options(store, direction, postprocessing=postprocessing,
                           non_overlap=non_overlap, score_threshold=score_threshold,
                           object_start=object_start)
    if seed is not None:
        log.warn("random weights: masks from them mean nothing")
    if predictor is not None:
        made = tracking_options(predictor)
        wanted = {k: options[k] for k in made}
        if made != wanted:
            raise BadInput(f"the predictor given was built with {made}, the tracking asks for {wanted}")
    start = min(p.frame for p in prompts)
    settings = tracking_settings(prompts, direction, options)
    again = force or stored_settings(store) != settings  # then every chunk is tracked anew
    needed = {d: pass_chunks(plan, d, start) if again
              else store.ledger(f"track_{d}").todo(pass_chunks(plan, d, start))
              for d in passes(direction)}
    if not set(ChunkSupply.missing(store, needed)) <= on_disk(store, "frames"):
        stored_source(store)  # before anything changes: the source must be there
    prepare(store, prompts, settings, again, quiet)
    pending = [d for d in passes(direction)
               if store.ledger(f"track_{d}").count() < len(pass_chunks(plan, d, start))]
    if not pending:
        sweep(store)
        log.info("track: already complete", quiet)
        return store
    if cluster is not None:
        from segpipe.units import track as track_on
        track_on(cluster, store, pending,
                 cluster.work(store_path, for_workers(checkpoint, weights), device, batch_size),
                 on_commit, quiet)
    else:
        if predictor is None:
            predictor = build_model(spec["name"], spec["image_size"], weights,
                                    pick_device(device), postprocessing=options["postprocessing"],
                                    non_overlap=options["non_overlap"])
        run_passes(store, predictor, prompts, pending, on_commit, batch_size, quiet)
    sweep(store)  # under --keep masks: what a crash left between a chunk's last use and its drop
    if importlib.util.find_spec("sam2._C") is None:
        log.info("note: sam2 has no _C extension here, so small-hole filling was skipped "
                 "(as SAM 2's own predictor does)", quiet)
    log.info(f"track: masks for {len(prompt_file.object_ids(prompts))} objects in {store.path}", quiet)
    return store


def run_passes(store: RunStore, predictor, prompts: list, pending: list[str], on_commit=None,
               batch_size: int = 1, quiet: bool = False) -> None:
    """Run the passes `pending` of the store's tracking (prepared, with its settings recorded)
    one after the other: in this process, or one pass per Dask task."""
    settings = stored_settings(store)
    direction, start = settings["direction"], settings["start_frame"]
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    precision = store.attrs["model"].get("precision", "float32")
    todo = pass_todo(store, plan, pending, start)
    say_cost(store, plan, ChunkSupply.missing(store, todo), quiet)
    starts = {d: bool(todo[d]) and todo[d][0] == pass_chunks(plan, d, start)[0] for d in todo}
    supply = ChunkSupply(store, predictor, todo, starts,
                         sorted({plan.chunk_of(p.frame) for p in prompts}), batch_size)
    supply.ensure(todo[pending[0]][0])  # the features' shapes are known from then on
    vision_pos, maskmem_pos = positional_encodings(predictor, store, precision)
    features = StoredFeatures(store, predictor.device, vision_pos)
    for d in pending:
        tracker = Tracker(predictor, store, plan, d, prompts, features, maskmem_pos, supply,
                          settings["options"], on_commit)
        # the precision the embeddings were made in: SAM 2's GPU usage is bfloat16 autocast
        with autocast(predictor.device.type, precision), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cannot import name '_C'")
            tracker.run(shown_by(direction, d, start), quiet)
