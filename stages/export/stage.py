"""Export stage: masks out of the store into DAVIS PNGs, YouTube-VIS JSON or an overlay video.

Streamed chunk by chunk and resumable: every chunk's files are written atomically and fsynced
before the chunk's ledger entry; formats that end in one file (vis-json, overlay, cvat) assemble it
from per-chunk parts at the end, write it atomically, and then drop the parts.
"""

from __future__ import annotations

from pathlib import Path

from segpipe import log
from segpipe.errors import BadInput, StoreMismatch
from segpipe.fsutil import resolved
from segpipe.labels import entries
from segpipe.plan import ChunkPlan, frame_window
from segpipe.sources.registry import named, same_source
from segpipe.stages.export.formats import FORMATS, run_formats
from segpipe.stages.export.writers import Job, remove_parts  # (registers the formats)
from segpipe.store.labels import of_objects
from segpipe.store.lock import holds_store_lock
from segpipe.store.masks import mask_batches
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import require_tracked, stored_track, tracked_ids

RUN_FORMATS = tuple(run_formats())  # what `run` exports unless told


def parse_objects(spec: str | None, ids: list[int]) -> list[int]:
    """Slots of the chosen objects, in slot order."""
    if spec is None:
        return list(range(len(ids)))
    try:
        wanted = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise BadInput(f"--objects must be ids separated by commas, got {spec!r}") from None
    unknown = [v for v in wanted if v not in ids]
    if unknown or not wanted:
        raise BadInput(
            f"--objects: unknown object id {unknown[0] if unknown else spec!r}; "
            f"the store tracks {', '.join(map(str, ids))}"
        )
    return [s for s, i in enumerate(ids) if i in wanted]


def check_source(store: RunStore, source: Path) -> None:
    """The overlay re-decodes the original file: it must still be the same video."""
    if not source.exists():
        raise BadInput(f"overlay re-decodes the source video, which is gone: {source}")
    if not same_source(store.attrs["source"], source, store.attrs["video"].get("kind")):
        raise BadInput(f"source video {source} changed since it was decoded; overlay refused")


def _frame_names(store: RunStore, source: Path) -> list[str] | None:
    """The frame files' names (stems) of a folder source; None where frames are numbered."""
    return named(store.attrs["video"].get("kind")).frame_names(source)


