"""`segpipe evaluate`: DAVIS 2017 semi-supervised J, F and J&F on small PNG folders written
here. The figures are worked out by hand in the comments and compared exactly."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, assert_user_error, segpipe
from PIL import Image

from segpipe.errors import BadInput
from segpipe.vos.davis import boundary_f, boundary_map, boundary_radius, dilate, evaluate, jaccard

PALETTE = [c for i in range(256) for c in ((i * 53) % 256, (i * 97) % 256, (i * 181) % 256)]


def write_png(path, ids):
    """An indexed PNG whose pixel values are `ids`, as DAVIS and SAM 2 write them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(np.asarray(ids, np.uint8), mode="P")
    img.putpalette(PALETTE)
    img.save(path)


def write_video(root, video, frames):
    for t, ids in enumerate(frames):
        write_png(root / video / f"{t:05d}.png", ids)


def write_video_per_object(root, video, frames):
    """The same frames in the per-object layout: <video>/<id:03d>/<frame>.png, 0 / 1."""
    ids = sorted({int(i) for f in frames for i in np.unique(f) if i not in (0, 255)})
    for oid in ids:
        for t, f in enumerate(frames):
            write_png(root / video / f"{oid:03d}" / f"{t:05d}.png", (np.asarray(f) == oid))


def square(y, x, size=10, shape=(32, 32), value=1, into=None):
    out = np.zeros(shape, np.uint8) if into is None else into
    out[y : y + size, x : x + size] = value
    return out


# ---------------------------------------------------------------------------------------
# The hand-computed case


def test_shifted_square_gives_the_hand_computed_j_and_f(tmp_path):
    """One object, a 10x10 square (rows 10..19, columns 10..19) in a 32x32 frame, four frames.
    The result: frame 0 empty, frame 1 the square one pixel to the right, frame 2 two pixels
    to the right, frame 3 empty. Only frames 1 and 2 are scored.

    J, frame 1: intersection 10 rows x 9 columns = 90, union 100 + 100 - 90 = 110.
    J, frame 2: intersection 10 x 8 = 80, union 200 - 80 = 120.

    F: the radius is ceil(0.008 * sqrt(32^2 + 32^2)) = ceil(0.36) = 1, the disk the centre
    and its 4 neighbours. _seg2bmap's boundary of a square is the outline of the square one
    pixel larger up and to the left: for the ground truth the 11x11 outline of rows 9..19 x
    columns 9..19, 4 * 11 - 4 = 40 pixels; the result's outline is the same moved right.
      Frame 1 (moved by 1): every result outline pixel is on, or next to, the ground truth's
      (its top and bottom rows overlap the ground truth's except the last pixel, which
      touches the ground truth's corner; its left column x=10 runs beside the ground truth's
      x=9, its right column x=20 beside x=19), and the same the other way round:
      precision 40/40, recall 40/40, F = 1.
      Frame 2 (moved by 2; result outline rows 9 and 19 over columns 11..21, columns 11 and
      21 over rows 10..18): of the result's top row, columns 11..19 lie on the ground
      truth's top row and column 20 touches (9, 19): 10 of 11; the bottom row likewise 10;
      its left column x=11 is 2 from the ground truth's x=9, but its ends (10, 11) and
      (18, 11) touch the ground truth's top and bottom rows at (9, 11) and (19, 11): 2 of 9;
      its right column x=21 is 2 from x=19 and its ends touch nothing (row 9 of the ground
      truth stops at x=19): 0 of 9. Precision 22/40. Recall, the same count the other way
      round (top row: columns 10..19 of 9..19, 10 of 11; bottom row 10; left column 0; the
      right column x=19 touches the result's rows 9 and 19 at its ends: 2): 22/40.
      F = 2 * P * R / (P + R) = 0.55.
    """
    gt = [square(10, 10)] * 4
    empty = np.zeros((32, 32), np.uint8)
    res = [empty, square(10, 11), square(10, 12), empty]
    write_video(tmp_path / "gt", "sq", gt)
    write_video(tmp_path / "res", "sq", res)

    report = evaluate(tmp_path / "res", tmp_path / "gt")

    j = (90 / 110 + 80 / 120) / 2
    p = r = 22 / 40
    f2 = 2 * p * r / (p + r)
    f = (40 / 40 + f2) / 2
    assert report.j_mean == j
    assert report.f_mean == f and round(f, 12) == 0.775
    assert report.jf_mean == (j + f) / 2
    (video,) = report.videos
    assert (video.name, video.num_objects, video.frames_scored) == ("sq", 1, 2)
    assert (video.j_mean, video.f_mean, video.jf_mean) == (j, f, (j + f) / 2)
    # the empty first and last frames (J = F = 0 there) are not scored: with them the
    # figures would be a quarter, not a half, of the sums
    assert report.j_mean != (90 / 110 + 80 / 120) / 4
    assert report.f_mean != (1 + f2) / 4
    # the same frames, one by one
    assert jaccard(gt[1] == 1, res[1] == 1) == 90 / 110
    assert jaccard(gt[2] == 1, res[2] == 1) == 80 / 120
    assert boundary_f(gt[1] == 1, res[1] == 1) == 1.0
    assert boundary_f(gt[2] == 1, res[2] == 1) == f2


