"""The transformers configs of the families segpipe runs through Hugging Face transformers,
at a given input size: the full architectures (their defaults) and the small ones segpipe
offers for tests and trials (random weights only). No weights here: `family.build` loads
them."""

from __future__ import annotations

# a model name -> (family, the config's overrides); "-mini" models are the architectures at
# small widths and depths, which random weights make run on 2 cores in well under a second
# a frame at 256
EDGETAM_MINI = {
    "backbone": {
        "hidden_size": 32,
        "embed_dim_per_stage": [32, 64, 128, 256],
        "blocks_per_stage": [1, 1, 2, 1],
        "num_attention_heads_per_stage": [1, 1, 2, 4],
        "global_attention_blocks": [3],
    },
    "fpn_hidden_size": 256,
    "memory_attention_mlp_hidden_size": 256,
    "memory_fuser_intermediate_dim": 256,
}
SAM3_TRACKER_MINI = {
    "backbone": {
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "window_size": 8,
        "global_attn_indexes": [1],
    },
    "memory_attention_mlp_hidden_size": 256,
    "memory_fuser_intermediate_dim": 256,
}


def _spread(config, std: float):
    """Random weights drawn at `std` (transformers' 0.02 gives near-constant logits at these
    sizes: nothing above 0, no occlusion): masks that appear and vanish exercise more."""
    config.initializer_range = std
    for name in ("vision_config", "prompt_encoder_config", "mask_decoder_config"):
        sub = getattr(config, name)
        sub.initializer_range = std
        if getattr(sub, "backbone_config", None) is not None:
            sub.backbone_config.initializer_range = std
    return config


def edgetam_config(image_size: int, mini: bool):
    """EdgeTAM's video config at `image_size` (a multiple of 16), with SAM 2.1 tiny's Hiera
    as its vision encoder, as transformers' `EdgeTamVideoConfig` defaults to (the RepViT of
    facebook's checkpoint needs timm, which needs torchvision): `--checkpoint` brings the
    checkpoint's own."""
    from transformers import EdgeTamVideoConfig

    small = EDGETAM_MINI if mini else {}
    S = image_size
    backbone = {"image_size": [S, S], **small.get("backbone", {})}
    if mini:
        backbone["num_attention_heads"] = 1
    channels = list(reversed(backbone.get("embed_dim_per_stage", [96, 192, 384, 768])))
    vision = {
        "model_type": "sam2_vision_model",
        "backbone_config": {"model_type": "sam2_hiera_det_model", **backbone},
        "backbone_channel_list": channels,
        "backbone_feature_sizes": [[S // 4] * 2, [S // 8] * 2, [S // 16] * 2],
    }
    rest = {k: v for k, v in small.items() if k not in ("backbone", "fpn_hidden_size")}
    config = EdgeTamVideoConfig(
        vision_config=vision,
        prompt_encoder_config={"image_size": S},
        image_size=S,
        memory_attention_rope_feat_sizes=[S // 16, S // 16],
        **rest,
    )
    return _spread(config, 0.3) if mini else config


def sam3_tracker_config(image_size: int, mini: bool):
    """SAM 3's tracker's video config at `image_size` (a multiple of 14)."""
    from transformers import Sam3TrackerVideoConfig

    small = SAM3_TRACKER_MINI if mini else {}
    vision = {"model_type": "sam3_vision_model"}
    if mini:
        vision["backbone_config"] = {
            "model_type": "sam3_vit_model",
            "image_size": image_size,
            **small["backbone"],
        }
    rest = {k: v for k, v in small.items() if k != "backbone"}
    config = Sam3TrackerVideoConfig(vision_config=vision, **rest)
    config.image_size = image_size  # propagated to the sub-configs by the config itself
    return _spread(config, 0.1) if mini else config