class Export:
    """One export of a store: its writer, its ledger (`export_<format>`) and its record in
    the store's attributes, which says with which settings it was made and whether it is
    complete. Chunks are exported by `chunk` (each committed after its files), the
    single-file formats assembled by `finish`."""

    def __init__(
        self,
        store: RunStore,
        fmt: str,
        out,
        frames=None,
        objects: str | None = None,
        force: bool = False,
        palette=None,
        per_object: bool = False,
        tracking: bool = False,
        name: str | None = None,
        recorded: bool = False,
    ):
        """`tracking`: made while the tracking still runs (chunks are exported as the
        passes commit them), so tracking need not be finished yet. `name`: the export's own
        record and ledger (default: the format's), for an export kept apart from the
        user's (the dataset command's PNGs). `recorded`: a Dask task's (`segpipe.dask.tasks`): the
        client recorded the export; settings that differ from the record (an `out` that
        resolves elsewhere on the worker, say) are an error, never a reset, so tasks
        cannot wipe each other's commits or the record."""
        if fmt not in FORMATS:
            raise BadInput(f"--format must be one of {', '.join(FORMATS)}")
        if (palette is not None or per_object) and fmt != "davis":
            raise BadInput("a palette and per-object PNGs are options of the davis format")
        track = stored_track(store) if tracking else require_tracked(store)
        self.store, self.fmt, self.name = store, fmt, name or fmt
        T, C = store.frame_count, store.chunk_size
        all_ids = tracked_ids(store, track)
        self.range = a, b = (0, T) if frames is None else frame_window(frames, T)
        self.slots = parse_objects(objects, all_ids)
        ids = [all_ids[s] for s in self.slots]
        self.out = out = resolved(out)
        self.source = source = Path(store.attrs["source"]["path"])
        names = _frame_names(store, source)
        palette = None if palette is None else [int(v) for v in palette]
        labels = of_objects(store, ids) if FORMATS[fmt].named else None
        self.writer = FORMATS[fmt].writer(
            Job(
                out,
                ids,
                (a, b),
                store.attrs["video"],
                source,
                store,
                names,
                palette,
                per_object,
                labels,
            )
        )
        self.stage = f"export_{self.name}"
        self._record(track, ids, palette, per_object, labels, force, recorded)
        self.complete = bool(store.attrs["exports"][self.name].get("complete"))
        self.plan = ChunkPlan(T, C)
        self.chunks = list(range(self.plan.chunk_of(a), self.plan.chunk_of(b - 1) + 1))
        self.started = False

    def _record(self, track, ids, palette, per_object, labels, force: bool, recorded: bool):
        """The export's record made or checked (`_reconcile_record`): the settings its parts
        are made with, and the objects' names where its format shows them (in those settings,
        or, a format that names them in its finish only, in what its finish was made with).
        New tracking options discard the exports with the tracking: see `reset_from`."""
        settings = {
            "out": str(self.out),
            "frames": list(self.range),
            "objects": ids,
            "track": track["prompts_sha256"],
            "direction": track["direction"],
            "palette": palette,
            "per_object": per_object,
        }
        named = {"labels": None if labels is None else entries(labels)}  # (None: as before labels)
        in_parts = getattr(self.writer, "NAMES_IN_PARTS", True)
        if FORMATS[self.fmt].named and in_parts:
            settings = {**settings, **named}
        finished = named if FORMATS[self.fmt].named and not in_parts else {}
        self._reconcile_record(settings, force, recorded, finished)

    def _reconcile_record(
        self, settings: dict, force: bool, recorded: bool, finished: dict
    ) -> None:
        """Reconcile the record with `settings`: a Dask task's must match, others reset on
        need. `finished`: what only the export's finish writes (DAVIS's labels.json): where
        only that changed, the chunks stay and the finish is done again."""
        store, out = self.store, self.out
        exports = store.attrs.get("exports", {})
        record = exports.get(self.name, {})
        differs = [k for k in settings if record.get(k) != settings[k]]
        redo = force or (record.get("complete") and not out.exists()) or differs
        if record and not recorded and not redo:
            if any(record.get(k) != v for k, v in finished.items()):
                exports[self.name] = {**record, **finished, "complete": False}
                store.set_attrs(exports=exports)
                return
        if recorded:
            if self.name not in exports or differs:
                what = f"its {', '.join(differs)}" if self.name in exports else "no record"
                raise StoreMismatch(
                    f"store {store.path}: a Dask task's export {self.name} is not "
                    f"the recorded one ({what}): the workers must see the "
                    f"client's paths, and no other run change the export"
                )
        elif redo:
            # forced; finished, then deleted (redo); or new settings
            store.ledger(self.stage).reset()
            exports[self.name] = {**settings, **finished, "complete": False}
            store.set_attrs(exports=exports)

    def start(self) -> None:
        if not self.started:
            if FORMATS[self.fmt].needs_source:
                check_source(self.store, self.source)
            self.writer.start()
            self.started = True

    def frames_of(self, k: int) -> tuple[int, int]:
        lo, hi = self.plan.bounds(k)
        return max(lo, self.range[0]), min(hi, self.range[1])

    def todo(self) -> list[int]:
        return self.store.ledger(self.stage).todo(self.chunks)

    def chunk(self, k: int) -> None:
        """Export chunk k (its masks must be final) and commit it. The writer gets the masks
        in batches of frames bounded in bytes (`mask_batches`), never the whole chunk."""
        self.store.check_lease()  # a Dask task of a run taken over writes nothing
        self.start()
        lo, hi = self.frames_of(k)
        batches = mask_batches(self.store, lo, hi, self.slots)
        self.store.commit(self.stage, k, files=self.writer.chunk(k, lo, hi, batches))

    def run(self, quiet: bool) -> None:
        """Every chunk not yet exported, then the finish."""
        self.start()
        todo = self.store.ledger(self.stage).reread().todo(self.chunks)  # Dask workers' too
        done = sum(hi - lo for lo, hi in map(self.frames_of, self.chunks)) - sum(
            hi - lo for lo, hi in map(self.frames_of, todo)
        )
        with log.progress(
            f"export {self.fmt}", self.range[1] - self.range[0], quiet, initial=done
        ) as bar:
            for k in todo:
                self.chunk(k)
                bar.update(self.frames_of(k)[1] - self.frames_of(k)[0])
        self.writer.finish(self.chunks)
        exports = self.store.attrs.get("exports", {})
        exports[self.name]["complete"] = True
        if self.fmt == "overlay":
            exports[self.name]["size"] = list(self.writer.coded)  # an odd size is padded to even
        self.store.set_attrs(exports=exports)
        self.complete = True
        remove_parts(self.out)  # only now: until the record says complete, finish may need them


@holds_store_lock
def export(
    store_path,
    fmt: str,
    out,
    frames=None,
    objects: str | None = None,
    quiet: bool = False,
    force: bool = False,
    palette=None,
    per_object: bool = False,
) -> Path:
    """Export the tracked masks in `fmt` to `out`, resuming an unfinished export."""
    store = RunStore.open(store_path)
    job = Export(store, fmt, out, frames, objects, force, palette, per_object)
    if job.complete:
        remove_parts(job.out)
        log.info(f"export {fmt}: already complete", quiet)
        log.result(f"export {fmt}: {job.out}", quiet)
        return job.out
    job.run(quiet)
    log.result(f"export {fmt}: {job.out}", quiet)
    return job.out
