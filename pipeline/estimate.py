"""Storage estimate: what a store will hold once every stage is done (today's `--keep all`:
everything kept), by group of arrays, and the free-space check that `run`, `decode` and
`encode` make before they write anything. `status` shows the same figures beside the bytes
on disk. No torch, no video decoding here except the frame sample decode asks for.

Groups (the arrays each covers): `frames` (frames, pts, timestamps), `features`
(features/*), `memory` (memory/*), `masks` (masks, object_scores, object_areas, tracked, prompt_masks),
`other` (ledgers and group metadata). Sizes are file bytes, as `status` reports them; the
file system rounds every file up to its block size (a few KiB per chunk file), which is not
counted.

What each figure rests on (the `basis` shown beside it):

- frame count: the decoded count once decode is done; before, what the container claims
  (`video.claimed_frames`, about what a player shows; a frame folder counts its files),
  or the frames stored so far if more. No claim and nothing decoded: no estimate.
- features: exact. They are stored uncompressed (a crc32c per chunk) and zarr writes every
  chunk at full size (the last one padded), so: chunks x C x bytes per frame + 4 per chunk.
  Per frame, levels [32, S/4, S/4], [64, S/8, S/8], [256, S/16, S/16] at 4 bytes (float32)
  or 2 (float16, bfloat16); under `--precision bfloat16`, `--embedding-dtype bfloat16` keeps
  level 2 in float32 (SAM 2 computes it in float32, the FPN's top-down sum: see
  `segpipe.store.features.storage_dtype`), so 2, 2 and 4 bytes. An encoded store's own arrays
  give their dtypes. Before encode has run, decode assumes encode's default (float32).
- frames: zstd-compressed uint8 S x S x 3, so it depends on the content: measured. With
  frames stored, their bytes per stored frame; before decode starts, decode (and run)
  compress a sample the way the store will (`SAMPLE_FRAMES` consecutive frames from the
  start and from the middle of the source, each run compressed as one chunk, the mean);
  where neither exists (`status` on a store that has no frame yet), the raw size, an upper
  bound.
- masks: zstd bool (T, O, H, W), every frame written (untracked ones empty). Once a chunk is
  tracked, the bytes per frame of the tracked chunks measured; before, 1/`MASK_RATIO` of
  the raw size: the worst ratio measured (the noisy masks of random weights compress
  about 15x; clean object masks several hundred times), so the estimate errs high. The
  object count is the prompts' (given to `run`, or the store's); without prompts the
  memory and masks figures are per object.
- memory: per tracking pass, the prompted frames' outputs (one chunk) and one snapshot per
  chunk the pass visits, counted slot by slot from the prompts (`segpipe.stages.track.memory`:
  up to num_maskmem - 1 = 6 mask memories and max_obj_ptrs - 1 = 15 object pointers per
  object, fewer while a pass starts); bfloat16 mask memories at `RHO_MASKMEM` of their raw size
  (zstd, measured 0.70-0.76), float32 values at `RHO_FLOAT32` (float32 precision) or
  `RHO_FLOAT32_FROM_BF16` (bfloat16 precision: float32 holding bfloat16 values). Once a
  pass has written snapshots, the figure is scaled by measured / counted for them.
- other: ledgers (5 bytes per chunk and stage, ~480 bytes of metadata each) and group
  metadata; every array's own metadata (~700 bytes) is counted in its group.

The free-space check: this command is refused (one line, the store untouched) when the
bytes still to be written by its stages (the estimate of their groups, plus `other`, minus
what the store already holds on disk) exceed the free space of the store's file system
(`shutil.disk_usage` of the store, or of its nearest existing parent). `decode` counts
frames; `encode` frames and features; `run` everything it will run (memory and masks only
with prompts). Bytes already in the store count as available, whether the command keeps
them (a resumed run needs only the rest) or starts them over (`--force` deletes them
first). `--no-space-check` skips the check (not `--force`, which starts over a store made
with other settings: overriding a space check must not also discard work). A source whose
frame count nobody claims is not checked, and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from segpipe.fsutil import tree_bytes
from segpipe.plan import ChunkPlan, Span, passes

if TYPE_CHECKING:
    from segpipe.models.base import Sizes

GROUPS = ("frames", "features", "memory", "masks", "other")
STAGE_GROUPS = {
    "decode": ("frames",),
    "encode": ("frames", "features"),
    "track": ("frames", "features", "memory", "masks"),
}


def model_sizes(model: str | None) -> Sizes:
    """`model`'s sizes, as its family gives them (`ModelFamily.sizes`: widths, memory
    lengths, feature levels); before a model is chosen, the default model's family's."""
    from segpipe.errors import BadInput
    from segpipe.models.registry import family_of
    from segpipe.settings import DEFAULTS

    try:
        return family_of(model or DEFAULTS["model"]).sizes(model)
    except BadInput:  # a model this installation does not know (a store from elsewhere)
        return family_of(DEFAULTS["model"]).sizes(None)


# Calibration (measured on the test clips, random weights, 256 float32 and 512 bfloat16).
RESIDENT_CHUNKS = 3  # chunks of frames and of features a `--keep masks` run has on disk at once
MASK_RATIO = 15.0  # zstd on bool masks: random-weight masks ~15-16x; clean shapes far more
RHO_MASKMEM = 0.75  # zstd on bfloat16 mask memories: 0.70-0.76 of raw
RHO_FLOAT32 = 0.9  # zstd on float32 pointers and logits: 0.65-0.92
RHO_FLOAT32_FROM_BF16 = 0.5  # float32 holding bfloat16 values (their low halves are zero)
SAMPLE_FRAMES = 8  # frames per sample run (a run is compressed as one chunk)
CHUNK_OVERHEAD = 24  # a compressed chunk's zstd frame header and crc32c, about
ARRAY_META, LEDGER_META, GROUP_META, ROOT_META = 700, 480, 66, 1900


@dataclass
class Part:
    bytes: int
    basis: str


@dataclass
class Estimate:
    """The expected bytes of a finished store, by group, with what each figure rests on."""

    frames: int
    frames_basis: str
    chunk_size: int
    image_size: int
    objects: int | None  # None: no prompts known, memory and masks are per object
    parts: dict[str, Part] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts.values())

    def bytes_for(self, stages, keep: str = "all") -> int:
        """What the groups written by `stages` come to, with `other`; under `keep="masks"`
        frames and features at most `RESIDENT_CHUNKS` chunks of them (what a run keeps at
        once: see `segpipe.store.retention`)."""
        groups = {g for s in stages for g in STAGE_GROUPS[s]} | {"other"}
        chunks = -(-self.frames // self.chunk_size)
        total = 0
        for g, p in self.parts.items():
            if g in groups:
                dropped = keep == "masks" and g in ("frames", "features")
                total += (
                    min(p.bytes, -(-p.bytes * RESIDENT_CHUNKS // chunks)) if dropped else p.bytes
                )
        return total

    def as_dict(self) -> dict:
        return {
            "frames": self.frames,
            "frames_basis": self.frames_basis,
            "objects": self.objects,
            "total": self.total,
            "groups": {g: {"bytes": p.bytes, "basis": p.basis} for g, p in self.parts.items()},
        }

    def summary(self) -> str:
        """The estimate in one line: the total, then each group's figure."""
        per = "" if self.objects is not None else ", memory and masks for 1 object"
        groups = ", ".join(f"{g} {human(p.bytes)}" for g, p in self.parts.items())
        return (
            f"storage estimate: total {human(self.total)} for {self.frames:,} frames at "
            f"{self.image_size}, chunks of {self.chunk_size}{per} ({groups})"
        )


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


