"""`id_mask` prompts and dataset annotations: object ids read at the PNG's depth.

An id mask's pixel values are object ids: 8-bit palette or grey PNGs hold 1..255, 16-bit grey
PNGs 1..65535, and each id gives one mask prompt with exactly its pixels; what cannot be read
as ids (colour, floats, 32-bit values out of 0..65535) is one line naming the entry, never
ids cut to 8 bits (issue 45: 257..300 merged into 1..44, 256 dropped, without a word).
Real PNG files, the real parser (`segpipe.prompts.load`) and the real CLI.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_user_error, segpipe
from PIL import Image

from segpipe import prompts as prompt_file
from segpipe.errors import BadInput

H, W = 120, 160  # 19,200 pixels: ids 1..300, 64 pixels each


def three_hundred_ids() -> np.ndarray:
    """(H, W) uint16: ids 1..300 in runs of 64 pixels, shuffled (no id is a neat block)."""
    ids = np.repeat(np.arange(1, 301, dtype=np.uint16), 64)
    return np.random.default_rng(0).permutation(ids).reshape(H, W)


def write_prompts(folder: Path, id_mask: str, frame: int = 0) -> Path:
    path = folder / "prompts.json"
    path.write_text(json.dumps({"prompts": [{"frame": frame, "id_mask": id_mask}]}))
    return path


def int32_tiff(path: Path, values) -> None:
    img = Image.fromarray(np.array(values, np.int32))
    assert img.mode == "I"
    img.save(path, "TIFF")


def png_bytes(img: Image.Image) -> bytes:
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("given", ["file", "inline"])  # inline: what segpipe studio PUTs
def test_a_16_bit_id_mask_gives_one_prompt_per_id(tmp_path, given):
    ids = three_hundred_ids()
    img = Image.fromarray(ids)
    assert img.mode == "I;16"
    if given == "file":
        img.save(tmp_path / "ids.png")
        with Image.open(tmp_path / "ids.png") as back:  # really a 16-bit PNG on disk
            assert back.mode == "I;16" and np.array_equal(np.array(back), ids)
        name = "ids.png"  # relative to the prompts file
    else:
        name = "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()
    loaded = prompt_file.load(write_prompts(tmp_path, name, frame=2), 3, W, H)
    assert [p.object_id for p in loaded] == list(range(1, 301))
    for p in loaded:
        assert p.frame == 2 and p.points is None and p.box is None
        assert p.mask.dtype == bool and p.mask.sum() == 64, p.object_id
        assert np.array_equal(p.mask, ids == p.object_id), p.object_id


def test_16_bit_ids_up_to_65535_are_exact(tmp_path):
    """The ids 8 bits would lose (256: 0, 257: 1, 65535: 255), each its own object."""
    ids = np.array([[0, 1, 255, 256], [257, 4097, 65534, 65535]], np.uint16)
    big_endian = Image.fromarray(ids.astype(">u2"))
    assert big_endian.mode == "I;16B"
    big_endian.save(tmp_path / "ids.png")  # read back as PIL gives any 16-bit grey PNG
    loaded = prompt_file.load(write_prompts(tmp_path, "ids.png"), 1, 4, 2)
    assert [p.object_id for p in loaded] == [1, 255, 256, 257, 4097, 65534, 65535]
    assert all(np.array_equal(p.mask, ids == p.object_id) for p in loaded)
    assert prompt_file.read_id_mask(tmp_path / "ids.png").dtype == np.uint16
    int32_tiff(tmp_path / "ids.tif", ids)  # a 32-bit image within 0..65535: read exactly
    loaded = prompt_file.load(write_prompts(tmp_path, "ids.tif"), 1, 4, 2)
    assert [p.object_id for p in loaded] == [1, 255, 256, 257, 4097, 65534, 65535]


@pytest.mark.parametrize("mode", ["P", "L"])
def test_palette_and_grey_id_masks_give_ids_1_to_255(tmp_path, mode):
    """A DAVIS annotation (palette, with its own colours) or an 8-bit grey one: ids 1..255,
    one pixel each, read as uint8 (what the dataset mode composes from)."""
    ids = np.arange(256, dtype=np.uint8).reshape(16, 16).T.copy()
    img = Image.fromarray(ids)
    if mode == "P":  # an L image with a palette becomes P, its values kept
        img.putpalette([v for i in range(256) for v in ((i * 47) % 256, (i * 91) % 256, 255 - i)])
    img.save(tmp_path / "ann.png")
    with Image.open(tmp_path / "ann.png") as back:
        assert back.mode == mode
    assert prompt_file.read_id_mask(tmp_path / "ann.png").dtype == np.uint8
    loaded = prompt_file.load(write_prompts(tmp_path, "ann.png"), 1, 16, 16)
    assert [p.object_id for p in loaded] == list(range(1, 256))
    assert all(p.mask.sum() == 1 and p.mask[ids == p.object_id].all() for p in loaded)


def test_a_1_bit_png_is_object_1(tmp_path):
    on = np.zeros((4, 6), bool)
    on[1:3, 2:5] = True
    Image.fromarray(on).save(tmp_path / "one.png")
    with Image.open(tmp_path / "one.png") as back:
        assert back.mode == "1"
    (p,) = prompt_file.load(write_prompts(tmp_path, "one.png"), 1, 6, 4)
    assert p.object_id == 1 and np.array_equal(p.mask, on)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("32-bit id 70000", ["70000", "0..65535"]),
        ("32-bit id -1", ["-1", "0..65535"]),
        ("RGB", ["RGB image", "indexed"]),
        ("grey with alpha", ["LA image", "indexed"]),
        ("float", ["F image", "indexed"]),
    ],
)
def test_what_is_not_ids_is_refused_in_one_line(tmp_path, kind, words):
    path = tmp_path / "bad.tif"
    if kind.startswith("32-bit"):
        int32_tiff(path, [[0, 1], [2, int(kind.split()[-1])]])
    elif kind == "RGB":
        Image.new("RGB", (2, 2), (1, 0, 0)).save(path)
    elif kind == "grey with alpha":
        Image.new("LA", (2, 2), (1, 255)).save(path)
    else:
        Image.fromarray(np.ones((2, 2), np.float32)).save(path)
    with pytest.raises(BadInput) as e:
        prompt_file.load(write_prompts(tmp_path, "bad.tif"), 1, 2, 2)
    message = e.value.message
    assert "\n" not in message and message.startswith("prompt #0: id_mask "), message
    for w in words:
        assert w in message, (w, message)


def test_id_mask_arrays_must_be_non_negative_integers():
    for array, word in [(np.full((2, 2), 1.5), "float64"), (np.full((2, 2), -3), "-3")]:
        with pytest.raises(BadInput, match=f"prompt #0: .*{word}"):
            prompt_file.load([{"frame": 0, "id_mask": array}], 1, 2, 2)
    (p,) = prompt_file.load([{"frame": 0, "id_mask": np.array([[0, 70000]])}], 1, 2, 1)
    assert p.object_id == 70000


def test_the_cli_names_the_id_mask_in_one_line_and_exits_1(tmp_path):
    """`run` refuses before it writes: a 32-bit mask out of range, and 300 ids with a davis
    export (its PNGs hold 1..255). The checkpoint is absent, so a run whose prompts passed
    would stop on that instead, before decoding."""
    (tmp_path / "frames").mkdir()
    Image.new("RGB", (W, H)).save(tmp_path / "frames" / "00000.jpg")
    int32_tiff(tmp_path / "bad.tif", np.full((H, W), 70000))
    Image.fromarray(three_hundred_ids()).save(tmp_path / "ids.png")
    base = ["run", tmp_path / "frames", "--store", tmp_path / "s.zarr"]
    base += ["--checkpoint", tmp_path / "absent.pt", "--device", "cpu"]

    proc = segpipe(*base, "--prompts", write_prompts(tmp_path, "bad.tif"), "--export", "none")
    assert proc.returncode == 1
    assert_user_error(proc, "prompt #0: id_mask", "bad.tif", "70000")
    proc = segpipe(*base, "--prompts", write_prompts(tmp_path, "ids.png"), "--export", "davis")
    assert proc.returncode == 1
    assert_user_error(proc, "davis PNGs hold object ids 1..255", "256, 257,", "299, 300]")
    assert not (tmp_path / "s.zarr").exists()


def test_dataset_annotations_keep_8_bits_and_refuse_more(tmp_path):
    """Dataset mode: a DAVIS (palette) annotation as before, uint8 ids and its palette; a
    16-bit one with ids over 255 refused before anything runs (the tool would cut them to 8
    bits; its output PNGs hold no more); a 16-bit one within 1..255 read as it is."""
    from segpipe.vos.inputs import Layout, read_inputs

    frames, anns = tmp_path / "JPEGImages" / "v", tmp_path / "Annotations" / "v"
    frames.mkdir(parents=True)
    anns.mkdir(parents=True)
    Image.new("RGB", (W, H)).save(frames / "00000.jpg")
    layout = Layout(tmp_path / "JPEGImages", tmp_path / "Annotations")

    davis = (three_hundred_ids() % 7).astype(np.uint8)  # ids 0..6
    img = Image.fromarray(davis)
    palette = [v for i in range(256) for v in (i, 255 - i, (i * 3) % 256)]
    img.putpalette(palette)
    img.save(anns / "00000.png")
    inputs = read_inputs(layout, "v", use_all_masks=False, later_objects=False)
    assert inputs.object_ids == [1, 2, 3, 4, 5, 6] and inputs.palette == palette
    assert all(np.array_equal(p.mask, davis == p.object_id) for p in inputs.prompts)

    Image.fromarray(davis.astype(np.uint16)).save(anns / "00000.png")
    inputs = read_inputs(layout, "v", use_all_masks=False, later_objects=False)
    assert inputs.object_ids == [1, 2, 3, 4, 5, 6]

    Image.fromarray(three_hundred_ids()).save(anns / "00000.png")
    with pytest.raises(BadInput, match=r"00000.png holds object id 300: .* 1\.\.255") as e:
        read_inputs(layout, "v", use_all_masks=False, later_objects=False)
    assert "\n" not in e.value.message
