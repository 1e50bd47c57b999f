#!/usr/bin/env python3
"""segpipe studio's latency and memory on a long 1080p video with 4 objects: frame + masks
fetch while scrubbing (in order, as a drag or play does, and jumping at random), the
preview of a click, and the studio's RSS along the whole timeline.

The store is decoded by segpipe (image size 256) from a 1080p H.264 clip (one keyframe a
second, as cameras write), and its masks and object scores are the clip's ground truth
written in place of tracking results (tracking 3000 frames of 4 objects on this CPU takes
far longer than looking at them, and the studio reads a store's masks the same whichever
way they got there). The chunk of the previewed frame is encoded with segpipe_tiny. The
studio runs as `segpipe studio` in its own process; requests come over loopback as the page
sends them (a frame's JPEG and masks PNG at once).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "data"))
sys.path.insert(0, str(HERE.parent))
import make_sample  # noqa: E402
from measure import table  # noqa: E402

ROOT = HERE.parent


def fake_tracked(store: Path, masks, period: int) -> None:
    """The clip's ground truth (4 objects, cycling every `period` frames) as the tracking
    results of a decoded store: masks, object scores (+5 present, -5 absent) and `tracked`."""
    import numpy as np

    from segpipe.store.runstore import RunStore

    s = RunStore.open(store)
    plan = s.plan
    T, C = plan.num_frames, plan.chunk_size
    H, W = s.attrs["video"]["height"], s.attrs["video"]["width"]
    O = masks.shape[1]
    ids = list(range(1, O + 1))
    m = s.create_array("masks", (T, O, H, W), (C, 1, H, W), "bool", fill_value=False)
    scores = s.create_array("object_scores", (T, O), (C, 1), "float32", fill_value=np.nan)
    areas = s.create_array("object_areas", (T, O), (C, 1), "int64", fill_value=0)
    tracked = s.create_array("tracked", (T, O), (C, 1), "bool", fill_value=False)
    m.attrs["object_ids"] = ids
    for k in plan:
        lo, hi = plan.bounds(k)
        chunk = masks[[t % period for t in range(lo, hi)]]
        m[lo:hi] = chunk
        scores[lo:hi] = np.where(chunk.any((2, 3)), 5.0, -5.0).astype(np.float32)
        areas[lo:hi] = chunk.sum((2, 3))
        tracked[lo:hi] = True
        for o in range(O):  # a ledger per object
            s.ledger(f"track_forward/{o}").mark_done(k)
    s.set_attrs(
        track={
            "prompts_sha256": "benchmark",
            "direction": "forward",
            "object_ids": ids,
            "start_frame": 0,
            "prompts": [
                {"object": i, "frame": 0, "points": [[10.0, 10.0]], "labels": [1]} for i in ids
            ],
            "options": {
                "postprocessing": True,
                "non_overlap": False,
                "score_threshold": 0.0,
                "object_start": "earliest",
            },
        }
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def play(url: str, seconds: float):
    """(frames, seconds, the video's frame rate) of the page playing from frame 0 for about
    `seconds` in headless Chromium (Debian's), each frame drawn with its masks; None
    without it."""
    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = Path("(playwright)")
    if not chromium.exists():
        print(f"no {chromium}: playback not measured", file=sys.stderr)
        return None

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url + "?frame=0")
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        fps = page.evaluate("studio.info.fps")
        page.keyboard.press(" ")
        page.wait_for_selector("body:not([data-frame='0'])", timeout=60_000)
        first = time.perf_counter()  # (from the first frame played on)
        time.sleep(seconds)
        shown = int(page.evaluate("document.body.dataset.frame"))
        took = time.perf_counter() - first
        browser.close()
    return shown - 1, took, fps


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def post(url: str, body: dict, method="POST") -> bytes:
    req = urllib.request.Request(url, json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")  # as the page sends it
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def percentiles(ms: list[float]) -> tuple[float, float]:
    import numpy as np

    return float(np.percentile(ms, 50)), float(np.percentile(ms, 95))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--jumps", type=int, default=200)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--play", type=float, default=10, help="seconds played in the page")
    args = parser.parse_args()

    import numpy as np

    period = 120
    base, masks = make_sample.make_clip(num_frames=period, width=1920, height=1080, seed=3)
    masks = np.concatenate([masks, masks[:, :1, :, ::-1]], axis=1)  # a 4th object, mirrored
    with tempfile.TemporaryDirectory(
        dir=ROOT / "build" if (ROOT / "build").is_dir() else None
    ) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        video = tmp / "clip.mp4"
        cycle = base[[t % period for t in range(args.frames)]]
        make_sample.write_video(video, cycle, encoder_options={"g": "24"})
        store = tmp / "clip.zarr"
        import segpipe

        segpipe.decode(
            video,
            store,
            decoding=segpipe.Decoding(image_size=args.image_size),
            execution=segpipe.Execution(progress=False),
        )
        fake_tracked(store, masks, period)
        f_preview = 1500 % args.frames
        chunk = f_preview // 32
        from segpipe.settings import Encoding, Execution
        from segpipe.stages.encode import encode

        encode(store, Encoding(model="segpipe_tiny"), Execution(progress=False), chunks=[chunk])
        print(f"made the store in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

        proc = subprocess.Popen(
            [sys.executable, "-m", "segpipe.cli", "studio", str(store), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        try:
            url = proc.stdout.readline().split()[1]
            get(url + "api/info")
            rss = {"started": rss_mib(proc.pid)}
            scores_t = time.perf_counter()
            get(url + "api/scores")
            scores_ms = 1000 * (time.perf_counter() - scores_t)
            listening = threading.Thread(  # the page's last step: its events stream
                target=lambda: urllib.request.urlopen(url + "api/events").read(1), daemon=True
            )
            listening.start()
            pool = ThreadPoolExecutor(2)

            def fetch(t):  # what the page asks for a frame: both at once
                began = time.perf_counter()
                a = pool.submit(get, f"{url}api/frames/{t}.jpg")
                b = pool.submit(get, f"{url}api/masks/{t}.png")
                a.result(), b.result()
                return 1000 * (time.perf_counter() - began)

            in_order = []
            for t in range(args.frames):
                in_order.append(fetch(t))
                if t == 299:
                    rss["after 300 frames"] = rss_mib(proc.pid)
            rss["after the whole timeline"] = rss_mib(proc.pid)
            rng = np.random.default_rng(0)
            jumps = [fetch(int(t)) for t in rng.integers(0, args.frames, args.jumps)]
            rss["after random jumps"] = rss_mib(proc.pid)
            post(
                url + "api/prompts",
                {
                    "prompts": [
                        {"object": 1, "frame": f_preview, "points": [[700, 500]], "labels": [1]}
                    ]
                },
                "PUT",
            )
            previews = []
            for i in range(11):
                began = time.perf_counter()
                post(url + "api/preview", {"frame": f_preview, "object": 1})
                previews.append(1000 * (time.perf_counter() - began))
            # the flags: every chunk's masks measured in the background since the first
            # scores (while the timeline above was scrubbed); the scores once they are in
            while (scores := json.loads(get(url + "api/scores")))["measuring"]:
                time.sleep(0.5)
            measured_s = time.perf_counter() - scores_t
            flagged = sum(len(f) for f in scores["flags"])
            began = time.perf_counter()
            get(url + "api/scores")
            flags_ms = 1000 * (time.perf_counter() - began)
            playback = play(url, args.play)
        finally:
            proc.terminate()
            proc.wait()

    rows = [
        ["frame + masks, in order", args.frames, *percentiles(in_order)],
        ["frame + masks, random jumps", args.jumps, *percentiles(jumps)],
        ["preview, first (model built since the page listened)", 1, previews[0], previews[0]],
        ["preview, then", 10, *percentiles(previews[1:])],
        [
            "scores of the whole timeline (first: the flags from masks to come)",
            1,
            scores_ms,
            scores_ms,
        ],
        [f"scores with every chunk's flags ({flagged} flags)", 1, flags_ms, flags_ms],
    ]
    print(
        f"segpipe studio on a {args.frames}-frame 1920x1080 H.264 clip (keyframe every 24 "
        f"frames), 4 objects, store at image size {args.image_size}, {os.cpu_count()} cores\n"
    )
    print(table(["request", "n", "p50 ms", "p95 ms"], rows))
    print()
    print(table(["studio RSS", "MiB"], [[k, v] for k, v in rss.items()]))
    print(f"\nevery chunk's masks measured for the flags {measured_s:.0f} s after the first scores")
    if playback:
        print(
            f"playback in headless Chromium (Space, from frame 0): {playback[0]} frames in "
            f"{playback[1]:.1f} s, {playback[0] / playback[1]:.1f} frames/s against the "
            f"video's {playback[2]:g}"
        )
    ok = rows[0][3] < 150 and rows[2][3] < 1000 and rows[3][3] < 1000
    print(
        f"\ngoals (frame + masks p95 < 150 ms while scrubbing, every preview < 1 s): "
        f"{'met' if ok else 'NOT met'}; random jumps p95 < 150 ms too: "
        f"{'met' if rows[1][3] < 150 else 'not met'}"
    )


if __name__ == "__main__":
    main()