def test_boundary_f_with_unequal_boundaries():
    """The ground truth's 10x10 square (outline rows 9..19 x columns 9..19, 40 pixels)
    against its left half, rows 10..19 x columns 10..14 (outline rows 9..19 x columns 9..14,
    2 * 6 + 2 * 11 - 4 = 30 pixels), radius 1.
    Precision: the half's top and bottom rows (6 + 6) and left column (9) lie on the ground
    truth's outline; of its right column x=14 only the ends (10, 14) and (18, 14) touch the
    ground truth's top and bottom rows: 23 of 30.
    Recall: the ground truth's top row matches at columns 9..14 and at 15 (next to (9, 14)),
    7; the bottom row 7; the left column 9; the right column x=19 nothing: 23 of 40."""
    gt = square(10, 10) == 1
    half = np.zeros((32, 32), bool)
    half[10:20, 10:15] = True
    assert boundary_map(half).sum() == 30
    p, r = 23 / 30, 23 / 40
    assert boundary_f(gt, half) == 2 * p * r / (p + r)
    assert jaccard(gt, half) == 50 / 100
    # A 4x4 square in the middle (outline rows and columns 12..16): 3 or more pixels from
    # every ground-truth boundary pixel, so precision = recall = 0, and F is 0.
    inner = np.zeros((32, 32), bool)
    inner[13:17, 13:17] = True
    assert boundary_f(gt, inner) == 0.0 and jaccard(gt, inner) == 16 / 100


def test_boundary_map_is_seg2bmaps():
    # A square inside the frame: the 11x11 outline up and to the left of it (40 pixels).
    b = boundary_map(square(10, 10) == 1)
    outline = np.zeros((32, 32), bool)
    outline[9:20, 9:20] = True
    outline[10:19, 10:19] = False
    assert np.array_equal(b, outline) and b.sum() == 40
    # A square in the bottom-right corner: in the last row only the right neighbour counts,
    # in the last column only the lower one, so the square's own edges on the image border
    # are no boundary: row 21 over columns 21..31 and column 21 over rows 22..31, 21 pixels.
    b = boundary_map(square(22, 22) == 1)
    corner = np.zeros((32, 32), bool)
    corner[21, 21:] = True
    corner[21:, 21] = True
    assert np.array_equal(b, corner) and b.sum() == 21
    # In the top-left corner: the square's right column and bottom row, 10 + 10 - 1 = 19.
    assert boundary_map(square(0, 0) == 1).sum() == 19
    assert not boundary_map(np.zeros((5, 7), bool)).any()
    assert not boundary_map(np.ones((5, 7), bool)).any()  # all foreground: no edge inside


