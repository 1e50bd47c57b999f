"""Named objects (issue 47 item 2): names and classes from a prompts file's "objects",
`segpipe track --labels` or `segpipe.label` are recorded apart from the tracking (naming
redoes no tracking) and reach the exports: CVAT labels per class with the names as track
attributes, YouTube-VIS categories and names, a labels.json beside DAVIS's PNGs."""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from conftest import (
    IMAGE_SIZE,
    assert_user_error,
    run_in_process,
    tree_digest,
    tree_mtimes,
)
from conftest import (
    segpipe as cli,
)

NAMED = [
    {"id": 1, "name": "left square", "class": "square"},
    {"id": 2, "name": "the <circle> & co", "class": "circle"},
]


def tracking_files(store) -> dict:
    """Every file of the store but its attributes and the exports' ledgers, with its
    modification time: equal, nothing was tracked (or written) again."""
    return {
        k: v
        for k, v in tree_mtimes(store).items()
        if k != "zarr.json" and not k.startswith("ledger/export") and (store / k).is_file()
    }


def exports(store):
    return store.with_name(store.name.removesuffix(".zarr") + ".export")


@pytest.fixture(scope="module")
def named(small, tmp_path_factory):
    """A run whose prompts file names objects 1 and 2 (object 3 has no name)."""
    root = tmp_path_factory.mktemp("named")
    prompts = json.loads((small / "prompts.json").read_text())
    for e in prompts["prompts"]:  # (mask paths relative to the prompts file)
        if isinstance(e.get("mask"), str):
            e["mask"] = str(small / e["mask"])
    (root / "prompts.json").write_text(json.dumps({**prompts, "objects": NAMED}))
    store = root / "run.zarr"
    import segpipe as api
    from segpipe.settings import from_options

    options = dict(chunk_size=4, image_size=IMAGE_SIZE, random_weights=0, progress=False)
    api.run(small / "clip.mp4", store, root / "prompts.json", **from_options(options))
    return store


def cvat(path):
    root = ET.parse(path).getroot()
    labels = {
        label.findtext("name"): [a.findtext("name") for a in label.iter("attribute")]
        for label in root.iter("label")
    }
    tracks = {}
    for track in root.iter("track"):
        names = {a.text for m in track.iter("mask") for a in m.iter("attribute")}
        tracks[int(track.get("id"))] = (track.get("label"), names)
    return labels, tracks


