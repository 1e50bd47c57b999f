#!/usr/bin/env python3
"""Dask distributed beside one process: encode throughput of a 200-frame video (image size
256) and the wall time of a 4-video dataset (854x480 JPEGs, 2 objects, 50 frames each, image
size 256), each in one process and on 1 and 2 local Dask workers (`--workers`); then the
cost of a task: a chunk encoded in process and by a Dask task, and a task that finds its
chunk done (the round trip alone). Random weights, this CPU.

Commands are timed whole (start-up and the cluster's included); the encode rows also give
the steady rate, between the first and the last chunk committed (ledger entry times). Each
worker gets the client's torch thread count (OMP_NUM_THREADS where set, else the client's
`torch.get_num_threads()`: `cluster.worker_threads`), so set OMP_NUM_THREADS to cores // N
to keep N workers from oversubscribing the cores; one process uses torch's default unless
OMP_NUM_THREADS is set.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from bench_dataset import make_dataset  # noqa: E402
from measure import looped_clip, measure, segpipe, table  # noqa: E402

MODES = [("one process", []), ("1 worker", ["--workers", 1]), ("2 workers", ["--workers", 2])]


def steady_fps(store: Path, chunk: int) -> float:
    """Frames per second between the first and the last encode commit."""
    times = sorted(p.stat().st_mtime for p in (store / "ledger" / "encode" / "c").iterdir())
    return chunk * (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def bench_encode(tmp: Path, frames: int, size: int, chunk: int) -> list[list]:
    base, _ = make_sample.make_clip(num_frames=48, width=640, height=480, seed=2)
    clip = looped_clip(tmp / "clip.mp4", base, frames)
    decoded = tmp / "decoded.zarr"
    measure(
        segpipe("decode", clip, "--store", decoded, "--chunk-size", chunk, "--image-size", size)
    )
    rows = []
    for name, flags in MODES:
        store = tmp / f"encode-{len(rows)}.zarr"
        shutil.copytree(decoded, store)
        seconds, mib, _ = measure(
            segpipe("encode", "--store", store, "--random-weights", 0, "--device", "cpu", *flags)
        )
        rows.append(
            [
                f"encode {frames} frames, {name}",
                seconds,
                frames / seconds,
                steady_fps(store, chunk),
                mib,
            ]
        )
    return rows


def bench_dataset(tmp: Path, videos: int, frames: int, size: int, chunk: int) -> list[list]:
    root = make_dataset(tmp / "ds", videos, frames)
    rows = []
    for name, flags in MODES:
        out = tmp / f"out-{len(rows)}"
        seconds, mib, _ = measure(
            segpipe(
                "dataset",
                "--base-video-dir",
                root / "JPEGImages",
                "--input-mask-dir",
                root / "Annotations",
                "--output-mask-dir",
                out,
                "--work-dir",
                tmp / f"work-{len(rows)}",
                "--image-size",
                size,
                "--chunk-size",
                chunk,
                "--random-weights",
                0,
                "--device",
                "cpu",
                *flags,
            )
        )
        rows.append(
            [
                f"dataset {videos} x {frames} frames, {name}",
                seconds,
                videos * frames / seconds,
                float("nan"),
                mib,
            ]
        )
    return rows


def bench_overhead(tmp: Path, size: int, chunk: int, chunks: int) -> list[list]:
    """Per chunk: encode in process (model built, frames on disk) and as a Dask task on one
    warm worker, one task at a time; then a task whose chunk is done (its round trip: the
    lease check, the store opened, the ledger read)."""
    from segpipe.dask.client import Cluster, _client, worker_threads
    from segpipe.dask.tasks import encode_task
    from segpipe.model import Weights, build_model
    from segpipe.stages.encode import FramesOnDisk, encode_chunk
    from segpipe.store.lock import store_lock
    from segpipe.store.runstore import RunStore

    base, _ = make_sample.make_clip(num_frames=chunks * chunk, width=320, height=240, seed=4)
    clip = tmp / "short.mp4"
    make_sample.write_video(clip, base)
    store = tmp / "overhead.zarr"
    measure(segpipe("decode", clip, "--store", store, "--chunk-size", chunk, "--image-size", size))
    measure(segpipe("encode", "--store", store, "--random-weights", 0, "--device", "cpu"))
    run = RunStore.open(store)
    predictor = build_model("sam2.1_hiera_t", size, Weights(random_seed=0), "cpu")
    frames_of = FramesOnDisk(run)
    encode_chunk(run, predictor, 0, frames_of)  # warm
    here = []
    for k in range(chunks):
        began = time.perf_counter()
        encode_chunk(run, predictor, k, frames_of)
        here.append(time.perf_counter() - began)
    with store_lock(store), _client(1, None) as client:  # as `--workers 1` makes it
        cluster = Cluster(client, worker_threads())
        work = cluster.work(store, None, "cpu")

        def task(k):
            began = time.perf_counter()
            cluster.wait([cluster.submit(encode_task, str(store.resolve()), k, work, key="t")])
            return time.perf_counter() - began

        def undone(k):  # the chunk's ledger entry gone: the task encodes it
            run.ledger("encode").undo(k)
            return task(k)

        task(0)  # the worker's model built
        dask = [undone(k) for k in range(chunks)]
        noop = [task(k) for k in range(chunks)]
    ms = [1000 * statistics.median(v) for v in (here, dask, noop)]
    return [
        [f"a chunk of {chunk} frames encoded in process", ms[0]],
        ["the same chunk encoded by a Dask task", ms[1]],
        ["a Dask task whose chunk is done (round trip)", ms[2]],
        ["Dask's cost per chunk (task - in process)", ms[1] - ms[0]],
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--video-frames", type=int, default=50)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--overhead-chunks", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does it run")
    args = parser.parse_args()
    if args.smoke:
        args.frames, args.videos, args.video_frames, args.image_size = 16, 2, 4, 128
        args.chunk_size, args.overhead_chunks = 4, 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = bench_encode(tmp, args.frames, args.image_size, args.chunk_size)
        rows += bench_dataset(tmp, args.videos, args.video_frames, args.image_size, args.chunk_size)
        print(
            table(["run", "wall s", "frames/s", "steady frames/s", "peak MiB (one process)"], rows)
        )
        print()
        print(
            table(
                ["per chunk", "ms (median)"],
                bench_overhead(tmp, args.image_size, args.chunk_size, args.overhead_chunks),
            )
        )


if __name__ == "__main__":
    main()
