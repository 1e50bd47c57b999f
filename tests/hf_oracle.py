"""The oracle for the families Hugging Face transformers hosts: transformers' own model and
inference session over the whole video in memory, its prompts added as transformers' usage
adds them (one `add_inputs_to_inference_session` and one model call on the prompt's frame per
prompt, in file order), then its own `propagate_in_video_iterator` from the earliest prompt,
forward or reverse, each direction in a fresh session.

The frames are the store's decoded model input, normalised as transformers' processors do
(rescale and normalise fused); the masks go to the video's size as its `post_process_masks`
does (bilinear, then > 0). Both are written out here, apart from segpipe's code (the
processors themselves need torchvision, which this environment does not hold)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import zarr
from oracle import Oracle

from segpipe import prompts as prompt_file

# (model class, session class, processor class, mean, std) per family, from transformers
CLASSES = {
    "edgetam": (
        "transformers.EdgeTamVideoModel",
        "transformers.models.edgetam_video.modeling_edgetam_video.EdgeTamVideoInferenceSession",
        "transformers.Sam2VideoProcessor",
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
    ),
    "sam3-video": (
        "transformers.Sam3VideoModel",
        "transformers.models.sam3_video.modeling_sam3_video.Sam3VideoInferenceSession",
        "transformers.models.sam3_video.processing_sam3_video.Sam3VideoProcessor",
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
    ),
    "sam3-tracker": (
        "transformers.Sam3TrackerVideoModel",
        "transformers.models.sam3_tracker_video.modeling_sam3_tracker_video.Sam3TrackerVideoInferenceSession",
        "transformers.Sam3TrackerVideoProcessor",
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
    ),
}


def _load(dotted: str):
    import importlib

    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def hf_model(family: str, config, seed: int):
    """transformers' model built from `config` with `torch.manual_seed(seed)` first."""
    torch.manual_seed(seed)
    return _load(CLASSES[family][0])(config).eval()


def pixel_values(frames: np.ndarray, family: str) -> torch.Tensor:
    """(T, S, S, 3) uint8 -> (T, 3, S, S) float32 as transformers' processors normalise:
    `normalize(x, mean / rescale_factor, std / rescale_factor)` with rescale_factor 1/255."""
    _, _, _, mean, std = CLASSES[family]
    mean = torch.tensor(mean) * (1.0 / (1 / 255))
    std = torch.tensor(std) * (1.0 / (1 / 255))
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).to(torch.float32)
    return ((x - mean[:, None, None]) / std[:, None, None]).contiguous()  # as processors give


def processor(family: str, image_size: int):
    cls = _load(CLASSES[family][2])
    p = cls.__new__(cls)  # its prompt handling alone (the image processors need torchvision)
    p.point_pad_value, p.target_size = -10, image_size
    return p


def add(proc, session, p) -> None:
    if p.mask is not None:
        proc.add_inputs_to_inference_session(
            session, p.frame, p.object_id, input_masks=np.asarray(p.mask, bool)
        )
    else:
        proc.add_inputs_to_inference_session(
            session,
            p.frame,
            p.object_id,
            input_points=None if p.points is None else [[[list(q) for q in p.points]]],
            input_labels=None if p.labels is None else [[list(p.labels)]],
            input_boxes=None if p.box is None else [[list(p.box)]],
        )


@torch.inference_mode()
def hf_oracle(store_path, prompts_path, family: str, model) -> Oracle:
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    frames = group["frames"][...]
    T, H, W = attrs["frame_count"], attrs["video"]["height"], attrs["video"]["width"]
    S = attrs["decoding"]["image_size"]
    prompts = prompt_file.load(prompts_path, T, W, H)
    ids = prompt_file.object_ids(prompts)
    video = pixel_values(frames, family)
    masks, scores = {}, {}
    for direction in ("forward", "reverse"):
        session = _load(CLASSES[family][1])(
            video=video, video_height=H, video_width=W, dtype=torch.float32
        )
        proc = processor(family, S)
        for p in prompts:
            add(proc, session, p)
            model(inference_session=session, frame_idx=p.frame)
        m = np.zeros((T, len(ids), H, W), bool)
        s = np.full((T, len(ids)), np.nan, np.float32)
        for out in model.propagate_in_video_iterator(session, reverse=direction == "reverse"):
            assert list(out.object_ids) == ids
            video_res = F.interpolate(out.pred_masks, (H, W), mode="bilinear", align_corners=False)
            m[out.frame_idx] = (video_res[:, 0] > 0.0).numpy()
            s[out.frame_idx] = out.object_score_logits.float().reshape(len(ids)).numpy()
        masks[direction], scores[direction] = m, s
    start = min(p.frame for p in prompts)
    for result in (masks, scores):
        result["both"] = np.concatenate([result["reverse"][:start], result["forward"][start:]])
    return Oracle(masks, scores)


@torch.inference_mode()
def hf_prompted(store_path, prompts: list, family: str, model) -> tuple[np.ndarray, float]:
    """One object's mask (H, W) and score logit on one frame right after its prompts there
    are added to a session over the whole video (each prompt, then the model on the frame)."""
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    H, W = attrs["video"]["height"], attrs["video"]["width"]
    video = pixel_values(group["frames"][...], family)
    session = _load(CLASSES[family][1])(
        video=video, video_height=H, video_width=W, dtype=torch.float32
    )
    proc = processor(family, attrs["decoding"]["image_size"])
    for p in prompts:
        add(proc, session, p)
        out = model(inference_session=session, frame_idx=p.frame)
    video_res = F.interpolate(out.pred_masks, (H, W), mode="bilinear", align_corners=False)
    return (video_res[0, 0] > 0.0).numpy(), float(out.object_score_logits.reshape(-1)[0])


