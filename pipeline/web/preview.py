"""One frame's mask for one object's prompts on that frame, as SAM 2's
`add_new_points_or_box` (or `add_new_mask`) makes it when the prompt is added: from the
stored embeddings where the frame's chunk is encoded, else from the frame itself, encoded
alone by SAM 2's own state (nothing is written)."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import torch

from segpipe.model import (
    autocast,
    family_of_predictor,
    model_spec_of,
    pick_device,
    precision_of,
    predictor_for,
    resolve_weights,
)
from segpipe.stages.track.stage import embeddings_weights
from segpipe.stages.track.tracker import StoredFeatures, new_state, positional_encodings
from segpipe.store.retention import has
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import preview_options, stored_settings


class Previewer:
    """The store's model (or, before the store is encoded, the studio's `encoding`: model
    and weights), built once on first use, with the store's tracking options."""

    def __init__(self, store_path, encoding, device: str):
        self.path, self.choice, self.device = store_path, encoding, device
        self.predictor = None
        self.options = None
        self.built_for = None  # the store's model spec it was built for (None: the studio's)
        self._lock = threading.Lock()  # one preview at a time: they share the model

    def model(self, store: RunStore):
        spec = model_spec_of(store)
        options = preview_options(store, (stored_settings(store) or {}).get("direction", "both"))
        if self.predictor is None or spec != self.built_for or options != self.options:
            built_for = spec
            if spec is not None:
                weights, _ = embeddings_weights(store, spec, self.choice.checkpoint)
            else:  # what Track will record (`encode`'s choice of model and weights)
                name = self.choice.model
                weights = resolve_weights(name, self.choice.checkpoint, self.choice.random_weights)
                spec = {"name": name, "image_size": store.image_size}
            # its own, kept here: a job may track on another thread meanwhile
            self.predictor = predictor_for(spec, weights, self.device, options, kept=False)
            self.options, self.built_for = options, built_for  # once it is built
        return self.predictor

    def build(self, store: RunStore) -> None:
        """Build the model now (`Studio.warm`), waiting for a preview under way."""
        with self._lock:
            self.model(store)

    def precision(self, store: RunStore) -> str:
        return precision_of(None, store, pick_device(self.device))

    @torch.inference_mode()
    def mask(self, prompts: list) -> tuple[np.ndarray, float]:
        """(H, W) bool mask and object score logit of the prompts of one object on one
        frame (in the order they were made)."""
        with self._lock:
            store = RunStore.open(self.path, read_only=True)
            predictor = self.model(store)
            plan, video = store.plan, store.attrs["video"]
            f, obj = prompts[0].frame, prompts[0].object_id
            precision = self.precision(store)
            if family_of_predictor(predictor).session_tracker:
                return self._session_mask(store, predictor, prompts, f)
            if has(store, "features", plan.chunk_of(f)):
                vision_pos, maskmem_pos = positional_encodings(predictor, store, precision)
                features = StoredFeatures(store, predictor.device, vision_pos, {})
                state = new_state(
                    predictor,
                    plan.num_frames,
                    video["height"],
                    video["width"],
                    features,
                    maskmem_pos,
                )
            else:
                state = self._state_from_frame(store, predictor, f, video)
            with autocast(predictor.device.type, precision), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*cannot import name '_C'")
                masks = None
                for p in prompts:
                    if p.mask is not None:
                        _, _, masks = predictor.add_new_mask(state, f, obj, p.mask)
                    else:
                        _, _, masks = predictor.add_new_points_or_box(
                            state,
                            f,
                            obj,
                            points=None if p.points is None else np.array(p.points, np.float32),
                            labels=None if p.labels is None else np.array(p.labels, np.int32),
                            box=None if p.box is None else np.array(p.box, np.float32),
                        )
            out = state["temp_output_dict_per_obj"][0]["cond_frame_outputs"][f]
            score = float(out["object_score_logits"].float().reshape(-1)[0])
            threshold = self.options["score_threshold"]
            return (masks[0, 0] > threshold).cpu().numpy(), score

    def _session_mask(self, store: RunStore, predictor, prompts: list, f: int):
        """A family tracked in its own session (`stages.track.session`): its preview."""
        from segpipe.stages.track.session import OneFrame, preview

        if has(store, "features", store.plan.chunk_of(f)):
            features = StoredFeatures(store, predictor.device, [], {})
        else:
            family = family_of_predictor(predictor)
            image = family.preprocess(self._frame(store, f), predictor.device)
            features = OneFrame(f, family.encode(predictor, image))
        return preview(predictor, store, prompts, features, self.options["score_threshold"])

    def _frame(self, store: RunStore, f: int) -> np.ndarray:
        """Frame f at the model's size (1, S, S, 3): as stored, else decoded again."""
        if has(store, "frames", store.plan.chunk_of(f)):
            return store.read("frames", f, f + 1)
        from segpipe.sources.frames import model_input
        from segpipe.store.source import SourceReader, stored_source

        _, _, picture = next(SourceReader(store, stored_source(store)).frames(f, 1))
        return model_input(picture, store.image_size)[None]

    def _state_from_frame(self, store: RunStore, predictor, f: int, video: dict) -> dict:
        """SAM 2's own state over the one frame, which its image encoder encodes on the
        first prompt (the frame as stored, else decoded again from the source)."""
        from segpipe.models.sam2.frames import preprocess

        image = preprocess(self._frame(store, f))[0]
        state = new_state(
            predictor, store.plan.num_frames, video["height"], video["width"], {}, None
        )
        state["images"] = _OneFrame(f, image)
        state["constants"] = {}
        return state


class _OneFrame:
    """SAM 2's `images` for a state that holds one frame: the preprocessed frame at `f`."""

    def __init__(self, f: int, image: torch.Tensor):
        self.f, self.image = f, image

    def __getitem__(self, i: int) -> torch.Tensor:
        if i != self.f:
            raise IndexError(i)
        return self.image
