"""What a studio shows and changes, without the web: the store's video, frames and masks,
the page's prompts (shared by every tab), previews, and one tracking job at a time in the
background, which runs exactly what `segpipe track --prompts` runs."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from segpipe import environment, interrupt, log
from segpipe import labels as label_file
from segpipe import prompts as prompt_file
from segpipe.errors import (
    BadInput,
    DamagedStore,
    SegpipeError,
    StoreLocked,
    StoreMismatch,
    StoreNotReady,
    os_error_line,
)
from segpipe.flags import ChunkMeasures, detect, written
from segpipe.fsutil import resolved
from segpipe.limits import MAX_OBJECT_ID
from segpipe.model import model_spec_of
from segpipe.models.registry import family_of
from segpipe.plan import Span, passes
from segpipe.settings import Encoding, Execution, Tracking
from segpipe.store import edits
from segpipe.store.labels import save as save_labels
from segpipe.store.labels import stored as stored_labels
from segpipe.store.lock import Claim, holder, store_lock
from segpipe.store.masks import CHANGING, chunk_files
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import (
    DIRECTIONS,
    DRAFT,
    draft_prompts,
    next_prompts,
    save_draft,
    stored_settings,
    tracked_ids,
)


class Studio:
    """One store's studio. `read_only`: another process writes the store (or was asked):
    the page can look but not change prompts or track. `source` ((video, `Decoding`), what
    decode is given): a store not fully decoded yet is decoded from it, as the studio's first job,
    its progress in the page; meanwhile the store's frames and masks are not there yet."""

    def __init__(
        self,
        store,
        encoding: Encoding = Encoding(),
        execution: Execution = Execution(),
        source: tuple | None = None,
    ):
        self.path, self.device = resolved(store), execution.device
        # the model a store not yet encoded is encoded with (as `encode` takes it), and
        # where Track computes (quietly, resuming, in one group; `allow_env_change`: in
        # another environment too)
        self.encoding = encoding.check().filled()
        self.execution = replace(execution, progress=False, force=False, groups=None)
        self._stop_seen = (None, None)  # (when, where a tracking stopped): `progress`
        self._same_seen = (None, None)  # (version, the page's prompts are the tracked ones)
        self._previewer = None  # made on the first preview or Track (or `warm`): torch then
        self._warmed = False
        self.entries, self.seen, self.direction = [], None, "both"
        self.version = 0  # bumped on every change a tab should see
        self.changed = threading.Condition()
        self.job = Job()
        self._starting = threading.Lock()  # a job's check and start are one step
        self._frames = FrameSource(self.path)
        self._masks = ChunkMasks()
        self._measures, self._measuring = ChunkMeasures(), False  # the flags' (`scores`)
        self.source = source
        self.decoding = not _decoded(self.path)
        if not self.decoding:
            self._opened()
        elif source is None:
            raise StoreNotReady(f"store {self.path} is not fully decoded yet (run decode)")

    def begin(self) -> None:
        """Start decoding a store not fully decoded yet (once the server answers): the
        studio's first job. A decode that failed or was cancelled starts again (resuming)
        when a page opens."""
        with self._starting:
            if self.decoding and not self.job.running():
                self.job.start(self, "decode", self._decode)

    def warm(self) -> None:
        """Load torch and build the preview's model in the background, once: when a page has
        loaded (its events stream opens; the page's first requests do not wait behind the
        build) or a decode ends, so that the first click previews as fast as the later ones."""

        def build():
            try:
                self.previewer.build(self.store())
            except Exception:  # noqa: BLE001 - the first preview says what is wrong
                pass

        with self._starting:
            if self.decoding or self._warmed:
                return
            self._warmed = True
        threading.Thread(target=build, daemon=True).start()

    def _opened(self) -> None:
        """Take the decoded store's prompts and direction."""
        store = RunStore.open(self.path, read_only=True)
        self.entries, self.seen = self._stored_entries(store), self._tracking_seen(store)
        self.direction = (stored_settings(store) or {}).get("direction", "both")

    def _decode(self, job: "Job") -> str:
        from segpipe.stages.decode import decode

        video, decoding = self.source
        with log.watching(job.watch):
            decode(video, self.path, decoding, quiet=True)
        self._opened()  # then the store is there for every request
        self.decoding = False
        self.warm()
        return "decoded"

    @property
    def previewer(self):
        if self._previewer is None:
            from segpipe.web.preview import Previewer

            self._previewer = Previewer(self.path, self.encoding, self.device)
        return self._previewer

    # -- the video ---------------------------------------------------------------------------
    def store(self) -> RunStore:
        if self.decoding:
            raise StoreNotReady(f"store {self.path.name} is being decoded: wait for it")
        return RunStore.open(self.path, read_only=True)

    @property
    def read_only(self) -> str | None:
        """Why the studio cannot write now (another process holds the store), else None."""
        places = [self.path.parent] + ([self.path] if self.path.exists() else [])
        if not all(os.access(p, os.W_OK) for p in places):
            return (
                f"store {self.path} cannot be written here (a read-only file system, or "
                f"not this user's): the studio is read-only"
            )
        writer = holder(self.path)
        if writer is None or writer.get("pid") == os.getpid():
            return None  # free, or held by this studio (its job, or a save of its prompts)
        return f"store {self.path} is being written by {_who(writer)}: the studio is read-only"

    def info(self) -> dict:
        if self.decoding:  # the page shows the decode's progress, then opens the store
            self.begin()  # again, after a failure or a Cancel: a page reload retries
            return {"store": self.path.name, "decoding": True, "read_only": self.read_only}
        self.sync()
        store = self.store()
        video = store.attrs["video"]
        settings = stored_settings(store)
        return {
            "store": self.path.name,
            "frames": store.attrs["frame_count"],
            "fps": video["fps"],
            "width": video["width"],
            "height": video["height"],
            "encoded": "model" in store.attrs,
            "tracked_objects": tracked_ids(store, settings),
            "concepts": (settings or {}).get("concepts", []),
            "direction": self.direction,
            "read_only": self.read_only,
            "version": self.version,
            "formats": _menu(),
        }

    def frame_number(self, n) -> int:
        T = self.store().attrs["frame_count"]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < T:
            raise BadInput(f"frame {n!r} is out of range: the video has frames 0..{T - 1}")
        return n

    def frame_jpeg(self, n: int) -> bytes:
        return self._frames.jpeg(self.frame_number(n))

    def masks_png(self, n: int) -> tuple[bytes, str]:
        """Frame n's masks as a PNG at the video's size, and its format: "grey" (value = 1
        + the object's slot in `tracked_objects`, 0: none; where masks overlap, the later
        object's) while there are fewer than 255 objects, else "rgb" (R + 256 G = that)."""
        n = self.frame_number(n)
        store = self.store()
        video = store.attrs["video"]
        array = store.array("masks")
        masks = []
        if stored_settings(store) is not None and array is not None:
            masks = self._masks.frame(store, n)
        grey = array is None or array.shape[1] < 255
        value = np.zeros((video["height"], video["width"]), np.uint8 if grey else np.int32)
        for slot, m in enumerate(masks):
            value[m] = slot + 1
        if grey:  # a third of the bytes to compress: most of a request's time at 1080p
            return png(value), "grey"
        rgb = np.zeros((*value.shape, 3), np.uint8)
        rgb[..., 0], rgb[..., 1] = value & 255, value >> 8
        return png(rgb), "rgb"

    def scores(self) -> dict:
        """Per tracked object its score and mask area on every frame (None where untracked),
        the frames a pass reached, and where each object may be lost (`segpipe.flags`, as
        [frame, kind, reason] per object): what the timeline strips draw. Flags that look
        at masks come as their chunks are measured, in the background (`_measure`)."""
        store = self.store()
        settings = stored_settings(store)
        empty = {
            "objects": [],
            "scores": [],
            "areas": [],
            "tracked": [],
            "flags": [],
            "measuring": False,
        }
        if settings is None or store.array("object_scores") is None:
            return empty
        scores = written(store, "object_scores", np.nan)  # then areas: see `Tracker.write`
        areas = written(store, "object_areas", 0)
        tracked = written(store, "tracked", False)
        if scores is None or areas is None or tracked is None or scores.shape != areas.shape:
            return empty  # reset since it looked (new prompts): the page asks again
        masks = store.array("masks")
        if masks is None or masks.shape[1] != scores.shape[1]:
            return empty
        keys = self._measures.keys(store)  # (each chunk's mask files listed once)
        self._measure(store, keys)
        ids = tracked_ids(store, settings)
        if len(ids) != scores.shape[1]:  # instances being added (a concept tracking)
            return empty
        video = store.attrs["video"]
        found = detect(
            scores,
            areas,
            self._measures.measured(store, keys),
            ids,
            video["width"] * video["height"],
        )
        tracked, untracked = tracked.any(axis=1), np.isnan(scores)
        return {
            "objects": ids,
            "scores": [
                [None if np.isnan(s) else round(float(s), 3) for s in scores[:, o]]
                for o in range(scores.shape[1])
            ],
            "areas": [
                [None if u else int(a) for a, u in zip(areas[:, o], untracked[:, o])]
                for o in range(areas.shape[1])
            ],
            "tracked": [bool(t) for t in tracked],
            "flags": [[[f.frame, f.kind, f.reason] for f in found if f.object == i] for i in ids],
            "measuring": self._measuring,  # (flags from masks still to come)
        }

    def _measure(self, store: RunStore, keys: list) -> None:
        """Measure the chunks not measured yet (or rewritten since) on a thread of its own,
        then tell the tabs (their next scores have those chunks' flags)."""
        if self._measuring or not self._measures.stale(store, keys):  # (looked at unlocked)
            return
        with self._starting:
            if self._measuring:
                return
            self._measuring = True

        def work():
            try:
                store = RunStore.open(self.path, read_only=True)
                self._measures.measure_rest(store, pause=0.01)  # (the page's requests first)
            except Exception:  # noqa: BLE001 - reset meanwhile, say: measured when it changes
                return
            finally:
                self._measuring = False
            self.bump()

        threading.Thread(target=work, name="segpipe-flags", daemon=True).start()

    # -- prompts -----------------------------------------------------------------------------
    def _stored_entries(self, store: RunStore) -> list[dict]:
        """The store's prompts as entries: its draft, else the last tracked (else none)."""
        if draft_prompts(store) is None and stored_settings(store) is None:
            return []
        return prompt_file.to_file(next_prompts(store))

    @staticmethod
    def _tracking_seen(store: RunStore):
        """What identifies the store's prompts now: its draft's, its tracking's, and the
        objects' names."""
        path = store.path / DRAFT
        draft = path.stat().st_mtime_ns if path.is_file() else None
        tracked = (stored_settings(store) or {}).get("prompts_sha256")
        return draft, tracked, repr(store.attrs.get("labels"))

    def sync(self) -> bool:
        """Take the store's prompts again where another process changed them (a `segpipe
        track` with new prompts while the studio was open); whether it did."""
        if self.decoding:
            return False
        store = self.store()
        seen = self._tracking_seen(store)
        if seen == self.seen or self.job.running():
            return False
        self.entries, self.seen = self._stored_entries(store), seen
        self.direction = (stored_settings(store) or {}).get("direction", self.direction)
        self.bump()
        return True

    def prompts(self) -> list:
        """The page's prompts as `segpipe.Prompt`s, checked as a prompts file is."""
        store = self.store()
        video, T = store.attrs["video"], store.attrs["frame_count"]
        if not self.entries:
            raise BadInput("no prompts yet: click on a frame to add one")
        return prompt_file.load(self.entries, T, video["width"], video["height"])

    def set_prompts(self, entries) -> None:
        """Replace the page's prompts (checked first: a bad entry changes nothing). Masks come
        inline (`data:` URIs): the studio reads no file a request names."""
        self._writable()
        _inline_only(entries)
        store = self.store()
        video, T = store.attrs["video"], store.attrs["frame_count"]
        loaded = prompt_file.load(entries, T, video["width"], video["height"]) if entries else []
        self._save_entries(prompt_file.to_file(loaded))  # id masks: one mask entry per object

    def _save_entries(self, entries: list[dict] | None, step=None) -> None:
        """`entries` saved as the store's draft, the entries they replace kept in the edit
        history (`store.edits`); with `step` (`edits.undo` or `edits.redo`), the entries
        that step gives instead (none: `BadInput`, nothing to undo or redo)."""
        with self._between_jobs() as store:  # one writer: the draft is the store's
            if step is not None:
                entries = self._step(store, step)
            elif entries != self.entries:
                edits.changed(store, self.entries)
            save_draft(store, entries)
            self.entries = [dict(e) for e in entries]
            self.seen = self._tracking_seen(store)
        self.bump()

    @contextlib.contextmanager
    def _between_jobs(self):
        """The store (opened for writing) while no job runs nor starts, under its lock: the
        page's own writes (its prompts, their history, the names)."""
        with self._starting:
            if self.job.running():
                raise StoreLocked(f"a {self.job.kind} is running: wait for it, or Cancel")
            with store_lock(self.path):
                yield RunStore.open(self.path)

    def _step(self, store: RunStore, step) -> list[dict]:
        """The entries the history's step gives (`edits.undo` or `edits.redo`), checked as
        prompts first: a step that is not (a history edited by hand) is dropped, in one
        line, and nothing else changes."""
        which = step.__name__
        candidate = edits.peek(store, which)
        if candidate is None:
            raise BadInput(f"nothing to {which}")
        video, T = store.attrs["video"], store.attrs["frame_count"]
        try:
            _inline_only(candidate)  # (a history edited by hand names no file either)
            checked = (
                []
                if candidate == []
                else prompt_file.to_file(
                    prompt_file.load(candidate, T, video["width"], video["height"])
                )
            )
        except SegpipeError as e:
            edits.drop(store, which)
            raise BadInput(f"the step to {which} is not valid prompts ({e.message}): dropped")
        step(store, self.entries)
        return checked

    def undo(self) -> None:
        """The prompts as they were before the last change (kept in the store: a reload,
        another tab or a restarted studio undoes as well)."""
        self._writable()
        self.store()
        self.sync()  # (another process's prompts: what is undone is theirs)
        self._save_entries(None, edits.undo)

    def redo(self) -> None:
        """The change the last undo took back, made again."""
        self._writable()
        self.store()
        self.sync()
        self._save_entries(None, edits.redo)

    def history(self) -> dict:
        """How many changes can be undone and redone."""
        return edits.counts(self.store())

    def prompts_file(self) -> dict:
        """The page's prompts as a prompts file (masks inline), with the objects' names
        where there are any (`segpipe track --prompts` records them too)."""
        store = self.store()  # none while the store is being decoded
        self.sync()
        named = label_file.entries(stored_labels(store))
        return {"prompts": self.entries, **({"objects": named} if named else {})}

    # -- names -------------------------------------------------------------------------------
    def labels(self) -> dict:
        """The objects' names and classes, as a labels file ("+ object" lists one unnamed)."""
        return {"objects": label_file.entries(stored_labels(self.store()))}

    def set_labels(self, entries, remove: list | None = None) -> None:
        """Replace the objects' names and classes; with `remove` (a list, maybe empty), set
        only those of the objects in `entries`, the others' kept but those of the ids in
        `remove`, read and written in one turn. Checked first: a bad entry changes nothing.
        No tracking is redone: the exports that show names are, when next made."""
        self._writable()
        named = label_file.parse(entries, "labels")
        if remove is not None:
            if not isinstance(remove, list):
                raise BadInput("remove must be a list of object ids")
            label_file.parse([{"id": i} for i in remove], "remove")  # (ids checked as names' are)
            both = sorted(set(remove) & named.keys())
            if both:
                raise BadInput(f"object {both[0]} is both named and removed")
        with self._between_jobs() as store:
            save_labels(store, named, replace=remove is None, remove=remove or ())
            self.seen = self._tracking_seen(store)
        self.bump()

    def preview(self, frame, object_id) -> tuple[bytes, float, dict | None] | None:
        """The mask SAM 2 makes on `frame` for `object_id`'s prompts there (PNG, 255 = object),
        its object score, and how it differs from the object's tracked mask there
        (`change`); None where it has no prompt there (now: a page's edit, or another tab's,
        may have taken it away while the page asked)."""
        frame = self.frame_number(frame)
        if type(object_id) is not int or not 0 < object_id <= MAX_OBJECT_ID:
            raise BadInput(f"object must be an object id (an integer 1..{MAX_OBJECT_ID})")
        model = (self.store().attrs.get("model") or {}).get("name") or self.encoding.model
        if model is not None and family_of(model).detects:
            raise BadInput(f"{model}: the studio tracks concepts, not clicks: type one, press Find")
        mine = [p for p in self.prompts() if p.frame == frame and p.object_id == object_id]
        if not mine:
            return None
        mask, score = self.previewer.mask(mine)
        return png(mask.astype(np.uint8) * 255), score, self.change(frame, object_id, mask)

    def change(self, frame: int, object_id: int, mask: np.ndarray) -> dict | None:
        """How `mask` differs from the object's tracked mask on `frame`: "iou" (their
        intersection over union), "shift" (how far its centre moved, in body lengths: the
        square root of the tracked area; None where `mask` is empty) and "drastic": the
        correction empties the mask, or moves it (an IoU under `DRASTIC_IOU` and its centre
        more than `DRASTIC_SHIFT` body lengths away: onto another target, say; a
        refinement of the outline keeps its centre). None where nothing is tracked there
        to compare with."""
        store = self.store()
        settings = stored_settings(store)
        if settings is None or object_id not in settings["object_ids"]:
            return None
        masks = self._masks.frame(store, frame) if store.array("masks") is not None else []
        slot = settings["object_ids"].index(object_id)
        if slot >= len(masks) or not masks[slot].any():
            return None
        before, after = masks[slot], mask.astype(bool)
        iou = float((before & after).sum() / (before | after).sum())
        shift = None
        if after.any():
            moved = np.subtract(_centre(after), _centre(before))
            shift = round(float(np.hypot(*moved) / np.sqrt(before.sum())), 2)
        drastic = shift is None or (iou < DRASTIC_IOU and shift > DRASTIC_SHIFT)
        return {"iou": round(iou, 3), "shift": shift, "drastic": drastic}

    # -- tracking ----------------------------------------------------------------------------
    def track(self, direction: str | None = None, frames=None, concepts=None) -> None:
        """Start tracking the page's prompts in the background (as `segpipe track
        --prompts FILE --direction D --frames A:B` on the store): `frames` [A, B] (B None:
        to the end) is the tracking window, [0, None] the whole video, None the store's (as
        the command without --frames). `concepts` (a list of phrases): every instance of
        them instead, as `segpipe track --concept ...` (the store's model must detect)."""
        self._writable()
        if concepts is not None:
            return self._find(concepts)
        number = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        if frames is not None and not (
            isinstance(frames, list)
            and len(frames) == 2
            and number(frames[0])
            and (frames[1] is None or number(frames[1]))
        ):
            raise BadInput(f"frames must be [A, B] (B null: to the end), not {frames!r}")
        if self.sync():
            raise StoreMismatch(
                "another process tracked the store with other prompts: the page shows "
                "them now; press Track again to track these"
            )
        direction = direction or self.direction
        if direction not in DIRECTIONS:
            raise BadInput(f"direction must be one of {', '.join(DIRECTIONS)}")
        prompts = self.prompts()
        store = self.store()
        if frames is not None:
            frames = tuple(frames)
            Tracking(direction, frames).resolve(store, prompts)  # checked now, not in the job
        if "model" in store.attrs:  # another compute environment: refused now, not in the job
            computing = environment.of_work(self.device)
            environment.check(store, computing, self.execution.allow_env_change, record=False)
        with self._starting:
            claim = self._claim()
            try:
                if self.sync():  # another studio saved prompts since: the page's now
                    raise StoreMismatch(
                        "another studio changed the store's prompts: the page shows them "
                        "now; press Track again to track these"
                    )
                self.direction = direction
                work = lambda job: self._track(job, prompts, direction, frames)  # noqa: E731
                self.job.start(self, "track", work, claim)
            except BaseException:
                claim.release()
                raise

    def _find(self, concepts) -> None:
        """`track` with concepts: checked now (a 4xx), tracked by a job."""
        if not isinstance(concepts, list) or not all(isinstance(c, str) for c in concepts):
            raise BadInput(f"concepts must be a list of phrases, not {concepts!r}")
        tracking = Tracking(concepts=tuple(concepts))
        tracking.check_concepts()
        store = self.store()
        model = (store.attrs.get("model") or {}).get("name") or self.encoding.model
        if model is not None and not family_of(model).detects:
            raise BadInput(f"{model} has no detector: concepts need a store of sam3-video")
        with self._starting:
            claim = self._claim()
            try:
                work = lambda job: self._track(job, None, "forward", None, tracking)  # noqa: E731
                self.job.start(self, "track", work, claim)
            except BaseException:
                claim.release()
                raise

    def _track(self, job: "Job", prompts, direction: str, frames, tracking=None) -> str:
        from segpipe.stages.encode import encode
        from segpipe.stages.track.stage import track

        def committed(direction, k):
            store = self.store()
            span = Span.of(stored_settings(store), store.plan.num_frames)
            job.new += span.count_in(direction, *store.plan.bounds(k))
            job.done, job.total = tracked_frames(store)
            job.phase, job.committed = direction, time.monotonic()
            self.bump()

        if "model" not in self.store().attrs:  # recorded; chunks encoded as tracked
            encode(self.path, self.encoding, self.execution, chunks=[])
        predictor = self.previewer.predictor
        same = (
            predictor is not None
            and self.previewer.built_for == model_spec_of(self.store())
            and self.previewer.options == _options(self)
        )
        try:
            track(
                self.path,
                prompts,
                tracking or Tracking(direction, frames),
                self.encoding,
                self.execution,
                predictor=predictor if same else None,
                on_commit=committed,
            )
        finally:  # the store's prompts are these now, by this studio's doing
            self.seen = self._tracking_seen(self.store())
        return "" if job.new else "already tracked with these prompts: nothing to do"

    def export(self, fmt) -> None:
        """Export the tracked masks in `fmt` into `<store>.export/`, as `segpipe run` does,
        in the background."""
        from segpipe.stages.export.stage import FORMATS
        from segpipe.store.layout import export_folder
        from segpipe.store.tracking import require_tracked

        self._writable()
        if fmt not in FORMATS:
            raise BadInput(f"format must be one of {', '.join(FORMATS)}")
        require_tracked(self.store())
        out = export_folder(self.path) / FORMATS[fmt].output

        def work(job: Job) -> str:
            from segpipe.stages.export.stage import export

            with log.watching(job.watch):  # its progress bar, in the page
                export(self.path, fmt, out, quiet=True)
            return f"exported {fmt} to {out}"

        with self._starting:
            self.job.start(self, f"export {fmt}", work, self._claim())

    def _claim(self) -> Claim:
        """The store's lock for a job, taken before the request is answered (a second
        writer, another studio's Track say, is refused now: 409); refused while a job runs
        or another process writes the store."""
        if self.job.running():
            raise StoreLocked(f"a {self.job.kind} is running: wait for it, or Cancel")
        self._writable()
        return Claim(self.path)

    def cancel(self) -> None:
        """As one Ctrl-C: the chunk in flight finishes, the next Track resumes."""
        self.job.cancel()

    def progress(self) -> dict:
        """The job's state; before this studio has run one, where a tracking of the store
        stopped short of its end (a studio or command killed or cancelled), as the state
        "interrupted" with its frames done and to do, and what goes on from there."""
        now = {**self.job.snapshot(), "version": self.version, "read_only": self.read_only}
        if now["state"] == "idle" and not self.decoding and not self.read_only:
            stopped = self._stopped()
            if stopped is not None:
                done, total, message = stopped
                now.update(state="interrupted", kind="track", done=done, total=total)
                now["message"] = message
        return now

    def _stopped(self) -> tuple[int, int, str] | None:
        """(frames tracked, frames to track, what to say) of the store's tracking where it
        stopped short of its end, else None: read again when the tabs' view changes, and at
        most every 2 s otherwise (another process may track on meanwhile)."""
        key = (self.version, int(time.monotonic() // 2))
        if self._stop_seen[0] != key:
            self._stop_seen = (key, self._where_tracking_stopped(self.store()))
        return self._stop_seen[1]

    def _tracked_prompts(self, settings: dict) -> bool:
        """Whether the page's prompts are those of the store's tracking (`settings`): read
        once per version (the page's prompts change only with it; masks are decoded)."""
        if self._same_seen[0] != self.version:
            try:
                same = prompt_file.digest(self.prompts()) == settings["prompts_sha256"]
            except SegpipeError:
                same = False
            self._same_seen = (self.version, same)
        return self._same_seen[1]

    def _where_tracking_stopped(self, store: RunStore) -> tuple[int, int, str] | None:
        settings = stored_settings(store)
        if "frame_count" not in store.attrs or settings is None:
            return None
        done, total = tracked_frames(store)
        if done >= total:
            return None
        said = f"tracking interrupted at {done}/{total} frames"
        if settings.get("concepts"):
            return done, total, f"{said}: Find {', '.join(settings['concepts'])} resumes it"
        if not self._tracked_prompts(settings):
            return done, total, f"{said}, with other prompts than these: Track starts over"
        if "frames" in settings:  # a window: Track (the whole video) would start over
            lo, hi = settings["frames"]
            return done, total, f"{said} of frames {lo}..{hi - 1}: track them again to resume"
        return done, total, f"{said}: Track resumes it"

    def bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def _writable(self) -> None:
        if self.read_only:
            raise StoreLocked(self.read_only)


class Job:
    """The studio's background work (a tracking or an export), one at a time: its state,
    message and its frames done of frames to do (a tracking's over its passes; otherwise
    its stage's progress bar's, through `watch`)."""

    def __init__(self):
        self.kind, self.state, self.message = "", "idle", ""
        self.done = self.total = self.new = 0  # frames done, to do, done by this job
        self.phase = ""  # what it does now: a tracking's pass ("forward", "reverse")
        self.runs = 0  # jobs started
        self.began = self.committed = None  # when it started, and last moved
        self.thread = None
        self._stop = threading.Lock()  # a Cancel and the end of the work, one at a time

    def running(self) -> bool:
        """Whether the work is under way: until its end is recorded (its thread may still
        be telling the tabs), a new job waits."""
        return self.state == "running"

    def start(self, studio: Studio, kind: str, work, claim: Claim | None = None) -> None:
        """Run `work(job)` (it returns the message said when it is done) in a thread, which
        holds `claim` (the store's lock, taken by the caller) until it ends."""
        self.kind, self.state, self.message = kind, "running", ""
        self.done = self.total = self.new = 0
        self.phase = ""
        self.runs += 1
        self.began, self.committed = time.monotonic(), None
        with self._stop:
            interrupt.clear()  # no Cancel of an earlier job stops this one
        self.thread = threading.Thread(target=self._run, args=(studio, work, claim), daemon=True)
        try:
            self.thread.start()
        except BaseException:
            self.state = "failed"
            if claim is not None:
                claim.release()
            raise

    def _run(self, studio: Studio, work, claim: Claim | None) -> None:
        state, message = "failed", ""
        try:
            with claim.held() if claim is not None else contextlib.nullcontext():
                message = work(self)
            state = "done"
        except interrupt.Interrupted:
            state, message = "cancelled", f"{self.kind} cancelled: start it again to continue"
        except SegpipeError as e:
            message = e.message
        except OSError as e:  # a full disk, say: as the CLI says it
            message = os_error_line(e)
        except Exception as e:  # noqa: BLE001 - said on the page, in one line
            message = f"{type(e).__name__}: {e}"
        finally:
            with self._stop:  # the job ends here: a Cancel from now on finds none running
                interrupt.clear()
                self.state, self.message = state, message
            studio.bump()

    def watch(self, desc: str, n: int, total: int | None, initial: int) -> None:
        """A `log.watching` callback: the stage's bar moved (the events stream, which polls
        the progress, tells the tabs; nothing of the store changed for them to reload)."""
        self.done, self.total, self.new = n, total or 0, n - initial
        self.phase, self.committed = desc, time.monotonic()

    def cancel(self) -> None:
        """As one Ctrl-C: the work stops after its next commit (every stage checks then)."""
        with self._stop:
            if self.running():
                interrupt.request()

    def snapshot(self) -> dict:
        """Its state; the rate is the frames done over the time to the last time they
        moved, and the ETA counts down from then (it does not grow while a chunk is under
        way)."""
        rate = eta = None
        if self.new and self.committed and self.committed > self.began:
            rate = self.new / (self.committed - self.began)
            since = time.monotonic() - self.committed
            eta = max(0.0, (self.total - self.done) / rate - since)
        return {
            "kind": self.kind,
            "state": self.state,
            "phase": self.phase,
            "runs": self.runs,
            "message": self.message,
            "done": self.done,
            "total": self.total,
            "rate": 0.0 if rate is None else round(rate, 2),
            "eta": None if eta is None else round(eta),
        }


def tracked_frames(store: RunStore) -> tuple[int, int]:
    """(frames the passes have tracked, frames they track in all)."""
    settings = stored_settings(store)
    plan = store.plan
    span = Span.of(settings, plan.num_frames)
    done = total = 0
    for d in passes(settings["direction"]):
        chunks = span.chunks(plan, d)
        todo = set(store.pass_ledger(d).todo(chunks))
        for k in chunks:
            n = span.count_in(d, *plan.bounds(k))
            total += n
            done += 0 if k in todo else n
    return done, total


def _menu() -> list[list[str]]:
    """The export menu: [format, label] of each registered format the studio offers."""
    from segpipe.stages.export.stage import FORMATS

    return [[name, f.label] for name, f in FORMATS.items() if f.label is not None]


def _options(studio: Studio) -> dict:
    from segpipe.store.tracking import preview_options

    return preview_options(studio.store(), studio.direction)


class ChunkMasks:
    """The masks of one chunk at a time, packed to bits (an eighth of their size: 33 MiB for
    32 frames of 4 objects at 1080p), so that stepping through a chunk reads its zarr chunks
    once, not once a frame (a zarr chunk of masks holds all its frames). Read again when the
    chunk's files change (a retrack, here or by another process); nothing else is kept."""

    def __init__(self):
        self.key, self.packed = None, None
        self._lock = threading.Lock()

    def frame(self, store: RunStore, n: int) -> list[np.ndarray]:
        """Frame n's (H, W) mask of every object; none while its chunk is not written."""
        from segpipe.store.masks import read_masks, unpack

        k = store.plan.chunk_of(n)
        lo, hi = store.plan.bounds(k)
        listed = chunk_files(store, k)
        if listed == CHANGING:  # a chunk written (renamed in) or reset this moment
            return []
        key = (str(store.path), k, listed)
        with self._lock:
            array = store.array("masks")
            if array is None:  # reset since the caller looked (new prompts): none shown
                return []
            if key != self.key:
                self.key, self.packed = None, None  # the old chunk goes before the new comes
                slots = list(range(array.shape[1]))
                try:
                    self.packed = read_masks(store, lo, hi, slots, packed=True)
                except DamagedStore:  # not written yet (a tracking under way): none shown
                    return []
                self.key = key
            H, W = array.shape[2:]
            return list(unpack(self.packed[n - lo], H, W))


class FrameSource:
    """Frames at the video's own size: decoded from the source where it is there (one
    reader, reading on when frames come in order), else the stored model input scaled
    back. Holds no more than the decoder's own state: no frame cache."""

    def __init__(self, path: Path):
        self.path = path
        self._reader = None
        self._lock = threading.Lock()

    def jpeg(self, n: int) -> bytes:
        with self._lock:
            picture = self._picture(n)
        out = io.BytesIO()
        picture.save(out, "JPEG", quality=90)
        return out.getvalue()

    def _picture(self, n: int) -> Image.Image:
        store = RunStore.open(self.path, read_only=True)
        if self._reader is None:
            from segpipe.store.source import SourceReader, stored_source

            try:
                self._reader = SourceReader(store, stored_source(store))
            except BadInput:
                self._reader = False  # the source is gone or changed: the stored frames
        if self._reader:
            try:
                return next(self._reader.frames(n, 1))[2]()
            except SegpipeError:
                self._reader = False
        video = store.attrs["video"]
        frame = store.read("frames", n, n + 1)[0]
        return Image.fromarray(frame).resize((video["width"], video["height"]))


def _inline_only(entries) -> None:
    """Refuse prompts that are not a list, or whose masks are not inline (`data:` URIs):
    the studio reads no file a request (or its history) names."""
    if not isinstance(entries, list):
        raise BadInput("prompts must be a list of prompt entries")
    for i, e in enumerate(entries):
        for key in ("mask", "id_mask"):
            if isinstance(e, dict) and key in e:
                if not (isinstance(e[key], str) and e[key].startswith(prompt_file.DATA_URI)):
                    raise BadInput(
                        f'prompt {i}: "{key}" must be inline PNG data '
                        f"({prompt_file.DATA_URI}...): the studio reads no files"
                    )


DRASTIC_IOU = 0.5  # a correction whose preview overlaps the tracked mask less, and ...
DRASTIC_SHIFT = 0.5  # ... whose centre moves more body lengths than this: said


def _centre(mask: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(mask)
    return float(xs.mean()), float(ys.mean())


def _decoded(path: Path) -> bool:
    return RunStore.exists(path) and "frame_count" in RunStore.open(path, read_only=True).attrs


def png(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(a).save(out, "PNG", compress_level=1)
    return out.getvalue()


def _who(info: dict | None) -> str:
    if not info:
        return "another segpipe process"
    return f"pid {info.get('pid')} on {info.get('host')}"
