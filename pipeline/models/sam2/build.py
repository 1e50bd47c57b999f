"""Building SAM 2's video predictor with SAM 2's own builder, for any of its models.

Also the one place where segpipe changes SAM 2's arithmetic: on CPU in float32 the official
predictor crashes when an object's memory holds only bfloat16 mask memories and no object
pointers (`mat1 and mat2 must have the same dtype`). `install_memory_cast` casts that memory
to float32 before memory attention, exactly what `torch.cat` already does as soon as a float32
pointer joins the bfloat16 memories, so every other case stays bit-identical.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

from segpipe.errors import BadInput
from segpipe.models.base import Weights
from segpipe.models.sam2.catalog import OFFICIAL, SHIPPED


def build(
    model: str,
    image_size: int,
    weights: Weights,
    device: str = "cpu",
    postprocessing: bool = True,
    non_overlap: bool = False,
):
    """SAM 2's video predictor for `model` at `image_size`, in eval mode on `device`.

    `postprocessing` is `build_sam2_video_predictor`'s `apply_postprocessing` (on by default,
    as there; SAM 2's `vos_inference` turns it off); `non_overlap` its
    `++model.non_overlap_masks` (each pixel to the highest-scoring object only). Neither
    touches the image encoder: they change tracking, not embeddings."""
    import torch
    from sam2.build_sam import build_sam2_video_predictor

    overrides = [
        f"++model.image_size={image_size}",
        f"++model.non_overlap_masks={'true' if non_overlap else 'false'}",
    ]
    if weights.random_seed is not None:
        torch.manual_seed(weights.random_seed)
    with _BUILDING, _config_dir(model) as config:
        predictor = build_sam2_video_predictor(
            config,
            ckpt_path=None,
            device="cpu",
            hydra_overrides_extra=overrides,
            apply_postprocessing=postprocessing,
        )
    if weights.checkpoint is not None:
        try:
            loaded = torch.load(weights.checkpoint, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - whatever torch says, it is not a checkpoint
            raise BadInput(
                f"{weights.checkpoint} is not a PyTorch checkpoint ({type(e).__name__})"
                f": give a SAM 2 checkpoint file (.pt)"
            ) from None
        if not isinstance(loaded, dict) or "model" not in loaded:
            raise BadInput(
                f"{weights.checkpoint} is a PyTorch file but not a SAM 2 checkpoint "
                f'(no "model" state dict in it)'
            )
        try:
            predictor.load_state_dict(loaded["model"], strict=True)
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInput(
                f"checkpoint {weights.checkpoint} does not fit {model}: {first}"
            ) from None
    install_memory_cast(predictor)
    return predictor.to(device).eval()


@functools.lru_cache(maxsize=None)
def widths(model: str) -> tuple[int, int]:
    """(mem_dim, hidden_dim) of `model`: the official configs' 64 and 256, or what a shipped
    config says (read from its YAML, so the storage estimate needs no torch)."""
    if model not in SHIPPED:
        return 64, 256
    import yaml

    config = yaml.safe_load(SHIPPED[model][0].read_text())["model"]
    return config["memory_encoder"]["out_dim"], config["image_encoder"]["neck"]["d_model"]


# Building one of our models points Hydra, process-wide, at our config folder for the build:
# builds take turns.
_BUILDING = threading.Lock()


@contextmanager
def _config_dir(model: str):
    """The config name SAM 2's builder composes for `model`: an official one from the sam2
    package, or one of ours from its folder (Hydra pointed there for the build only, so SAM 2's
    own builder, overrides and all, makes every model)."""
    if model in OFFICIAL:
        yield OFFICIAL[model][0]
        return
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    config = SHIPPED[model][0]
    # Hydra's own backup and restore (what its initialize_* context managers use): the sam2
    # package's Hydra, made at `import sam2`, is put back after.
    sam2s = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config.parent), version_base="1.2"):
            yield config.name
    finally:
        restore_gh_from_backup(sam2s)


def tracking_options(predictor) -> dict:
    """The build options a predictor was made with, as the track settings record them."""
    return {
        "postprocessing": predictor.fill_hole_area > 0,
        "non_overlap": bool(predictor.non_overlap_masks),
    }


def _autocast_on(device_type: str) -> bool:
    import torch

    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has only the per-device functions
        return (
            torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        )


def install_memory_cast(predictor) -> None:
    """Cast a memory made only of bfloat16 mask memories to the features' dtype (see above)."""
    import torch

    def cast(_module, args, kwargs):
        memory, curr = kwargs.get("memory"), kwargs.get("curr")
        if (
            memory is not None
            and curr
            and memory.dtype == torch.bfloat16
            and curr[0].dtype == torch.float32
            and not _autocast_on(curr[0].device.type)
        ):
            kwargs["memory"] = memory.to(torch.float32)
        return args, kwargs

    if not getattr(predictor, "_segpipe_memory_cast", False):
        predictor.memory_attention.register_forward_pre_hook(cast, with_kwargs=True)
        predictor._segpipe_memory_cast = True