# -- the parts --------------------------------------------------------------------------------


def level_itemsizes(embedding_dtype: str, precision: str) -> tuple[int, int, int]:
    """Bytes per value of the three stored levels (`segpipe.store.features.storage_dtype`)."""
    if embedding_dtype == "float32":
        return 4, 4, 4
    if embedding_dtype == "bfloat16" and precision == "bfloat16":
        return 2, 2, 4  # level 2 is computed in float32 and kept so
    return 2, 2, 2


def features_part(
    T: int,
    C: int,
    S: int,
    embedding_dtype: str,
    precision: str,
    stored: list | None = None,
    basis: str | None = None,
    levels=None,
) -> Part:
    """Exact: uncompressed, full-size chunks. `stored`: (itemsize, per-frame values) of the
    store's own level arrays, when they exist; else `levels` ((channels, stride) of each,
    the model's `Sizes`: `model_sizes`; None: the default model's)."""
    chunks = ChunkPlan(T, C).num_chunks
    if stored is None:
        sizes = level_itemsizes(embedding_dtype, precision)
        model = levels or model_sizes(None)
        stored = [
            (size, ch * model.side(S, i) ** 2)
            for i, (size, (ch, _, _)) in enumerate(zip(sizes, model.levels))
        ]
    total = sum(chunks * (C * n * size + 4) + ARRAY_META for size, n in stored)
    per_frame = sum(n * size for size, n in stored)
    return Part(
        total,
        basis
        or f"{embedding_dtype} under {precision} precision, {human(per_frame)} a frame, exact",
    )


