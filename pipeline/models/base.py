"""What a model family provides segpipe, and the weights any model is built from.

A family is one instance of a `ModelFamily` subclass, registered (`models.registry`); a
model name belongs to exactly one family, and a store made by one model refuses another
(its model record: `segpipe.model.model_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.sources.identity import file_identity


@dataclass(frozen=True)
class Weights:
    """Where the weights come from: a checkpoint file (by sha256) or a random seed."""

    checkpoint: Path | None = None
    random_seed: int | None = None

    def describe(self) -> dict:
        if self.checkpoint is not None:
            return {"checkpoint_sha256": file_identity(self.checkpoint)["sha256"]}
        return {"random_seed": self.random_seed}


@dataclass(frozen=True)
class Sizes:
    """A model's sizes, as the storage estimate needs them (no torch, no weights): the
    memory's and the features' widths, the mask memories and object pointers a frame's
    memory holds at most, and the stored feature levels as (channels, patch, per patch):
    S // patch * per_patch values a side. A mask memory holds `memory_tokens` values of
    `mem_dim` (None: one per patch), stored `memory_bytes` bytes a value (SAM 2's in
    bfloat16; a transformers session's as it computed them)."""

    mem_dim: int
    hidden_dim: int
    num_maskmem: int
    max_obj_ptrs: int
    levels: tuple[tuple[int, int, int], ...]
    memory_tokens: int | None = None
    memory_bytes: int = 2

    def side(self, S: int, level: int) -> int:
        """Level `level`'s side at input size S (a model storing fewer levels: its last)."""
        _, patch, per = self.levels[min(level, len(self.levels) - 1)]
        return S // patch * per

    def memory_slot(self, S: int) -> int:
        """Bytes a frame's mask memory takes in a snapshot (before compression)."""
        patch = self.levels[-1][1]
        tokens = self.memory_tokens or (S // patch) ** 2
        return self.mem_dim * tokens * self.memory_bytes


class ModelFamily:
    """A model family: its models, and for each, the weights, the predictor, the image
    encoder's features and the sizes. Capability flags say what segpipe may do with it.

    The tracking step and the memory snapshot's layout are per kind of tracker, not per
    family: SAM 2's predictor (`stages/track/tracker.py`) or a transformers session
    (`stages/track/session.py`, `session_tracker`); see docs/architecture.md."""

    name: str = ""
    models: tuple[str, ...] = ()
    # capabilities
    checkpoints_from_hub: bool = False  # takes --checkpoint hf:<repo>
    tracks_with_segpipe: bool = (
        True  # tracked chunk by chunk by stages/track (its memory re-injected)
    )
    # tracked by driving the family's own inference session (stages/track/session.py),
    # not SAM 2's predictor (stages/track/tracker.py)
    session_tracker: bool = False
    detects: bool = False  # takes concept prompts (a detector: SAM 3's concept model)

    native_size: int | None = None  # its input size, where not the command line's 1024

    def check_concepts(self, model: str, concepts, weights: "Weights") -> None:
        """Refuse concepts this family cannot take (`BadInput`), before anything is made."""
        raise BadInput(f"{model} has no detector: concept prompts need --model sam3-video")

    def check_size(self, model: str, image_size: int) -> None:
        """Refuse an input size `model` cannot take (`BadInput`), before anything is made."""

    def weights(self, model: str, checkpoint: str | None, random_seed: int | None) -> Weights:
        """Where `model`'s weights come from (one of `checkpoint`, `random_seed`, or the
        family's shipped ones; none of them: `BadInput` saying where to get them)."""
        raise NotImplementedError

    def shipped(self, spec: dict) -> bool:
        """Whether a store's model record is made with weights the family ships (later
        stages find them without --checkpoint)."""
        return False

    def build(self, model: str, image_size: int, weights: Weights, device: str, options: dict):
        """The model's video predictor at `image_size`, in eval mode on `device`, with the
        tracking `options` (`postprocessing`, `non_overlap`)."""
        raise NotImplementedError

    def preprocess(self, frames, device=None):
        """uint8 frames (N, S, S, 3) at the model's size to its normalised float32 input
        (N, 3, S, S) on `device`, as the family's own video predictor makes them."""
        raise NotImplementedError

    def encode(self, predictor, images) -> list:
        """The stored feature levels of a batch of preprocessed images (N, 3, S, S), as the
        tracking step reads them back."""
        raise NotImplementedError

    def tracking_options(self, predictor) -> dict:
        """The tracking options a predictor was built with, as the store records them."""
        raise NotImplementedError

    def sizes(self, model: str | None) -> Sizes:
        """`model`'s sizes (None: the family's usual ones, before a model is chosen)."""
        raise NotImplementedError