def test_radius_and_disk():
    assert boundary_radius((32, 32)) == 1
    assert boundary_radius((480, 854)) == 8  # DAVIS 480p: ceil(7.84)
    assert boundary_radius((75, 100)) == 1  # diagonal 125: 0.008 * 125 = 1.0, ceil 1
    one = np.zeros((41, 41), bool)
    one[20, 20] = True
    # skimage's disk(r): the offsets with dx^2 + dy^2 <= r^2
    for r, count in ((1, 5), (2, 13), (3, 29), (8, 197)):
        d = dilate(one, r)
        ys, xs = np.nonzero(d)
        assert d.sum() == count
        assert ((ys - 20) ** 2 + (xs - 20) ** 2 <= r * r).all()
    # at the image's edge the disk is cut off, nothing wraps round
    corner = np.zeros((6, 6), bool)
    corner[0, 0] = True
    assert np.array_equal(
        np.argwhere(dilate(corner, 2)), [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0]]
    )


# ---------------------------------------------------------------------------------------
# Ground truth against itself, both layouts


def moving_objects(T=5, shape=(36, 48)):
    """Three objects moving over T frames, one of them vanishing for a frame, a void band."""
    frames = []
    for t in range(T):
        f = np.zeros(shape, np.uint8)
        square(2 + t, 3 + 2 * t, size=8, shape=shape, into=f)
        if t != 2:
            f[20:30, 30 - t : 40 - t] = 2
        f[25 - t : 33 - t, 2:9] = 3
        f[:, 44:] = 255  # void
        frames.append(f)
    return frames


@pytest.mark.parametrize("per_object", [False, True], ids=["indexed", "per-object"])
def test_ground_truth_against_itself_scores_one(tmp_path, per_object):
    write = write_video_per_object if per_object else write_video
    write(tmp_path / "gt", "a", moving_objects())
    write(tmp_path / "gt", "b", moving_objects(T=4, shape=(30, 50)))
    report = evaluate(tmp_path / "gt", tmp_path / "gt", per_object_png=per_object)
    assert [v.name for v in report.videos] == ["a", "b"]
    assert [v.num_objects for v in report.videos] == [3, 3]
    assert report.jf_mean == report.j_mean == report.f_mean == 1.0
    assert all(o.j == o.f == 1.0 for o in report.objects)
    assert "1.000" in report.table()


def test_per_object_layout_scores_like_the_indexed_one(tmp_path):
    gt = [np.where(f == 255, 0, f) for f in moving_objects()]  # per-object PNGs have no void
    res = [np.roll(f, 1, axis=1) for f in gt]  # everything one pixel to the right
    res[2][res[2] == 3] = 0  # object 3 lost in frame 2
    res = [np.where(f == 2, 0, f) for f in res]  # object 2 lost everywhere: no folder 002
    for write, layout in ((write_video, "idx"), (write_video_per_object, "obj")):
        write(tmp_path / layout / "gt", "a", gt)
        write(tmp_path / layout / "res", "a", res)
    assert not (tmp_path / "obj" / "res" / "a" / "002").exists()
    a = evaluate(tmp_path / "idx" / "res", tmp_path / "idx" / "gt")
    b = evaluate(tmp_path / "obj" / "res", tmp_path / "obj" / "gt", per_object_png=True)
    assert [(o.id, o.j, o.f) for o in a.objects] == [(o.id, o.j, o.f) for o in b.objects]
    # object 2, missing from the result, is scored on empty masks: J 0 in frames 1 and 3,
    # 1 in frame 2, where the ground truth has no object 2 either
    assert b.objects[1].id == 2 and b.objects[1].j == b.objects[1].f == (0 + 1 + 0) / 3
    assert 0 < b.jf_mean < 1


# ---------------------------------------------------------------------------------------
# Conventions


