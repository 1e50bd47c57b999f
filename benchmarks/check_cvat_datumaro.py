#!/usr/bin/env python3
"""`segpipe export --format cvat` read back by datumaro, CVAT's own format library: every
mask it decodes must equal the store's.

datumaro is not one of segpipe's dependencies (it pulls pandas, pyarrow, OpenCV and another
Pillow), so this runs in two interpreters: segpipe's writes the store's masks to a .npy,
then a separate venv with datumaro reads the XML:

    python -m venv /tmp/dm && /tmp/dm/bin/pip install datumaro
    python benchmarks/check_cvat_datumaro.py STORE.zarr --datumaro-python /tmp/dm/bin/python

datumaro 1.13's CVAT reader fails on mask shapes inside <track> elements (CVAT for video:
it takes the image size from an <image> element there is none of), so the check moves each
track's masks, their RLE strings and boxes untouched, into CVAT for images 1.1 layout, which
it reads (objects `outside` on a frame: no mask there).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

READ = r"""
import os, sys, tempfile, xml.etree.ElementTree as ET
import numpy as np
from PIL import Image
from datumaro.components.annotation import AnnotationType, Mask
from datumaro.components.dataset import Dataset

xml, npy = sys.argv[1:3]
masks = np.load(npy)
T, O, H, W = masks.shape
src = ET.parse(xml).getroot()
out = ET.Element("annotations")
ET.SubElement(out, "version").text = "1.1"
out.append(src.find("meta"))
images = {}
folder = tempfile.mkdtemp()
os.makedirs(os.path.join(folder, "images"))
for t in range(T):
    name = f"frame_{t:06d}.png"
    images[t] = ET.SubElement(out, "image", id=str(t), name=name, width=str(W), height=str(H))
    Image.new("RGB", (W, H)).save(os.path.join(folder, "images", name))
for track in src.findall("track"):
    for m in track.findall("mask"):
        if m.get("outside") != "1":
            keep = ("rle", "left", "top", "width", "height", "occluded", "z_order")
            attrs = {k: m.get(k) for k in keep}
            ET.SubElement(images[int(m.get("frame"))], "mask", label=track.get("label"), **attrs)
ET.ElementTree(out).write(os.path.join(folder, "annotations.xml"))
dataset = Dataset.import_from(folder, "cvat")
names = [label.name for label in dataset.categories()[AnnotationType.label]]
read = 0
for item in dataset:
    t = int(item.attributes.get("frame", item.id.split("_")[-1]))
    got = {}
    for ann in item.annotations:
        assert isinstance(ann, Mask), type(ann)
        got[int(names[ann.label].split()[-1]) - 1] = ann.image.astype(bool)
    for o in range(O):
        assert np.array_equal(got.get(o, np.zeros((H, W), bool)), masks[t, o]), (t, o)
    read += len(got)
import datumaro
print(f"datumaro {datumaro.__version__}: {len(dataset)} frames, {read} masks, "
      f"each equal to the store's ({O} objects, {T} frames)")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--datumaro-python", required=True, help="a python with datumaro")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np

    import segpipe
    from segpipe.api import export_folder

    run = segpipe.open(args.store)
    xml = export_folder(args.store) / "annotations.xml"  # where `run` exports it
    segpipe.export(args.store, "cvat", xml, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        npy = Path(tmp) / "masks.npy"
        masks = run.masks()
        assert [int(i) for i in run.object_ids] == list(range(1, masks.shape[1] + 1))
        np.save(npy, masks)
        return subprocess.run([args.datumaro_python, "-c", READ, str(xml), str(npy)]).returncode


if __name__ == "__main__":
    sys.exit(main())