def _masks_to_boxes(masks: torch.Tensor) -> torch.Tensor:
    """torchvision's `masks_to_boxes` (which the processor's module imports only where
    torchvision is installed), written out: (N, H, W) bool -> (N, 4) x0, y0, x1, y1."""
    boxes = torch.zeros((masks.shape[0], 4), dtype=torch.float)
    for i, m in enumerate(masks):
        y, x = torch.where(m != 0)
        if len(x):
            boxes[i] = torch.tensor([x.min(), y.min(), x.max(), y.max()], dtype=torch.float)
    return boxes


@torch.inference_mode()
def concept_oracle(store_path, concepts: list[str], model, tokenizer):
    """transformers' `Sam3VideoModel` over the whole video in one session: the concepts
    added with its processor's `add_text_prompt`, `propagate_in_video_iterator` from frame
    0, each frame's output through the processor's own `postprocess_outputs`. Returns per
    frame {transformers id: (mask (H, W) bool, score)}; and what happened on the way: the
    ids the hotstart removed, and per concept the ids ever shown for it."""
    import transformers.models.sam3_video.processing_sam3_video as processing

    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs
    H, W = attrs["video"]["height"], attrs["video"]["width"]
    video = pixel_values(group["frames"][...], "sam3-video")
    session = _load(CLASSES["sam3-video"][1])(
        video=video, video_height=H, video_width=W, dtype=torch.float32
    )
    cls = _load(CLASSES["sam3-video"][2])
    proc = cls.__new__(cls)  # its text and output handling (its image processors need torchvision)
    proc.tokenizer = tokenizer
    proc.add_text_prompt(session, list(concepts))
    if not hasattr(processing, "masks_to_boxes"):
        processing.masks_to_boxes = _masks_to_boxes
    frames, shown = {}, {c: set() for c in concepts}
    for out in model.propagate_in_video_iterator(session):
        post = proc.postprocess_outputs(session, out)
        frames[out.frame_idx] = {
            int(i): (m.numpy(), float(sc))
            for i, m, sc in zip(post["object_ids"], post["masks"], post["scores"])
        }
        for c, ids in post["prompt_to_obj_ids"].items():
            shown[c].update(ids)
    assert sorted(frames) == list(range(len(video)))
    return frames, {"removed": set(session.hotstart_removed_obj_ids), "shown": shown}


@torch.inference_mode()
def click_oracle(store_path, prompts_path, concept_model) -> Oracle:
    """The objects clicked beside concepts as transformers tracks them with SAM 3's tracker
    alone: `Sam3TrackerVideoModel` loaded by transformers from the concept model's
    checkpoint (saved here; transformers maps its detector's backbone, tracker neck and
    tracker), in one session over the whole video, forward from the earliest prompt
    (`hf_oracle`'s "forward"; frames before it untracked: no mask, NaN scores).

    Loaded weights lie where the safetensors file put them, not 64-byte aligned as a built
    model's: on this CPU a matrix product's last bits depend on that alignment (its kernels
    split the work by it), so the loaded tensors are copied to fresh memory first, as the
    concept model segpipe builds holds them. Their values are transformers' load's."""
    import tempfile

    from transformers import Sam3TrackerVideoModel

    with tempfile.TemporaryDirectory() as folder:
        concept_model.save_pretrained(folder)
        tracker = Sam3TrackerVideoModel.from_pretrained(folder, dtype=torch.float32).eval()
    for t in [*tracker.parameters(), *tracker.buffers()]:
        t.data = t.data.clone()
    return hf_oracle(store_path, prompts_path, "sam3-tracker", tracker)


def assert_concepts_as_transformers(store_path, oracle, clicks: Oracle | None = None) -> None:
    """The store's masks, ids and scores are the oracle's, frame by frame: every instance
    the oracle shows on a frame, and none other, with its mask and score bit for bit
    (segpipe's object id is transformers' + 1, past the clicked objects' ids). The objects
    clicked beside the concepts, in the first columns, are `clicks`' forward pass's, every
    frame. Every chunk committed (a missing chunk is not read as fill)."""
    from segpipe.store.runstore import RunStore

    store = RunStore.open(store_path, read_only=True)
    assert store.pass_ledger("forward").count() == store.plan.num_chunks
    masks = store.array("masks")
    m, s = masks[...], store.array("object_scores")[...]
    P = 0 if clicks is None else clicks.masks["forward"].shape[1]
    if clicks is not None:
        clicked = [e["object"] for e in store.attrs["track"]["prompts"]]
        assert masks.attrs["object_ids"][:P] == list(dict.fromkeys(clicked))
        assert np.array_equal(m[:, :P], clicks.masks["forward"]), "a clicked object's mask"
        assert np.array_equal(s[:, :P], clicks.scores["forward"], equal_nan=True), "a score"
    base = max(masks.attrs["object_ids"][:P], default=0)
    ids = [i - 1 - base for i in masks.attrs["object_ids"][P:]]
    assert ids == list(masks.attrs["concept_ids"])
    seen = {i for shown in oracle.values() for i in shown}
    assert sorted(ids) == sorted(seen), (ids, seen)
    m, s = m[:, P:], s[:, P:]
    for t, shown in oracle.items():
        for c, i in enumerate(ids):
            if i in shown:
                mask, score = shown[i]
                assert np.array_equal(m[t, c], mask), f"frame {t}, instance {i}: mask differs"
                assert np.float32(score) == s[t, c], f"frame {t}, instance {i}: score differs"
            else:
                assert not m[t, c].any() and np.isnan(s[t, c]), f"frame {t}: {i} not shown"
