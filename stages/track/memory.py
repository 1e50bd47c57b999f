"""What the tracker carries between chunks, as an explicit structure, and its zarr form.

SAM 2's predictor keeps, per object, `cond_frame_outputs` (prompted frames) and
`non_cond_frame_outputs` (every tracked frame, forever). Tracking frame f reads only the
prompted outputs, the mask memories of the last `num_maskmem - 1` frames at the memory stride
and the object pointers of the last `max_obj_ptrs_in_encoder - 1` frames. `TrackerMemory`
holds exactly that, with global frame indices, so a chunk can continue where the last one
stopped, in this process or after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from segpipe.store.layout import PROMPTED, memory_arrays
from segpipe.store.runstore import RunStore


@dataclass
class FrameOutput:
    """One frame's output for one object, as far as later frames read it."""

    maskmem: torch.Tensor | None  # bfloat16 [1, 64, S/16, S/16] mask memory
    obj_ptr: torch.Tensor | None  # float32 [1, 256] object pointer
    score: torch.Tensor | None  # float32 [1, 1] object score logit
    logits: torch.Tensor | None = None  # float32 [1, 1, S/4, S/4]: kept for prompted frames

    def as_sam2(self, maskmem_pos_enc: list[torch.Tensor]) -> dict:
        return {
            "maskmem_features": self.maskmem,
            "maskmem_pos_enc": maskmem_pos_enc,
            "pred_masks": self.logits,
            "obj_ptr": self.obj_ptr,
            "object_score_logits": self.score,
        }

    @classmethod
    def from_sam2(cls, out: dict, keep_logits: bool) -> "FrameOutput":
        return cls(
            out["maskmem_features"],
            out["obj_ptr"],
            out["object_score_logits"],
            out["pred_masks"] if keep_logits else None,
        )


@dataclass
class ObjectMemory:
    object_id: int
    prompted: dict[int, FrameOutput] = field(default_factory=dict)  # frame -> output
    recent: dict[int, FrameOutput] = field(default_factory=dict)  # frame -> output still in reach


@dataclass
class TrackerMemory:
    direction: str  # "forward" or "reverse"
    num_frames: int  # global frame count (SAM 2 normalises pointer distances by it)
    start_frame: int  # the pass tracks start_frame .. next_frame (exclusive, in pass order)
    next_frame: int
    objects: list[ObjectMemory]  # in SAM 2's object slot order

    @property
    def step(self) -> int:
        return -1 if self.direction == "reverse" else 1


