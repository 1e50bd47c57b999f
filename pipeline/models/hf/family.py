"""The trackers Hugging Face transformers hosts (EdgeTAM, SAM 3's tracker) as model families:
transformers' own model, built from its config (seeded random weights) or loaded from a
checkpoint folder (`--checkpoint hf:<repo>` or a local folder); its image encoder's three
levels are the stored features, and `stages/track/session.py` drives transformers' own
inference session over them chunk by chunk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.models.base import ModelFamily, Sizes, Weights
from segpipe.models.hf import configs

FILES = ["*.json", "*.safetensors"]  # a repository's config and weights (not its .pt files)
TEXT_TOKENS = 32  # what `Sam3VideoProcessor.add_text_prompt` pads a concept to


@dataclass
class SessionPredictor:
    """A transformers video model with what segpipe asks of a predictor: its device, input
    size and family; `session_class` makes its inference sessions."""

    model: object
    image_size: int
    device: object
    segpipe_family: "HfVideo"
    options: dict  # the tracking options it was built with (`tracking_options`)
    tokenizer: object = None  # a concept model's (`Sam3Video`)

    @property
    def session_class(self):
        return self.segpipe_family.session_class()


class HfVideo(ModelFamily):
    """A video tracker of transformers (its `propagate_in_video_iterator` API). Each subclass
    names its classes, config, normalisation, checkpoint types and where to get weights."""

    checkpoints_from_hub = True
    session_tracker = True  # tracked by stages/track/session.py, in transformers' session
    model_types: tuple[str, ...] = ()  # a checkpoint's config.json `model_type`s it loads
    hub: str = ""  # where its official weights are
    mean = std = (0.0, 0.0, 0.0)
    multiple = 16  # the input size is a multiple of the image encoder's patch
    masks_beside_others = True  # a mask prompt works with other objects in the session
    smallest = 0  # the smallest input size its architecture takes
    memory_tokens: int | None = None  # a mask memory's tokens (None: one per patch)
    memory_bytes = 2  # bytes a value of a mask memory (transformers casts it as SAM 2 does)
    detects = False  # takes concept prompts (a detector: `Sam3Video`)
    files = FILES  # what a hub checkpoint brings

    def model_class(self):
        raise NotImplementedError

    def session_class(self):
        raise NotImplementedError

    def processor_class(self):
        """transformers' video processor class (its prompt handling alone is used)."""
        raise NotImplementedError

    def config(self, model: str, image_size: int):
        raise NotImplementedError

    def weights(self, model, checkpoint, random_seed) -> Weights:
        if random_seed is not None:
            return Weights(random_seed=random_seed)
        if model.endswith("-mini"):
            raise BadInput(f"{model} has no weights: it is for tests (--random-weights SEED)")
        if checkpoint is None:
            raise BadInput(
                f"no weights for {model}: pass --checkpoint hf:{self.hub} (or a folder "
                f"holding its config.json and model.safetensors; --random-weights SEED for "
                f"tests only)"
            )
        folder = (
            _hub_folder(checkpoint[3:], self.files)
            if checkpoint.startswith("hf:")
            else Path(checkpoint)
        )
        return Weights(checkpoint=self._weights_file(folder))

    def _weights_file(self, folder: Path) -> Path:
        """The checkpoint folder's weights file, once its config says it is this family's."""
        config = folder / "config.json"
        if not config.is_file():
            raise BadInput(f"{folder} is not a transformers checkpoint folder (no config.json)")
        try:
            kind = json.loads(config.read_text()).get("model_type")
        except (ValueError, OSError):
            raise BadInput(f"{config} is not readable JSON") from None
        if kind not in self.model_types:
            raise BadInput(
                f"{folder} holds a {kind!r} checkpoint, not {self.name}'s "
                f"({', '.join(self.model_types)})"
            )
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise BadInput(f"{folder} has no .safetensors weights")
        return files[0]

    def build(self, model, image_size, weights, device, options) -> SessionPredictor:
        """transformers' model; `options`: SAM 2's postprocessing has no part here (recorded
        as given), non-overlap is not offered."""
        import torch

        if options.get("non_overlap"):
            raise BadInput(f"{model}: --non-overlap is SAM 2's alone so far")
        self.check_size(model, image_size)
        cls = self.model_class()
        if weights.checkpoint is not None:
            net = _load(cls, Path(weights.checkpoint).parent)
            if net.config.image_size != image_size:
                raise BadInput(
                    f"{model}'s checkpoint is made for --image-size {net.config.image_size}"
                )
        else:
            torch.manual_seed(weights.random_seed)
            net = cls(self.config(model, image_size))
        net = net.to(device).eval()
        return SessionPredictor(net, image_size, torch.device(device), self, dict(options))

    def check_size(self, model, image_size):
        if image_size % self.multiple or image_size < self.smallest:
            least = f"of at least {self.smallest} " if self.smallest else ""
            raise BadInput(
                f"{model} takes image sizes {least}that are multiples of {self.multiple}, "
                f"not {image_size}"
            )

    def preprocess(self, frames, device=None):
        """uint8 (N, S, S, 3) -> float32 (N, 3, S, S) as transformers' processors normalise
        (rescale and normalise fused: (x - 255 mean) / (255 std), in float32)."""
        import torch

        x = torch.from_numpy(frames).to(device or "cpu").permute(0, 3, 1, 2).to(torch.float32)
        mean = torch.tensor(self.mean, device=x.device) * (1.0 / (1 / 255))
        std = torch.tensor(self.std, device=x.device) * (1.0 / (1 / 255))
        return ((x - mean[:, None, None]) / std[:, None, None]).contiguous()

    def encode(self, predictor, images) -> list:
        """The three levels `get_image_features` gives (levels 0 and 1 through the mask
        decoder's conv_s0 / conv_s1), as (N, C, H, W) views of what it computed."""
        out = predictor.model.get_image_features(images, return_dict=True)
        levels = []
        for feats, (h, w) in zip(out.fpn_hidden_states, self.feature_sizes(predictor)):
            levels.append(feats.permute(1, 2, 0).unflatten(2, (h, w)))
        return levels

    def feature_sizes(self, predictor) -> list:
        return [tuple(s) for s in predictor.model.config.vision_config.backbone_feature_sizes]

    def tracking_options(self, predictor) -> dict:
        return {k: predictor.options[k] for k in ("postprocessing", "non_overlap")}

    def sizes(self, model) -> Sizes:
        # levels 0 and 1 through the mask decoder's conv_s0 / conv_s1, as SAM 2's; a mask
        # memory's positional encoding, stored beside it, is the same for every frame and
        # compresses to next to nothing
        p = self.multiple
        levels = ((32, p, 4), (64, p, 2), (256, p, 1))
        return Sizes(64, 256, 7, 16, levels, self.memory_tokens, self.memory_bytes)


