"""SAM 2 as a model family: SAM 2 and 2.1's official models and segpipe_tiny, built by SAM
2's own builder; its image encoder's three levels are the stored features, and
`stages/track` is its tracking step."""

from __future__ import annotations

from segpipe.errors import BadInput
from segpipe.models.base import ModelFamily, Sizes, Weights
from segpipe.models.sam2 import build, catalog

# SAM 2's tracker (every official config): mask memories of num_maskmem - 1 = 6 earlier
# frames, object pointers of max_obj_ptrs_in_encoder - 1 = 15; segpipe_tiny has the same
# memory sizes and narrower widths (its config).
NUM_MASKMEM, MAX_OBJ_PTRS = 7, 16


class Sam2(ModelFamily):
    name = "sam2"
    models = (*catalog.OFFICIAL, *catalog.SHIPPED)
    checkpoints_from_hub = True

    def weights(self, model, checkpoint, random_seed) -> Weights:
        return catalog.weights(model, checkpoint, random_seed)

    def shipped(self, spec: dict) -> bool:
        return catalog.made_by_shipped_weights(spec)

    def check_size(self, model, image_size):
        if image_size % 32:
            raise BadInput(f"{model} takes image sizes that are multiples of 32 (its stride)")

    def build(self, model, image_size, weights, device, options):
        self.check_size(model, image_size)
        predictor = build.build(
            model,
            image_size,
            weights,
            device,
            postprocessing=options["postprocessing"],
            non_overlap=options["non_overlap"],
        )
        predictor.segpipe_family = self  # (`segpipe.model.family_of_predictor`)
        return predictor

    def preprocess(self, frames, device=None):
        from segpipe.models.sam2.frames import preprocess  # torch: once there is work

        return preprocess(frames, device)

    def encode(self, predictor, images) -> list:
        """The backbone's three levels, as `forward_image` gives them (levels 0 and 1
        already through the mask decoder's conv_s0 / conv_s1)."""
        return predictor.forward_image(images)["backbone_fpn"]

    def tracking_options(self, predictor) -> dict:
        return build.tracking_options(predictor)

    def sizes(self, model) -> Sizes:
        mem_dim, hidden_dim = build.widths(model) if model else (64, 256)
        # levels 0 and 1 come out of the mask decoder's conv_s0 / conv_s1: hidden_dim / 8
        # and / 4 channels, at strides 4 and 8; level 2 at 16
        levels = ((hidden_dim // 8, 16, 4), (hidden_dim // 4, 16, 2), (hidden_dim, 16, 1))
        return Sizes(mem_dim, hidden_dim, NUM_MASKMEM, MAX_OBJ_PTRS, levels)


SAM2 = Sam2()
