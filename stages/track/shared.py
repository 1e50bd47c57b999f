"""Work SAM 2 repeats for every object of a frame, done once a frame.

sam2 1.1.0 tracks each object alone on the same frame features, so two steps of every
object's tracking of a frame take the same input: the first memory-attention layer's
self-attention (over the frame's own tokens, before any memory is seen) and the memory
encoder's projection of the frame's features (`pix_feat_proj`). Inside `PerFrame.frame()`
each runs once and its result is handed to the next objects; a call whose inputs are not
bit for bit those of the held result (dtype, shape, strides, every bit; the held inputs are
copies, so a tensor changed in place since cannot pass) is computed anew, so sharing skips
only a computation whose inputs equal those of one already done (same op, same shapes: the
same bits on the same device and thread count). The held output is handed on as it is: SAM 2
reads it (`x + masks`, `tgt + ...`) and never changes it in place.

On the CPU only: comparing tensors on a GPU would wait for it once per object, against the
tracker's one wait per chunk. The state is per thread (the studio may preview on another
thread while a job tracks). `benchmarks/bench_shared.py` measures what it saves.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext

import torch


class Shared(threading.local):
    """Wraps one computation: while `on` (in this thread), the last call's inputs (copied) and
    output are held, and a call with bit-identical inputs gets that output back. `computed`
    counts real calls."""

    def __init__(self, fn):
        self.fn, self.on, self.held, self.computed = fn, False, None, 0

    def __call__(self, *args):
        if self.on and self.held is not None and same(self.held[0], args):
            return self.held[1]
        self.computed += 1
        out = self.fn(*args)
        if self.on:
            self.held = (tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), out)
        return out


class PerFrame:
    """The shared steps of one predictor, installed on it once (`of`)."""

    def __init__(self, predictor):
        self.cpu = predictor.device.type == "cpu"
        layer = predictor.memory_attention.layers[0]
        projection = predictor.memory_encoder.pix_feat_proj
        self.steps = {
            "self_attention": Shared(layer._forward_sa),
            "pix_feat_proj": Shared(projection.forward),
        }
        # instance attributes: SAM 2's code calls them as before; the weights are untouched
        layer._forward_sa = self.steps["self_attention"]
        projection.forward = self.steps["pix_feat_proj"]

    @classmethod
    def of(cls, predictor) -> PerFrame:
        shared = getattr(predictor, "_segpipe_per_frame", None)
        if shared is None:
            shared = predictor._segpipe_per_frame = cls(predictor)
        return shared

    def frame(self):
        """Share within one frame's objects (on the CPU); what is held is let go at the end."""
        return self._sharing() if self.cpu else nullcontext()

    @contextmanager
    def _sharing(self):
        for step in self.steps.values():
            step.on, step.held = True, None
        try:
            yield
        finally:
            for step in self.steps.values():
                step.on, step.held = False, None


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _same(x, y) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return x is y
    if (x.dtype, x.shape, x.stride(), x.device) != (y.dtype, y.shape, y.stride(), y.device):
        return False  # a layout computes other bits (see store.features.restore_layout)
    if x.dtype.is_floating_point:  # bits, not values: -0.0 and 0.0 differ, a NaN equals itself
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        x, y = x.view(bits), y.view(bits)
    return torch.equal(x, y)
