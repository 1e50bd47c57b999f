"""Object names and classes: validated in full before anything is written.

They come as a labels file, as the "objects" list a prompts file may carry beside its
prompts, or as the list itself (dicts or `Label`s):
{"objects": [{"id": 1, "name": "left mouse", "class": "mouse"},
             {"id": 2, "name": "right mouse", "class": "mouse"},
             {"id": 3}]}
`name` and `class` are optional, one line of at most `MAX_TEXT` characters each; an
object listed with neither exists all the same (segpipe studio's "+ object" before its
first prompt). Names are what exports call the objects (CVAT's track attribute, YouTube-VIS
and DAVIS labels); classes become CVAT labels and YouTube-VIS categories. A name change
redoes no tracking: the store keeps them apart from what it tracked (`store.labels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.limits import MAX_OBJECT_ID, read_json_file

MAX_TEXT = 200  # characters of a name or a class
MAX_LABELS = 100_000
KEYS = {"id", "name", "class"}


@dataclass(frozen=True)
class Label:
    """What an object is called: `name` (say "left mouse") and `category` (its class, say
    "mouse"), each None where not given.

    Example:
        >>> segpipe.label("clip.zarr", [segpipe.Label(1, "left mouse", "mouse")])
    """

    id: int
    name: str | None = None
    category: str | None = None

    def as_entry(self) -> dict:
        entry = {"id": self.id}
        if self.name is not None:
            entry["name"] = self.name
        if self.category is not None:
            entry["class"] = self.category
        return entry

    def called(self) -> str:
        """What an export calls the object: its name, else "object <id>"."""
        return self.name if self.name is not None else f"object {self.id}"


def load(source) -> dict[int, Label]:
    """Labels by object id from a labels file path, the file's contents ({"objects":
    [...]}), or a list of entries (dicts or `Label`s); an id listed twice is refused."""
    if isinstance(source, dict) and set(source) == {"objects"}:
        return parse(source["objects"], "labels")
    if isinstance(source, (str, Path)):
        path = Path(source)
        doc = read_json_file(path, "labels file")
        if not isinstance(doc, dict) or set(doc) != {"objects"}:
            raise BadInput(f'labels file {path} must be an object with the single key "objects"')
        return parse(doc["objects"], f"labels file {path}")
    return parse(source, "labels")


def of_prompts(source) -> dict[int, Label]:
    """The "objects" a prompts file carries beside its prompts ({} where it has none, or
    `source` is a list of prompts)."""
    if not isinstance(source, (str, Path)):
        return {}
    path = Path(source)
    doc = read_json_file(path, "prompts file")
    found = doc.get("objects", []) if isinstance(doc, dict) else []
    return parse(found, f"prompts file {path}")


def parse(entries, where: str) -> dict[int, Label]:
    """`entries` (dicts as the file has them, or `Label`s) checked, by id."""
    if not isinstance(entries, (list, tuple)):
        raise BadInput(f'{where}: "objects" must be a list of {{"id": N, "name": ...}}')
    if len(entries) > MAX_LABELS:
        raise BadInput(f"{where}: {len(entries):,} objects: segpipe takes at most {MAX_LABELS:,}")
    out = {}
    for i, entry in enumerate(entries):
        label = entry if isinstance(entry, Label) else _entry(entry, f"{where}: object {i}")
        _check(label, f"{where}: object {i}")
        if label.id in out:
            raise BadInput(f"{where}: object id {label.id} is listed twice")
        out[label.id] = label
    return out


def _entry(entry, where: str) -> Label:
    if not isinstance(entry, dict):
        raise BadInput(f'{where} must be {{"id": N, "name": ..., "class": ...}}')
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (allowed: class, id, name)")
    if "id" not in entry:
        raise BadInput(f'{where} has no "id"')
    return Label(entry["id"], entry.get("name"), entry.get("class"))


def _check(label: Label, where: str) -> None:
    i = label.id
    if not isinstance(i, int) or isinstance(i, bool) or not 1 <= i <= MAX_OBJECT_ID:
        raise BadInput(f"{where}: the id must be an integer 1..{MAX_OBJECT_ID}, got {_cut(i)}")
    for key, text in (("name", label.name), ("class", label.category)):
        if text is None:
            continue
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"{where}: the {key} must be text, got {_cut(text)}")
        if len(text) > MAX_TEXT:
            raise BadInput(f"{where}: the {key} is {len(text)} characters: at most {MAX_TEXT}")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise BadInput(f"{where}: the {key} {_cut(text)} holds a control character")


def entries(labels: dict[int, Label]) -> list[dict]:
    """Labels as the file's "objects" list, by id."""
    return [labels[i].as_entry() for i in sorted(labels)]


def _cut(v) -> str:
    said = repr(v)
    return said if len(said) <= 40 else said[:37] + "..."
