"""SAM 2's models: the official configs and checkpoints (a file, or hf:), segpipe's own demo
model (`segpipe_tiny`: SAM 2's architecture, smaller, its config and weights shipped in the
package), and where each model's weights come from."""

from __future__ import annotations

import zipfile
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.fsutil import regular_file
from segpipe.models.base import Weights

PACKAGE = Path(__file__).resolve().parents[2]  # segpipe's folder: its configs/ and weights/
# model name -> (config inside the sam2 package, official checkpoint file, Hugging Face repo)
OFFICIAL = {
    "sam2.1_hiera_t": (
        "configs/sam2.1/sam2.1_hiera_t.yaml",
        "sam2.1_hiera_tiny.pt",
        "facebook/sam2.1-hiera-tiny",
    ),
    "sam2.1_hiera_s": (
        "configs/sam2.1/sam2.1_hiera_s.yaml",
        "sam2.1_hiera_small.pt",
        "facebook/sam2.1-hiera-small",
    ),
    "sam2.1_hiera_b+": (
        "configs/sam2.1/sam2.1_hiera_b+.yaml",
        "sam2.1_hiera_base_plus.pt",
        "facebook/sam2.1-hiera-base-plus",
    ),
    "sam2.1_hiera_l": (
        "configs/sam2.1/sam2.1_hiera_l.yaml",
        "sam2.1_hiera_large.pt",
        "facebook/sam2.1-hiera-large",
    ),
    "sam2_hiera_t": (
        "configs/sam2/sam2_hiera_t.yaml",
        "sam2_hiera_tiny.pt",
        "facebook/sam2-hiera-tiny",
    ),
    "sam2_hiera_s": (
        "configs/sam2/sam2_hiera_s.yaml",
        "sam2_hiera_small.pt",
        "facebook/sam2-hiera-small",
    ),
    "sam2_hiera_b+": (
        "configs/sam2/sam2_hiera_b+.yaml",
        "sam2_hiera_base_plus.pt",
        "facebook/sam2-hiera-base-plus",
    ),
    "sam2_hiera_l": (
        "configs/sam2/sam2_hiera_l.yaml",
        "sam2_hiera_large.pt",
        "facebook/sam2-hiera-large",
    ),
}
# segpipe's own: SAM 2's architecture at a size a CPU trains (data/train_tiny.py), its config
# and its weights shipped inside the package (package data): name -> (config, weights)
SHIPPED = {
    "segpipe_tiny": (
        PACKAGE / "configs" / "segpipe_tiny.yaml",
        PACKAGE / "weights" / "segpipe_tiny.pt",
    ),
}
CHECKPOINT_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/{release}/{file}"


def weights(model: str, checkpoint: str | None, random_seed: int | None) -> Weights:
    """Where `model`'s weights come from (a model of this family; not both a checkpoint and
    a seed: `segpipe.model.resolve_weights` checks both)."""
    if checkpoint is None and random_seed is None and model in SHIPPED:
        shipped = SHIPPED[model][1]
        if not shipped.is_file():
            raise BadInput(
                f"{model}'s weights are not at {shipped} (inside the segpipe "
                f"package): reinstall segpipe, train them with python "
                f"data/train_tiny.py, or pass --checkpoint PATH"
            )
        return Weights(checkpoint=shipped)
    if checkpoint is None and random_seed is None:
        _, file, _ = OFFICIAL[model]
        release = "092824" if model.startswith("sam2.1") else "072824"
        raise BadInput(
            f"no weights for {model}: download {CHECKPOINT_URL.format(release=release, file=file)} "
            f"and pass it as --checkpoint PATH (or --checkpoint hf:{OFFICIAL[model][2]}; "
            f"--random-weights SEED for tests only)"
        )
    if random_seed is not None:
        return Weights(random_seed=random_seed)
    if checkpoint.startswith("hf:"):
        return Weights(checkpoint=_hf_checkpoint(checkpoint[3:]))
    path = Path(checkpoint)
    regular_file(path, "checkpoint", "a SAM 2 checkpoint file (.pt)")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive: checked without torch
        raise BadInput(
            f"{path} is not a PyTorch checkpoint (not the zip archive torch.save "
            f"writes): give a SAM 2 checkpoint file (.pt)"
        )
    return Weights(checkpoint=path)


def _hf_checkpoint(repo_id: str) -> Path:
    """Resolve `hf:facebook/sam2.1-hiera-tiny` through huggingface_hub's cache, as SAM 2's
    own `from_pretrained` does; downloaded only when the hub can be reached (asked once,
    so an offline machine hears it in one line, not after huggingface_hub's retries)."""
    files = {repo: file for _, file, repo in OFFICIAL.values()}
    if repo_id not in files:
        raise BadInput(f"unknown Hugging Face model {repo_id!r}; known: {', '.join(files)}")
    from huggingface_hub import constants, hf_hub_download

    where = f"download {files[repo_id]} and pass --checkpoint PATH"
    try:
        return Path(
            hf_hub_download(repo_id=repo_id, filename=files[repo_id], local_files_only=True)
        )
    except Exception:  # noqa: BLE001 - not cached: download it, if the hub can be reached
        pass
    unreachable = _unreachable(constants.ENDPOINT, constants.HF_HUB_OFFLINE)
    if unreachable:
        raise BadInput(
            f"could not get checkpoint hf:{repo_id}: not in the Hugging Face cache, and "
            f"{unreachable}; {where}"
        )
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=files[repo_id]))
    except Exception as e:  # noqa: BLE001 - network, permissions: all one message
        raise BadInput(
            f"could not get checkpoint hf:{repo_id} ({type(e).__name__}); {where}"
        ) from None


def _unreachable(endpoint: str, offline: bool) -> str | None:
    """Why the Hugging Face hub at `endpoint` cannot be reached (None: it answers)."""
    import socket
    from urllib.parse import urlparse

    if offline:
        return "HF_HUB_OFFLINE is set"
    from urllib.request import getproxies

    if getproxies():  # through a proxy: huggingface_hub's own request decides
        return None
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as e:
        return f"{url.hostname} cannot be reached ({e.strerror or e})"
    return None


def made_by_shipped_weights(spec: dict) -> bool:
    """Whether a store's model record (`encode`'s spec) is a shipped model with its shipped
    weights, which later stages then find without --checkpoint."""
    shipped = SHIPPED.get(spec["name"])
    return bool(
        shipped
        and shipped[1].is_file()
        and spec["weights"] == Weights(checkpoint=shipped[1]).describe()
    )
