#!/usr/bin/env python3
"""Concept prompts over a short and a 4x longer video: segpipe's chunked tracking beside
transformers' own `Sam3VideoModel` session over the whole video in memory, on the same
model-input frames, weights and concept. Per side and length: the peak RSS of the process
and seconds per frame of the tracking alone (the model built and the frames encoded
before the clock starts: segpipe's from its stored features, transformers' encoding each
frame as it goes, as its session does; so segpipe's column is the time beside a stored
encode, whose own time per frame is printed too). Both sides track at most
`--max-objects` instances at once (the model's own `max_num_objects`), so what grows with
the video is what each side keeps, not the work random weights make.

    python benchmarks/bench_concepts.py                       # sam3-video-mini at 112, 40 and 160 frames
    python benchmarks/bench_concepts.py --model sam3-video --size 1008 --lengths 40 160   # a GPU
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
import make_sample  # noqa: E402
from measure import measure, python, segpipe, table  # noqa: E402

SEGPIPE = """
import json, sys, time
from segpipe.model import Weights, build_model
from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.encode import encode
from segpipe.stages.track.stage import track
store, name, size, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
model = build_model(name, size, Weights(random_seed=0), device)
model.model.max_num_objects = int(sys.argv[5])
quiet = Execution(progress=False, device=device)
start = time.perf_counter()
encode(store, Encoding(model=name, random_weights=0), quiet, predictor=model)
encoded = time.perf_counter()
track(store, None, Tracking(concepts=("fish",)), execution=quiet, predictor=model)
print(json.dumps({"encode": encoded - start, "track": time.perf_counter() - encoded}))
"""

TRANSFORMERS = """
import json, sys, time
import torch, zarr
sys.path.insert(0, "tests")
from hf_oracle import pixel_values, _load, CLASSES
from segpipe.models.hf.configs import sam3_video_config, tokenizer
store, name, size, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
net = _load(CLASSES["sam3-video"][0])(sam3_video_config(size, name.endswith("-mini")))
net = net.to(device).eval()
net.max_num_objects = int(sys.argv[5])
group = zarr.open_group(store, mode="r")
H, W = group.attrs["video"]["height"], group.attrs["video"]["width"]
video = pixel_values(group["frames"][...], "sam3-video")
start = time.perf_counter()
with torch.inference_mode():
    session = _load(CLASSES["sam3-video"][1])(
        video=video, video_height=H, video_width=W, dtype=torch.float32,
        inference_device=device, inference_state_device=device, video_storage_device=device,
    )
    cls = _load(CLASSES["sam3-video"][2])
    proc = cls.__new__(cls)
    proc.tokenizer = tokenizer()
    proc.add_text_prompt(session, ["fish"])
    ids = set()
    for out in net.propagate_in_video_iterator(session):
        ids.update(out.obj_id_to_mask)
print(json.dumps({"track": time.perf_counter() - start, "instances": len(ids)}))
"""


def bench(model: str, size: int, frames: int, device: str, most: int, work: Path) -> list:
    clip = work / f"clip{frames}.mp4"
    pictures, _ = make_sample.make_clip(num_frames=frames, width=320, height=240, seed=1)
    make_sample.write_video(clip, pictures)
    rows = []
    store = work / f"s{frames}.zarr"
    measure(segpipe("decode", clip, "--store", store, "--image-size", size, "--chunk-size", 8))
    given = [str(store), model, str(size), device, str(most)]
    _, rss, stdout = measure(python(SEGPIPE) + given)
    got = json.loads(stdout.strip().splitlines()[-1])
    n = len(json.loads((store / "masks" / "zarr.json").read_text())["attributes"]["object_ids"])
    rows.append(["segpipe (chunks of 8)", frames, 1000 * got["track"] / frames,
                 1000 * got["encode"] / frames, rss, n])  # fmt: skip
    _, rss, stdout = measure(python(TRANSFORMERS) + given)
    got = json.loads(stdout.strip().splitlines()[-1])
    rows.append(["transformers session", frames, 1000 * got["track"] / frames, None, rss,
                 got["instances"]])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sam3-video-mini")
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 160])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--max-objects",
        type=int,
        default=8,
        help="the model's max_num_objects on both sides: live instances bounded, so the "
        "memory reflects the video's length, not how many instances random weights find",
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for frames in args.lengths:
            rows += bench(args.model, args.size, frames, args.device, args.max_objects, Path(tmp))
            print(f"{frames} frames: done", file=sys.stderr)
    header = [
        "who", "frames", "track ms/frame", "encode ms/frame", "peak RSS MiB",
        "instances (seg: shown; tf: ever tracked)",
    ]  # fmt: skip
    print(
        f"{args.model} at {args.size}, seeded random weights, concept 'fish', {args.device}, "
        f"at most {args.max_objects} instances tracked at once"
    )
    print(table(header, rows))


if __name__ == "__main__":
    main()
