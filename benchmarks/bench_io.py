#!/usr/bin/env python3
"""What the store costs the pipeline: bytes written per frame by each stage (a process's
`write_bytes` from /proc/self/io, and the chunk files' bytes by array), this disk's fsync'd
write bandwidth measured in the same run, the store-bound ceiling it implies at image size
1024 (features alone, float32 and bfloat16), and the wall time of the pipelined `run --keep
all` and `run --keep masks` beside the four stages run one after another.

`run` hands each chunk's features to the tracker in memory; under `--keep all` a writer
thread writes them behind the tracking, and under `--keep masks` only the prompted chunks'
features are written at all. The script exits 1 if `--keep masks` wrote feature bytes
beyond the prompted chunks', or if the three ways differ in their masks or scores.

Clip: synthetic (data/make_sample.py), 320x240, image size 256, chunk 16, random weights,
one object boxed on frame 40 (so both passes run), direction both. `--small` runs it at
image size 64 on 24 frames in chunks of 4 (a quick check that it runs).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import ROOT, looped_clip, table  # noqa: E402

# A segpipe command in this process, counting what it writes: the bytes written into each
# array's chunk files (zarr's local store writes each through pathlib.Path.open), and at exit
# the process's own /proc/self/io (every thread's).
COUNTING = """
import atexit, json, pathlib, sys, threading
report, argv = sys.argv[1], sys.argv[2:]
written, counting = {}, threading.Lock()  # zarr writes from a pool of threads
opened = pathlib.Path.open

def group(path):  # the store's top-level node a chunk file is under
    parts = path.parts
    stores = [i for i, p in enumerate(parts) if p.endswith(".zarr")]
    return parts[stores[-1] + 1] if stores and "c" in parts else None

class Counted:
    def __init__(self, f, key):
        self.f, self.key = f, key
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)
    def __getattr__(self, name):
        return getattr(self.f, name)
    def write(self, data):
        with counting:
            written[self.key] = written.get(self.key, 0) + len(data)
        return self.f.write(data)

def counting_open(self, mode="r", *args, **kwargs):
    f = opened(self, mode, *args, **kwargs)
    key = group(self) if "w" in mode else None
    return Counted(f, key) if key else f

pathlib.Path.open = counting_open

def dump():
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open(report, "w") as out:
        json.dump({"io": {k: int(v) for k, v in io.items()}, "written": written}, out)