@dataclass(frozen=True)
class Reach:
    """Which earlier frames SAM 2 reads, mirroring `_prepare_memory_conditioned_features`."""

    num_maskmem: int
    stride: int
    max_obj_ptrs: int
    num_frames: int

    @classmethod
    def of(cls, predictor, num_frames: int) -> "Reach":
        return cls(
            predictor.num_maskmem,
            predictor.memory_temporal_stride_for_eval,
            predictor.max_obj_ptrs_in_encoder if predictor.use_obj_ptrs_in_encoder else 1,
            num_frames,
        )

    def maskmem_frames(self, f: int, reverse: bool) -> set[int]:
        r, frames = self.stride, set()
        for t_pos in range(1, self.num_maskmem):
            t_rel = self.num_maskmem - t_pos
            if t_rel == 1:
                frames.add(f + 1 if reverse else f - 1)
            elif reverse:
                frames.add(-(-(f + 2) // r) * r + (t_rel - 2) * r)
            else:
                frames.add(((f - 2) // r) * r - (t_rel - 2) * r)
        return frames

    def pointer_frames(self, f: int, reverse: bool) -> set[int]:
        limit = min(self.num_frames, self.max_obj_ptrs)
        frames = (f + d if reverse else f - d for d in range(1, limit))
        return {t for t in frames if 0 <= t < self.num_frames}

    @property
    def maskmem_slots(self) -> int:
        return max(self.num_maskmem - 1, 1)

    @property
    def pointer_slots(self) -> int:
        return max(min(self.num_frames, self.max_obj_ptrs) - 1, 1)

    def needed(self, next_frame: int, reverse: bool) -> tuple[set[int], set[int]]:
        """Tracked frames whose mask memory / pointer any frame from `next_frame` on reads."""
        horizon = self.stride * (self.num_maskmem + 1) + self.max_obj_ptrs
        step = -1 if reverse else 1
        mem, ptr = set(), set()
        for f in range(next_frame, next_frame + step * horizon, step):
            mem |= self.maskmem_frames(f, reverse)
            ptr |= self.pointer_frames(f, reverse)

        def done(t):
            return t > next_frame if reverse else t < next_frame

        return {t for t in mem if done(t)}, {t for t in ptr if done(t)}

    def prune(self, memory: "TrackerMemory") -> None:
        """Drop from every object what no frame from `memory.next_frame` on reads."""
        mem, ptr = self.needed(memory.next_frame, memory.direction == "reverse")
        for obj in memory.objects:
            self._prune(obj, mem, ptr)

    @staticmethod
    def _prune(obj: ObjectMemory, mem: set[int], ptr: set[int]) -> None:
        for t in list(obj.recent):
            out = obj.recent[t]
            if t not in mem and t not in ptr:
                del obj.recent[t]
            elif t not in mem:
                out.maskmem = None
            elif t not in ptr:
                out.obj_ptr = out.score = None


# -- zarr form -----------------------------------------------------------------------------
# Per object (its slot in the tracking's objects), so groups of objects tracked side by side
# never write one file: under memory/<direction>/<slot>/
#   prompted_*: that object's prompted-frame outputs, (K, ...) in frame order;
#   recent_*:   one snapshot per chunk boundary, (chunks, slots, ...), -1 frames padding.


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").view(torch.int16).numpy().view(np.uint16)


def _bf16(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).to(device)


def _f32(a: np.ndarray, device, dtype: str = "float32") -> torch.Tensor:
    """Stored float32 back to a tensor of the dtype SAM 2 made (float32, or bfloat16 under
    CUDA autocast; the float32 copy holds either exactly)."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(device, getattr(torch, dtype))


def _dtype(t: torch.Tensor | None) -> str:
    return str(t.dtype).removeprefix("torch.") if t is not None else "float32"


class MemoryStore:
    """Reads and writes `TrackerMemory` for one direction, each object under
    `memory/<direction>/<slot>/` (`slots`: the memory's objects' slots, in order)."""

    def __init__(
        self,
        store: RunStore,
        direction: str,
        reach: Reach,
        slots: list[int],
        num_chunks: int,
        maskmem_shape: tuple,
        logits_shape: tuple,
        ptr_dim: int,
    ):
        self.store, self.direction = store, direction
        self.reach, self.slots, self.num_chunks = reach, list(slots), num_chunks
        self.maskmem_shape, self.logits_shape, self.ptr_dim = maskmem_shape, logits_shape, ptr_dim

    def recent_arrays(self) -> list[str]:
        return [a for s in self.slots for a in memory_arrays(self.direction, s, "recent")]

    def write_prompted(self, memory: TrackerMemory) -> None:
        for slot, obj in zip(self.slots, memory.objects):
            K = len(obj.prompted)
            frame = np.full((K,), -1, np.int32)
            maskmem = np.zeros((K, *self.maskmem_shape), np.uint16)
            ptr = np.zeros((K, self.ptr_dim), np.float32)
            score = np.zeros((K,), np.float32)
            logits = np.zeros((K, *self.logits_shape), np.float32)
            for j, (t, out) in enumerate(sorted(obj.prompted.items())):
                frame[j] = t
                maskmem[j] = _bits(out.maskmem[0])
                ptr[j] = out.obj_ptr[0].float().cpu().numpy()
                score[j] = out.score.reshape(()).item()
                logits[j] = out.logits[0, 0].float().cpu().numpy()
            first = next(iter(obj.prompted.values()))
            dtypes = {
                "maskmem": "bfloat16",
                "ptr": _dtype(first.obj_ptr),
                "score": _dtype(first.score),
                "logits": _dtype(first.logits),
            }
            datas = (frame, maskmem, ptr, score, logits)
            for name, path, data in zip(
                PROMPTED, memory_arrays(self.direction, slot, "prompted"), datas
            ):
                arr = self.store.create_array(
                    path,
                    data.shape,
                    data.shape,
                    data.dtype,
                    overwrite=True,
                    attributes={"torch_dtype": dtypes[name]} if name in dtypes else None,
                )
                arr[...] = data
                self.store.commit_array(path)

    def snapshot(self, memory: TrackerMemory) -> list[tuple]:
        """The boundary snapshot of `memory` on the host, per object: its five arrays and
        their torch dtypes (taken on the tracking thread, since the memory moves on;
        written by `write_snapshot`, which may run behind)."""
        M, P = self.reach.maskmem_slots, self.reach.pointer_slots
        out = []
        for obj in memory.objects:
            mem_frame = np.full((1, M), -1, np.int32)
            maskmem = np.zeros((1, M, *self.maskmem_shape), np.uint16)
            ptr_frame = np.full((1, P), -1, np.int32)
            ptr = np.zeros((1, P, self.ptr_dim), np.float32)
            score = np.zeros((1, P), np.float32)
            with_mem = sorted(t for t, out in obj.recent.items() if out.maskmem is not None)
            with_ptr = sorted(t for t, out in obj.recent.items() if out.obj_ptr is not None)
            assert len(with_mem) <= M and len(with_ptr) <= P, "memory window larger than its slots"
            for j, t in enumerate(with_mem):
                mem_frame[0, j] = t
                maskmem[0, j] = _bits(obj.recent[t].maskmem[0])
            for j, t in enumerate(with_ptr):
                ptr_frame[0, j] = t
                ptr[0, j] = obj.recent[t].obj_ptr[0].float().cpu().numpy()
                score[0, j] = obj.recent[t].score.reshape(()).item()
            some = next((out for out in obj.recent.values() if out.obj_ptr is not None), None)
            dtypes = [
                None,
                "bfloat16",
                None,
                _dtype(some and some.obj_ptr),
                _dtype(some and some.score),
            ]
            out.append(((mem_frame, maskmem, ptr_frame, ptr, score), dtypes))
        return out

    def write_snapshot(self, chunk: int, snapshot: list[tuple]) -> list[str]:
        """Write the boundary snapshot after `chunk` (`snapshot`); returns the arrays to
        commit."""
        for slot, (datas, dtypes) in zip(self.slots, snapshot):
            for path, data, dtype in zip(
                memory_arrays(self.direction, slot, "recent"), datas, dtypes
            ):
                arr = self.store.array(path)
                if arr is None:
                    shape = (self.num_chunks, *data.shape[1:])
                    arr = self.store.create_array(
                        path,
                        shape,
                        (1, *data.shape[1:]),
                        data.dtype,
                        fill_value=-1 if data.dtype == np.int32 else 0,
                        attributes={"torch_dtype": dtype} if dtype else None,
                    )
                arr[chunk : chunk + 1] = data
        return self.recent_arrays()

    def read(self, memory: TrackerMemory, chunk: int | None, device) -> None:
        """Fill `memory.objects` from the prompted outputs and the snapshot after `chunk`."""
        for slot, obj in zip(self.slots, memory.objects):
            paths = memory_arrays(self.direction, slot, "prompted")
            p = {n: self.store.read(path) for n, path in zip(PROMPTED, paths)}
            dt = {
                n: self.store.array(path).attrs.get("torch_dtype")
                for n, path in zip(PROMPTED, paths)
            }
            obj.prompted, obj.recent = {}, {}
            for j, t in enumerate(p["frame"]):
                if t >= 0:
                    obj.prompted[int(t)] = FrameOutput(
                        _bf16(p["maskmem"][j][None], device),
                        _f32(p["ptr"][j][None], device, dt["ptr"]),
                        _f32(p["score"][j].reshape(1, 1), device, dt["score"]),
                        _f32(p["logits"][j][None, None], device, dt["logits"]),
                    )
            if chunk is None:
                continue
            recent = memory_arrays(self.direction, slot, "recent")
            mem_frame, maskmem, ptr_frame, ptr, score = (
                self.store.read(path, chunk, chunk + 1)[0] for path in recent
            )
            ptr_dtype, score_dtype = (
                self.store.array(path).attrs.get("torch_dtype", "float32") for path in recent[3:]
            )
            for j, t in enumerate(ptr_frame):
                if t >= 0:
                    obj.recent[int(t)] = FrameOutput(
                        None,
                        _f32(ptr[j][None], device, ptr_dtype),
                        _f32(score[j].reshape(1, 1), device, score_dtype),
                    )
            for j, t in enumerate(mem_frame):
                if t >= 0:
                    out = obj.recent.setdefault(int(t), FrameOutput(None, None, None))
                    out.maskmem = _bf16(maskmem[j][None], device)
