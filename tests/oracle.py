"""The oracle: SAM 2's own `SAM2VideoPredictor`, tracking the whole video in memory.

It reads the store's decoded frames through SAM 2's own frame loader (the frames are written
losslessly as PNG data under the `NNNNN.jpg` names that loader lists), gets the same weights
and the same prompts through SAM 2's public API, and propagates over the whole video.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr
from PIL import Image

from segpipe import prompts as prompt_file

DIRECTIONS = ("both", "forward", "reverse")


@dataclass
class Oracle:
    """Per direction ("forward", "reverse", "both"): `masks` (T, O, H, W) bool and `scores`
    (T, O) float32, each object's score logit (NaN where the pass did not track the frame)."""

    masks: dict[str, np.ndarray]
    scores: dict[str, np.ndarray]
    seconds: float = 0.0  # spent in propagate_in_video (frames are encoded there)


OFFICIAL_CONFIGS = {"sam2.1_hiera_t": "configs/sam2.1/sam2.1_hiera_t.yaml"}
_BUILT: dict = {}


def sam2_predictor(
    model: str, image_size: int, seed: int | None = None, checkpoint=None, non_overlap=False
):
    """SAM 2's `SAM2VideoPredictor`, built with `sam2.build_sam.build_sam2_video_predictor`
    itself (nothing of segpipe's: not its builder, not its memory cast): seeded random
    weights (`torch.manual_seed(seed)` before the build), or a checkpoint's (segpipe_tiny's
    config is SAM 2's own format, composed from its file); `non_overlap`: SAM 2's
    `non_overlap_masks` on (a Hydra override of the config). One per arguments per process."""
    key = (model, image_size, seed, str(checkpoint), non_overlap)
    if key in _BUILT:
        return _BUILT[key]
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from sam2.build_sam import build_sam2_video_predictor

    if seed is not None:
        torch.manual_seed(seed)
    build = dict(
        ckpt_path=None if checkpoint is None else str(checkpoint),
        device="cpu",
        hydra_overrides_extra=[f"++model.image_size={image_size}"]
        + (["++model.non_overlap_masks=true"] if non_overlap else []),
    )
    if model in OFFICIAL_CONFIGS:
        predictor = build_sam2_video_predictor(OFFICIAL_CONFIGS[model], **build)
    else:  # a config of ours, in SAM 2's format: Hydra pointed at its folder for the build
        folder = Path(__file__).resolve().parents[1] / "pipeline" / "configs"
        sam2s = get_gh_backup()  # the sam2 package's Hydra, put back after
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(folder), version_base="1.2"):
                predictor = build_sam2_video_predictor(f"{model}.yaml", **build)
        finally:
            restore_gh_from_backup(sam2s)
    _BUILT[key] = predictor
    return predictor


def store_predictor(attrs) -> object:
    """The oracle's predictor for a store's model (its name, size and weights); for a store
    not encoded yet, the tests' usual model: SAM 2.1 tiny with seed-0 random weights."""
    model = attrs.get("model") or {"name": "sam2.1_hiera_t", "weights": {"random_seed": 0}}
    weights = model["weights"]
    checkpoint = None
    if weights.get("random_seed") is None:
        from segpipe.models.sam2.catalog import SHIPPED

        checkpoint = SHIPPED[model["name"]][1]
    return sam2_predictor(
        model["name"], attrs["decoding"]["image_size"], weights.get("random_seed"), checkpoint
    )


def memory_cast(predictor):
    """The documented workaround, applied to the oracle only where SAM 2 crashes without it
    (`oracle_tracking`): a memory made only of bfloat16 mask memories (an object tracked
    before its first prompt) is cast to float32 features' dtype, outside autocast. Returns
    the hook's handle (`.remove()`)."""

    def cast(_module, args, kwargs):
        memory, curr = kwargs.get("memory"), kwargs.get("curr")
        if (
            memory is not None
            and curr
            and memory.dtype == torch.bfloat16
            and curr[0].dtype == torch.float32
            and not torch.is_autocast_enabled(curr[0].device.type)
        ):
            kwargs["memory"] = memory.to(torch.float32)
        return args, kwargs

    return predictor.memory_attention.register_forward_pre_hook(cast, with_kwargs=True)