def test_empty_masks():
    empty, full = np.zeros((32, 32), bool), square(10, 10) == 1
    assert jaccard(empty, empty) == 1.0 and boundary_f(empty, empty) == 1.0
    # one empty: J 0; F from precision 1, recall 0 (or the reverse) is 0
    assert jaccard(full, empty) == 0.0 and boundary_f(full, empty) == 0.0
    assert jaccard(empty, full) == 0.0 and boundary_f(empty, full) == 0.0


def test_empty_masks_in_files(tmp_path):
    """Object 1 is in the first frame only: in the scored frames its ground truth is empty.
    Object 2 is there throughout. The result has object 1 in frame 1 (J = F = 0 there),
    nothing of it in frame 2 (both empty: J = F = 1), and never object 2 (J = F = 0)."""
    gt = [
        square(2, 2, into=square(15, 15, value=2)),
        square(15, 15, value=2),
        square(15, 15, value=2),
        square(15, 15, value=2),
    ]
    res = [gt[0], square(2, 2), np.zeros((32, 32), np.uint8), gt[3]]
    write_video(tmp_path / "gt", "v", gt)
    write_video(tmp_path / "res", "v", res)
    (video,) = evaluate(tmp_path / "res", tmp_path / "gt").videos
    one, two = video.objects
    assert (one.id, one.j, one.f) == (1, 0.5, 0.5)
    assert (two.id, two.j, two.f) == (2, 0.0, 0.0)


def test_means_are_over_objects_not_videos(tmp_path):
    """Video a: object 1 exact, object 2 missing from the result (scored as empty masks, J = F
    = 0). Video b: one object, exact. DAVIS's J-Mean is the mean over the 3 objects, 2/3;
    the mean of the per-video means would be (0.5 + 1) / 2 = 0.75."""
    a = [square(2, 2, into=square(18, 18, value=2))] * 3
    write_video(tmp_path / "gt", "a", a)
    write_video(tmp_path / "res", "a", [square(2, 2)] * 3)
    write_video(tmp_path / "gt", "b", [square(5, 5)] * 3)
    write_video(tmp_path / "res", "b", [square(5, 5)] * 3)
    report = evaluate(tmp_path / "res", tmp_path / "gt")
    assert [v.j_mean for v in report.videos] == [0.5, 1.0]
    assert report.j_mean == report.f_mean == report.jf_mean == 2 / 3
    # a video list picks and orders the videos
    only_b = evaluate(tmp_path / "res", tmp_path / "gt", videos=["b"])
    assert [v.name for v in only_b.videos] == ["b"] and only_b.jf_mean == 1.0


def test_void_pixels_are_left_out(tmp_path):
    """The result covers the object plus a strip that the ground truth marks void (255):
    without the void it scores 1, as DAVIS leaves void pixels out of J and F."""
    gt = square(10, 10)
    gt[10:20, 20:23] = 255
    res = square(10, 10)
    res[10:20, 20:23] = 1
    write_video(tmp_path / "gt", "v", [gt] * 3)
    write_video(tmp_path / "res", "v", [res] * 3)
    assert evaluate(tmp_path / "res", tmp_path / "gt").jf_mean == 1.0
    assert jaccard(gt == 1, res == 1) == 100 / 130  # the same, void counted


def test_objects_come_from_the_first_frame_and_extra_result_ids_are_ignored(tmp_path):
    """Ground-truth object 2 appears after the first frame: not scored (DAVIS takes the first
    frame's objects). Result ids 2 and 7 are no scored object: ignored, and listed."""
    gt = [square(2, 2), square(2, 2, into=square(18, 18, value=2)), square(2, 2)]
    res = [
        square(2, 2),
        square(2, 2, into=square(18, 18, value=7)),
        square(2, 2, into=square(18, 18, value=2)),
    ]
    write_video(tmp_path / "gt", "v", gt)
    write_video(tmp_path / "res", "v", res)
    report = evaluate(tmp_path / "res", tmp_path / "gt")
    (video,) = report.videos
    assert [o.id for o in video.objects] == [1] and report.jf_mean == 1.0
    assert video.ignored_result_ids == (7,)  # frame 2, the last, is not read
    assert video.unscored_gt_ids == (2,)
    text = report.table()
    assert "result id(s) 7" in text and "ground-truth id(s) 2" in text