def frames_part(T: int, C: int, S: int, per_frame: float | None, basis: str) -> Part:
    """frames (per_frame: compressed bytes a frame, None: raw), pts and timestamps."""
    raw = S * S * 3
    chunks = ChunkPlan(T, C).num_chunks
    frames = (per_frame if per_frame is not None else raw + CHUNK_OVERHEAD / C) * T + ARRAY_META
    times = 16 * T + 2 * (chunks * CHUNK_OVERHEAD + ARRAY_META)  # pts, timestamps: raw
    return Part(int(frames + times), basis)


@dataclass(frozen=True)
class Prompted:
    """What the estimate needs of a prompt: its object, its frame, whether it is a mask."""

    object_id: int
    frame: int
    mask: bool = False


def summarize_prompts(prompts) -> list[Prompted]:
    """`Prompt` objects or stored prompt entries (`track.prompts`) as `Prompted`."""
    out = []
    for p in prompts:
        if isinstance(p, dict):
            out.append(Prompted(int(p["object"]), int(p["frame"]), "mask" in p))
        else:
            out.append(Prompted(int(p.object_id), int(p.frame), p.mask is not None))
    return out


def tracking_layout(
    T: int, prompts: list[Prompted] | None, direction: str | None, object_start: str | None
) -> tuple[int, int, str, dict, list]:
    """(objects, start frame, direction, per-object first tracked frame, prompt list);
    without prompts one object prompted on frame 0, forward (so: per object). A prompt on a
    frame past the `T` a container claims counts on its last frame (the claim may be short:
    the prompts' frames are checked once the video is decoded)."""
    if prompts and T:
        prompts = [p if p.frame < T else Prompted(p.object_id, T - 1, p.mask) for p in prompts]
    if not prompts:
        prompts = [Prompted(1, 0)]
        direction = "forward"
    ids = list(dict.fromkeys(p.object_id for p in prompts))
    start = min(p.frame for p in prompts)
    firsts = {}
    for p in prompts:
        firsts[p.object_id] = min(p.frame, firsts.get(p.object_id, p.frame))
    own = object_start == "own"
    first = {i: (firsts[i] if own else 0) for i in ids}
    return len(ids), start, direction or "both", first, prompts


