"""A new export format is a writer and one registration: here a small one ("pixels": each
object's mask pixels per frame, a text file per frame) registered in this file alone. The
CLI, the API and the studio offer it, and its ledger resumes it."""

from __future__ import annotations

import errno
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from test_export import pristine  # noqa: F401 - a fixture
from test_studio import fetch

import segpipe
from segpipe.stages.export.formats import FORMATS, ExportFormat, register
from segpipe.stages.export.writers import each_frame, make_folder

CHUNKS_WRITTEN = []


class PixelCounts:
    """`<frame>.txt` per frame: each object's mask pixel count, one line. With `fail_at`,
    that chunk's write fails (a full disk), once."""

    fail_at = None

    def __init__(self, job):
        self.out, self.job = job.out, job

    def start(self):
        make_folder(self.out)

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        if k == PixelCounts.fail_at:
            PixelCounts.fail_at = None
            raise OSError(errno.ENOSPC, "No space left on device")
        CHUNKS_WRITTEN.append(k)
        files = []
        for t, masks in each_frame(batches):
            path = self.out / f"{self.job.name(t)}.txt"
            path.write_text(" ".join(str(int(m.sum())) for m in masks) + "\n")
            files.append(path)
        return files

    def finish(self, chunks):
        pass


@pytest.fixture
def pixels():
    """The format registered for the test, and taken away after it."""
    fmt = register(ExportFormat("pixels", PixelCounts, "pixels", label="pixels"))
    yield fmt
    FORMATS.pop("pixels")


def expected(store: Path) -> dict[str, str]:
    masks = segpipe.open(store).masks()  # (T, O, H, W)
    return {
        f"{t:05d}.txt": " ".join(str(int(m.sum())) for m in f) + "\n" for t, f in enumerate(masks)
    }


def written(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_a_format_registered_here_is_offered_everywhere_and_resumes(
    pixels,
    pristine,
    tmp_path,  # noqa: F811
):
    from segpipe.cli import cli
    from segpipe.web.server import StudioServer

    store = shutil.copytree(pristine, tmp_path / "s.zarr")
    want = expected(store)

    # the CLI; its first try fails at chunk 2 (after chunks 0 and 1), and its ledger
    # resumes it: only chunks 2 on are written again
    out = tmp_path / "cli"
    argv = ["export", "--store", str(store), "--format", "pixels", "--out", str(out), "--quiet"]
    PixelCounts.fail_at = 2
    with pytest.raises(OSError):
        cli.main(argv, prog_name="segpipe", standalone_mode=False)
    assert CHUNKS_WRITTEN == [0, 1]
    CHUNKS_WRITTEN.clear()
    cli.main(argv, prog_name="segpipe", standalone_mode=False)
    assert CHUNKS_WRITTEN[0] == 2 and 0 not in CHUNKS_WRITTEN and 1 not in CHUNKS_WRITTEN
    assert written(out) == want

    # the API, into a folder of its own
    assert segpipe.export(store, "pixels", tmp_path / "api", progress=False) == tmp_path / "api"
    assert written(tmp_path / "api") == want

    # the studio: in its menu, and exported into the store's export folder
    server = StudioServer(store, port=0).start()
    try:
        info = json.loads(fetch(server.url + "api/info")[1])
        assert ["pixels", "pixels"] in info["formats"]
        status, data, _ = fetch(server.url + "api/export", "POST", {"format": "pixels"})
        assert status == 202, data
        for _ in range(600):
            progress = json.loads(fetch(server.url + "api/progress")[1])
            if progress["state"] != "running":
                break
            time.sleep(0.1)
        assert progress["state"] == "done", progress
    finally:
        server.stop()
    assert written(store.with_name("s.export") / "pixels") == want
    assert np.all([v.strip() for v in want.values()])
