#!/usr/bin/env python3
"""Start-up: `import segpipe`, `segpipe --help` and `segpipe status` beside `import torch`.

`import segpipe` must not import torch or SAM 2 (the calls that run the model do), so the
CLI's light commands answer well under a second. Each figure is the median wall time of
fresh processes (the interpreter's own start-up included).
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from measure import ROOT, measure, python, table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(ROOT / "data"))
        import make_sample

        frames, _ = make_sample.make_clip(num_frames=8, width=64, height=48)
        make_sample.write_video(Path(tmp) / "clip.mp4", frames)
        store = Path(tmp) / "clip.zarr"
        cli = [sys.executable, "-m", "segpipe.cli"]
        measure(
            cli
            + ["decode", Path(tmp) / "clip.mp4", "--store", store, "--image-size", 32, "--quiet"]
        )
        cases = [
            ("python -c 'import torch'", python("import torch")),
            ("python -c 'import segpipe'", python("import segpipe")),
            ("segpipe --help", cli + ["--help"]),
            ("segpipe status", cli + ["status", "--store", store]),
        ]
        rows = []
        for name, argv in cases:
            times = [measure(argv)[0] for _ in range(args.repeats)]
            rows.append([name, statistics.median(times), min(times)])
    print(table(["command", "median s", "min s"], rows))


if __name__ == "__main__":
    main()
