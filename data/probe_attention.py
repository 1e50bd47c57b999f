#!/usr/bin/env python3
"""Where does memory attention look? Tracks `bench_quality`'s held-out "bounce" clip forward
with a model and says what share of memory cross-attention's weight lands on memory tokens at
the query's own position (in any memory frame), and on the object pointers.

A model that follows objects by their looks spreads its attention; `look_where_it_was`'s start puts it
all in place, and the shipped weights kept it there (docs/demo-model.md: 0.987).

    python data/probe_attention.py                          # the shipped segpipe_tiny
    python data/probe_attention.py --checkpoint data/next.pt
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
import bench_quality  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the shipped weights")
    args = parser.parse_args()
    import sam2.modeling.sam.transformer as transformer
    from sam2.modeling.position_encoding import apply_rotary_enc

    import segpipe
    from segpipe.model import resolve_weights, trained_size

    shares = []  # (own position, object pointers) per cross-attention call
    forward = transformer.RoPEAttention.forward

    def watched(self, q, k, v, num_k_exclude_rope=0):
        if self.rope_k_repeat:  # cross-attention to the memories (not self-attention)
            with torch.no_grad():
                qq = self._separate_heads(self.q_proj(q), self.num_heads)
                kk = self._separate_heads(self.k_proj(k), self.num_heads)
                n = qq.shape[-2]
                cis = self.compute_cis(end_x=math.isqrt(n), end_y=math.isqrt(n))
                rope = kk.shape[-2] - num_k_exclude_rope
                qr, kr = apply_rotary_enc(qq, kk[:, :, :rope], freqs_cis=cis, repeat_freqs_k=True)
                keys = torch.cat([kr, kk[:, :, rope:]], 2)
                weight = (qr @ keys.transpose(-1, -2) / math.sqrt(qq.shape[-1])).softmax(-1)
                own = torch.arange(n)
                same = sum(weight[..., own, m * n + own] for m in range(rope // n))
                shares.append((float(same.mean()), float(weight[..., rope:].sum(-1).mean())))
        return forward(self, q, k, v, num_k_exclude_rope)

    transformer.RoPEAttention.forward = watched
    size = trained_size(resolve_weights("segpipe_tiny", args.checkpoint, None)) or 128
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        video, truth = bench_quality.write_clip(folder, "bounce")
        prompts = bench_quality.write_prompts(folder, "bounce", truth, 0, "forward")
        segpipe.run(
            video,
            folder / "bounce.zarr",
            prompts,
            decoding=segpipe.Decoding(image_size=size),
            encoding=segpipe.Encoding(model="segpipe_tiny", checkpoint=args.checkpoint),
            output=segpipe.Output(exports=[]),
            execution=segpipe.Execution(device="cpu", progress=False),
        )
    own, pointers = np.mean(shares, 0)
    tokens = (size // 16) ** 2
    print(
        f"memory attention ({args.checkpoint or 'shipped weights'}, image size {size}): "
        f"{own:.3f} of its weight on the query's own position (spread evenly: about "
        f"{1 / tokens:.3f}), {pointers:.3f} on object pointers, over {len(shares)} calls"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
