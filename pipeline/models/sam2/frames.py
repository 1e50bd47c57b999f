"""SAM 2's frames as its video predictor's frame loader makes them: uint8 frames at the
model's size to normalised float32, bit for bit (`sam2.utils.misc.load_video_frames`)."""

from __future__ import annotations

import numpy as np
import torch

# SAM 2's frame loader normalisation (sam2.utils.misc.load_video_frames)
IMG_MEAN = torch.tensor((0.485, 0.456, 0.406), dtype=torch.float32)[:, None, None]
IMG_STD = torch.tensor((0.229, 0.224, 0.225), dtype=torch.float32)[:, None, None]


def _normalised(device: torch.device) -> torch.Tensor:
    """(3 * 256,) float32: every uint8 value of each channel normalised in SAM 2's arithmetic
    order (/255 in float64 (numpy), cast to float32, minus the mean, divided by the std)."""
    key = str(device)
    if key not in _TABLES:
        values = torch.from_numpy(np.arange(256, dtype=np.uint8) / 255.0).to(torch.float32)
        table = values.repeat(3, 1)
        table -= IMG_MEAN[:, :, 0]
        table /= IMG_STD[:, :, 0]
        _TABLES[key] = table.reshape(-1).to(device)
    return _TABLES[key]


_TABLES: dict[str, torch.Tensor] = {}


def _channel_offsets(device: torch.device) -> torch.Tensor:
    """(1, 3, 1, 1) int64: where each channel's 256 values start in the table."""
    key = f"offsets {device}"
    if key not in _TABLES:
        _TABLES[key] = torch.arange(3, device=device).mul(256).view(1, 3, 1, 1)
    return _TABLES[key]


def preprocess(frames: np.ndarray, device=None) -> torch.Tensor:
    """uint8 (N, S, S, 3) -> normalised float32 (N, 3, S, S), on `device` (None: the CPU):
    SAM 2's frame loader's values bit for bit, each pixel looked up in the table of its 256
    possible results (`_normalised`), so the uint8 frames are what crosses to the device.
    The result is contiguous NCHW like SAM 2's frame tensor: with a channels-last layout the
    convolutions take another kernel and the features change in the last bits."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cpu":  # a plane per channel, looked up by numpy (the faster here)
        table = _normalised(device).view(3, 256).numpy()
        return torch.from_numpy(np.stack([table[c][frames[..., c]] for c in range(3)], axis=1))
    pixels = torch.from_numpy(np.ascontiguousarray(frames))
    if device.type == "cuda":
        pixels = pixels.pin_memory().to(device, non_blocking=True)
    else:  # MPS and the like
        pixels = pixels.to(device)
    index = pixels.permute(0, 3, 1, 2).to(torch.int64) + _channel_offsets(device)
    return _normalised(device)[index].contiguous(memory_format=torch.contiguous_format)