def memory_snapshots(
    T: int,
    C: int,
    S: int,
    prompts: list[Prompted],
    direction: str,
    first: dict,
    precision: str,
    model: str | None = None,
    span: Span | None = None,
) -> dict[str, list[float]]:
    """Per pass, the counted bytes of the prompted outputs (index 0) and of each chunk's
    snapshot in the pass's order (1..)."""
    plan = ChunkPlan(T, C)
    sizes = model_sizes(model)
    hidden_dim = sizes.hidden_dim
    # a snapshot's mask memory: SAM 2's bfloat16, or float32 bytes (a transformers session's)
    slot = sizes.memory_slot(S) * (RHO_MASKMEM if sizes.memory_bytes == 2 else RHO_FLOAT32)
    logits = (sizes.side(S, 2) * 4) ** 2  # a prompted frame's low-res logits
    rho = RHO_FLOAT32_FROM_BF16 if precision == "bfloat16" else RHO_FLOAT32
    M, P = sizes.num_maskmem - 1, max(min(T, sizes.max_obj_ptrs) - 1, 1)
    ids = list(dict.fromkeys(p.object_id for p in prompts))
    O = len(ids)
    span = span or Span.whole(min(p.frame for p in prompts), T)
    cond = {i: sorted({p.frame for p in prompts if p.object_id == i}) for i in ids}
    # per object (its own arrays: `memory/<dir>/<slot>/`)
    prompted = sum(
        len(c) * (4 + slot + hidden_dim * 4 * rho + 4 + logits * 4 * rho) for c in cond.values()
    ) + O * (5 * (CHUNK_OVERHEAD + ARRAY_META) + GROUP_META)
    small = O * ((2 * P + M) * 4 + 5 * CHUNK_OVERHEAD)  # frame indices, scores, headers
    out = {}
    for d in passes(direction):
        chunks = span.chunks(plan, d)
        if not chunks:
            continue
        sizes, seen = [prompted], {i: 0 for i in ids}
        for n, k in enumerate(chunks):
            lo, hi = plan.bounds(k)
            mem = ptr = 0
            for i in ids:  # frames this object is tracked on in the chunk, less its prompted ones
                a, b = max(lo, first[i]), hi
                tracked = span.count_in(d, a, b) if a < b else 0
                prompted_here = sum(
                    1 for f in cond[i] if a <= f < b and f in span.frames_in(d, lo, hi)
                )
                seen[i] += tracked - prompted_here
                mem += min(M, seen[i])
                ptr += min(P, seen[i])
            sizes.append(mem * slot + ptr * hidden_dim * 4 * rho + small)
            if all(v >= max(M, P) for v in seen.values()):  # full from here on
                sizes += [sizes[-1]] * (len(chunks) - n - 1)
                break
        out[d] = sizes
    return out


def masks_part(
    T: int,
    C: int,
    H: int,
    W: int,
    O: int,
    tracked: int,
    masks_prompts: int,
    per_frame: float | None,
    basis: str | None,
) -> Part:
    """masks (per_frame: measured bytes per tracked frame, else raw / MASK_RATIO), object
    scores and areas, tracked, prompt masks."""
    chunks = ChunkPlan(T, C).num_chunks
    raw = O * H * W
    per = per_frame if per_frame is not None else raw / MASK_RATIO
    masks = per * tracked + chunks * CHUNK_OVERHEAD + ARRAY_META
    rest = (
        T * O * (4 + 8 + 1)
        + 3 * O * chunks * CHUNK_OVERHEAD  # scores, areas, tracked: a zarr chunk per object
        + 3 * ARRAY_META
        + (masks_prompts * H * W / MASK_RATIO + ARRAY_META if masks_prompts else 0)
    )
    return Part(
        int(masks + rest),
        basis or f"zstd assumed 1:{MASK_RATIO:g} of {human(raw)} a frame until tracked",
    )


def tracked_frames(T: int, span: Span, direction: str) -> int:
    return sum(span.count_in(d, 0, T) for d in passes(direction))


def other_part(
    T: int, C: int, pass_chunk_counts: list[int], exports: int, prompts_json: int, O: int = 1
) -> Part:
    """Ledgers (a pass's: one per object) and metadata."""
    n = ChunkPlan(T, C).num_chunks
    ledgers = [n, n, *[c for c in pass_chunk_counts for _ in range(O)]] + [n] * exports
    total = (
        sum(LEDGER_META + 5 * c for c in ledgers)
        + ROOT_META
        + prompts_json
        + GROUP_META * (3 + len(pass_chunk_counts))
    )
    return Part(int(total), "ledgers and metadata")


