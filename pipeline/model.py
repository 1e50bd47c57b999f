"""Building SAM 2 models: official configs, checkpoints (file or hf:), seeded random weights,
and segpipe's own demo model (`segpipe_tiny`: SAM 2's architecture, smaller, weights shipped).

Also the one place where segpipe changes SAM 2's arithmetic: on CPU in float32 the official
predictor crashes when an object's memory holds only bfloat16 mask memories and no object
pointers (`mat1 and mat2 must have the same dtype`). `install_memory_cast` casts that memory
to float32 before memory attention, exactly what `torch.cat` already does as soon as a float32
pointer joins the bfloat16 memories, so every other case stays bit-identical.
"""

from __future__ import annotations

import functools
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.fsutil import regular_file, resolved
from segpipe.settings import DEFAULTS, PRECISIONS
from segpipe.sources.identity import file_identity
from segpipe.store.runstore import RunStore

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
        Path(__file__).parent / "configs" / "segpipe_tiny.yaml",
        Path(__file__).resolve().parent / "weights" / "segpipe_tiny.pt",
    ),
}
MODELS = [*OFFICIAL, *SHIPPED]
DEFAULT_MODEL = DEFAULTS["model"]
CHECKPOINT_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/{release}/{file}"


@dataclass(frozen=True)
class Weights:
    """Where the weights come from: a checkpoint file (by sha256) or a random seed."""

    checkpoint: Path | None = None
    random_seed: int | None = None

    def describe(self) -> dict:
        if self.checkpoint is not None:
            return {"checkpoint_sha256": file_identity(self.checkpoint)["sha256"]}
        return {"random_seed": self.random_seed}


