"""Objects through SAM 2's step in batches (`--object-batch K`): opt-in, not exact.

sam2 1.1.0's predictor tracks each object alone (`batch_size=1`); its legacy predictor
(`sam2_video_predictor_legacy.py`) runs every object of a frame through one
`_run_single_frame_inference(batch_size=N)`, which can keep a GPU busy where one small
object step leaves it idle. Here up to K objects of a frame whose memories are read from the
same frames (the same prompted frames, the same tracked frames in reach, the same ones with
their mask memory dropped: what `_prepare_memory_conditioned_features` selects by) go
through SAM 2's own step together, their per-object memories stacked along the batch, the
outputs split back per object. The batched kernels compute other bits than one object at a
time (`benchmarks/bench_objects.py` and `bench_quality.py --object-batch` measure how much),
so a batched
tracking is not SAM 2's predictor's bit for bit; it is the same from chunk to chunk and
across a resume (the batches depend only on the frame and the memories), which is why such a
tracking runs as one group of objects (`groups.coupled`). Prompted frames are never batched:
their outputs are SAM 2's own, made by its API for each object. A model that applies
non-overlap to the masks it encodes as memory (`non_overlap_masks_for_mem_enc`, off in SAM
2's configs) would couple a batch's objects: batching is refused there.
"""

from __future__ import annotations

import torch

KINDS = ("cond_frame_outputs", "non_cond_frame_outputs")


def batches(todo: list[int], state: dict, size: int) -> list[list[int]]:
    """The objects (slots) `todo` in batches of up to `size` whose memories are read from
    the same frames, in slot order within each; one object a batch at size 1."""
    if size <= 1:
        return [[o] for o in todo]
    kinds: dict[tuple, list[int]] = {}
    for o in todo:
        kinds.setdefault(reads(state["output_dict_per_obj"][o]), []).append(o)
    return [objs[i : i + size] for objs in kinds.values() for i in range(0, len(objs), size)]


def reads(out_dict: dict) -> tuple:
    """What SAM 2 selects an object's memory by: its frames of each kind, and which of them
    hold a mask memory."""
    return tuple(
        tuple(sorted((t, out["maskmem_features"] is None) for t, out in out_dict[kind].items()))
        for kind in KINDS
    )


def stacked(out_dicts: list[dict], maskmem_pos_enc: list[torch.Tensor]) -> dict:
    """The objects' output dicts as one, each frame's outputs stacked along the batch, as
    SAM 2's legacy predictor holds them (the positional encoding expanded, as
    `_get_maskmem_pos_enc` does)."""
    K = len(out_dicts)
    if any(reads(d) != reads(out_dicts[0]) for d in out_dicts[1:]):  # `batches` makes none
        raise AssertionError("objects batched whose memories SAM 2 reads from other frames")
    pos = [p.expand(K, -1, -1, -1) for p in maskmem_pos_enc]

    def cat(outs: list[dict], key: str):
        values = [out[key] for out in outs]
        return None if values[0] is None else torch.cat(values)

    return {
        kind: {
            t: {
                "maskmem_features": cat(outs, "maskmem_features"),
                "maskmem_pos_enc": pos,
                "pred_masks": None,  # a memory's logits are never read by a later frame
                "obj_ptr": cat(outs, "obj_ptr"),
                "object_score_logits": cat(outs, "object_score_logits"),
            }
            for t in out_dicts[0][kind]
            for outs in [[d[kind][t] for d in out_dicts]]
        }
        for kind in KINDS
    }


def one_of(out: dict, i: int, maskmem_pos_enc: list[torch.Tensor]) -> dict:
    """Object i's output of a batched step, as SAM 2 gives one object's."""

    def pick(key: str):
        value = out[key]
        return None if value is None else value[i : i + 1]

    return {
        "maskmem_features": pick("maskmem_features"),
        "maskmem_pos_enc": maskmem_pos_enc,
        "pred_masks": pick("pred_masks"),
        "obj_ptr": pick("obj_ptr"),
        "object_score_logits": pick("object_score_logits"),
    }