# -- building one -----------------------------------------------------------------------------


@dataclass
class Later:
    """What the stages after this one will use, where known (None: the store's, else the
    defaults)."""

    embedding_dtype: str | None = None
    precision: str | None = None
    prompts: list | None = None  # Prompt objects or stored entries
    direction: str | None = None
    object_start: str | None = None
    frames: object = None  # a tracking window given (`--frames`): counted as the whole video
    exports: int = 0
    device: str = "auto"  # decides the default precision (bfloat16 on CUDA)
    model: str | None = None  # decides the widths of features and memory

    @classmethod
    def of(cls, settings, prompts) -> "Later":
        """What a run's settings (`segpipe.settings.Settings`) say of the stages after
        decode."""
        encoding, tracking = settings.encoding, settings.tracking
        return cls(
            encoding.embedding_dtype,
            encoding.precision,
            prompts,
            tracking.direction or ("forward" if tracking.concepts else None),
            tracking.object_start,
            tracking.frames,
            len(settings.output.exports) if prompts is not None or tracking.concepts else 0,
            settings.execution.device,
            encoding.model,
        )


def build(
    T: int,
    frames_basis: str,
    C: int,
    S: int,
    W: int,
    H: int,
    later: Later,
    frame_rate: tuple[float | None, str],
    store=None,
    sizes: dict | None = None,
) -> Estimate:
    """The estimate for these settings; `store` (and its `sizes` on disk, by array) replace
    figures with measured ones where the store has them."""
    attrs = store.attrs if store is not None else {}
    sizes = sizes or {}
    model = attrs.get("model") or {}
    track = attrs.get("track") or {}
    emb = later.embedding_dtype or model.get("embedding_dtype") or "float32"
    from segpipe.model import precision_of

    # (asked, else the store's, else float32: the device is not known here; the disk guard
    # puts the device's default in `later` where it changes the sizes, bfloat16 embeddings)
    precision = precision_of(later.precision, store, model=getattr(later, "model", None))
    prompts = _prompts_of(later, track)
    direction = later.direction or track.get("direction")
    object_start = later.object_start or (track.get("options") or {}).get("object_start")
    est = Estimate(T, frames_basis, C, S, len({p.object_id for p in prompts}) if prompts else None)

    est.parts["frames"] = frames_part(T, C, S, *frame_rate)

    name = later.model or model.get("name")
    est.parts["features"] = _features_estimate(T, C, S, emb, precision, later, model, name, store)

    same_tracking = _same_tracking(store, track, later, prompts)
    O, start, direction, first, plist = tracking_layout(T, prompts, direction, object_start)
    # a windowed tracking counts as the whole video until it is the store's (an upper bound)
    span = Span.of(track, T) if same_tracking else Span.whole(start, T)
    snaps = memory_snapshots(T, C, S, plist, direction, first, precision, name, span)
    est.parts["memory"] = _memory_estimate(snaps, O, prompts, store, same_tracking, sizes)
    est.parts["masks"] = _masks_estimate(
        T, C, H, W, O, span, direction, plist, prompts, store, same_tracking
    )
    prompts_json = (
        len(json.dumps(track.get("prompts", [])))
        if same_tracking
        else 100 * len(plist)
        if prompts
        else 0
    )
    counts = [len(v) - 1 for v in snaps.values()]
    est.parts["other"] = other_part(T, C, counts, later.exports, prompts_json, max(O, 1))

    # What a finished stage holds is no longer an estimate: the bytes on disk.
    if store is not None and sizes:
        _finished_on_disk(est, store, sizes, T, C, same_tracking, span, direction)
    return est


def _prompts_of(later: Later, track: dict) -> list[Prompted] | None:
    """The prompts the tracking will use: those given, else the store's, else None."""
    if later.prompts is not None:
        return summarize_prompts(later.prompts)
    if track.get("prompts"):
        return summarize_prompts(track["prompts"])
    return None