def resolve_weights(model: str, checkpoint: str | None, random_seed: int | None) -> Weights:
    if model not in MODELS:
        raise BadInput(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if checkpoint is not None and random_seed is not None:
        raise BadInput("give either --checkpoint or --random-weights, not both")
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


def build_model(
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


def made_by_shipped_weights(spec: dict) -> bool:
    """Whether a store's model record (`encode`'s spec) is a shipped model with its shipped
    weights, which later stages then find without --checkpoint."""
    shipped = SHIPPED.get(spec["name"])
    return bool(
        shipped
        and shipped[1].is_file()
        and spec["weights"] == Weights(checkpoint=shipped[1]).describe()
    )


def for_workers(checkpoint: str | None, weights: Weights) -> str | None:
    """The checkpoint Dask workers are sent: the one given (a path, or an hf: name they
    resolve themselves), else the weights resolved here (a shipped model's, found in this
    installation), else None (random weights)."""
    return checkpoint or (str(weights.checkpoint) if weights.checkpoint else None)


def trained_size(weights: Weights) -> int | None:
    """The image size a checkpoint says it was trained at (data/train_tiny.py records it;
    official checkpoints do not), else None."""
    if weights.checkpoint is None:
        return None
    import torch

    try:
        # mmap: an official checkpoint's tensors (up to 900 MB) are not read for this
        size = torch.load(weights.checkpoint, map_location="cpu", weights_only=True, mmap=True).get(
            "image_size"
        )
    except Exception:  # noqa: BLE001 - unreadable: build_model says so
        return None
    return size if isinstance(size, int) else None


@functools.lru_cache(maxsize=None)
def model_widths(model: str) -> tuple[int, int]:
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


class Models:
    """Predictors built once and kept, one per build (model, image size, weights, device,
    tracking options), the `keep` most recently used. A checkpoint counts by its path, inode,
    size and modification and change times: a file written again is built again. SAM 2's predictor keeps
    nothing of a video between calls (a video's state is its `inference_state`; segpipe's
    per-frame sharing lets go of what it holds at each frame's end), so a kept predictor
    tracks as a new one does."""

    def __init__(self, keep: int = 2):
        self.keep, self.built = keep, {}

    def get(
        self,
        model: str,
        image_size: int,
        weights: Weights,
        device: str,
        postprocessing: bool = True,
        non_overlap: bool = False,
    ):
        key = (model, image_size, _fingerprint(weights), device, postprocessing, non_overlap)
        if key in self.built:
            self.built[key] = self.built.pop(key)  # the most recently used, last
        else:
            while len(self.built) >= self.keep:
                del self.built[next(iter(self.built))]
            self.built[key] = build_model(
                model,
                image_size,
                weights,
                device,
                postprocessing=postprocessing,
                non_overlap=non_overlap,
            )
        return self.built[key]


def _fingerprint(weights: Weights) -> tuple:
    if weights.checkpoint is None:
        return ("random", weights.random_seed)
    try:
        stat = Path(weights.checkpoint).stat()
    except OSError:  # build_model says what is wrong with it
        return ("file", str(weights.checkpoint), None)
    # the change time too: a copy that keeps the old modification time (cp -p, rsync -a)
    # still changes it
    return (
        "file",
        str(resolved(weights.checkpoint)),
        stat.st_dev,
        stat.st_ino,
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
    )


_KEPT = threading.local()  # each thread's `Models`: `shared_predictor`


def shared_predictor(
    model: str,
    image_size: int,
    weights: Weights,
    device: str,
    postprocessing: bool = True,
    non_overlap: bool = False,
):
    """SAM 2's video predictor for these settings, built once in this thread and kept
    (`Models`, the last one built): one command's stages, the API calls and dataset videos
    that follow one another, the tasks a Dask worker runs (one at a time, in one thread)
    share it. Two threads never share one: a predictor is not made to run two videos at
    once. It stays in memory until another is built in the thread, the thread ends, or
    `release_predictors()`."""
    if not hasattr(_KEPT, "models"):
        _KEPT.models = Models(keep=1)  # (the old one let go before the next is built)
    return _KEPT.models.get(model, image_size, weights, device, postprocessing, non_overlap)


def release_predictors() -> None:
    """Let go of the predictor this thread keeps (`shared_predictor`)."""
    _KEPT.__dict__.pop("models", None)


def tracking_options(predictor) -> dict:
    """The build options a predictor was made with, as the track settings record them."""
    return {
        "postprocessing": predictor.fill_hole_area > 0,
        "non_overlap": bool(predictor.non_overlap_masks),
    }


def pick_precision(precision: str | None, device: str) -> str:
    """How SAM 2 computes: "bfloat16" is SAM 2's documented GPU usage (everything under
    `torch.autocast(device, dtype=torch.bfloat16)`, as its README and vos_inference run it),
    the default on CUDA; "float32" (no autocast) the default elsewhere."""
    if precision is None:
        return "bfloat16" if device == "cuda" else "float32"
    if precision not in PRECISIONS:
        raise BadInput(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def autocast(device_type: str, precision: str):
    """The autocast context of `precision` on `device_type` (CPU autocast runs the same code
    path as CUDA's, so the GPU semantics can be tested without a GPU)."""
    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


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


_PROBES: dict = {}


def thread_probe() -> str:
    """A digest of what SAM 2's image encoder computes here, at this process's torch thread
    count and thread environment: SAM 2.1 tiny with seeded random weights on one seeded
    64 x 64 image (a second or so). CPU results change in their last bits with the thread
    count (at 64 already), so two processes that give the same digest compute alike; Dask's
    client compares its workers' with its own before sending them work."""
    import hashlib

    import torch

    threads = torch.get_num_threads()
    if threads not in _PROBES:
        predictor = build_model("sam2.1_hiera_t", 64, Weights(random_seed=0))
        image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            levels = predictor.forward_image(image)["backbone_fpn"]
        digest = hashlib.sha256()
        for level in levels:
            digest.update(level.contiguous().numpy().tobytes())
        _PROBES[threads] = digest.hexdigest()[:16]
    return _PROBES[threads]


def predictor_for(
    spec: dict, weights: Weights, device: str, options: dict | None = None, kept: bool = True
):
    """The one way from a model record (`spec`: its `name` and `image_size`) and its weights
    to a predictor on `device`, built with the tracking `options` (postprocessing and
    non-overlap; None: SAM 2's defaults, which the image encoder does not depend on): this
    thread's kept one (`shared_predictor`), or, not `kept`, a new one."""
    from segpipe.store.tracking import OPTIONS

    options = OPTIONS if options is None else options
    return (shared_predictor if kept else build_model)(
        spec["name"],
        spec["image_size"],
        weights,
        pick_device(device),
        postprocessing=options["postprocessing"],
        non_overlap=options["non_overlap"],
    )


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda asked for, but torch sees no CUDA device")
    if device == "mps" and not torch.backends.mps.is_available():
        raise BadInput("--device mps asked for, but torch sees no MPS device")
    return device


def model_spec(
    store: RunStore, model: str, weights, embedding_dtype: str, precision: str = "float32"
) -> dict:
    return {
        "name": model,
        "image_size": store.image_size,
        "weights": weights.describe(),
        "embedding_dtype": embedding_dtype,
        "precision": precision,
    }


def model_spec_of(store: RunStore) -> dict | None:
    """The store's model record as `model_spec` makes it (without the compute environment
    it records beside: `segpipe.environment`), or None before encode."""
    record = store.attrs.get("model")
    if record is None:
        return None
    return {k: v for k, v in record.items() if not k.startswith("environment")}


def check_model(store: RunStore, spec: dict) -> None:
    """Encode and track refuse to mix embeddings of different models in one store."""
    existing = store.attrs.get("model")
    if existing is None:
        return
    for key in ("name", "image_size", "weights", "embedding_dtype", "precision"):
        store.require(f"model {key}", existing[key], spec[key])
