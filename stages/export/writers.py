"""The export formats, one writer each: DAVIS PNGs, YouTube-VIS JSON, the overlay MP4 and
its frames, CVAT for video XML. A writer makes one chunk's files, then assembles them at the finish."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

from segpipe.errors import BadInput
from segpipe.fsutil import atomic_write, fsync_path_dir, replacing
from segpipe.labels import entries
from segpipe.stages.export.formats import ExportFormat, register
from segpipe.store.runstore import RunStore
from segpipe.store.source import SourceReader


@dataclass(frozen=True)
class Job:
    """What every writer needs: where, which objects and frames, and the video."""

    out: Path
    ids: list[int]
    frames: tuple[int, int]
    video: dict
    source: Path
    store: RunStore  # overlay seeks the source by the stored pts
    names: list[str] | None = None  # a frame folder's file stems: outputs are named alike
    palette: list[int] | None = None  # davis: the PNGs' palette (default: DAVIS's)
    per_object: bool = False  # davis: <obj:03d>/<frame>.png, 0/1 per object (SA-V's layout)
    labels: dict | None = None  # a named format's: each object's `Label` (None: none named)

    def name(self, t: int) -> str:
        """Frame t's output name: the source file's stem for a frame folder (as SAM 2's
        vos_inference names its PNGs), else the zero-padded index."""
        return self.names[t] if self.names is not None else f"{t:05d}"


def davis_palette() -> list[int]:
    """The DAVIS / PASCAL VOC palette: index i's colour from the bits of i."""
    palette = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        palette += [r, g, b]
    return palette


def compose(masks: np.ndarray, ids: list[int]) -> np.ndarray:
    """(O, H, W) bool -> (H, W) uint8 of object ids; where objects overlap the lowest id wins,
    as SAM 2's tools/vos_inference.py composes them (highest id painted first)."""
    out = np.zeros(masks.shape[1:], np.uint8)
    for slot in sorted(range(len(ids)), key=lambda s: ids[s], reverse=True):
        out[masks[slot]] = ids[slot]
    return out


class DavisWriter:
    """One indexed PNG per frame, 00000.png ..., pixel value = object id; or, per object,
    <obj:03d>/00000.png ... holding 0/1 (SA-V's layout). The DAVIS palette unless given.
    Written as SAM 2's vos_inference writes its PNGs (`Image.fromarray`, `putpalette`).
    The objects' names go in labels.json at the finish: a rename redoes no PNG."""

    NAMES_IN_PARTS = False

    def __init__(self, job: Job):
        if not job.per_object and any(not 1 <= i <= 255 for i in job.ids):
            raise BadInput(f"davis PNGs hold object ids 1..255; this store has {job.ids}")
        self.out, self.ids, self.job = job.out, job.ids, job
        self.palette = job.palette if job.palette is not None else davis_palette()

    def start(self):
        make_folder(self.out)
        for obj in self.ids if self.job.per_object else ():
            make_folder(self.out / f"{obj:03d}")

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        files = []
        for t, frame_masks in each_frame(batches):
            name = f"{self.job.name(t)}.png"
            if self.job.per_object:
                for slot, obj in enumerate(self.ids):
                    files.append(
                        self._save(
                            self.out / f"{obj:03d}" / name, frame_masks[slot].astype(np.uint8)
                        )
                    )
            else:
                files.append(self._save(self.out / name, compose(frame_masks, self.ids)))
        return files

    def _save(self, path: Path, values: np.ndarray) -> Path:
        img = Image.fromarray(values)
        img.putpalette(self.palette)
        atomic_write(path, _png_bytes(img))
        return path

    LABELS = "labels.json"  # beside the PNGs: the objects' names and classes, as a labels file

    def finish(self, chunks):
        path = self.out / self.LABELS
        if self.job.labels is not None:
            atomic_write(path, (json.dumps({"objects": entries(self.job.labels)}) + "\n").encode())
        elif path.exists():  # (named before, no longer)
            path.unlink()
            fsync_path_dir(self.out)