def _features_estimate(
    T: int,
    C: int,
    S: int,
    emb: str,
    precision: str,
    later: Later,
    model: dict,
    name: str | None,
    store,
) -> Part:
    """The features part, from the store's own level arrays where they exist."""
    stored = None
    if store is not None and later.embedding_dtype is None:
        arrays = [store.array(f"features/level{i}") for i in range(3)]
        if all(a is not None for a in arrays):
            stored = [(a.dtype.itemsize, math.prod(a.shape[1:])) for a in arrays]
    default = "" if (later.embedding_dtype or model) else " (encode's default)"
    part = features_part(T, C, S, emb, precision, stored, levels=model_sizes(name))
    part.basis += default
    return part


def _same_tracking(store, track: dict, later: Later, prompts: list[Prompted] | None) -> bool:
    """Whether the tracking estimated is the one the store records (its figures then count)."""
    given = later.direction or track.get("direction")
    return (
        store is not None
        and bool(track)
        and (
            later.prompts is None
            or (
                prompts == summarize_prompts(track.get("prompts", []))
                and given == track.get("direction")
                and later.frames is None
            )
        )
    )


def _memory_estimate(snaps: dict, O: int, prompts, store, same_tracking: bool, sizes: dict) -> Part:
    """The memory part: the counted snapshots, scaled by those a pass has written so far."""
    memory, measured = 0, False
    for d, counted in snaps.items():
        recent_meta = 5 * ARRAY_META * O
        pass_total = sum(counted) + recent_meta
        done = store.pass_ledger(d).count() if same_tracking else 0
        if done:  # scale the count by what the snapshots written so far measure
            mine = {n: v for n, v in sizes.items() if n.startswith(f"memory/{d}/")}
            written = sum(v for n, v in mine.items() if n.rsplit("/", 1)[-1].startswith("recent_"))
            written -= recent_meta
            prompted = sum(
                v for n, v in mine.items() if n.rsplit("/", 1)[-1].startswith("prompted_")
            )
            counted_written = sum(counted[1 : 1 + done])
            if written > 0 and counted_written > 0 and prompted > 0:
                rest = sum(counted[1 + done :]) * written / counted_written
                pass_total = prompted + written + rest + recent_meta
                measured = True
        memory += pass_total
    what = (
        f"{O} object{'s' if O != 1 else ''}, passes {'+'.join(snaps) or 'none'}"
        if prompts
        else "per object, one pass over every frame"
    )
    return Part(
        int(memory),
        what + (", scaled by the snapshots written" if measured else ", counted slot by slot"),
    )


def _masks_estimate(
    T: int,
    C: int,
    H: int,
    W: int,
    O: int,
    span: Span,
    direction: str,
    plist: list[Prompted],
    prompts,
    store,
    same_tracking: bool,
) -> Part:
    """The masks part, measured on the store's tracked chunks where it has them."""
    tracked = tracked_frames(T, span, direction)
    per_frame, basis = None, None
    masks = store.array("masks") if (store is not None and same_tracking) else None
    if masks is not None and masks.chunks[0] == C:  # chunk k of the masks is pipeline chunk k
        per_frame = measured_mask_bytes(store, T, C, span, direction)
        if per_frame is not None:
            basis = f"measured on the tracked chunks, {human(per_frame)} a frame"
    part = masks_part(T, C, H, W, O, tracked, sum(p.mask for p in plist), per_frame, basis)
    if not prompts:
        part.basis += " (per object)"
    return part


def _finished_on_disk(
    est: Estimate,
    store,
    sizes: dict,
    T: int,
    C: int,
    same_tracking: bool,
    span: Span,
    direction: str,
) -> None:
    """Replace the figures of finished stages (decode, every tracking pass) by their bytes."""
    if "frame_count" in store.attrs:
        est.parts["frames"] = Part(_sum(sizes, "frames"), "on disk (decoded)")
    plan = ChunkPlan(T, C)
    if same_tracking and all(
        store.pass_ledger(d).count() >= len(span.chunks(plan, d)) for d in passes(direction)
    ):
        for g in ("memory", "masks"):
            est.parts[g] = Part(_sum(sizes, g), "on disk (tracked)")


