"""segpipe studio in a real browser (Debian's chromium, driven by Playwright) against the
real server on loopback, over a real store tracked by the shipped model: what the page does
must be what `segpipe track --prompts` does with the prompts file the page downloads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ROOT,
    assert_same_store,
    ledger_count,
    ledger_records,
    read_checked,
    require_root,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)
from PIL import Image

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def shade(page, object_id: int) -> tuple:
    """The colour the page gives an object (studio.js's palette, in the order that keeps
    clear of the video's own colours)."""
    return tuple(page.evaluate(f"colourOf({object_id})"))


FLAG_IOU = (0, 229, 255)  # studio.js's mark of an "iou" flag
SHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def made(small, tmp_path_factory) -> Path:
    """The small clip decoded and encoded with the shipped model (chunks of 4, size 128),
    nothing tracked: what a new user opens in the studio."""
    import segpipe

    store = tmp_path_factory.mktemp("studio") / "clip.zarr"
    segpipe.decode(
        small / "clip.mp4",
        store,
        decoding=segpipe.Decoding(chunk_size=4, image_size=128),
        execution=segpipe.Execution(progress=False),
    )
    segpipe.encode(
        store,
        encoding=segpipe.Encoding(model="segpipe_tiny"),
        execution=segpipe.Execution(progress=False),
    )
    return store


@pytest.fixture
def store(made, tmp_path) -> Path:
    copy = tmp_path / "clip.zarr"
    shutil.copytree(made, copy)
    return copy


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        if os.environ.get("SEGPIPE_CI"):
            pytest.fail("chromium is not installed (.ci/run installs it)")
        require_root("installing chromium")
        pytest.skip("chromium is not installed: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def studio(store):
    from segpipe.web.server import StudioServer

    server = StudioServer(store, port=0).start()
    yield server
    server.stop()


def here(*args) -> None:
    """segpipe's command line in this process (reference results: the commands a test is
    about run in their own)."""
    from segpipe.cli import cli

    cli.main([*map(str, args), "--quiet"], prog_name="segpipe", standalone_mode=False)


def open_page(browser, url: str):
    """A page on `url`, ready; its script errors are kept in `page.errors` (tests end by
    asserting there are none)."""
    page = browser.new_page(viewport={"width": 1000, "height": 700}, accept_downloads=True)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("response", lambda r: r.status >= 400 and page.errors.append(refused(r)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page


def refused(response) -> str:
    """A request the server refused, said with its answer's message."""
    try:
        said = response.text()[:300]
    except Exception as e:  # noqa: BLE001 - (the page went away meanwhile)
        said = repr(e)
    return f"{response.status} {response.request.method} {response.url}: {said}"


def click_video(page, x: float, y: float, **kw) -> None:
    """Click the frame at video pixel (x, y)."""
    box = page.locator("#view").bounding_box()
    W, H = page.evaluate("[studio.info.width, studio.info.height]")
    page.mouse.click(
        box["x"] + (x + 0.5) * box["width"] / W, box["y"] + (y + 0.5) * box["height"] / H, **kw
    )


def drag_video(page, x0, y0, x1, y1) -> None:
    box = page.locator("#view").bounding_box()
    W, H = page.evaluate("[studio.info.width, studio.info.height]")
    sx, sy = box["width"] / W, box["height"] / H
    page.mouse.move(box["x"] + (x0 + 0.5) * sx, box["y"] + (y0 + 0.5) * sy)
    page.mouse.down()
    page.mouse.move(box["x"] + (x0 + x1) / 2 * sx, box["y"] + (y0 + y1) / 2 * sy, steps=3)
    page.mouse.move(box["x"] + (x1 + 0.5) * sx, box["y"] + (y1 + 0.5) * sy, steps=3)
    page.mouse.up()


def canvas_rgb(page) -> np.ndarray:
    data = page.evaluate(
        """() => { const c = document.getElementById('view');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }"""
    )
    W, H = page.evaluate("[studio.info.width, studio.info.height]")
    return np.array(data, np.uint8).reshape(H, W, 4)[..., :3]


def fetch(url: str, method="GET", body=None, kind="application/json") -> tuple[int, bytes, dict]:
    """(status, body, headers) of one request; a body goes as JSON (`kind`), as the page
    sends it (bytes as they are)."""
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None and kind:
        request.add_header("Content-Type", kind)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def preview_mask(url: str, frame: int, obj: int) -> np.ndarray:
    status, data, _ = fetch(url + "api/preview", "POST", {"frame": frame, "object": obj})
    assert status == 200, data
    import io

    return np.asarray(Image.open(io.BytesIO(data))) > 0


def near_marks(shape, points=(), box=None) -> np.ndarray:
    """Pixels the page draws prompt marks on (a point's dot, a box's outline)."""
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    near = np.zeros(shape, bool)
    for x, y in points:
        near |= (xx - x) ** 2 + (yy - y) ** 2 <= 36
    if box is not None:
        x0, y0, x1, y1 = box
        inside = (xx >= x0 - 2) & (xx <= x1 + 2) & (yy >= y0 - 2) & (yy <= y1 + 2)
        core = (xx > x0 + 2) & (xx < x1 - 2) & (yy > y0 + 2) & (yy < y1 - 2)
        near |= inside & ~core
    return near


def tinted(page, colour) -> np.ndarray:
    """Pixels of the canvas blended with `colour` at the page's opacity (0.5): where the
    frame shown and the canvas differ as that blend says."""
    shown = canvas_rgb(page).astype(float)
    frame = np.array(
        page.evaluate(
            """() => { const c = new OffscreenCanvas(studio.info.width, studio.info.height);
            const g = c.getContext('2d'); g.drawImage(studio.image, 0, 0);
            return Array.from(g.getImageData(0, 0, c.width, c.height).data); }"""
        ),
        float,
    ).reshape(*shown.shape[:2], 4)[..., :3]
    blend = 0.5 * frame + 0.5 * np.array(colour, float)
    return (np.abs(shown - blend) <= 1.5).all(-1) & (np.abs(shown - frame) > 1.5).any(-1)


def test_prompt_preview_and_track_in_the_browser_equal_the_cli(
    browser, studio, store, small, tmp_path
):
    """Open the store, go to frame 5 by URL, click a point for object 1; step to frame 8,
    add object 2 and drag a box; each preview appears on the canvas (the pixels tinted in
    the object's colour are the API's preview mask); Track; the store is then bit for bit
    what `segpipe track --prompts <the page's downloaded prompts file>` makes of a copy."""
    before = tmp_path / "before.zarr"
    shutil.copytree(store, before)
    page = open_page(browser, studio.url + "?frame=5")
    assert page.evaluate("studio.frame") == 5
    assert page.locator("#frame").input_value() == "5"

    click_video(page, 37, 27)  # the disc (object 1) of the small clip on frame 5
    page.wait_for_selector("body[data-previewed='5:1']", timeout=20_000)
    mask = preview_mask(studio.url, 5, 1)
    assert mask.sum() > 20
    seen, marks = tinted(page, shade(page, 1)), near_marks(mask.shape, points=[(37.5, 27.5)])
    assert np.array_equal(seen & ~marks, mask & ~marks) and (mask & ~marks).sum() > 20

    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.wait_for_selector("body[data-frame='8']")
    page.keyboard.press("n")  # a new object: 2
    assert page.evaluate("studio.selected") == 2
    drag_video(page, 46, 7, 59, 21)  # the square (object 2) on frame 8
    page.wait_for_selector("body[data-previewed='8:2']", timeout=20_000)
    mask2 = preview_mask(studio.url, 8, 2)
    seen2, marks = (
        tinted(page, shade(page, 2)),
        near_marks(mask2.shape, box=(46.5, 7.5, 59.5, 21.5)),
    )
    assert np.array_equal(seen2 & ~marks, mask2 & ~marks) and (mask2 & ~marks).sum() >= 10
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "studio_prompts.png")

    entries = json.loads(fetch(studio.url + "api/prompts")[1])["prompts"]
    assert [(e["object"], e["frame"], sorted(e)) for e in entries] == [
        (1, 5, ["frame", "labels", "object", "points"]),
        (2, 8, ["box", "frame", "object"]),
    ]

    track_and_compare(page, store, before, tmp_path / "first")
    page.screenshot(path=SHOTS / "studio_tracked.png")
    other = open_page(browser, studio.url + "?frame=5")  # a second tab: the same state, live
    assert other.evaluate("studio.entries") == page.evaluate("studio.entries")
    # the tracked masks: object 1's where object 2's (drawn over it) is not, the click's
    # mark aside, pixel for pixel
    tracked = read_checked(store, "masks")[5]
    own, marks = tracked[0] & ~tracked[1], near_marks(tracked.shape[1:], points=[(37.5, 27.5)])
    assert np.array_equal(tinted(other, shade(other, 1)) & ~marks, own & ~marks)
    assert (own & ~marks).any()
    runs = job_runs(other)

    # correction: a negative point on a later frame, retracked from the stored embeddings
    with encoder_calls() as calls:
        page.fill("#frame", "15")
        page.press("#frame", "Enter")
        page.wait_for_selector("body[data-frame='15']")
        page.keyboard.press("1")
        page.keyboard.down("Shift")
        click_video(page, 40, 30)
        page.keyboard.up("Shift")
        page.wait_for_selector("body[data-previewed='15:1']", timeout=20_000)
        entries = track_and_compare(page, store, before, tmp_path / "corrected")
    assert calls.count == 0
    other.wait_for_selector(f"body[data-job='done'][data-runs='{runs + 1}']", timeout=30_000)
    shown = len(page.evaluate("studio.entries"))  # the mask tracked there, then the click
    other.wait_for_function(f"studio.entries.length === {shown}", timeout=30_000)
    assert other.evaluate("studio.entries") == page.evaluate("studio.entries")
    assert not other.errors, other.errors
    other.close()
    last = entries[-1]
    assert (last["object"], last["frame"], last["labels"]) == (1, 15, [0])
    assert np.allclose(last["points"], [[40.5, 30.5]], atol=0.2)  # screen to video pixels

    # the brush and the eraser on frame 12's mask of object 2: its mask prompt
    page.fill("#frame", "12")
    page.press("#frame", "Enter")
    page.wait_for_selector("body[data-frame='12']")
    page.keyboard.press("2")
    page.keyboard.press("b")
    page.fill("#radius", "4")
    drag_video(page, 10, 50, 40, 55)  # painted: a stroke from (10, 50) to (40, 55)
    page.wait_for_selector("body[data-previewed='12:2']", timeout=20_000)
    page.keyboard.press("e")
    page.evaluate("document.body.dataset.previewed = ''")
    drag_video(page, 25, 45, 25, 60)  # erased: a vertical stroke through it
    page.wait_for_selector("body[data-previewed='12:2']", timeout=20_000)
    page.screenshot(path=SHOTS / "studio_brush.png")
    entries = track_and_compare(page, store, before, tmp_path / "brushed")
    painted = [e for e in entries if e["frame"] == 12 and e["object"] == 2]
    assert len(painted) == 1 and painted[0]["mask"].startswith("data:image/png;base64,")
    from segpipe.prompts import load

    mask = load(painted[0:1], 24, 96, 72)[0].mask
    assert mask[52, 12] and mask[52, 38] and not mask[52, 25]  # painted, then erased

    # the CVAT export from the page: the store's masks
    from test_export import cvat_masks

    page.select_option("#export-format", "cvat")
    runs = job_runs(page)
    page.click("#export")
    page.wait_for_selector(f"body[data-job='done'][data-runs='{runs + 1}']", timeout=60_000)
    xml = store.with_name("clip.export") / "annotations.xml"
    assert str(xml) in page.inner_text("#progress")
    import segpipe as api

    run = api.open(store)
    tracks = cvat_masks(xml, 72, 96)
    for obj in run.object_ids:
        assert sorted(tracks[f"object {obj}"]) == list(range(24))
        for t, m in tracks[f"object {obj}"].items():
            assert np.array_equal(m, run.mask(t, obj))
    progress = json.loads(fetch(studio.url + "api/progress")[1])  # the export's bar's count
    assert (progress["kind"], progress["done"], progress["total"]) == ("export cvat", 24, 24)

    # track from here: the tracking window of `track --frames A:B`, forward and backward
    # (the new tracking empties the CVAT export's ledger, which the CLI's copy never had)
    skip = ("ledger/export_cvat",)
    go_to(page, 10)
    page.fill("#to-frame", "17")
    track_and_compare(
        page, store, before, tmp_path / "ahead", "#track-forward",
        "--direction", "forward", "--frames", "10:18", skip=skip,
    )  # fmt: skip
    tracked = np.nonzero(api.open(store).tracked)[0]
    assert tracked.min() == 10 and tracked.max() == 17
    # a pass starts where SAM 2's would (forward: the later of the frame and the earliest
    # prompt, 5; backward: the earlier): a button is offered where its pass starts here
    assert page.is_disabled("#track-backward") and not page.is_disabled("#track-forward")
    go_to(page, 4)
    assert page.is_disabled("#track-forward") and not page.is_disabled("#track-backward")
    page.fill("#to-frame", "1")
    track_and_compare(
        page, store, before, tmp_path / "back", "#track-backward",
        "--direction", "reverse", "--frames", "1:5", skip=skip,
    )  # fmt: skip
    assert np.nonzero(api.open(store).tracked)[0].tolist() == [1, 2, 3, 4]
    assert not page.errors, page.errors
    page.close()


def go_to(page, frame: int) -> None:
    page.fill("#frame", str(frame))
    page.press("#frame", "Enter")
    page.wait_for_selector(f"body[data-frame='{frame}']")


def track_and_compare(
    page, store: Path, before: Path, work: Path, button="#track", *cli_args, skip=()
):
    """Download the page's prompts, press Track (or `button`), wait for it; the store must
    then be what `segpipe track --prompts <that file> [cli_args]` makes of `before` (a copy
    of it; arrays `skip` left out). Returns the prompts."""
    work.mkdir()
    with page.expect_download() as download:
        page.click("#download")
    prompts = work / "prompts.json"
    download.value.save_as(prompts)
    runs = job_runs(page)
    page.click(button)
    page.wait_for_selector(f"body[data-job='done'][data-runs='{runs + 1}']", timeout=120_000)
    cli = work / "cli.zarr"
    shutil.copytree(before, cli)
    here("track", "--store", cli, "--prompts", prompts, *cli_args)
    assert_same_store(store, cli, skip=skip)
    return json.loads(prompts.read_text())["prompts"]


class encoder_calls:
    """Counts SAM 2 image-encoder calls in this process, on any predictor (the real model,
    observed through a global forward hook)."""

    def __enter__(self):
        import torch
        from sam2.modeling.backbones.image_encoder import ImageEncoder

        self.count = 0

        def hook(module, *_):
            if isinstance(module, ImageEncoder):
                self.count += 1

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_bad_requests_get_one_line_4xx_and_change_nothing(studio, store):
    url = studio.url
    fetch(
        url + "api/prompts",
        "PUT",
        {"prompts": [{"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}]},
    )
    digest = tree_digest(store)
    cases = [
        ("GET", "api/frames/24.jpg", None, 400, "out of range"),
        ("GET", "api/masks/999.png", None, 400, "out of range"),
        ("GET", "api/frames/-1.jpg", None, 404, "not found"),
        ("GET", "api/frames/x.jpg", None, 404, "not found"),
        ("POST", "api/preview", b"{nope", 400, "not valid json"),
        ("POST", "api/preview", {"frame": 5, "object": "7"}, 400, "object must be an object id"),
        ("POST", "api/preview", {"frame": 99, "object": 1}, 400, "out of range"),
        (
            "PUT",
            "api/prompts",
            {"prompts": [{"object": 1, "frame": 5, "points": [[500, 5]], "labels": [1]}]},
            400,
            "outside",
        ),
        (
            "PUT",
            "api/prompts",
            {"prompts": [{"object": 1, "frame": 50, "box": [1, 1, 9, 9]}]},
            400,
            "frame",
        ),
        ("PUT", "api/prompts", {"prompts": "all"}, 400, "list"),
        ("PUT", "api/prompts", [1, 2], 400, "prompts"),
        (
            "PUT",
            "api/prompts",
            {"prompts": [{"object": 1, "frame": 5, "mask": "../../etc/passwd"}]},
            400,
            "mask",
        ),
        ("PUT", "api/labels", {"objects": [{"id": 0}]}, 400, "id must be an integer"),
        ("PUT", "api/labels", {"objects": [{"id": 1, "name": "a\nb"}]}, 400, "control"),
        ("PUT", "api/labels", {"labels": []}, 400, '{"objects"'),
        ("PATCH", "api/labels", {"labels": []}, 400, '{"objects"'),
        ("PATCH", "api/labels", {"remove": "3"}, 400, "remove must be a list of object ids"),
        ("PATCH", "api/labels", {"remove": [0]}, 400, "remove: object 0: the id must be"),
        ("PATCH", "api/labels", {"objects": [{"id": 4}], "remove": [4]}, 400, "both named and"),
        ("POST", "api/track", {"direction": "sideways"}, 400, "direction"),
        ("POST", "api/track", {"frames": [5, 2]}, 400, "holds no frame"),
        ("POST", "api/track", {"frames": "10:18"}, 400, "frames must be [a, b]"),
        ("POST", "api/track", {"frames": [True, 3]}, 400, "frames must be [a, b]"),
        ("POST", "api/track", {"frames": [-1, None]}, 400, "outside the video's frames"),
        ("POST", "api/track", {"frames": [0, 4], "direction": "forward"}, 400, "no forward pass"),
        ("POST", "api/track", b"{}", 400, "content-type"),  # as another site's form sends
        ("POST", "api/cancel", b"", 400, "content-type"),
        ("PUT", "api/prompts", b"{nope", 400, "not valid json"),
        ("POST", "api/export", {"format": "cvat"}, 409, "no tracking results"),
        ("POST", "api/export", {"format": "png"}, 400, "format must be one of"),
        ("POST", "api/export", [], 400, "format"),
        ("DELETE", "api/prompts", None, 405, "method not allowed"),
        ("GET", "api/../../../etc/passwd", None, 404, "not found"),
        ("GET", "static/..%2f..%2fsession.py", None, 404, "not found"),
        ("GET", "static/%2e%2e/session.py", None, 404, "not found"),
    ]
    for method, path, body, status, words in cases:
        kind = (
            None
            if path in ("api/track", "api/cancel") and isinstance(body, bytes)
            else "application/json"
        )
        got, data, _ = fetch(url + path, method, body, kind)
        assert got == status, (path, body, got, data)
        message = json.loads(data)["error"]
        assert "\n" not in message and words in message.lower(), (path, message)
    # no prompt of object 7 on frame 5 (another tab may have just taken it): nothing to show
    assert fetch(url + "api/preview", "POST", {"frame": 5, "object": 7})[:2] == (204, b"")
    got = json.loads(fetch(url + "api/prompts")[1])["prompts"]
    assert got == [{"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}]
    assert tree_digest(store) == digest


def write_tracking(store: Path, O: int) -> np.ndarray:
    """Tracking results of O objects written into the small clip's store through zarr
    (object k's mask: row k % 72); the masks."""
    import zarr

    T, H, W = 24, 72, 96
    group = zarr.open_group(str(store), mode="r+")
    for name in ("masks", "object_scores", "object_areas", "tracked"):
        if name in group:
            del group[name]
    masks = np.zeros((T, O, H, W), bool)
    for o in range(O):
        masks[:, o, o % H, : o % W + 1] = True
    group.create_array("masks", data=masks, chunks=(4, 1, H, W))
    group.create_array("object_scores", data=np.ones((T, O), np.float32), chunks=(4, 1))
    group.create_array("object_areas", data=masks.sum((2, 3)), chunks=(4, 1))
    group.create_array("tracked", data=np.ones((T, O), bool), chunks=(4, 1))
    group.attrs["track"] = {
        "prompts_sha256": "set by the test",
        "direction": "forward",
        "object_ids": list(range(1, O + 1)),
        "start_frame": 0,
        "prompts": [{"object": 1, "frame": 0, "points": [[1.0, 1.0]], "labels": [1]}],
        "options": {
            "postprocessing": True,
            "non_overlap": False,
            "score_threshold": 0.0,
            "object_start": "earliest",
        },
    }
    return masks


def test_a_reset_between_a_requests_reads_shows_nothing_instead_of_failing(store):
    """New prompts reset the tracking (remove its arrays) while a request reads them: a
    masks or timeline request that looked before the reset and reads after it answers
    "nothing tracked" (the page asks again), not a 500 (seen in the browser test: an
    AttributeError on the masks array gone between two reads)."""
    import shutil

    from segpipe.errors import DamagedStore
    from segpipe.store.masks import read_masks
    from segpipe.store.runstore import RunStore
    from segpipe.web.session import ChunkMasks, Studio

    write_tracking(store, 3)
    studio = Studio(store)
    assert len(studio.scores()["objects"]) == 3 and studio.masks_png(3)[1] == "grey"
    looked = RunStore.open(store, read_only=True)  # as the request holds it: it looked
    assert looked.array("masks") is not None and looked.array("object_areas") is not None
    for name in ("masks", "object_areas"):  # the reset (its arrays go one by one)
        shutil.rmtree(store / name)
    assert ChunkMasks().frame(looked, 3) == []
    with pytest.raises(DamagedStore):
        read_masks(looked, 0, 4, [0, 1, 2], packed=True)
    assert studio.scores()["objects"] == []  # object_scores still there, areas gone


def test_masks_come_grey_under_255_objects_and_as_rgb_from_then_on(store):
    """A frame's masks PNG holds 1 + each pixel's object slot: grey (a third of the bytes to
    compress) while the slots fit, R + 256 G from 255 objects on. Tracking results of 3 and
    of 300 objects are written into the store through zarr (object k's mask: row k % 72)."""
    import io

    from segpipe.web.server import StudioServer

    H, W = 72, 96
    for O, kind in ((3, "grey"), (300, "rgb")):
        masks = write_tracking(store, O)
        expected = np.zeros((H, W), int)
        for o in range(O):
            expected[masks[3, o]] = o + 1  # the later object's where they overlap
        server = StudioServer(store, port=0).start()
        try:
            status, data, headers = fetch(server.url + "api/masks/3.png")
        finally:
            server.stop()
        assert status == 200 and {k.lower(): v for k, v in headers.items()}["x-mask-format"] == kind
        image = np.asarray(Image.open(io.BytesIO(data)))
        shown = image if kind == "grey" else image[..., 0] + 256 * image[..., 1].astype(int)
        assert image.ndim == (2 if kind == "grey" else 3)
        assert np.array_equal(shown, expected) and shown.max() == O


def test_the_api_is_described_by_its_openapi_schema(studio):
    """Every endpoint the page uses is in `GET /api/schema`, with a summary."""
    from segpipe.web.app import make_app

    status, data, _ = fetch(studio.url + "api/schema")
    assert status == 200, data
    paths = json.loads(data)["paths"]
    import re

    routes = {
        re.sub(r":\w+}", "}", r.path)
        for r in make_app(studio.studio).routes
        if r.path.startswith("/api/")
    }
    assert set(paths) == routes - {"/api/schema"}
    for path, methods in paths.items():
        for method, spec in methods.items():
            assert spec.get("summary"), (path, method)


def test_the_pages_prompts_are_the_stores_and_outlive_the_studio(store, small, tmp_path):
    """The page's prompts are saved with the store as they change: a new studio opens with
    them, and `segpipe track` without --prompts tracks them (the same store as with the
    prompts file); once tracked, the store's draft is gone (they are its prompts)."""
    from segpipe.web.server import StudioServer

    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    before = tmp_path / "before.zarr"
    shutil.copytree(store, before)
    server = StudioServer(store, port=0).start()
    try:
        assert fetch(server.url + "api/prompts", "PUT", {"prompts": entries})[0] == 200
    finally:
        server.stop()
    server = StudioServer(store, port=0).start()
    try:
        saved = json.loads(fetch(server.url + "api/prompts")[1])["prompts"]
    finally:
        server.stop()
    assert [(e["object"], e["frame"]) for e in saved] == [(1, 5), (2, 8)]
    assert (store / "prompts.json").is_file()
    shown = segpipe("status", "--store", store, check=True).stdout
    assert "segpipe studio's saved prompts (2 prompts" in shown, shown
    tracked = segpipe("track", "--store", store)
    assert tracked.returncode == 0 and "segpipe studio saved" in tracked.stderr, tracked.stderr
    assert not (store / "prompts.json").exists()
    assert json.loads(segpipe("status", "--store", store, "--json").stdout)["draft"] is None
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": entries}))
    here("track", "--store", before, "--prompts", prompts)
    assert_same_store(store, before)

    # a repair recomputes what was tracked, never a draft; a studio open while another
    # command tracks new prompts shows those
    server = StudioServer(store, port=0).start()
    try:
        other = [{"object": 1, "frame": 9, "box": [20, 20, 60, 50]}]
        assert fetch(server.url + "api/prompts", "PUT", {"prompts": other})[0] == 200
        damaged = next((store / "masks" / "c").rglob("*"), None)
        while damaged.is_dir():
            damaged = next(damaged.iterdir())
        damaged.unlink()
        segpipe("repair", "--store", store, "--quiet", check=True)
        assert (store / "prompts.json").is_file()
        assert_same_store(store, before)
        fetch(server.url + "api/prompts", "PUT", {"prompts": []})  # no draft now
        here("track", "--store", store, "--prompts", small / "prompts.json")
        shown = json.loads(fetch(server.url + "api/prompts")[1])["prompts"]
        assert [(e["object"], e["frame"]) for e in shown] == [(1, 5), (2, 8), (3, 11)]
    finally:
        server.stop()


def test_a_store_not_yet_encoded_previews_and_tracks_as_encode_then_track(small, tmp_path):
    """`segpipe studio clip.mp4 --model segpipe_tiny`: the video is decoded as the studio's
    first job (the store is `segpipe decode`'s), the preview encodes its frame alone (one
    encoder call, nothing written), Track encodes the chunks as it tracks them; the store is
    then `segpipe encode --model segpipe_tiny` and `segpipe track` on the decoded store."""
    from segpipe.settings import Decoding, Encoding
    from segpipe.web.server import StudioServer

    store = tmp_path / "clip.zarr"
    before = tmp_path / "before.zarr"
    here("decode", small / "clip.mp4", "--store", before, "--chunk-size", 4, "--image-size", 128)
    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    source = (small / "clip.mp4", Decoding(chunk_size=4, image_size=128))
    tiny = Encoding(model="segpipe_tiny")
    server = StudioServer(store, port=0, encoding=tiny, source=source).start()
    try:
        url = server.url
        deadline = time.monotonic() + 60
        while json.loads(fetch(url + "api/progress")[1])["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        done = json.loads(fetch(url + "api/progress")[1])
        assert (done["kind"], done["state"], done["done"], done["total"]) == (
            "decode",
            "done",
            24,
            24,
        )
        assert_same_store(store, before)
        assert json.loads(fetch(url + "api/info")[1])["encoded"] is False
        assert fetch(url + "api/prompts", "PUT", {"prompts": entries})[0] == 200
        digest = {k: v for k, v in tree_digest(store).items() if k != "prompts.json"}
        with encoder_calls() as calls:
            assert preview_mask(url, 5, 1).any()
        assert calls.count == 1
        assert {k: v for k, v in tree_digest(store).items() if k != "prompts.json"} == digest
        assert fetch(url + "api/track", "POST", {})[0] == 202
        deadline = time.monotonic() + 120
        while json.loads(fetch(url + "api/progress")[1])["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert json.loads(fetch(url + "api/progress")[1])["state"] == "done"
    finally:
        server.stop()
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": entries}))
    here("encode", "--store", before, "--model", "segpipe_tiny")
    here("track", "--store", before, "--prompts", prompts)
    assert_same_store(store, before)


def studio_process(argv, *hooks) -> tuple[subprocess.Popen, str]:
    """`segpipe <argv>` (a studio) in its own process, with `kill_points` test hooks
    installed first; (the process, the URL it printed)."""
    code = "import sys\nsys.path.insert(0, 'tests')\nimport kill_points\n"
    code += "".join(f"kill_points.{h}\n" for h in hooks) + "kill_points.cli(sys.argv[1:])"
    proc = spawn(argv, code, subprocess.PIPE, subprocess.PIPE)
    line = proc.stdout.readline()
    assert line.startswith("studio: http://"), proc.stderr.read()
    return proc, line.split()[1]


def test_a_video_is_decoded_in_the_page_with_its_progress(browser, small, tmp_path):
    """`segpipe studio clip.mp4 --store S`: bad input is refused at once, on the terminal;
    otherwise the URL comes at once and the page shows the decode's progress (the decode is
    held as it writes its 3rd chunk's frames, by a test hook: frames decoded, fewer than
    24). The page's Cancel there stops it after that chunk, as one Ctrl-C, and the page says
    so (the other controls are disabled meanwhile, saying why); a reload decodes on from there, then the page opens the store, which is `segpipe
    decode`'s."""
    store, flag = tmp_path / "clip.zarr", tmp_path / "go"
    args = ["--store", store, "--chunk-size", 4, "--image-size", 128, "--port", 0]
    refused = segpipe("studio", small / "prompts.json", *args)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("Error:") and not store.exists(), refused.stderr
    argv = ["studio", small / "clip.mp4", *args]
    proc, url = studio_process(argv, f"wait_before_write('frames', 3, {str(flag)!r})")
    try:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-decoding='1']", timeout=30_000)
        page.wait_for_function(
            "/^decode: [0-9]+[/]24 frames/.test(document.getElementById('progress').textContent)",
            timeout=30_000,
        )
        shown = page.inner_text("#progress")
        assert 8 <= int(shown.split()[1].split("/")[0]) < 24, shown  # (with rate and ETA)
        page.screenshot(path=SHOTS / "studio_decoding.png")
        assert fetch(url + "api/prompts")[0] == 409  # no store to read yet
        # meanwhile the page's Cancel works, and the other controls are off, saying why
        assert page.is_disabled("#track") and page.is_disabled("#scrub")
        assert "once the video is decoded" in page.get_attribute("#track", "title")
        page.click("#cancel")
        flag.touch()
        page.wait_for_selector("body[data-decoding='cancelled']", timeout=30_000)
        assert "decode cancelled" in page.inner_text("#error")
        assert 3 <= ledger_count(store, "decode") < 6  # the chunk in flight committed, no more
        page.reload()  # decodes on
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        assert page.evaluate("studio.info.frames") == 24
        assert not page.is_disabled("#track") and "track the prompts" in page.get_attribute(
            "#track", "title"
        )
        page.close()
    finally:
        flag.touch()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    reference = tmp_path / "reference.zarr"
    here("decode", small / "clip.mp4", "--store", reference, "--chunk-size", 4, "--image-size", 128)
    assert_same_store(store, reference)


def test_beyond_loopback_every_request_needs_the_token(store):
    from segpipe.web.server import StudioServer

    server = StudioServer(store, host="0.0.0.0", port=0).start()
    try:
        assert "?token=" in server.url
        port = server.url.split(":")[2].split("/")[0]
        base = f"http://127.0.0.1:{port}/"
        for path in ("", "api/info", "api/frames/0.jpg", "static/studio.js"):
            status, data, _ = fetch(base + path)
            assert status == 401 and b"token" in data, path
        assert fetch(base + "api/info?token=wrong")[0] == 401
        status, _, headers = fetch(base + f"?token={server.token}")
        assert status == 200 and server.token in headers.get("set-cookie", "")
        request = urllib.request.Request(base + "api/info")
        request.add_header("Cookie", f"segpipe_token={server.token}")
        with urllib.request.urlopen(request) as r:
            assert json.loads(r.read())["frames"] == 24
    finally:
        server.stop()


def hold_store(store: Path) -> subprocess.Popen:
    """Another process holding the store's lock (as a running `segpipe track` does)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from segpipe.store.lock import store_lock\n"
            "with store_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(store),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_store_another_process_writes_is_read_only_meanwhile(store):
    """While another process holds the store (a `segpipe track`), the studio says it is
    read-only and refuses changes in one line, whether it was opened before or after; the
    store is left as it was; once that process is done, the studio writes again."""
    from segpipe.web.server import StudioServer

    body = {"prompts": [{"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}]}
    opened_first = StudioServer(store, port=0).start()
    try:
        holder = hold_store(store)
        try:
            status, data, _ = fetch(opened_first.url + "api/prompts", "PUT", body)
            assert status == 409 and "read-only" in json.loads(data)["error"], data
        finally:
            holder.kill()
            holder.wait()
        assert fetch(opened_first.url + "api/prompts", "PUT", body)[0] == 200
        assert fetch(opened_first.url + "api/prompts", "PUT", {"prompts": []})[0] == 200
    finally:
        opened_first.stop()
    holder = hold_store(store)
    try:
        digest = tree_digest(store)
        server = StudioServer(store, port=0).start()
        try:
            info = json.loads(fetch(server.url + "api/info")[1])
            assert "read-only" in info["read_only"] and f"pid {holder.pid}" in info["read_only"]
            body = {"prompts": [{"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}]}
            for method, path, b in (
                ("PUT", "api/prompts", body),
                ("POST", "api/track", {}),
                ("POST", "api/export", {"format": "davis"}),
                ("PUT", "api/labels", {"objects": [{"id": 1, "name": "disc"}]}),
                ("POST", "api/undo", {}),
                ("POST", "api/redo", {}),
            ):
                status, data, _ = fetch(server.url + path, method, b)
                assert status == 409 and "read-only" in json.loads(data)["error"], data
            assert fetch(server.url + "api/frames/3.jpg")[0] == 200  # looking still works
        finally:
            server.stop()
        assert tree_digest(store) == digest
    finally:
        holder.kill()
        holder.wait()


def test_cancel_then_kill_9_of_the_studio_mid_track_then_track_again_resumes(
    store, small, tmp_path
):
    """One `segpipe studio` process, held before its 2nd chunk's masks (a test hook): a CLI
    track on the store is refused meanwhile (one writer); Cancel then lets that chunk in
    flight finish and stops, as one Ctrl-C. Track again resumes, and the studio is killed
    -9 halfway through writing a later chunk's masks. A new studio's Track resumes from the
    chunks committed; the store is then the CLI's with the same prompts."""
    before = tmp_path / "before.zarr"
    shutil.copytree(store, before)
    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    flag = tmp_path / "go"

    def start(*hooks):
        return studio_process(["studio", store, "--port", 0], *hooks)

    def wait_job(url, proc=None):
        deadline = time.monotonic() + 120
        while (p := json.loads(fetch(url + "api/progress")[1]))["state"] == "running":
            assert time.monotonic() < deadline and (proc is None or proc.poll() is None)
            time.sleep(0.05)
        return p

    # one masks file per object and chunk, forward from frame 5 in chunks of 4: chunk 0's
    # (untracked) are writes 1-2, chunk 1's 3-4, chunk 2's 5-6, chunk 3's 7-8, chunk 4's 9-10
    proc, url = start(f"wait_before_write('masks', 5, {str(flag)!r})", "mid_write('masks', 9)")
    try:
        assert fetch(url + "api/prompts", "PUT", {"prompts": entries})[0] == 200
        assert fetch(url + "api/track", "POST", {"direction": "forward"})[0] == 202
        deadline = time.monotonic() + 120
        while ledger_count(store, "track_forward") < 1:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        refused = segpipe("track", "--store", store, "--prompts", small / "prompts.json")
        assert refused.returncode != 0 and "in use by" in refused.stderr, refused.stderr
        assert fetch(url + "api/cancel", "POST", {})[0] == 200
        flag.touch()
        p = wait_job(url, proc)
        assert p["state"] == "cancelled" and "cancelled" in p["message"], p
        assert ledger_count(store, "track_forward") == 2  # the chunk in flight finished
        assert fetch(url + "api/track", "POST", {"direction": "forward"})[0] == 202
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        proc.kill()
    assert ledger_count(store, "track_forward") == 3  # killed in chunk 4 of 1..5
    proc, url = start()
    try:
        assert json.loads(fetch(url + "api/prompts")[1])["prompts"] != []
        assert fetch(url + "api/track", "POST", {"direction": "forward"})[0] == 202
        assert wait_job(url)["state"] == "done"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": entries}))
    here("track", "--store", before, "--prompts", prompts, "--direction", "forward")
    assert_same_store(store, before)


def test_a_killed_server_shows_a_banner_and_its_restart_says_where_tracking_stopped(
    browser, store, small, tmp_path
):
    """A page open on a studio that is tracking (held before its 2nd chunk's masks, by a test
    hook): a kill -9 of the server shows the disconnected banner, and the page no longer
    shows the job as under way; a button then says in one line that the server does not
    answer. A new studio on the same port: the page reconnects by itself, the banner goes,
    and it says where the tracking stopped (the frames the store's ledgers hold); Track
    then resumes it to the end."""
    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    flag = tmp_path / "never"
    proc, url = studio_process(
        ["studio", store, "--port", 0], f"wait_before_write('masks', 5, {str(flag)!r})"
    )
    port = url.rstrip("/").rsplit(":", 1)[1]
    try:
        assert fetch(url + "api/prompts", "PUT", {"prompts": entries})[0] == 200
        assert fetch(url + "api/track", "POST", {"direction": "forward"})[0] == 202
        assert wait_for(lambda: ledger_count(store, "track_forward") >= 1, proc, timeout=120)
        page = open_page(browser, url)
        page.wait_for_function("document.body.dataset.job === 'running'", timeout=30_000)
        assert page.locator("#connection").is_hidden()
        proc.kill()
        proc.wait(30)
        page.wait_for_selector("body[data-connection='lost']", timeout=30_000)
        assert page.locator("#connection").is_visible()
        assert "disconnected" in page.inner_text("#connection")
        assert "tracking" not in page.inner_text("#progress")  # not shown as under way
        page.click("#track")
        page.wait_for_function(
            "/does not answer/.test(document.getElementById('error').textContent)"
        )
    finally:
        proc.kill()
        proc.wait(30)
    kept = ledger_records(store, "track_forward")  # chunk -> its record's time
    assert kept
    proc, url = studio_process(["studio", store, "--port", port])
    try:
        page.wait_for_selector("body[data-connection='ok']", timeout=30_000)
        assert page.locator("#connection").is_hidden()
        page.wait_for_selector("body[data-job='interrupted']", timeout=30_000)
        said = page.inner_text("#progress")
        p = json.loads(fetch(url + "api/progress")[1])
        assert (p["state"], p["kind"]) == ("interrupted", "track"), p
        assert 0 < p["done"] < p["total"], p
        assert said == f"tracking interrupted at {p['done']}/{p['total']} frames: Track resumes it"
        page.select_option("#direction", "forward")
        page.click("#track")
        page.wait_for_selector("body[data-job='done']", timeout=120_000)
        assert json.loads(fetch(url + "api/progress")[1])["state"] == "done"
        # the only errors: the requests the killed server cut or did not answer
        assert all(e.startswith("Failed to load resource: net::ERR_") for e in page.errors), (
            page.errors
        )
        page.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    now = ledger_records(store, "track_forward")
    assert len(now) > len(kept) and now.items() >= kept.items()  # resumed: none redone


def test_timeline_strips_mark_where_an_object_is_lost_and_keys_jump_there(
    browser, store, small, tmp_path
):
    """The strips draw each object where it is present (its colour), tracked but absent
    (grey) and its prompts (white); frames where it may be lost are marked above its strip
    (its score falls below zero: red; its area against its running median: orange; its
    mask empties while its score says present: yellow; `segpipe.flags`), ] / [ jump to the
    next / previous mark and say which object and why, and the flag list links each flag
    to its frame. The scores and areas are set in the store (through zarr) to make losses
    the test knows: object 1 absent on 10..13, its area 4x on frame 16, empty on frame 19;
    object 2 steady."""
    import zarr

    import segpipe
    from segpipe.web.server import StudioServer

    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    segpipe.track(store, entries, execution=segpipe.Execution(progress=False))
    with zarr.config.set({"array.write_empty_chunks": True}):
        group = zarr.open_group(str(store), mode="r+")
        s, a = group["object_scores"][...], np.full(group["object_areas"].shape, 500)
        s = np.abs(s) + 1.0
        s[10:14, 0] = -5.0
        a[10:14, 0], a[16, 0], a[19, 0] = 0, 2000, 0
        group["object_scores"][...], group["object_areas"][...] = s, a
    server = StudioServer(store, port=0).start()
    try:
        page = open_page(browser, server.url + "?frame=2")
        page.wait_for_function(  # (the masks' flags too, and the page drawn from them)
            "studio.scores.measuring === false && document.body.dataset.refreshed == studio.version"
        )
        # (5: the shipped model's own mask on its prompt's frame, unlike the one before)
        assert page.evaluate("studio.scores.flags.map((o) => o.map(([f, kind]) => [f, kind]))") == [
            [[5, "iou"], [10, "absent"], [16, "area"], [19, "vanished"]],
            [],
        ]
        assert page.evaluate("studio.lost") == [5, 10, 16, 19]
        page.keyboard.press("]")
        page.wait_for_selector("body[data-frame='5']")
        page.keyboard.press("]")
        page.wait_for_selector("body[data-frame='10']")
        assert (
            page.inner_text("#flag-said") == "frame 10: object 1: absent, its score fell to -5.00"
        )
        assert page.evaluate(
            "[...document.querySelectorAll('#flag-list li')].map((li) => li.textContent)"
        ) == [
            "frame 5object 1: iou",
            "frame 10object 1: absent",
            "frame 16object 1: area",
            "frame 19object 1: vanished",
        ]
        page.click("#flag-list li[data-frame='16'] .go")
        page.wait_for_selector("body[data-frame='16']")
        assert "object 1: area, its area is 4.0x its running median" in page.inner_text(
            "#flag-said"
        )
        page.keyboard.press("End")
        page.wait_for_selector("body[data-frame='23']")
        page.keyboard.press("[")
        page.wait_for_selector("body[data-frame='19']")
        page.keyboard.press("Home")
        page.wait_for_selector("body[data-frame='0']")
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("body[data-frame='1']")
        # each row: flags in its top band, the strip in the middle, the prompts' ticks at the
        # bottom, the object's name at the left (`stripGeometry`)
        band = """(c, T, r, f, y) => { const G = stripGeometry, W = c.width - G.left;
            return Array.from(c.getContext('2d').getImageData(
              G.left + Math.floor((f + 0.5) * W / T), r * G.row + y, 1, 1).data.slice(0, 3)); }"""
        sample = f"""(y) => {{ const c = document.getElementById('strips'), T = studio.info.frames;
            const at = {band}; return [0, 1].map((r) =>
              Array.from({{length: T}}, (_, f) => at(c, T, r, f, y))); }}"""
        strips, marks, ticks = (page.evaluate(sample, y) for y in (15, 3, 27))
        assert [marks[0][f] for f in (10, 16, 19, 3)] == [
            [255, 23, 68],
            [255, 145, 0],
            [255, 234, 0],
            [0, 0, 0],  # 3: none
        ]
        colour, grey, white = list(shade(page, 1)), [68, 68, 68], [255, 255, 255]
        assert strips[0][11] == grey and strips[0][12] == grey
        assert strips[0][3] == colour and strips[0][20] == colour
        assert strips[0][5] == colour  # (its prompt's tick below it, not over it)
        assert ticks[0][5] == white and ticks[1][8] == white  # the prompts' frames
        assert marks[0][5] == list(FLAG_IOU) and ticks[0][5] == white  # a tick beside a flag
        row = page.locator("#strips").bounding_box()
        page.mouse.move(row["x"] + row["width"] - 2, row["y"] + 15)  # object 1, the last frame
        assert page.get_attribute("#strips", "title").startswith("object 1, frame 23; score ")
        label = page.evaluate(
            "Array.from(document.getElementById('strips').getContext('2d')"
            ".getImageData(0, 0, stripGeometry.left, 30).data).some((v, i) => i % 4 < 3 && v > 150)"
        )
        assert label  # the object's name drawn at the left
        # zoomed (+, twice: 10 frames at least), the strips show a window of frames that
        # follows the frame shown; a click there is the frame under it; 0 shows all again
        page.keyboard.press("+")
        page.keyboard.press("+")
        a, b = map(int, page.get_attribute("#strips", "data-span").split(":"))
        assert b - a == 10 and a <= 1 < b
        page.keyboard.press("Shift+ArrowRight")  # frame 11, past the window
        page.wait_for_selector("body[data-frame='11']")
        assert page.get_attribute("#strips", "data-span") == "2:12"
        zoomed = """(y) => { const c = document.getElementById('strips'), G = stripGeometry;
            const W = c.width - G.left, g = c.getContext('2d');
            return Array.from({length: 10}, (_, k) => Array.from(g.getImageData(
              G.left + Math.floor((k + 0.5) * W / 10), y, 1, 1).data.slice(0, 3))); }"""
        strip, mark = page.evaluate(zoomed, 15), page.evaluate(zoomed, 3)
        assert strip[11 - 2] == grey and strip[3 - 2] == colour and strip[9 - 2] == colour
        assert mark[10 - 2] == [255, 23, 68] and mark[5 - 2] == list(FLAG_IOU)
        box = page.locator("#strips").bounding_box()
        left = page.evaluate(
            "stripGeometry.left * document.getElementById('strips').clientWidth"
            " / document.getElementById('strips').width"
        )
        page.mouse.click(box["x"] + left + (box["width"] - left) * 6.5 / 10, box["y"] + 15)
        page.wait_for_selector("body[data-frame='8']")  # the 7th frame of 2..11
        page.keyboard.press("-")  # 20 frames around frame 8: 0..19
        assert page.get_attribute("#strips", "data-span") == "0:20"
        # Ctrl + the wheel over frame 18: 10 frames around it, frame 8 shown outside them
        page.mouse.move(box["x"] + left + (box["width"] - left) * 18.5 / 20, box["y"] + 15)
        page.keyboard.down("Control")
        page.mouse.wheel(0, -100)
        page.keyboard.up("Control")
        page.wait_for_selector("#strips[data-span='9:19']")
        assert page.evaluate("studio.frame") == 8
        page.keyboard.press("0")
        assert page.get_attribute("#strips", "data-span") == "0:24"
        page.keyboard.press("Home")
        page.wait_for_selector("body[data-frame='0']")
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("body[data-frame='1']")
        page.screenshot(path=SHOTS / "studio_lost.png")
        assert tinted(page, shade(page, 1)).sum() > 20  # object 1 shown on frame 1
        page.keyboard.press("1")
        page.keyboard.press("h")  # hidden
        assert tinted(page, shade(page, 1)).sum() == 0 and tinted(page, shade(page, 2)).sum() > 20
        page.keyboard.press("h")  # shown again
        assert tinted(page, shade(page, 1)).sum() > 20
        assert not page.errors, page.errors
        page.close()
    finally:
        server.stop()


def test_objects_named_in_the_page_reach_the_exports_and_an_added_object_stays(
    browser, store, small, tmp_path
):
    """Issue 47 item 2 in the page: the selected object's name and class are typed in,
    "+ object" adds one before its first prompt; both are in the store (a reload, and
    `segpipe.open`, see them); the page's CVAT, vis-json and DAVIS exports carry the names
    and classes, and the prompts file it downloads names the objects too."""
    import segpipe
    from segpipe.web.server import StudioServer

    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    segpipe.track(store, entries, execution=segpipe.Execution(progress=False))
    server = StudioServer(store, port=0).start()
    try:
        named = {"objects": [{"id": 5, "name": "x"}]}  # (a PUT replaces every name)
        assert fetch(server.url + "api/labels", "PUT", named)[0] == 200
        assert segpipe.open(store).labels == {5: segpipe.Label(5, "x")}
        assert fetch(server.url + "api/labels", "PUT", {"objects": []})[0] == 200
        assert segpipe.open(store).labels == {}
        page = open_page(browser, server.url)
        page.click("#objects button[data-object='2']")
        page.fill("#object-name", "the circle")
        page.press("#object-name", "Tab")
        page.fill("#object-class", "circle")
        page.press("#object-class", "Tab")
        page.wait_for_function("studio.labels.get(2)?.class === 'circle'")
        page.click("#add-object")
        page.wait_for_selector("#objects button[data-object='3']")  # (at once; then kept:)
        deadline = time.monotonic() + 30
        while 3 not in segpipe.open(store).labels:
            assert time.monotonic() < deadline, "+ object was not kept in the store"
            time.sleep(0.1)
        # another tab names an object 4 meanwhile, and this one has not heard yet: its next
        # change names only its own object, so both stay (then the other tab forgets its 4)
        tab = {"objects": [{"id": 4, "name": "the other tab's"}]}
        assert fetch(server.url + "api/labels", "PATCH", tab)[0] == 200
        page.evaluate("studio.labels.delete(4)")
        page.click("#objects button[data-object='2']")
        page.fill("#object-name", "the disc")
        with page.expect_request(
            lambda r: r.url.endswith("api/labels") and r.method != "GET"
        ) as sent:
            page.press("#object-name", "Tab")
        assert (sent.value.method, json.loads(sent.value.post_data)) == (
            "PATCH",
            {"objects": [{"id": 2, "name": "the disc", "class": "circle"}], "remove": []},
        )  # (its own object's name alone)
        page.wait_for_function("studio.labels.get(2)?.name === 'the disc'")
        assert page.evaluate("studio.labels.get(4)?.name") == "the other tab's"
        assert segpipe.open(store).labels[4].name == "the other tab's"
        assert fetch(server.url + "api/labels", "PATCH", {"remove": [4]})[0] == 200
        page.fill("#object-name", "the circle")
        page.press("#object-name", "Tab")
        page.wait_for_function("studio.labels.get(2)?.name === 'the circle'")
        page.reload()
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        assert page.evaluate(
            "[...document.querySelectorAll('#objects button')].map(b => b.textContent)"
        ) == ["1", "2 the circle", "3"]
        page.click("#objects button[data-object='2']")
        assert page.input_value("#object-name") == "the circle"
        assert page.input_value("#object-class") == "circle"
        assert segpipe.open(store).labels == {
            2: segpipe.Label(2, "the circle", "circle"),
            3: segpipe.Label(3),
        }
        for fmt in ("cvat", "vis-json", "davis"):
            page.select_option("#export-format", fmt)
            runs = job_runs(page)
            page.click("#export")
            page.wait_for_selector(f"body[data-job='done'][data-runs='{runs + 1}']", timeout=60_000)
        out = store.with_name("clip.export")
        xml = (out / "annotations.xml").read_text()
        assert '<track id="1" label="circle"' in xml and xml.count(">the circle</attribute>") == 24
        assert '<track id="0" label="object 1"' in xml
        vis = json.loads((out / "masks.json").read_text())
        assert [c["name"] for c in vis["categories"]] == ["object", "circle"]
        assert [a.get("name") for a in vis["annotations"]] == [None, "the circle"]
        davis = json.loads((out / "davis" / "labels.json").read_text())
        assert davis == {"objects": [{"id": 1}, {"id": 2, "name": "the circle", "class": "circle"}]}
        page.set_viewport_size({"width": 1280, "height": 800})  # docs/studio.md's picture
        page.keyboard.press("End")
        page.wait_for_selector("body[data-frame='23']")
        page.mouse.move(0, 0)
        page.keyboard.press("o")  # (outlines: the shapes show through)
        page.screenshot(path=SHOTS / "studio_named_1280x800.png")  # docs/screenshots/studio.png
        page.keyboard.press("o")
        with page.expect_download() as download:
            page.click("#download")
        downloaded = json.loads(Path(download.value.path()).read_text())
        assert downloaded["objects"] == [
            {"id": 2, "name": "the circle", "class": "circle"},
            {"id": 3},
        ]
        assert not page.errors, page.errors
        page.close()
    finally:
        server.stop()


def job_runs(page) -> int:
    """The jobs the server has run, as the page last showed (once its events said any)."""
    page.wait_for_selector("body[data-runs]", state="attached")
    return page.evaluate("Number(document.body.dataset.runs)")


def got(url: str):
    status, body, _ = fetch(url)
    assert status == 200, body
    return json.loads(body)


def prompt_rows(page) -> list[str]:
    return page.evaluate(
        "[...document.querySelectorAll('#prompt-list li')].map((li) =>"
        " li.querySelector('select').value + ' ' + li.querySelector('.go').textContent"
        " + ' ' + li.querySelector('span').textContent)"
    )


def test_a_prompt_is_deleted_alone_moved_and_undone_after_a_reload_then_redone(
    browser, studio, store
):
    """Issue 47 item 1: the prompt list shows every prompt; one is deleted alone (its
    object's other prompts stay) and one moved to another object; undo and redo go
    through the store's history, so they work after a reload (and in another tab)."""
    url = studio.url
    page = open_page(browser, url + "?frame=5")
    assert page.inner_text("#flag-said").startswith("To start: click an object")  # first run
    click_video(page, 30, 25)  # object 1, frame 5
    page.wait_for_selector("body[data-previewed='5:1']")
    assert page.inner_text("#flag-said") == ""  # (the hint goes with the first prompt)
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("body[data-frame='6']")
    click_video(page, 30, 25)  # object 1, frame 6
    page.wait_for_selector("body[data-previewed='6:1']")
    page.keyboard.press("n")
    page.wait_for_selector("#objects button[data-object='2'].selected")
    drag_video(page, 55, 10, 75, 35)  # object 2, a box on frame 6
    page.wait_for_selector("body[data-previewed='6:2']")
    assert prompt_rows(page) == [
        "1 frame 5 1 point (1+ 0-)",
        "1 frame 6 1 point (1+ 0-)",
        "2 frame 6 box",
    ]
    # frame 5's deleted alone, and the box moved to object 1 while the page still previews
    # frame 6's objects after the deletion: the move reaches the server before the page has
    # its answer, so the page asks for object 2's preview there when it has no prompt left
    # (held here by routes, as a slow machine holds them): nothing to show, no error
    held = {}

    def on_preview(route):
        if "preview" in held:
            route.continue_()
        else:
            held["preview"] = route  # object 1's, after the deletion

    def on_prompts(route):
        if route.request.method == "PUT" and "preview" in held and "put" not in held:
            held["put"] = (route, route.fetch())  # (the server has it; the page not yet)
        else:
            route.continue_()

    def until(key):  # (the page's request held: within 30 s)
        deadline = time.monotonic() + 30
        while key not in held:
            assert time.monotonic() < deadline, f"the page sent no {key}"
            page.wait_for_timeout(20)

    def let_go(key):
        if key in held and key not in gone:
            gone.add(key)
            if key == "put":
                held[key][0].fulfill(response=held[key][1])
            else:
                held[key].continue_()

    gone = set()
    page.route("**/api/preview", on_preview)
    page.route("**/api/prompts", on_prompts)
    try:
        page.click("#prompt-list li[data-index='0'] .delete")  # frame 5's alone
        page.wait_for_function("studio.entries.length === 2")
        until("preview")
        page.select_option("#prompt-list li[data-index='1'] select", "1")  # the box: object 1's
        until("put")
        with page.expect_response(lambda r: '"object":2' in (r.request.post_data or "")) as late:
            let_go("preview")
        assert late.value.status == 204  # object 2 has no prompt on frame 6 now
    finally:
        for key in [*held]:  # (the put's answer after the preview; all let go, whatever happened)
            let_go(key)
        page.unroute("**/api/preview")
        page.unroute("**/api/prompts")
    page.wait_for_function("studio.entries[1].object === 1")
    assert page.inner_text("#error") == ""  # (the page took the 204 as nothing to show)
    assert prompt_rows(page) == ["1 frame 6 1 point (1+ 0-)", "1 frame 6 box"]
    assert [(e["object"], e["frame"]) for e in got(url + "api/prompts")["prompts"]] == [
        (1, 6),
        (1, 6),
    ]
    assert got(url + "api/history") == {"undo": 5, "redo": 0}  # 3 prompts, a delete, a move
    page.reload()
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert len(prompt_rows(page)) == 2
    page.keyboard.press("z")  # the move undone
    page.wait_for_function("studio.entries.length === 2 && studio.entries[1].object === 2")
    page.keyboard.press("z")  # the deletion undone
    page.wait_for_function("studio.entries.length === 3")
    assert prompt_rows(page)[0] == "1 frame 5 1 point (1+ 0-)"
    other = open_page(browser, url + "?frame=6")  # another tab redoes what this one undid
    other.keyboard.press("y")
    page.wait_for_function("studio.entries.length === 2")
    assert got(url + "api/history") == {"undo": 4, "redo": 1}
    assert not page.evaluate("document.getElementById('redo').disabled")
    # a history edited by hand: its bad step is dropped in one line, the prompts stay
    history = json.loads((store / "prompts.history.json").read_text())
    named = [{"object": 1, "frame": 5, "mask": "/etc/hostname"}]  # a file: never read
    (store / "prompts.history.json").write_text(json.dumps({**history, "redo": [named, 3]}))
    for said in ("not valid", "inline PNG data"):  # the last step first
        status, body, _ = fetch(url + "api/redo", "POST", {})
        assert status == 400 and said in json.loads(body)["error"], body
    assert got(url + "api/history") == {"undo": 4, "redo": 0}
    assert len(got(url + "api/prompts")["prompts"]) == 2
    page.click("#prompt-list li[data-index='0'] .go")
    page.wait_for_selector("body[data-frame='6']")
    assert not page.errors and not other.errors, (page.errors, other.errors)
    page.close()
    other.close()


def test_a_correction_that_moves_an_object_onto_another_is_said_before_track(browser, store, small):
    """Issue 47 item 1: on a tracked frame, a box for object 2 drawn around object 1 (the
    swap the issue saw) previews onto object 1: the page says the correction changes
    object 2's tracked mask drastically (its overlap and how far it moved); undone, the
    warning goes; a box around object 2's own shape says nothing."""
    import make_sample

    import segpipe
    from segpipe.web.server import StudioServer

    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    segpipe.track(store, entries, execution=segpipe.Execution(progress=False))
    _, truth = make_sample.make_clip(num_frames=24, width=96, height=72, seed=1)
    server = StudioServer(store, port=0).start()
    try:
        page = open_page(browser, server.url + "?frame=14")
        page.wait_for_function(  # the events' first refresh done: frame 14's masks shown
            "studio.version >= 0 && document.body.dataset.refreshed == studio.version"
            " && studio.shown === 14"
        )
        page.keyboard.press("2")
        for slot, said in ((0, True), (1, False)):  # object 1's shape, then object 2's
            ys, xs = np.nonzero(truth[14, slot])
            page.evaluate("document.body.dataset.previewed = ''")
            drag_video(page, xs.min() - 1, ys.min() - 1, xs.max() + 1, ys.max() + 1)
            page.wait_for_function("document.body.dataset.previewed === '14:2'")
            warning = page.inner_text("#warning")
            if said:
                assert "object 2 on frame 14" in warning and "drastically" in warning, warning
                assert page.evaluate("document.body.dataset.warning") == "14:2"
                page.keyboard.press("z")
                page.wait_for_function("studio.entries.length === 2")
                page.wait_for_function("document.body.dataset.warning === ''")
                assert page.inner_text("#warning") == ""
            else:
                assert warning == "", warning
        assert not page.errors, page.errors
        page.close()
    finally:
        server.stop()


def frame_rgb(page) -> np.ndarray:
    """The frame the canvas shows, without masks or marks."""
    W, H = page.evaluate("[studio.info.width, studio.info.height]")
    data = page.evaluate(
        """() => { const c = new OffscreenCanvas(studio.info.width, studio.info.height);
        const g = c.getContext('2d'); g.drawImage(studio.image, 0, 0);
        return Array.from(g.getImageData(0, 0, c.width, c.height).data); }"""
    )
    return np.array(data, np.uint8).reshape(H, W, 4)[..., :3]


def test_masks_drawn_as_outlines_and_one_object_alone(browser, store, small):
    """Issue 47 item 5: "o" draws each mask's outline (its pixels with a 4-neighbour not
    its own, in its colour, opaque) and leaves the rest of the frame as it is; "s" shows the
    selected object's masks alone, "s" again all of them."""
    import segpipe
    from segpipe.web.server import StudioServer

    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    segpipe.track(store, entries, execution=segpipe.Execution(progress=False))
    server = StudioServer(store, port=0).start()
    try:
        page = open_page(browser, server.url + "?frame=14")
        page.wait_for_function(
            "document.body.dataset.refreshed == studio.version && studio.shown === 14"
        )
        values = np.array(page.evaluate("Array.from(studio.tracked)"))
        W, H = page.evaluate("[studio.info.width, studio.info.height]")
        values = values.reshape(H, W)
        padded = np.pad(values, 1, constant_values=-1)
        edge = (values > 0) & (
            (padded[:-2, 1:-1] != values)
            | (padded[2:, 1:-1] != values)
            | (padded[1:-1, :-2] != values)
            | (padded[1:-1, 2:] != values)
        )
        assert edge.sum() > 10 and ((values > 0) & ~edge).sum() > 10  # outlines and insides
        page.keyboard.press("o")
        assert page.input_value("#view-mode") == "outline"
        shown, frame = canvas_rgb(page), frame_rgb(page)
        colours = np.array([shade(page, 1), shade(page, 2)], np.uint8)
        assert (shown[edge] == colours[values[edge] - 1]).all()
        assert (shown[~edge] == frame[~edge]).all()  # insides and the rest: the frame itself
        page.keyboard.press("o")  # filled again
        assert tinted(page, shade(page, 1)).sum() > 20 and tinted(page, shade(page, 2)).sum() > 20
        page.keyboard.press("1")
        page.keyboard.press("s")  # object 1 alone
        assert tinted(page, shade(page, 1)).sum() > 20 and tinted(page, shade(page, 2)).sum() == 0
        page.keyboard.press("s")
        assert tinted(page, shade(page, 2)).sum() > 20
        assert not page.errors, page.errors
        page.close()
    finally:
        server.stop()


def test_mask_colours_stand_apart_from_the_video_and_from_each_other(browser, studio):
    """Issue 47 item 5: the sample's shapes are red, green and blue, as the palette's first
    colours are (masks nearly invisible on them). The page takes its colours in the order of
    how little of frame 0 lies near each: the first objects' colours are far from the
    shapes' colours and from each other, and little of the frame lies near any of them."""
    import make_sample

    page = open_page(browser, studio.url + "?frame=0")
    page.wait_for_function("studio.shown === 0")
    frame = frame_rgb(page).reshape(-1, 3).astype(float)
    colours = np.array([shade(page, i) for i in range(1, 6)], float)
    shapes = np.array(make_sample.COLOURS, float)
    assert np.linalg.norm(colours[:, None] - shapes[None], axis=2).min() > 90
    apart = np.linalg.norm(colours[:, None] - colours[None], axis=2)
    assert apart[~np.eye(5, dtype=bool)].min() > 90
    near = np.linalg.norm(frame[:, None] - colours[None], axis=2) < 90
    assert near.mean(axis=0).max() < 0.02, near.mean(axis=0)
    assert not page.errors, page.errors
    page.close()


@pytest.mark.parametrize("width", [1024, 1280, 1920])
def test_the_toolbar_does_not_move_when_the_status_changes(browser, studio, width):
    """Issue 47 item 6: at 1024, 1280 and 1920 pixels wide, every control and the frame keep
    their boxes while the texts that change (the job's progress, an error, a warning, what
    a flag says, the score, the store's read-only note) go from empty to long."""
    page = browser.new_page(viewport={"width": width, "height": 800})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(studio.url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    boxes = """() => Object.fromEntries([...document.querySelectorAll(
        'header button, header input, header select, header a, footer button, footer input, #view')]
        .map((e) => [e.id || e.dataset.object || e.textContent, JSON.stringify(e.getBoundingClientRect())]))"""
    texts = ["progress", "error", "warning", "flag-said", "score", "store"]
    for text in texts:
        page.evaluate(f"document.getElementById('{text}').textContent = ''")
    before = page.evaluate(boxes)
    long = "tracking (forward): 123456/999999 frames, 12.34 frames/s, 99999 s left " * 3
    for text in texts:
        page.evaluate(f"document.getElementById('{text}').textContent = {json.dumps(long)}")
    assert page.evaluate(boxes) == before
    assert page.evaluate("document.querySelector('header').getBoundingClientRect().height") < 120
    for label in ("radius", "passes", "to"):  # the boxes say what they are
        assert page.locator("header label", has_text=label).count() >= 1, label
    page.screenshot(path=SHOTS / f"studio_{width}.png")
    assert not page.errors, page.errors
    page.close()