atexit.register(dump)
from segpipe.cli import main
sys.argv = ["segpipe", *argv]
main()
"""


def counted(args: list, report: Path) -> dict:
    """Run `segpipe ARGS --quiet` in a fresh process; its seconds and what it wrote."""
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", COUNTING, str(report), *map(str, args), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"segpipe {' '.join(map(str, args))} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(report.read_text())
    return {"seconds": seconds, "write_bytes": out["io"]["write_bytes"], **out["written"]}


def disk_bandwidth(folder: Path, total: int = 256 << 20, block: int = 16 << 20) -> float:
    """MB/s writing `total` bytes in `block`-byte writes, then fsync (as `dd conv=fsync`)."""
    path = folder / "bandwidth.bin"
    data = os.urandom(block)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(total // block):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return total / seconds / 1e6


def feature_bytes_per_frame(size: int, embedding_dtype: str, precision: str) -> int:
    from segpipe.estimate import level_itemsizes, model_sizes

    sizes = level_itemsizes(embedding_dtype, precision)
    model = model_sizes(None)
    return sum(
        n * ch * model.side(size, i) ** 2
        for i, (n, (ch, _, _)) in enumerate(zip(sizes, model.levels))
    )


def results(store: Path) -> dict:
    from segpipe.store.runstore import RunStore

    run = RunStore.open(store)
    return {name: run.read(name) for name in ("masks", "object_scores", "tracked")}


def main() -> int:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.pop(name, None)  # each run as a new user's shell starts it
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="image size 64, 24 frames")
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=16)
    a = parser.parse_args()
    T, S, C = (24, 64, 4) if a.small else (a.frames, a.image_size, a.chunk_size)
    prompt_frame = T * 5 // 12
    with tempfile.TemporaryDirectory(
        dir=ROOT / "build" if (ROOT / "build").is_dir() else None
    ) as tmp:
        work = Path(tmp)
        base, masks = make_sample.make_clip(num_frames=min(T, 48), width=320, height=240)
        video = looped_clip(work / "clip.mp4", base, T)
        box = make_sample.bbox(masks[prompt_frame % len(base), 1])
        prompts = work / "prompts.json"
        prompts.write_text(
            json.dumps({"prompts": [{"object": 1, "frame": prompt_frame, "box": box}]})
        )
        mbps = disk_bandwidth(work)
        common = ["--chunk-size", C, "--image-size", S, "--random-weights", 0]
        staged = work / "staged.zarr"
        rows, stores, report = [], {}, work / "io.json"
        steps = [
            ("decode", ["decode", video, "--store", staged, "--chunk-size", C, "--image-size", S]),
            ("encode", ["encode", "--store", staged, "--random-weights", 0]),
            ("track", ["track", "--store", staged, "--prompts", prompts, "--direction", "both"]),
            ("export", ["export", "--store", staged, "--format", "davis", "--out", work / "davis"]),
        ]
        total = {"seconds": 0.0}
        for name, args in steps:
            got = counted(args, report)
            rows.append(row(f"staged: {name}", got, T))
            for k, v in got.items():
                total[k] = total.get(k, 0) + v
        rows.append(row("staged: all four", total, T))
        stores["staged"] = staged
        for keep in ("all", "masks"):
            store = work / f"run_{keep}.zarr"
            args = ["run", video, "--store", store, "--prompts", prompts, *common]
            got = counted([*args, "--keep", keep, "--export", "davis"], report)
            rows.append(row(f"run --keep {keep}", got, T))
            stores[keep] = store
            if keep == "masks":
                masks_features = got.get("features", 0)
        fine = True
        reference = results(stores["staged"])
        for name, store in stores.items():
            same = all(
                np.array_equal(v, reference[k], equal_nan=v.dtype.kind == "f")
                for k, v in results(store).items()
            )
            fine &= same
            print(f"{name}: masks, scores and tracked {'the same' if same else 'DIFFER'}")
        # the prompted chunk's features: C frames (the chunk of the prompt frame)
        per_frame_here = feature_bytes_per_frame(S, "float32", "float32")
        bound = C * per_frame_here * 1.01 + 4096  # zarr's chunk header and checksum
        print(
            f"--keep masks wrote {masks_features} feature bytes; the prompted chunk's are "
            f"{C * per_frame_here} ({'within' if masks_features <= bound else 'OVER'})"
        )
        fine &= masks_features <= bound
    print(
        f"\n{T} frames at {S}, chunk {C}, random weights, one box on frame {prompt_frame}, "
        f"direction both; bytes per frame"
    )
    header = [
        "what",
        "s",
        "write_bytes/frame",
        "features/frame",
        "frames/frame",
        "masks/frame",
        "memory/frame",
    ]
    print(table(header, rows))
    print(f"\nthis disk, fsync'd writes in 16 MiB blocks: {mbps:.0f} MB/s")
    for dtype, precision in (("float32", "float32"), ("bfloat16", "bfloat16")):
        per = feature_bytes_per_frame(1024, dtype, precision)
        print(
            f"features at 1024, {dtype}: {per / 2**20:.1f} MiB a frame: the store alone "
            f"bounds writing them at {mbps * 1e6 / per:.1f} frames/s"
        )
    return 0 if fine else 1


def row(name: str, got: dict, T: int) -> list:
    per = lambda key: int(got.get(key, 0) / T)  # noqa: E731
    return [
        name,
        round(got["seconds"], 1),
        per("write_bytes"),
        per("features"),
        per("frames"),
        per("masks"),
        per("memory"),
    ]


if __name__ == "__main__":
    sys.exit(main())
