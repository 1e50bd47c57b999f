#!/usr/bin/env python3
"""Ledger and chunk-plan overhead of `status`, `track` and `export` on a long finished store.

The store has 100,000 frames at chunk size 8 (12,500 chunks) and every ledger complete:
decode, encode, track_forward, track_reverse and export_davis (its output folder exists), so
`track` and `export` have nothing to do and each command's time is start-up plus the
ledger/plan work. Its arrays exist with their metadata only (no chunk data: no model work is
measured). Each command runs in a fresh process, beside `python -c "import torch"` (what any
command that tracks pays before it starts); then the same ledger and plan calls are timed
alone, in process.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from measure import measure, python, segpipe, table  # noqa: E402

STAGES = ("decode", "encode", "track_forward", "track_reverse", "export_davis")


def build_store(
    tmp: Path, T: int, C: int, S: int, prompt_frames: tuple[int, int]
) -> tuple[Path, Path]:
    """A finished store of T frames (arrays as metadata, complete ledgers) and its davis output."""
    import numpy as np

    from segpipe import prompts as prompt_file
    from segpipe.plan import ChunkPlan, Span
    from segpipe.sources.identity import file_identity
    from segpipe.stages.track.stage import prepare, tracking_settings
    from segpipe.store.features import LEVELS
    from segpipe.store.runstore import RunStore
    from segpipe.store.tracking import OPTIONS

    W, H = 64, 48
    source = tmp / "clip.mp4"
    source.write_bytes(b"not decoded: the commands measured never read the source")
    store_path, out = tmp / "long.zarr", tmp / "long_davis"
    store = RunStore.create(
        store_path,
        {
            "source": {"path": str(source.resolve()), **file_identity(source)},
            "video": {
                "width": W,
                "height": H,
                "fps": 30.0,
                "frame_rate": "30/1",
                "time_base": "1/15360",
                "claimed_frames": T,
            },
            "decoding": {"chunk_size": C, "image_size": S},
        },
    )
    # decode's arrays and attributes
    store.create_array("frames", (T, S, S, 3), (C, S, S, 3), "uint8")
    store.create_array("pts", (T,), (C,), "int64", fill_value=-1, compress=False)
    store.create_array("timestamps", (T,), (C,), "float64", fill_value=np.nan, compress=False)
    store.set_attrs(frame_count=T, decode_warning=None)
    # encode's
    for name, (ch, div) in zip(LEVELS, ((32, 4), (64, 8), (256, 16))):
        store.create_array(
            name,
            (T, ch, S // div, S // div),
            (C, ch, S // div, S // div),
            "float32",
            compress=False,
            attributes={"embedding_dtype": "float32", "memory_format": "contiguous"},
        )
    store.set_attrs(
        model={
            "name": "sam2.1_hiera_t",
            "image_size": S,
            "weights": {"random_seed": 0},
            "embedding_dtype": "float32",
        }
    )
    # track's: prompts through the stage's own `prepare` (masks, object_scores, tracked, attrs)
    prompts_file = tmp / "prompts.json"
    prompts_file.write_text(
        json.dumps(
            {
                "prompts": [
                    {"object": 1, "frame": prompt_frames[0], "points": [[20, 20]], "labels": [1]},
                    {"object": 2, "frame": prompt_frames[1], "box": [30, 10, 60, 40]},
                ]
            }
        )
    )
    prompts = prompt_file.load(prompts_file, T, W, H)
    prepare(
        store, prompts, tracking_settings(prompts, "both", dict(OPTIONS)), again=True, quiet=True
    )
    # export davis's record, as a finished export leaves it
    track = store.attrs["track"]
    out.mkdir()
    store.set_attrs(
        exports={
            "davis": {
                "out": str(out.resolve()),
                "frames": [0, T],
                "objects": track["object_ids"],
                "track": track["prompts_sha256"],
                "direction": "both",
                "complete": True,
            }
        }
    )
    # ledgers: one zarr assignment each over the chunks the stage records
    plan = ChunkPlan(T, C)
    start = track["start_frame"]
    done = {
        "decode": list(plan),
        "encode": list(plan),
        "export_davis": list(plan),
        "track_forward": Span.whole(start, T).chunks(plan, "forward"),
        "track_reverse": Span.whole(start, T).chunks(plan, "reverse"),
    }
    objects = len(track["object_ids"])
    for stage in STAGES:
        chunks = done[stage]
        # a tracking pass keeps a ledger per object
        names = [f"{stage}/{o}" for o in range(objects)] if stage.startswith("track") else [stage]
        for name in names:
            arr = store.create_array(
                f"ledger/{name}", (max(chunks) + 1,), (1,), "uint8", compress=False
            )
            arr[min(chunks) : max(chunks) + 1] = 1
    return store_path, out


def in_process(store_path: Path, repeat: int) -> list[list]:
    """The ledger and plan calls alone: best of `repeat`, each on a freshly opened store."""
    from segpipe.plan import ChunkPlan, Span
    from segpipe.store.runstore import RunStore

    def best(fn):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    store0 = RunStore.open(store_path)
    T, C = store0.attrs["frame_count"], store0.attrs["decoding"]["chunk_size"]
    start = store0.attrs["track"]["start_frame"]
    plan = ChunkPlan(T, C)

    def first_done():
        store = RunStore.open(store_path)
        return [store.ledger(s).done() for s in STAGES]

    def done_five_times():
        store = RunStore.open(store_path)
        return [store.ledger(s).done() for s in STAGES for _ in range(5)]

    def todo_all():
        store = RunStore.open(store_path)
        return [store.ledger(s).todo(plan) for s in STAGES]

    def count_all():
        store = RunStore.open(store_path)
        return [store.ledger(s).count() for s in STAGES]

    counts = count_all()
    assert counts[:2] == [plan.num_chunks] * 2 and counts[4] == plan.num_chunks, counts
    return [
        ["RunStore.open + done() of the 5 ledgers", best(first_done)],
        ["RunStore.open + done() x5 of the 5 ledgers", best(done_five_times)],
        ["RunStore.open + todo(all chunks) of the 5 ledgers", best(todo_all)],
        ["RunStore.open + count() of the 5 ledgers", best(count_all)],
        [
            "Span.chunks forward + reverse",
            best(
                lambda: (
                    Span.whole(start, plan.num_frames).chunks(plan, "forward"),
                    Span.whole(start, plan.num_frames).chunks(plan, "reverse"),
                )
            ),
        ],
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command (median)")
    args = parser.parse_args()
    T, C = args.frames, args.chunk_size
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        store, out = build_store(tmp, T, C, args.image_size, (T * 2 // 5, T * 3 // 5))
        built = time.perf_counter() - t0

        def run(argv):
            return statistics.median(measure(argv)[0] for _ in range(args.repeat))

        torch_s = run(python("import torch"))
        commands = [
            ("segpipe status", segpipe("status", "--store", store)[:-1]),  # status has no --quiet
            ("segpipe track (complete)", segpipe("track", "--store", store)),
            (
                "segpipe export davis (complete)",
                segpipe("export", "--store", store, "--format", "davis", "--out", out),
            ),
        ]
        rows = []
        for name, argv in commands:
            seconds = run(argv)
            rows.append([name, seconds, torch_s, seconds - torch_s])
        inproc = in_process(store, args.repeat)
    print(
        f"overhead, {T} frames at chunk size {C} ({-(-T // C)} chunks), every ledger complete "
        f"(store built in {built:.1f} s; median of {args.repeat} fresh processes)"
    )
    print(table(["command", "seconds", "python -c 'import torch' s", "difference s"], rows))
    print()
    print(f"in process (best of {args.repeat})")
    print(table(["calls", "seconds"], inproc))


if __name__ == "__main__":
    main()
