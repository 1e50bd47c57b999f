"""How well segpipe's flags (`segpipe.flags`) find where tracking broke, on generated
tracked results with known failures (`data/failures.py`: a swap onto another object, a
slow drift onto the background, a disappearance; and clean clips), at the flags' own
thresholds. Prints, per failure kind, on how many clips the failed object was flagged
within 3 frames of where the ground truth says the tracking broke (and the offsets), and
the false flags per 100 frames on clean clips, by kind.

    python benchmarks/bench_flags.py [--seeds 5] [--frames 300]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "data"))

import failures  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=300)
    args = parser.parse_args(argv)
    out = {}
    print(f"{'clip':<10} {'clips':>5} {'flagged within 3':>16}  offsets / false flags")
    for kind in failures.KINDS:
        offsets = []
        for seed in range(args.seeds):
            clip = failures.tracked(kind, args.frames, at=args.frames // 3 + 7 * seed, seed=seed)
            offsets.append(failures.found(clip, failures.flagged(clip)))
        hit = sum(o is not None for o in offsets)
        out[kind] = (hit, args.seeds, offsets)
        print(f"{kind:<10} {args.seeds:>5} {hit:>16}  {offsets}")
    false, frames = Counter(), 0
    for seed in range(args.seeds):
        clip = failures.tracked(None, args.frames, seed=100 + seed)
        false.update(f.kind for f in failures.flagged(clip))
        frames += args.frames
    rate = 100 * sum(false.values()) / frames
    out["clean"] = (rate, dict(false))
    print(f"{'clean':<10} {args.seeds:>5} {'':>16}  {rate:.2f} per 100 frames {dict(false)}")
    return out


if __name__ == "__main__":
    main()
