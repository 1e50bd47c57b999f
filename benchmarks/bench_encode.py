#!/usr/bin/env python3
"""Encode stage beside a bare loop of SAM 2's `forward_image` on the same frames, in one run;
peak RSS at two lengths; bytes on disk per frame for each embedding dtype and codec tried."""

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
sys.path.insert(0, str(HERE.parent))
import make_sample  # noqa: E402
from measure import looped_clip, measure, python, segpipe, table  # noqa: E402

BARE = """
import sys, time, torch, zarr
from segpipe.model import Weights, build_model
from segpipe.models.sam2.frames import preprocess
group = zarr.open_group(sys.argv[1], mode="r")
model = build_model("sam2.1_hiera_t", group.attrs["decoding"]["image_size"], Weights(random_seed=0))
frames = group["frames"]
with torch.inference_mode():
    for t in range(frames.shape[0]):
        model.forward_image(preprocess(frames[t:t + 1]))
"""


def codec_table(store: Path) -> list[list]:
    """Bytes per frame of the stored features under each dtype and codec."""
    import torch
    import zarr
    from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

    from segpipe.store.features import LEVELS, to_storage

    group = zarr.open_group(str(store), mode="r")
    feats = [torch.from_numpy(group[name][...]) for name in LEVELS]
    n = feats[0].shape[0]
    codecs = {
        "none": [],
        "zstd-1": [ZstdCodec(level=1)],
        "zstd-3": [ZstdCodec(level=3)],
        "blosc-lz4-shuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "blosc-zstd-bitshuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("float32", "float16", "bfloat16"):
            arrays = [to_storage(f, dtype) for f in feats]
            for cname, codec in codecs.items():
                root = zarr.open_group(f"{tmp}/{dtype}_{cname}.zarr", mode="w")
                for i, a in enumerate(arrays):
                    arr = root.create_array(
                        f"l{i}",
                        shape=a.shape,
                        chunks=a.shape,
                        dtype=a.dtype,
                        compressors=[*codec, Crc32cCodec()],
                    )
                    arr[...] = a
                size = sum(
                    f.stat().st_size
                    for f in Path(f"{tmp}/{dtype}_{cname}.zarr").rglob("*")
                    if f.is_file()
                )
                raw = sum(a.nbytes for a in arrays)
                rows.append([dtype, cname, size / n / 2**20, raw / size])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--codec-image-size", type=int, default=1024)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base, _ = make_sample.make_clip(num_frames=100, width=320, height=240)
        for n in args.lengths:
            clip = Path(tmp) / f"clip{n}.mp4"
            looped_clip(clip, base, n)
            store = Path(tmp) / f"s{n}.zarr"
            measure(
                segpipe(
                    "decode",
                    clip,
                    "--store",
                    store,
                    "--image-size",
                    args.image_size,
                    "--chunk-size",
                    16,
                )
            )
            bare_s, bare_rss, _ = measure(python(BARE) + [str(store)])
            ours_s, ours_rss, _ = measure(
                segpipe("encode", "--store", store, "--random-weights", 0)
            )
            rows.append([n, n / bare_s, n / ours_s, bare_s / ours_s, bare_rss, ours_rss])
        print(
            f"encode, sam2.1_hiera_t at {args.image_size}, CPU, batch 1, chunk 16 "
            f"(both columns include process start and model build)"
        )
        print(
            table(
                ["frames", "bare fps", "segpipe fps", "ratio", "bare RSS MiB", "segpipe RSS MiB"],
                rows,
            )
        )
        clip = Path(tmp) / "codec.mp4"
        make_sample.write_video(clip, base[:8])
        store = Path(tmp) / "codec.zarr"
        measure(segpipe("decode", clip, "--store", store, "--image-size", args.codec_image_size))
        measure(segpipe("encode", "--store", store, "--random-weights", 0))
        print(
            f"\nfeature bytes on disk per frame at {args.codec_image_size} (random weights; "
            f"real checkpoints may compress differently)"
        )
        print(table(["dtype", "codec", "MiB/frame", "compression"], codec_table(store)))


if __name__ == "__main__":
    main()