class VisJsonWriter:
    """YouTube-VIS layout: one annotation per object with COCO RLE per frame (null if absent)."""

    def __init__(self, job: Job):
        self.out, self.ids, self.video, self.frames = job.out, job.ids, job.video, job.frames
        self.store, self.job = job.store, job
        self.parts = parts_dir(job.out)

    def start(self):
        make_folder(self.parts)

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        from pycocotools import mask as mask_util

        part = {str(i): {"segmentations": [], "areas": [], "bboxes": []} for i in self.ids}
        for _, frame_masks in each_frame(batches):
            for slot, obj in enumerate(self.ids):
                m = frame_masks[slot]
                entry = part[str(obj)]
                if not m.any():
                    entry["segmentations"].append(None)
                    entry["areas"].append(None)
                    entry["bboxes"].append(None)
                    continue
                rle = mask_util.encode(np.asfortranarray(m.astype(np.uint8)))
                entry["segmentations"].append(
                    {"size": rle["size"], "counts": rle["counts"].decode()}
                )
                entry["areas"].append(int(m.sum()))
                entry["bboxes"].append([float(v) for v in mask_util.toBbox(rle)])
        path = self.parts / f"{k:06d}.json"
        atomic_write(path, json.dumps(part).encode())
        return [path]

    KEYS = ("segmentations", "areas", "bboxes")
    BATCH = 64  # objects gathered per pass over the parts (3 open files each)

    def finish(self, chunks):
        """Assemble the parts into one JSON. Each part is parsed once per batch of objects:
        its items, serialized, are appended to one file per object and key in the parts
        folder, which are then streamed into the JSON in order. Memory stays bounded by one
        part whatever the video's length."""
        length = self.frames[1] - self.frames[0]
        W, H = self.video["width"], self.video["height"]
        work = self.parts / "assemble"
        shutil.rmtree(work, ignore_errors=True)  # left by an interrupted finish
        work.mkdir(parents=True)
        objects = list(enumerate(self.ids))
        with replacing(self.out) as tmp, open(tmp, "w") as f:
            f.write('{"info": {"description": "segpipe export"}, "videos": ')
            times = self.store.read("timestamps", *self.frames)
            f.write(
                json.dumps(
                    [
                        {
                            "id": 1,
                            "width": W,
                            "height": H,
                            "length": length,
                            "file_names": [f"{self.job.name(t)}.jpg" for t in range(*self.frames)],
                            "timestamps": [None if np.isnan(v) else float(v) for v in times],
                        }
                    ]
                )
            )
            categories, category_of = vis_categories(self.ids, self.job.labels)
            f.write(', "categories": ' + json.dumps(categories))
            f.write(', "annotations": [')
            for b in range(0, len(objects), self.BATCH):
                batch = objects[b : b + self.BATCH]
                self._gather(chunks, batch, work)
                for n, obj in batch:
                    annotation = {
                        "id": n + 1,
                        "object_id": obj,
                        "video_id": 1,
                        "category_id": category_of[obj],
                        "iscrowd": 0,
                        "height": H,
                        "width": W,
                        "length": length,
                    }
                    if self.job.labels is not None and self.job.labels[obj].name is not None:
                        annotation["name"] = self.job.labels[obj].name
                    head = json.dumps(annotation)
                    f.write(("," if n else "") + head[:-1])
                    for key in self.KEYS:
                        f.write(f', "{key}": [')
                        items = work / f"{n}.{key}"
                        with open(items) as src:
                            shutil.copyfileobj(src, f)
                        items.unlink()
                        f.write("]")
                    f.write("}")
            f.write("]}\n")
        fsync_path_dir(self.out.parent)
        shutil.rmtree(work, ignore_errors=True)

    def _gather(self, chunks, batch, work: Path) -> None:
        """For each object of `batch` and key: its items of every part, in chunk order, as the
        comma-separated JSON that goes between the list's brackets."""
        files = {}
        try:
            for n, _ in batch:
                for key in self.KEYS:
                    files[n, key] = open(work / f"{n}.{key}", "w")
            started = set()
            for k in chunks:
                part = json.loads((self.parts / f"{k:06d}.json").read_text())
                for n, obj in batch:
                    entry = part[str(obj)]
                    for key in self.KEYS:
                        if entry[key]:
                            text = ",".join(json.dumps(item) for item in entry[key])
                            files[n, key].write(("," if (n, key) in started else "") + text)
                            started.add((n, key))
        finally:
            for fh in files.values():
                fh.close()