def test_names_and_classes_reach_every_export_and_renaming_redoes_no_tracking(
    small, named, tmp_path
):
    import segpipe

    store = tmp_path / "run.zarr"
    shutil.copytree(named, store)
    shutil.copytree(exports(named), exports(store))
    run_in_process(small, store)  # (the exports' records name their folder: made here again)
    assert segpipe.open(store).labels == {
        1: segpipe.Label(1, "left square", "square"),
        2: segpipe.Label(2, "the <circle> & co", "circle"),
    }
    # run's exports: DAVIS's labels file, YouTube-VIS's categories and names
    davis = json.loads((exports(store) / "davis" / "labels.json").read_text())
    assert davis == {"objects": [*NAMED, {"id": 3}]}
    vis = json.loads((exports(store) / "masks.json").read_text())
    assert [c["name"] for c in vis["categories"]] == ["square", "circle", "object"]
    by_object = {a["object_id"]: a for a in vis["annotations"]}
    assert [by_object[i].get("name") for i in (1, 2, 3)] == ["left square", NAMED[1]["name"], None]
    category = {c["id"]: c["name"] for c in vis["categories"]}
    assert [category[by_object[i]["category_id"]] for i in (1, 2, 3)] == [
        "square",
        "circle",
        "object",
    ]
    # CVAT: a label per class, the names as the masks' attribute (escaped in the XML)
    out = tmp_path / "annotations.xml"
    segpipe.export(store, "cvat", out, progress=False)
    labels, tracks = cvat(out)
    assert labels == {"square": ["name"], "circle": ["name"], "object 3": ["name"]}
    assert tracks == {
        0: ("square", {"left square"}),
        1: ("circle", {"the <circle> & co"}),
        2: ("object 3", set()),
    }
    # renamed from the command line: no tracking redone, the named exports redone
    tracked = tracking_files(store)
    overlay = tree_digest(exports(store) / "overlay.mp4")
    pngs = {k: v for k, v in tree_mtimes(exports(store) / "davis").items() if k.endswith(".png")}
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"objects": [{"id": 2, "name": "circle two"}, {"id": 3}]}))
    proc = cli("track", "--store", store, "--labels", names, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert tracking_files(store) == tracked
    assert segpipe.open(store).labels[2] == segpipe.Label(2, "circle two")
    run_in_process(small, store)  # (the same prompts, without names: the exports redone)
    assert tracking_files(store) == tracked
    vis = json.loads((exports(store) / "masks.json").read_text())
    assert [c["name"] for c in vis["categories"]] == ["square", "object"]
    assert {a["object_id"]: a.get("name") for a in vis["annotations"]}[2] == "circle two"
    davis = json.loads((exports(store) / "davis" / "labels.json").read_text())
    assert davis["objects"][1] == {"id": 2, "name": "circle two"}
    now = {k: v for k, v in tree_mtimes(exports(store) / "davis").items() if k.endswith(".png")}
    assert now == pngs and len(pngs) == 24  # (DAVIS's finish alone: no PNG written again)
    assert tree_digest(exports(store) / "overlay.mp4") == overlay  # (shows no names)
    segpipe.export(store, "cvat", out, progress=False)
    assert cvat(out)[1][1] == ("object 2", {"circle two"})


def test_a_store_without_labels_exports_as_before(small, tmp_path):
    """No labels: one "object" category, CVAT labels "object N" with no attributes, no
    labels.json; naming one object then names it alone."""
    import segpipe

    store = tmp_path / "run.zarr"
    run_in_process(small, store)
    assert not (exports(store) / "davis" / "labels.json").exists()
    vis = json.loads((exports(store) / "masks.json").read_text())
    assert vis["categories"] == [{"id": 1, "name": "object", "supercategory": "object"}]
    assert all("name" not in a and a["category_id"] == 1 for a in vis["annotations"])
    out = tmp_path / "annotations.xml"
    segpipe.export(store, "cvat", out, progress=False)
    labels, tracks = cvat(out)
    assert labels == {f"object {i}": [] for i in (1, 2, 3)}
    segpipe.label(store, [segpipe.Label(3, "three")])
    segpipe.export(store, "cvat", out, progress=False)
    assert cvat(out)[1] == {
        0: ("object 1", set()),
        1: ("object 2", set()),
        2: ("object 3", {"three"}),
    }


@pytest.mark.parametrize(
    "objects, words",
    [
        ([{"id": 0, "name": "x"}], ["id must be an integer"]),
        ([{"id": 1, "nmae": "x"}], ["unknown key", "nmae"]),
        ([{"id": 1}, {"id": 1}], ["listed twice"]),
        ([{"id": 1, "name": "a\nb"}], ["control character"]),
        ([{"id": 1, "class": "x" * 201}], ["201 characters"]),
        ([{"id": 1, "name": 7}], ["must be text"]),
        ({"id": 1}, ["must be a list"]),
    ],
)
def test_bad_labels_are_refused_in_one_line_and_change_nothing(
    small, named, tmp_path, objects, words
):
    store = tmp_path / "run.zarr"
    shutil.copytree(named, store)
    before = tree_digest(store)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"objects": objects}))
    assert_user_error(cli("track", "--store", store, "--labels", labels), *words)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(
        json.dumps(
            {"prompts": [{"object": 1, "frame": 0, "box": [1, 1, 9, 9]}], "objects": objects}
        )
    )
    assert_user_error(cli("track", "--store", store, "--prompts", prompts), *words)
    assert tree_digest(store) == before
    new = tmp_path / "new.zarr"  # `run` refuses them before anything is written
    run = ("run", small / "clip.mp4", "--store", new, "--prompts", prompts, "--random-weights", 0)
    assert_user_error(cli(*run), *words)
    assert not new.exists()