class EdgeTam(HfVideo):
    name = "edgetam"
    models = ("edgetam", "edgetam-mini")
    model_types = ("edgetam_video",)
    hub = "yonigozlan/EdgeTAM-hf"  # the checkpoint transformers' own docs name
    native_size = 1024
    # transformers 5.23: EdgeTAM's mask-prompted output has a (1, 1) score where a tracked
    # object's is (1, 1, 1): its forward cannot concatenate a frame holding both
    masks_beside_others = False
    smallest = 256  # its perceiver's 16 x 16 latents pool the features at stride 16
    memory_tokens = 512  # its perceiver's latents: 256 1-D and 16 x 16 2-D
    memory_bytes = 4  # float32: its perceiver's output, cast to the masks' dtype
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def model_class(self):
        from transformers import EdgeTamVideoModel

        return EdgeTamVideoModel

    def session_class(self):
        from transformers.models.edgetam_video.modeling_edgetam_video import (
            EdgeTamVideoInferenceSession,
        )

        return EdgeTamVideoInferenceSession

    def processor_class(self):
        from transformers import Sam2VideoProcessor

        return Sam2VideoProcessor

    def config(self, model, image_size):
        return configs.edgetam_config(image_size, model.endswith("-mini"))


class Sam3Tracker(HfVideo):
    name = "sam3-tracker"
    models = ("sam3-tracker", "sam3-tracker-mini")
    model_types = ("sam3_tracker_video", "sam3_video", "sam3")
    hub = "facebook/sam3"
    native_size = 1008
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    multiple = 14

    def model_class(self):
        from transformers import Sam3TrackerVideoModel

        return Sam3TrackerVideoModel

    def session_class(self):
        from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import (
            Sam3TrackerVideoInferenceSession,
        )

        return Sam3TrackerVideoInferenceSession

    def processor_class(self):
        from transformers import Sam3TrackerVideoProcessor

        return Sam3TrackerVideoProcessor

    def config(self, model, image_size):
        return configs.sam3_tracker_config(image_size, model.endswith("-mini"))


