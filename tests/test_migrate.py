"""`segpipe migrate`: a store of the schema before (4) is refused in one line that names the
command, and converted in place, crash-safely, keeping its frames, features, memory and
masks: a run stopped before the conversion goes on after it as if it had never stopped."""

import json
import subprocess
from pathlib import Path

import pytest
import zarr
from conftest import (
    assert_same_store,
    assert_user_error,
    freeze,
    ledger_records,
    run_args,
    run_in_process,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)


def as_schema_4(store: Path) -> None:
    """Write `store`'s attributes as segpipe wrote them up to schema 4 (the only difference
    from 5: `chunk_size`, `image_size` and `keep` were attributes of their own), in place."""
    group = zarr.open_group(str(store), mode="r+")
    attrs = group.attrs.asdict()
    decoding, output = attrs.pop("decoding"), attrs.pop("output", None)
    attrs.update(schema_version=4, chunk_size=decoding["chunk_size"])
    attrs["image_size"] = decoding["image_size"]
    if output is not None:
        attrs["keep"] = output["keep"]
    group.attrs.put(attrs)


def without_attributes(digest: dict) -> dict:
    """A store's `tree_digest` but its group attributes."""
    return {k: v for k, v in digest.items() if k != "zarr.json"}


def work_digest(store: Path) -> dict:
    return without_attributes(tree_digest(store))


KILLED_MID_WRITE = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.mid_write(sys.argv[1], 1, chunks=False)  # halfway through its first file write
kill_points.cli(sys.argv[2:])
"""


@pytest.mark.parametrize("keep", ["all", "masks"])
def test_a_schema_4_store_stopped_mid_run_is_migrated_and_the_run_goes_on(small, tmp_path, keep):
    reference = tmp_path / "reference" / "run.zarr"
    run_in_process(small, reference, keep=keep)

    store = tmp_path / "run.zarr"
    proc = spawn(
        [*run_args(small, store), "--keep", keep],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        mid = wait_for(lambda: ledger_records(store, "track_forward"), proc, timeout=300)
        freeze(proc)
    finally:
        proc.kill()
        proc.wait()
    assert mid, "the run ended before a chunk was tracked"
    tracked = ledger_records(store, "track_forward")
    assert len(tracked) < len(ledger_records(reference, "track_forward"))  # stopped mid-run
    made = zarr.open_group(str(store), mode="r").attrs.asdict()  # as segpipe 5 records it
    as_schema_4(store)
    old = tree_digest(store)

    # every command refuses it in one line that says how to go on, and changes nothing
    for args in (
        run_args(small, store),
        ("status", "--store", store),
        ("track", "--store", store),
        ("export", "--store", store, "--format", "davis", "--out", tmp_path / "d"),
        ("repair", "--store", store),
    ):
        assert_user_error(
            segpipe(*args),
            f"store {store} has schema version 4",
            "this segpipe reads version 5",
            f"`segpipe migrate --store {store}` converts it in place",
        )
    assert tree_digest(store) == old

    # killed halfway through writing the converted attributes (the first file it writes
    # in the store): the store is as it was, but for the half-written temp file
    killed = spawn(
        [f"{store}/", "migrate", "--store", store],
        code=KILLED_MID_WRITE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    killed.communicate(timeout=120)
    assert killed.returncode == -9  # the kill landed
    assert tree_digest(store)["zarr.json"] == old["zarr.json"]
    assert set(tree_digest(store)) - set(old), "the kill landed before the write began"
    assert json.loads((store / "zarr.json").read_text())["attributes"]["schema_version"] == 4

    done = segpipe("migrate", "--store", store, check=True)
    assert f"migrate: {store} converted from schema version 4 to 5" in done.stdout
    assert zarr.open_group(str(store), mode="r").attrs.asdict() == made  # every setting
    assert work_digest(store) == without_attributes(old)  # frames, features, memory, masks
    assert set(tree_digest(store)) == set(old)  # the killed write's temp file removed
    again = segpipe("migrate", "--store", store, check=True)
    assert "at schema version 5 already" in again.stderr

    kept = {k: v for k, v in work_digest(store).items() if k.startswith("features/")}
    run_in_process(small, store, keep=keep)  # the run again, to the end
    assert_same_store(reference, store)
    assert ledger_records(store, "track_forward").items() >= tracked.items()  # not redone
    if keep == "all":  # the features encoded before were read, not made again
        now = work_digest(store)
        assert kept and all(now[k] == v for k, v in kept.items())


def test_migrate_refuses_what_it_cannot_convert(small, tmp_path):
    """A store older than 4, a folder that is no store: one line each, nothing changed."""
    store = tmp_path / "s.zarr"
    segpipe(
        "decode", small / "clip.mp4", "--store", store, "--chunk-size", 4, "--image-size", 64,
        check=True,
    )  # fmt: skip
    group = zarr.open_group(str(store), mode="r+")
    group.attrs["schema_version"] = 3
    before = tree_digest(store)
    assert_user_error(
        segpipe("migrate", "--store", store), "schema version 3", "cannot convert", "new store"
    )
    assert tree_digest(store) == before
    (tmp_path / "empty").mkdir()
    assert_user_error(segpipe("migrate", "--store", tmp_path / "empty"), "no segpipe store")
    assert list((tmp_path / "empty").iterdir()) == []
    other = zarr.open_group(str(tmp_path / "other.zarr"), mode="w")  # a zarr group, not ours
    other.attrs["format"] = "something else"
    before = tree_digest(tmp_path / "other.zarr")
    assert_user_error(segpipe("migrate", "--store", tmp_path / "other.zarr"), "not a segpipe store")
    assert tree_digest(tmp_path / "other.zarr") == before
    (store / "zarr.json").write_text("{not json")
    assert_user_error(segpipe("migrate", "--store", store), "cannot be read")
