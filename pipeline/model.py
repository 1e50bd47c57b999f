"""The one way from a model's name and weights to a predictor, whatever its family
(`segpipe.models`): the weights resolved by the model's family, predictors built once and
kept per thread, the device and precision they compute in, and the store's record of the
model its embeddings were made with (a store refuses another)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.fsutil import resolved
from segpipe.models.base import ModelFamily, Weights
from segpipe.models.registry import family_of, models
from segpipe.settings import DEFAULTS, PRECISIONS
from segpipe.store.runstore import RunStore

MODELS = models()  # every family's, as the command line offers them
DEFAULT_MODEL = DEFAULTS["model"]


def resolve_weights(model: str, checkpoint: str | None, random_seed: int | None) -> Weights:
    """Where `model`'s weights come from (its family says: `ModelFamily.weights`)."""
    family = family_of(model)
    if checkpoint is not None and random_seed is not None:
        raise BadInput("give either --checkpoint or --random-weights, not both")
    if checkpoint is not None and checkpoint.startswith("hf:") and not family.checkpoints_from_hub:
        raise BadInput(f"{model} takes no hf: checkpoint: give a checkpoint file")
    return family.weights(model, checkpoint, random_seed)


def build_model(
    model: str,
    image_size: int,
    weights: Weights,
    device: str = "cpu",
    postprocessing: bool = True,
    non_overlap: bool = False,
):
    """`model`'s video predictor at `image_size`, in eval mode on `device`, built by its
    family (`ModelFamily.build`). `postprocessing` is SAM 2's `apply_postprocessing` (on by
    default, as there; SAM 2's `vos_inference` turns it off); `non_overlap` its
    `non_overlap_masks` (each pixel to the highest-scoring object only). Neither touches
    the image encoder: they change tracking, not embeddings."""
    options = {"postprocessing": postprocessing, "non_overlap": non_overlap}
    with BUILDING:  # seeded random weights draw from torch's one generator: a build at a time
        return family_of(model).build(model, image_size, weights, device, options)


BUILDING = threading.RLock()  # (the studio builds its preview's model beside a job's)


def made_by_shipped_weights(spec: dict) -> bool:
    """Whether a store's model record (`encode`'s spec) is a model with the weights its
    family ships, which later stages then find without --checkpoint."""
    return family_of(spec["name"]).shipped(spec)


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
    if Path(weights.checkpoint).suffix == ".safetensors":  # a transformers folder's config
        config = Path(weights.checkpoint).parent / "config.json"
        try:
            size = json.loads(config.read_text()).get("image_size")
        except (OSError, ValueError):
            return None
        return size if isinstance(size, int) else None
    import torch

    try:
        # mmap: an official checkpoint's tensors (up to 900 MB) are not read for this
        size = torch.load(weights.checkpoint, map_location="cpu", weights_only=True, mmap=True).get(
            "image_size"
        )
    except Exception:  # noqa: BLE001 - unreadable: build_model says so
        return None
    return size if isinstance(size, int) else None


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


def family_of_predictor(predictor) -> ModelFamily:
    """The family that built `predictor` (one SAM 2's own builder made: SAM 2)."""
    return getattr(predictor, "segpipe_family", None) or family_of(DEFAULTS["model"])


def tracking_options(predictor) -> dict:
    """The build options a predictor was made with, as the track settings record them."""
    return family_of_predictor(predictor).tracking_options(predictor)


def pick_precision(precision: str | None, device: str) -> str:
    """How SAM 2 computes: "bfloat16" is SAM 2's documented GPU usage (everything under
    `torch.autocast(device, dtype=torch.bfloat16)`, as its README and vos_inference run it),
    the default on CUDA; "float32" (no autocast) the default elsewhere."""
    if precision is None:
        return "bfloat16" if device == "cuda" else "float32"
    if precision not in PRECISIONS:
        raise BadInput(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def precision_of(
    asked: str | None, store=None, device_type: str = "cpu", model: str | None = None
) -> str:
    """The precision work computes in, resolved one way everywhere (encode, the studio's
    preview, the disk guard, the estimate): the one asked for, else the store's (its
    embeddings were made in it), else the default of the device the model runs on
    (`pick_precision`); validated. `model` (else the store's): a family tracked in its own
    session computes in float32 (transformers' sessions in bfloat16 are not tracked yet)."""
    record = (store.attrs.get("model") or {}) if store is not None else {}
    name = model or record.get("name")
    if name is not None and family_of(name).session_tracker:  # float32 alone, for now
        if (asked or "float32") != "float32":
            raise BadInput(f"{name} is tracked in float32 only so far: drop --precision")
        return "float32"
    return pick_precision(asked or record.get("precision"), device_type)


def autocast(device_type: str, precision: str):
    """The autocast context of `precision` on `device_type` (CPU autocast runs the same code
    path as CUDA's, so the GPU semantics can be tested without a GPU)."""
    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


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
            levels = family_of_predictor(predictor).encode(predictor, image)
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