class Sam3Video(HfVideo):
    """SAM 3's concept model: its detector finds every instance of a noun phrase on each
    frame, its tracker follows them, and transformers' `Sam3VideoModel` decides which
    survive (hotstart, association). Tracked by `stages/track/concepts.py`. The stored
    features are its vision backbone's output, which both its necks read."""

    name = "sam3-video"
    models = ("sam3-video", "sam3-video-mini")
    model_types = ("sam3_video",)
    hub = "facebook/sam3"
    native_size = 1008
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    multiple = 14
    detects = True  # takes concept prompts (noun phrases); clicks beside them only
    files = ["*.json", "*.safetensors", "*.txt"]  # with its tokenizer's

    def model_class(self):
        from transformers import Sam3VideoModel

        return Sam3VideoModel

    def session_class(self):
        from transformers.models.sam3_video.modeling_sam3_video import (
            Sam3VideoInferenceSession,
        )

        return Sam3VideoInferenceSession

    def processor_class(self):
        from transformers.models.sam3_video.processing_sam3_video import Sam3VideoProcessor

        return Sam3VideoProcessor

    def config(self, model, image_size):
        return configs.sam3_video_config(image_size, model.endswith("-mini"))

    def build(self, model, image_size, weights, device, options) -> SessionPredictor:
        predictor = super().build(model, image_size, weights, device, options)
        folder = None if weights.checkpoint is None else Path(weights.checkpoint).parent
        predictor.tokenizer = configs.tokenizer(folder)
        return predictor

    def click_predictor(self, predictor: SessionPredictor) -> SessionPredictor:
        """SAM 3's tracker alone, for objects clicked beside the concepts: the concept
        model's own (`tracker_model`: a `Sam3TrackerVideoModel` without an image encoder),
        which is the model transformers loads as `Sam3TrackerVideoModel` from this model's
        checkpoint, less the image encoder whose output `stages.track.clicks` gives it."""
        model, size, device = predictor.model.tracker_model, predictor.image_size, predictor.device
        return SessionPredictor(model, size, device, SAM3_TRACKER, predictor.options)

    def check_concepts(self, model: str, concepts, weights: Weights) -> None:
        """Refuse a concept longer than its processor pads a text to (32 tokens, its start
        and end among them: its text encoder reads no more), counted by the model's own
        tokenizer (no model built)."""
        folder = None if weights.checkpoint is None else Path(weights.checkpoint).parent
        tokenize = configs.tokenizer(folder)
        for c in concepts:
            n = len(tokenize(c, verbose=False).input_ids)
            if n > TEXT_TOKENS:
                raise BadInput(f"--concept {c!r} is {n} tokens: {model} reads {TEXT_TOKENS}")

    def encode(self, predictor, images) -> list:
        """The vision backbone's output as the neck takes it, (N, C, H/14, W/14): one level,
        from which the detector's and the tracker's necks are computed as they track."""
        import torch

        vision = predictor.model.detector_model.vision_encoder
        side = images.shape[-1] // self.multiple
        # one frame at a time, as transformers' session encodes them (a batch's kernels
        # may round otherwise)
        hidden = torch.cat([vision.backbone(images[i : i + 1]).last_hidden_state
                            for i in range(len(images))])  # fmt: skip
        return [hidden.view(len(images), side, side, -1).permute(0, 3, 1, 2)]

    def feature_sizes(self, predictor) -> list:
        side = predictor.image_size // self.multiple
        return [(side, side)]

    def sizes(self, model) -> Sizes:
        # one level: the backbone's, 1024 wide (the -mini's 96) at one value a patch
        width = (
            configs.SAM3_TRACKER_MINI["backbone"]["hidden_size"]
            if model.endswith("-mini")
            else 1024
        )
        return Sizes(64, 256, 7, 16, ((width, self.multiple, 1),), None, 4)


def _load(cls, folder: Path):
    """transformers' model from a checkpoint folder, in float32 (transformers' default is
    the checkpoint's dtype); an encoder it cannot build here said in one line."""
    import torch

    try:
        return cls.from_pretrained(str(folder), dtype=torch.float32)
    except ImportError as e:  # EdgeTAM's RepViT: timm, which needs torchvision
        raise BadInput(
            f"{folder}: its image encoder needs a package missing here ({e.name or e}): "
            f"install timm and a torchvision built for this torch"
        ) from None


def _hub_folder(repo_id: str, files: list[str]) -> Path:
    """A hub repository's snapshot folder (the cache first; a gated repository without a
    login said in one line)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=files))
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=files))
    except GatedRepoError:
        raise BadInput(
            f"hf:{repo_id} is gated: accept its licence on huggingface.co/{repo_id}, then "
            f"log in here with `hf auth login` (or set HF_TOKEN)"
        ) from None
    except Exception as e:  # noqa: BLE001 - network, permissions: all one message
        raise BadInput(
            f"could not get hf:{repo_id} ({type(e).__name__}); download it and pass its "
            f"folder as --checkpoint"
        ) from None


EDGETAM, SAM3_TRACKER, SAM3_VIDEO = EdgeTam(), Sam3Tracker(), Sam3Video()
