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


# SAM 3's concept model: a detector (its ViT, shared with the tracker, a CLIP text encoder,
# DETR encoder and decoder, mask decoder) beside SAM 3's tracker
SAM3_VIDEO_MINI = {
    "text": {
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "projection_dim": 64,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    },
    "geometry": {"num_layers": 1, "intermediate_size": 256},
    "detr_encoder": {"num_layers": 1, "intermediate_size": 256},
    "detr_decoder": {"num_layers": 1, "intermediate_size": 256, "num_queries": 16},
    # its rules at short-video scale, and thresholds its random weights' scores reach:
    # instances appear mid-video, the hotstart removes some, reconditioning happens
    "video": {
        "score_threshold_detection": 0.4,
        "new_det_thresh": 0.42,
        "assoc_iou_thresh": 0.3,
        "high_conf_thresh": 0.2,
        "high_iou_thresh": 0.5,
        "hotstart_delay": 4,
        "hotstart_unmatch_thresh": 3,
        "hotstart_dup_thresh": 3,
        "recondition_every_nth_frame": 4,
    },
}


def sam3_video_config(image_size: int, mini: bool):
    """SAM 3's video config (detector and tracker) at `image_size` (a multiple of 14)."""
    from transformers import Sam3VideoConfig

    tracker = sam3_tracker_config(image_size, mini).to_dict()
    detector: dict = {}
    if mini:
        small = SAM3_VIDEO_MINI
        detector = {
            "vision_config": {
                "backbone_config": {
                    "model_type": "sam3_vit_model",
                    "image_size": image_size,
                    **SAM3_TRACKER_MINI["backbone"],
                }
            },
            "text_config": small["text"],
            "geometry_encoder_config": small["geometry"],
            "detr_encoder_config": small["detr_encoder"],
            "detr_decoder_config": small["detr_decoder"],
        }
    config = Sam3VideoConfig(detector_config=detector, tracker_config=tracker)
    config.image_size = image_size
    config.low_res_mask_size = image_size // 14 * 4  # the masks' side, 288 at 1008
    if mini:
        for name, value in SAM3_VIDEO_MINI["video"].items():
            setattr(config, name, value)
        config.initializer_range = 0.1
        config.detector_config.initializer_range = 0.1
        for name in (
            "vision_config",
            "text_config",
            "geometry_encoder_config",
            "detr_encoder_config",
            "detr_decoder_config",
            "mask_decoder_config",
        ):
            sub = getattr(config.detector_config, name)
            sub.initializer_range = 0.1
            if getattr(sub, "backbone_config", None) is not None:
                sub.backbone_config.initializer_range = 0.1
    return config


# the -mini's tokenizer: one token a character (its text encoder has 64 tokens)
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 -'"


def tokenizer(folder=None):
    """The concept model's tokenizer: the checkpoint folder's own (CLIP's), or for random
    weights one a character a token, made with `tokenizers` (padded as CLIP's: <pad> 0,
    <bos> 1, <eos> 2)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if folder is not None:
        return AutoTokenizer.from_pretrained(str(folder))
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    special = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate([*special, *CHARACTERS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 1), ("<eos>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_max_length=32,
    )