class OverlayWriter:
    """H.264 MP4 of the source video with translucent colours, outlines and object ids, that
    plays in a browser: yuv420p (an odd size is padded by one black row or column), the
    source's frame times kept (variable frame rates too), every frame at the first's size."""

    ALPHA = 0.5

    def __init__(self, job: Job):
        self.out, self.ids, self.video, self.source = job.out, job.ids, job.video, job.source
        self.store, self.job = job.store, job
        self.parts = parts_dir(job.out)
        self.reader = SourceReader(job.store, job.source)  # read on across chunks
        self.size = (job.video["width"], job.video["height"])
        self.coded = tuple(v + v % 2 for v in self.size)  # yuv420p needs even sizes
        self.times, self.time_base = frame_times(job.store, job.video)
        palette = davis_palette()
        self.colours = {
            i: np.array(palette[3 * (i % 255 or 1) : 3 * (i % 255 or 1) + 3], np.float32)
            for i in job.ids
        }

    def start(self):
        make_folder(self.parts)

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        frames = self.reader.frames(lo, hi - lo)
        path = self.parts / f"{k:06d}.mp4"
        with replacing(path, ".mp4") as tmp, av.open(str(tmp), "w") as out:
            stream = self._stream(out)
            for (t, frame_masks), (_, _, picture) in zip(each_frame(batches), frames):
                image = picture()
                if image.size != self.size:  # a mid-stream size change: back to the first size
                    image = image.resize(self.size)
                img = self.draw(np.asarray(image), frame_masks)
                if self.coded != self.size:
                    img = np.pad(
                        img,
                        (
                            (0, self.coded[1] - self.size[1]),
                            (0, self.coded[0] - self.size[0]),
                            (0, 0),
                        ),
                    )
                frame = av.VideoFrame.from_ndarray(img, format="rgb24")
                frame.pts, frame.time_base = int(self.times[t] - self.times[lo]), self.time_base
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        return [path]

    def _stream(self, out):
        rate = Fraction(self.video["frame_rate"]) or Fraction(24)  # "0": rate unknown
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height = self.coded
        stream.pix_fmt = "yuv420p"
        stream.time_base = stream.codec_context.time_base = self.time_base
        # no B-frames: segments then concatenate with monotonic timestamps
        stream.options = {"crf": "18", "preset": "veryfast", "bf": "0", "threads": "1"}
        return stream

    STRIP_ROWS = 256  # rows blended at once: float32 copies of a strip, not of a 4K frame

    def draw(self, rgb: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Each object's colour blended in (in object order), its outline drawn, its id at
        its centroid. Computed in strips of rows, pixel for pixel what the whole frame at
        once gives (an outline pixel looks one row beyond its strip)."""
        H = rgb.shape[0]
        present = [(slot, obj) for slot, obj in enumerate(self.ids) if masks[slot].any()]
        out = np.empty_like(rgb)
        for r0 in range(0, H, self.STRIP_ROWS):
            r1 = min(r0 + self.STRIP_ROWS, H)
            img = rgb[r0:r1].astype(np.float32)
            for slot, obj in present:
                m = masks[slot, r0:r1]
                img[m] = (1 - self.ALPHA) * img[m] + self.ALPHA * self.colours[obj]
            h0, h1 = max(r0 - 1, 0), min(r1 + 1, H)  # the rows an outline pixel looks at
            for slot, obj in present:
                inner = _erode(masks[slot, h0:h1])[r0 - h0 : r0 - h0 + r1 - r0]
                img[masks[slot, r0:r1] & ~inner] = self.colours[obj]
            out[r0:r1] = img.round().clip(0, 255).astype(np.uint8)
        image = Image.fromarray(out)
        draw = ImageDraw.Draw(image)
        for slot, obj in present:
            x, y = _centroid(masks[slot])
            draw.text(
                (x, y),
                str(obj),
                fill=(255, 255, 255),
                stroke_width=1,
                stroke_fill=(0, 0, 0),
                anchor="mm",
            )
        return np.asarray(image)

    def finish(self, chunks):
        """Concatenate the chunk segments by remuxing (no re-encode); each segment starts at
        its first frame's source time, so the video keeps the source's timing."""
        plan = self.store.plan
        first = self.job.frames[0]  # where the exported range starts, maybe mid-chunk
        with (
            replacing(self.out, ".mp4") as tmp,
            av.open(str(tmp), "w", options={"movflags": "+faststart"}) as out,
        ):
            ostream = None
            for k in chunks:
                lo = max(plan.bounds(k)[0], first)  # the segment's first frame
                with av.open(str(self.parts / f"{k:06d}.mp4")) as seg:
                    istream = seg.streams.video[0]
                    if ostream is None:
                        ostream = out.add_stream_from_template(istream)
                        ostream.time_base = istream.time_base
                    offset = (self.times[lo] - self.times[first]) * self.time_base
                    for packet in seg.demux(istream):
                        if packet.dts is None:
                            continue
                        shift = int(round(offset / istream.time_base))
                        packet.pts += shift
                        packet.dts += shift
                        packet.stream = ostream
                        out.mux(packet)
        fsync_path_dir(self.out.parent)


def frame_times(store: RunStore, video: dict) -> tuple[np.ndarray, Fraction]:
    """Every frame's time as an integer count of a time base: the stored pts in the source's
    time base, or the frame index at the average rate where the source has no pts."""
    pts = store.read("pts")
    if (pts >= 0).all() and (np.diff(pts) > 0).all():
        return pts - pts[0], Fraction(video["time_base"])
    rate = Fraction(video["frame_rate"]) or Fraction(24)
    return np.arange(len(pts), dtype=np.int64), 1 / rate


class OverlayFramesWriter(OverlayWriter):
    """The overlay as a folder of JPEGs, one per frame (00000.jpg ...), at the video's size."""

    def start(self):
        make_folder(self.out)

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        files = []
        for (t, frame_masks), (_, _, picture) in zip(
            each_frame(batches), self.reader.frames(lo, hi - lo)
        ):
            image = picture()
            if image.size != self.size:
                image = image.resize(self.size)
            buf = io.BytesIO()
            Image.fromarray(self.draw(np.asarray(image), frame_masks)).save(buf, "JPEG", quality=95)
            path = self.out / f"{self.job.name(t)}.jpg"
            atomic_write(path, buf.getvalue())
            files.append(path)
        return files

    def finish(self, chunks):
        pass


class CvatWriter:
    """CVAT for video 1.1 XML: one mask track per object, every frame a keyframe, its mask as
    CVAT's RLE over the mask's bounding box (runs of 0 and 1 alternating, from 0, row by
    row), `outside="1"` where the object is absent. Chunks are written as parts, one XML
    fragment per object, then streamed into the file in order."""

    def __init__(self, job: Job):
        self.out, self.ids, self.video, self.frames = job.out, job.ids, job.video, job.frames
        self.store, self.parts, self.job = job.store, parts_dir(job.out), job

    def start(self):
        make_folder(self.parts)

    def chunk(self, k, lo, hi, batches) -> list[Path]:
        part = {str(obj): [] for obj in self.ids}
        inner = {obj: self._attributes(obj) for obj in self.ids}
        for t, frame_masks in each_frame(batches):
            for slot, obj in enumerate(self.ids):
                part[str(obj)].append(cvat_mask(t, frame_masks[slot], inner[obj]))
        path = self.parts / f"{k:06d}.json"
        atomic_write(path, json.dumps({o: "".join(v) for o, v in part.items()}).encode())
        return [path]

    def finish(self, chunks):
        from xml.sax.saxutils import escape, quoteattr

        W, H = self.video["width"], self.video["height"]
        a, b = self.frames
        labels = "".join(
            f"<label><name>{escape(name)}</name><type>mask</type>{self._declared()}</label>"
            for name in dict.fromkeys(map(self._label, self.ids))
        )
        with replacing(self.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write('<?xml version="1.0" encoding="utf-8"?>\n<annotations>\n')
            f.write("  <version>1.1</version>\n  <meta><task>")
            f.write(f"<name>{escape(self.store.path.name)}</name><size>{b - a}</size>")
            f.write("<mode>interpolation</mode><overlap>0</overlap>")
            f.write(f"<start_frame>{a}</start_frame><stop_frame>{b - 1}</stop_frame>")
            f.write(f"<labels>{labels}</labels>")
            f.write(f"<original_size><width>{W}</width><height>{H}</height></original_size>")
            f.write("</task><source>segpipe</source></meta>\n")
            for n, obj in enumerate(self.ids):
                label = quoteattr(self._label(obj))
                f.write(f'  <track id="{n}" label={label} source="auto">\n')
                for k in chunks:
                    f.write(json.loads((self.parts / f"{k:06d}.json").read_text())[str(obj)])
                f.write("  </track>\n")
            f.write("</annotations>\n")
        fsync_path_dir(self.out.parent)

    def _label(self, obj: int) -> str:
        """The object's CVAT label: its class, else "object <id>" (one label each)."""
        named = self.job.labels and self.job.labels[obj].category
        return named or f"object {obj}"

    def _declared(self) -> str:
        """A label's attributes: "name" (text) where any object is named."""
        if not self.job.labels or all(v.name is None for v in self.job.labels.values()):
            return "<attributes/>"
        return (
            "<attributes><attribute><name>name</name><mutable>False</mutable>"
            "<input_type>text</input_type><default_value></default_value><values></values>"
            "</attribute></attributes>"
        )

    def _attributes(self, obj: int) -> str:
        """What each `<mask>` of the object holds: its name, where it has one."""
        from xml.sax.saxutils import escape

        label = self.job.labels and self.job.labels[obj]
        if not label or label.name is None:
            return ""
        return f'<attribute name="name">{escape(label.name)}</attribute>'


def vis_categories(ids: list[int], labels: dict | None) -> tuple[list[dict], dict[int, int]]:
    """YouTube-VIS categories (one per class, in the order of the objects; "object" for
    objects without one) and each object's category id."""
    names = [labels[i].category if labels and labels[i].category else "object" for i in ids]
    order = list(dict.fromkeys(names)) or ["object"]
    categories = [{"id": n + 1, "name": c, "supercategory": "object"} for n, c in enumerate(order)]
    return categories, {i: order.index(c) + 1 for i, c in zip(ids, names)}


def cvat_mask(t: int, m: np.ndarray, inner: str = "") -> str:
    """Frame t's `<mask>` of one object: CVAT's RLE of `m` over its bounding box, holding
    `inner` (its attributes)."""
    head = f'    <mask frame="{t}" keyframe="1" occluded="0" z_order="0" '
    rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
    if not len(rows):
        return head + f'outside="1" rle="1" left="0" top="0" width="1" height="1">{inner}</mask>\n'
    top, left = int(rows[0]), int(cols[0])
    box = m[top : rows[-1] + 1, left : cols[-1] + 1].ravel()
    edges = np.flatnonzero(np.diff(box.astype(np.int8))) + 1  # where a run ends
    runs = np.diff(np.concatenate([[0], edges, [len(box)]]))
    counts = ([0] if box[0] else []) + runs.tolist()  # CVAT's runs start with zeros
    w, h = box.size // (rows[-1] + 1 - top), rows[-1] + 1 - top
    return (
        head + f'outside="0" rle="{", ".join(map(str, counts))}" left="{left}" top="{top}" '
        f'width="{w}" height="{h}">{inner}</mask>\n'
    )


register(
    ExportFormat(
        "davis",
        DavisWriter,
        "davis",
        label="DAVIS PNGs",
        in_run=True,
        named=True,
    )
)
register(
    ExportFormat(
        "vis-json",
        VisJsonWriter,
        "masks.json",
        single_file=True,
        label="vis-json",
        in_run=True,
        named=True,
    )
)
register(
    ExportFormat(
        "overlay",
        OverlayWriter,
        "overlay.mp4",
        single_file=True,
        needs_source=True,
        label="overlay.mp4",
        in_run=True,
    )
)
register(
    ExportFormat(
        "frames",
        OverlayFramesWriter,
        "overlay_frames",
        needs_source=True,
    )
)
register(
    ExportFormat(
        "cvat",
        CvatWriter,
        "annotations.xml",
        single_file=True,
        label="CVAT XML",
        named=True,
    )
)


def each_frame(batches):
    """(frame index, (O, H, W) masks) of each frame of `mask_batches`' batches, in order."""
    for a, masks in batches:
        for i, frame_masks in enumerate(masks):
            yield a + i, frame_masks


def make_folder(folder: Path) -> None:
    """Create an output folder durably: its name in its parent survives a power loss before
    any chunk written into it is recorded done."""
    folder.mkdir(parents=True, exist_ok=True)
    fsync_path_dir(folder)
    fsync_path_dir(folder.parent)


def parts_dir(out: Path) -> Path:
    """Where single-file formats keep their per-chunk parts until the file is assembled."""
    return out.with_name(f".{out.name}.parts")


def remove_parts(out: Path) -> None:
    shutil.rmtree(parts_dir(out), ignore_errors=True)


def _centroid(m: np.ndarray) -> tuple[int, int]:
    """(int(xs.mean()), int(ys.mean())) of the mask's pixels, without listing them (two int64
    arrays as long as the mask): the coordinate sums are exact integers, so the float64 means
    are numpy's bit for bit."""
    n = int(np.count_nonzero(m))
    xs = int((m.sum(axis=0, dtype=np.int64) * np.arange(m.shape[1], dtype=np.int64)).sum())
    ys = int((m.sum(axis=1, dtype=np.int64) * np.arange(m.shape[0], dtype=np.int64)).sum())
    return int(np.float64(xs) / n), int(np.float64(ys) / n)


def _erode(m: np.ndarray) -> np.ndarray:
    inner = m.copy()
    inner[1:] &= m[:-1]
    inner[:-1] &= m[1:]
    inner[:, 1:] &= m[:, :-1]
    inner[:, :-1] &= m[:, 1:]
    return inner


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