def oracle_tracking(
    store_path,
    prompts_path,
    predictor=None,
    video_dir=None,
    precision: str = "float32",
    directions=("forward", "reverse"),
    arguments: dict | None = None,
) -> Oracle:
    """ "forward" and "reverse" each from a fresh state with all prompts added up front, and
    "both" (reverse before the earliest prompt, forward from it on). Masks are what
    `propagate_in_video` yields; scores are read from the predictor's own state after it.
    With `video_dir` (a JPEG folder) SAM 2 loads that folder itself, as `init_state` does,
    instead of the store's frames. `precision="bfloat16"` runs it all under bfloat16
    autocast, SAM 2's documented GPU usage (here on the CPU). `arguments`, per direction, are
    more keyword arguments of `propagate_in_video` (`start_frame_idx`,
    `max_frame_num_to_track`)."""
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    frames = group["frames"][...]
    T, H, W = attrs["frame_count"], attrs["video"]["height"], attrs["video"]["width"]
    prompts = prompt_file.load(prompts_path, T, W, H)
    ids = prompt_file.object_ids(prompts)
    given = predictor
    predictor = given or store_predictor(attrs)

    def track():
        return _track(
            predictor, frames, attrs, prompts, ids, video_dir, precision, directions, arguments
        )

    if given is not None:
        return track()
    try:
        return track()
    except RuntimeError as e:  # SAM 2 crashes here without the documented cast
        if "dtype" not in str(e):
            raise
    handle = memory_cast(predictor)
    try:
        return track()
    finally:
        handle.remove()


def _track(predictor, frames, attrs, prompts, ids, video_dir, precision, directions, arguments):
    T, H, W = attrs["frame_count"], attrs["video"]["height"], attrs["video"]["width"]
    masks, scores = {}, {}
    seconds = 0.0  # in propagate_in_video, for benchmarks
    with tempfile.TemporaryDirectory() as tmp, _autocast(predictor.device.type, precision):
        if video_dir is None:
            for t, frame in enumerate(frames):
                Image.fromarray(frame).save(Path(tmp) / f"{t:05d}.jpg", format="PNG")
        for direction in directions:
            state = predictor.init_state(video_path=str(video_dir or tmp))
            if video_dir is None:
                state["video_height"], state["video_width"] = H, W  # the original video's size
            assert (state["video_height"], state["video_width"]) == (H, W)
            add_prompts(predictor, state, prompts)
            m = np.zeros((T, len(ids), H, W), bool)
            tracked = []
            began = time.perf_counter()
            with torch.inference_mode():
                for t, obj_ids, video_res in predictor.propagate_in_video(
                    state, reverse=direction == "reverse", **(arguments or {}).get(direction, {})
                ):
                    assert list(obj_ids) == ids
                    m[t] = (video_res[:, 0] > 0.0).cpu().numpy()
                    tracked.append(t)
            seconds += time.perf_counter() - began
            s = np.full((T, len(ids)), np.nan, np.float32)
            for o in range(len(ids)):
                outputs = state["output_dict_per_obj"][o]
                for t in tracked:
                    out = (
                        outputs["cond_frame_outputs"].get(t) or outputs["non_cond_frame_outputs"][t]
                    )
                    s[t, o] = out["object_score_logits"].detach().cpu().float().reshape(()).numpy()
            masks[direction], scores[direction] = m, s
    start = min(p.frame for p in prompts)
    for result in (masks, scores):
        if len(result) == 2:
            result["both"] = np.concatenate([result["reverse"][:start], result["forward"][start:]])
    return Oracle(masks, scores, seconds)


def add_prompts(predictor, state: dict, prompts: list) -> None:
    """Every prompt, in order, through SAM 2's public API (`add_new_mask`,
    `add_new_points_or_box`)."""
    for p in prompts:
        if p.mask is not None:
            predictor.add_new_mask(state, p.frame, p.object_id, p.mask)
        else:
            predictor.add_new_points_or_box(
                state,
                p.frame,
                p.object_id,
                points=None if p.points is None else np.array(p.points, np.float32),
                labels=None if p.labels is None else np.array(p.labels, np.int32),
                box=None if p.box is None else np.array(p.box, np.float32),
            )


def assert_tracked_as_sam2(store_path, oracle: Oracle, direction: str = "both") -> None:
    """The store's masks and object scores, read back with a missing chunk file raising (not
    read as fill), are SAM 2's bit for bit."""
    from segpipe.store.runstore import RunStore

    store = RunStore.open(store_path)
    assert oracle.masks[direction].any()
    assert np.array_equal(store.read("masks"), oracle.masks[direction]), direction
    assert same_bits(store.read("object_scores"), oracle.scores[direction]), direction


def _autocast(device_type: str, precision: str):
    """SAM 2's GPU usage: everything under bfloat16 autocast (`precision="bfloat16"`)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality of two float32 arrays (NaNs included, -0.0 differs from 0.0)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