# ---------------------------------------------------------------------------------------
# Errors


def test_missing_result_png_is_a_one_line_bad_input(tmp_path):
    write_video(tmp_path / "gt", "v", [square(2, 2)] * 4)
    write_video(tmp_path / "res", "v", [square(2, 2)] * 4)
    (tmp_path / "res" / "v" / "00002.png").unlink()
    with pytest.raises(BadInput) as e:
        evaluate(tmp_path / "res", tmp_path / "gt")
    assert "00002.png" in e.value.message and "\n" not in e.value.message

    proc = segpipe("evaluate", "--results-dir", tmp_path / "res", "--gt-dir", tmp_path / "gt")
    assert_user_error(proc, "no result", "00002.png")
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "case, words",
    [
        ("two frames", ("2 ground-truth frame", "needs 3")),
        ("no results folder", ("no results folder",)),
        ("size", ("32x32", "40x32")),
        ("rgb", ("RGB", "single-channel")),
    ],
)
def test_bad_inputs(tmp_path, case, words):
    write_video(tmp_path / "gt", "v", [square(2, 2)] * (2 if case == "two frames" else 3))
    if case != "no results folder":
        write_video(tmp_path / "res", "v", [square(2, 2)] * 3)
    else:
        (tmp_path / "res").mkdir()
    if case == "size":
        write_png(tmp_path / "res" / "v" / "00001.png", np.zeros((32, 40)))
    if case == "rgb":
        Image.new("RGB", (32, 32)).save(tmp_path / "res" / "v" / "00001.png")
    with pytest.raises(BadInput) as e:
        evaluate(tmp_path / "res", tmp_path / "gt")
    assert "\n" not in e.value.message
    for w in words:
        assert w in e.value.message, (w, e.value.message)


# ---------------------------------------------------------------------------------------
# The command line


def test_cli_prints_the_table_and_json(tmp_path):
    write_video(tmp_path / "gt", "a", [square(10, 10)] * 3)
    write_video(tmp_path / "gt", "b", [square(10, 10)] * 3)
    write_video(tmp_path / "res", "a", [square(10, 10), square(10, 12), square(10, 10)])
    write_video(tmp_path / "res", "b", [square(10, 10)] * 3)
    (tmp_path / "list.txt").write_text("a\n\n")
    args = ("evaluate", "--results-dir", tmp_path / "res", "--gt-dir", tmp_path / "gt")
    proc = segpipe(*args, check=True)
    head = ["video", "objects", "J-Mean", "F-Mean", "J&F-Mean"]
    assert proc.stdout.splitlines()[0].split() == head
    # a: J 80/120 = 0.667, F 0.55 (the square moved by 2, as in the hand-computed case);
    # b: 1; all: J (2/3 + 1) / 2 = 0.833, F (0.55 + 1) / 2 = 0.775, J&F 0.804
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert ["a", "1", "0.667", "0.550", "0.608"] in rows
    assert ["all", "2", "0.833", "0.775", "0.804"] in rows

    proc = segpipe(*args, "--video-list-file", tmp_path / "list.txt", "--json", check=True)
    out = json.loads(proc.stdout)
    assert [v["video"] for v in out["videos"]] == ["a"]
    f = 2 * (22 / 40) * (22 / 40) / (22 / 40 + 22 / 40)
    assert out["J-Mean"] == 80 / 120 and out["F-Mean"] == f
    assert out["J&F-Mean"] == (80 / 120 + f) / 2
    assert out["videos"][0]["per_object"] == [{"id": 1, "J": 80 / 120, "F": f}]

    proc = segpipe("evaluate", "--help", check=True)  # help with an example, as every command
    assert "Example" in proc.stdout and "segpipe evaluate" in proc.stdout


def test_import_does_not_load_torch():
    code = "import sys, segpipe.vos.davis; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