def _sum(sizes: dict, group: str) -> int:
    return sum(v for n, v in sizes.items() if group_of(n) == group)


def measured_mask_bytes(
    store, T: int, C: int, span: Span, direction: str, sample: int = 64
) -> float | None:
    """Bytes per tracked frame of the masks, from the chunk files of (up to `sample`) chunks
    some pass has committed."""
    plan = ChunkPlan(T, C)
    done = set()
    for d in passes(direction):
        vector = store.pass_ledger(d).done()
        done |= {k for k in span.chunks(plan, d) if k < len(vector) and vector[k]}
    if not done:
        return None
    chunks = sorted(done)
    step = max(1, len(chunks) // sample)
    total = frames = 0
    for k in chunks[::step]:
        folder = store.path / "masks" / "c" / str(k)
        total += tree_bytes(folder) if folder.exists() else 0
        frames += sum(span.count_in(d, *plan.bounds(k)) for d in passes(direction))
    return total / frames if frames and total else None


# -- measuring the store ----------------------------------------------------------------------


def group_bytes(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Bytes on disk by group; `other` is every file no array holds."""
    out = {g: 0 for g in GROUPS}
    for name, size in sizes.items():
        out[group_of(name)] += size
    out["other"] += total - sum(sizes.values())
    return out


def group_of(name: str) -> str:
    top = name.split("/")[0]
    if top in ("frames", "pts", "timestamps"):
        return "frames"
    if top in ("features", "memory"):
        return top
    if top in ("masks", "object_scores", "object_areas", "tracked", "prompt_masks"):
        return "masks"
    return "other"


def frame_rate_of(store, sizes: dict) -> tuple[float | None, str] | None:
    """Measured compressed bytes per frame from the store's frames, or None (none stored)."""
    arr = store.array("frames")
    if arr is None or arr.shape[0] == 0:
        return None
    data = sizes.get("frames", 0) - ARRAY_META
    if data <= 0:
        return None
    n = arr.shape[0]
    complete = "frame_count" in store.attrs
    return data / n, (
        "measured, all frames" if complete else f"measured on the {n:,} frames stored"
    )


def from_store(
    store, later: Later | None = None, sample: tuple | None = None, sizes: dict | None = None
) -> Estimate | None:
    """The estimate for an existing store (status, a resumed decode, encode, run); None when
    the frame count is unknown. `sample`: (bytes per frame, basis) from a source sample, used
    while the store holds no frame."""
    later = later or Later()
    attrs = store.attrs
    if sizes is None:
        sizes = store.array_bytes()
    C, S = store.chunk_size, store.image_size
    video = attrs["video"]
    if "frame_count" in attrs:
        T, basis = attrs["frame_count"], "decoded"
    else:
        arr = store.array("frames")
        stored = arr.shape[0] if arr is not None else 0
        claimed = video.get("claimed_frames") or 0
        if max(claimed, stored) == 0:
            return None
        T, basis = (claimed, _claim(video)) if claimed >= stored else (stored, "decoded so far")
    rate = frame_rate_of(store, sizes)
    if rate is None:
        rate = sample or (None, "raw size (nothing decoded yet): an upper bound")
    return build(T, basis, C, S, video["width"], video["height"], later, rate, store, sizes)


def _claim(video: dict) -> str:
    from segpipe.sources.registry import named

    kind = named(video.get("kind"))
    if not kind.counted:
        return "as the container claims"
    return "counted in the folder" if kind.folder else "counted in the file"


def before_decode(
    info, C: int, S: int, later: Later | None, sample: tuple | None
) -> Estimate | None:
    """The estimate for a store not created yet: the probe's claimed frame count, the sample."""
    if not info.claimed_frames:
        return None
    rate = sample or (None, "raw size (no sample): an upper bound")
    return build(
        info.claimed_frames,
        _claim({"kind": info.kind}),
        C,
        S,
        info.width,
        info.height,
        later or Later(),
        rate,
    )


# -- the check --------------------------------------------------------------------------------
