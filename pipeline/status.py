"""`segpipe status`: per stage, chunks done / total, and while a stage is unfinished its
frames/s and ETA; the storage estimate by group beside the bytes on disk; per array, bytes on
disk.

Rates come from the ledger: each entry file is written once, when its chunk is committed, so
its modification time is the commit time (the ledger records no time itself). A stage's
rate is the frames of its last `RATE_WINDOW` commits over the time they took; a pause
longer than ten typical intervals (the median interval, or the shortest of fewer than three)
and a minute in that window (a run stopped and resumed) starts the window after it. ETA =
frames left / rate, less the time since the last commit (the chunk in flight has been
under way that long). A stage whose last commit is older than `stalled_after` is reported
as not advancing (no ETA): no process may be working on it. Reading the times costs one `stat` per entry in the window, so `status` stays fast on
long stores. Times are this machine's clock against the file system's (a store on a network
file system with another clock skews them).
"""

from __future__ import annotations

import statistics
import time

from segpipe import environment, estimate, flags, space
from segpipe.plan import ChunkPlan, Span, passes
from segpipe.store import lock
from segpipe.store.labels import stored as stored_labels
from segpipe.store.ledger import pass_stage
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import tracked_ids

RATE_WINDOW = 16  # commits


def describe(store_path, now: float | None = None, with_flags: bool = False) -> dict:
    """The report `render` shows; `with_flags`: where each object may be lost too
    (`segpipe.flags`: every mask read once)."""
    store = RunStore.open(store_path, read_only=True)
    attrs = store.attrs
    T = attrs.get("frame_count")
    C = store.chunk_size
    stages, orders = _stages_and_orders(store, attrs, T, C)
    now = time.time() if now is None else now
    progress = {}
    for name, s in stages.items():
        if name in orders and (s["total"] is None or s["done"] < s["total"]) and s["done"]:
            p = stage_progress(store, name, *orders[name], now)
            if p is not None:
                progress[name] = p
    running = lock.holder(store.path)
    if running is None:  # nobody works on it: a rate, but no ETA for a process that is gone
        for p in progress.values():
            p["eta_s"], p["stopped"] = None, True
    warnings = _store_warnings(attrs)
    sizes = store.array_bytes()
    disk_total = space.store_total(store.path, sizes)
    est = estimate.from_store(store, sizes=sizes)
    on_disk = {**estimate.group_bytes(sizes, disk_total), "total": disk_total}
    return {
        "store": str(store.path),
        "source": attrs["source"]["path"],
        "frames": T,
        "chunk_size": C,
        "image_size": store.image_size,
        "video": {
            k: attrs["video"].get(k) for k in ("width", "height", "fps", "kind", "intensity")
        },
        "model": attrs.get("model"),
        "running": running,
        "objects": _objects(attrs.get("track"), stored_labels(store)),
        "concepts": _concepts(store, attrs.get("track")),
        "draft": _draft(store),
        "stages": stages,
        "exports": {
            name: {"out": e["out"], "complete": bool(e.get("complete"))}
            for name, e in (attrs.get("exports") or {}).items()
        },
        "progress": progress,
        "estimate": est.as_dict() if est is not None else None,
        "on_disk": on_disk,
        "bytes": sizes,
        "warnings": warnings,
        **({"flags": _flags(store, attrs)} if with_flags else {}),
    }


def _flags(store: RunStore, attrs: dict) -> list[dict]:
    if attrs.get("frame_count") is None:  # tracked alongside a decode not finished
        return []
    return [f.as_dict() for f in flags.of_store(store)]


def _stages_and_orders(store: RunStore, attrs: dict, T: int | None, C: int) -> tuple[dict, dict]:
    """Per stage: chunks done / total, and (its chunks in order, a chunk's frames, its frames)."""
    plan = ChunkPlan(T, C) if T is not None else None
    total = plan.num_chunks if plan is not None else None
    stages = {
        "decode": {"done": store.ledger("decode").count(), "total": total},
        "encode": {"done": store.ledger("encode").count(), "total": total},
    }
    # per stage: the chunks in the order the stage does them, and the frames of each
    orders = {}
    if plan is not None:
        orders["decode"] = orders["encode"] = (list(plan), lambda k: _size(plan, k), T)
    else:
        claimed = (attrs.get("video") or {}).get("claimed_frames") or None
        orders["decode"] = (range(len(store.ledger("decode").done())), lambda k: C, claimed)
    track = attrs.get("track")
    if track and T is None:  # tracking alongside an unfinished decode: its total is not known
        for d in passes(track["direction"]):
            stages[pass_stage(d)] = {"done": store.pass_ledger(d).count(), "total": None}
    elif track:
        span = Span.of(track, T)
        for d in passes(track["direction"]):
            chunks = span.chunks(ChunkPlan(T, C), d)
            stages[pass_stage(d)] = {"done": store.pass_ledger(d).count(), "total": len(chunks)}
            orders[pass_stage(d)] = (
                chunks,
                _pass_frames(plan, d, span),
                span.count_in(d, 0, T),
            )
    return stages, orders


def _concepts(store: RunStore, track: dict | None) -> dict | None:
    """A concept tracking's concepts, the instances found so far (their ids: not the
    objects clicked beside them, listed with `objects`), and per chunk committed the
    instances it shows (-1: not tracked yet)."""
    if not (track or {}).get("concepts"):
        return None
    counts = store.array("instances")
    clicked = {entry["object"] for entry in track.get("prompts", [])}
    return {
        "concepts": list(track["concepts"]),
        "instance_ids": [i for i in tracked_ids(store, track) if i not in clicked],
        "per_chunk": [] if counts is None else [int(n) for n in counts[...]],
    }


def _objects(track: dict | None, labels: dict) -> list[dict]:
    """Each tracked object's id, name and class (where it has them) and its prompts (frame
    and kind), in slot order."""
    objects = {}
    for entry in (track or {}).get("prompts", []):
        kind = next(k for k in ("points", "box", "mask") if k in entry)
        objects.setdefault(entry["object"], []).append({"frame": entry["frame"], "kind": kind})
    out = []
    for i, p in objects.items():
        label = labels.get(i)
        named = {} if label is None else {"name": label.name, "class": label.category}
        out.append({"id": i, **named, "prompts": p})
    return out


def _store_warnings(attrs: dict) -> list[str]:
    """What the store warns of: random weights, and decode's warning."""
    warnings = []
    weights = (attrs.get("model") or {}).get("weights", {})
    if "random_seed" in weights:
        warnings.append(
            f"random weights (seed {weights['random_seed']}): masks from them mean nothing"
        )
    if attrs.get("decode_warning"):
        warnings.append(attrs["decode_warning"])
    if environment.mixed(attrs.get("model")):
        warnings.append(
            "computed in more than one environment (--allow-env-change): the results are "
            "not bit-identical to an uninterrupted run"
        )
    return warnings


def _size(plan: ChunkPlan, k: int) -> int:
    lo, hi = plan.bounds(k)
    return hi - lo


def _pass_frames(plan: ChunkPlan, direction: str, span: Span):
    return lambda k: span.count_in(direction, *plan.bounds(k))


def stalled_after(interval: float) -> float:
    """Seconds without a commit after which a stage counts as not advancing."""
    return max(10 * interval, 120.0)


def stage_progress(
    store: RunStore, stage: str, order, frames_of, total_frames: int | None, now: float
) -> dict | None:
    """frames/s over the recent commits, frames left, ETA and the last commit's age."""
    ledger = store.ledger(stage)
    done = ledger.done()
    done_chunks = [k for k in order if k < len(done) and done[k]]
    if not done_chunks:
        return None
    times = ledger.commit_times(done_chunks[-RATE_WINDOW:])
    if not times:
        return None
    entries = sorted((t, k) for k, t in times.items())
    gaps = [b[0] - a[0] for a, b in zip(entries, entries[1:])]
    if gaps:
        typical = statistics.median(gaps) if len(gaps) >= 3 else min(gaps)
        for i in range(len(gaps) - 1, -1, -1):
            if gaps[i] > max(10 * typical, 60.0):  # a pause: the rate is what came after it
                entries = entries[i + 1 :]
                break
    first, last = entries[0][0], entries[-1][0]
    rate = interval = None
    if len(entries) >= 2 and last > first:
        rate = sum(frames_of(k) for _, k in entries[1:]) / (last - first)
        interval = (last - first) / (len(entries) - 1)
    left = None
    if total_frames is not None:
        left = max(0, total_frames - sum(frames_of(k) for k in done_chunks))
    age = max(0.0, now - last)
    stalled = interval is not None and age > stalled_after(interval)
    eta = max(0.0, left / rate - age) if (rate and left is not None and not stalled) else None
    return {
        "frames_per_s": rate,
        "frames_left": left,
        "eta_s": eta,
        "last_commit_s_ago": age,
        "commits_in_window": len(entries),
        "stalled": stalled,
    }


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _called(o: dict) -> str:
    """(name, class) of a named object, as the head shows it."""
    said = [v for v in (o.get("name"), o.get("class")) if v]
    return f" ({', '.join(said)})" if said else ""


def _flag_lines(report: dict) -> list[str]:
    if "flags" not in report:
        return []
    found = report["flags"]
    lines = [f"flags    {len(found)} (where an object may be lost: object, frame, why)"]
    lines += [f"  {f['object']:>6}  {f['frame']:>7}  {f['kind']}: {f['reason']}" for f in found]
    return lines


def render(report: dict, verbose: bool = False) -> str:
    """The summary; with `verbose`, the bytes on disk of every array too."""
    lines = [*_head(report), *_stage_lines(report), *_export_lines(report), *_flag_lines(report)]
    lines += _storage_lines(report)
    if verbose:
        width = max(map(len, report["bytes"]), default=5)
        lines.append(f"{'array':<{width + 2}}  bytes on disk")
        lines += [f"  {name:<{width}}  {size:>14,}" for name, size in report["bytes"].items()]
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def _draft(store) -> dict | None:
    """segpipe studio's saved prompts, not tracked yet: the file and how many entries."""
    from segpipe.errors import BadInput
    from segpipe.limits import read_json_file
    from segpipe.store.tracking import DRAFT

    path = store.path / DRAFT
    if not path.exists():
        return None
    try:
        entries = read_json_file(path, "the saved prompts").get("prompts", [])
    except (BadInput, AttributeError):
        return {"path": str(path), "prompts": None}
    return {"path": str(path), "prompts": len(entries)}


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:20])) + (", ..." if len(ids) > 20 else "") if ids else "none"


def _head(report: dict) -> list[str]:
    """Store, whether a process works on it, source, size, model, objects and prompts."""
    holder = report["running"]
    if holder is None:
        running = "not running: no process holds its lock"
    else:
        who = f"pid {holder['pid']} on {holder['host']}" if "pid" in holder else "a process"
        running = f"running: {who}, since {holder.get('started', '?')}"
    frames = report["frames"] if report["frames"] is not None else "? (decoding)"
    video = report["video"]
    lines = [
        f"store    {report['store']}  ({running})",
        f"source   {report['source']}  {video['width']}x{video['height']}, {video['fps']:g} fps, "
        f"{frames} frames; chunks of {report['chunk_size']}, image size {report['image_size']}",
    ]
    if video.get("intensity"):
        lo, hi = video["intensity"]
        lines.append(f"         16-bit samples {lo}..{hi} mapped to 0..255 (the model's input)")
    if report["model"]:
        m = report["model"]
        lines.append(
            f"model    {m['name']}, {m['embedding_dtype']} embeddings, {m['precision']} precision"
        )
        if m.get("environment"):
            also = [environment.said(e) for e in m.get("environment_changes", [])]
            late = " (recorded on a resume: the chunks before it, unknown)"
            lines.append(
                f"computed {environment.said(m['environment'])}"
                + (late if m.get("environment_late") else "")
                + "".join(f"; then (--allow-env-change) {e}" for e in also)
            )
    if report["objects"]:
        said = [
            f"{o['id']}{_called(o)}: "
            + ", ".join(f"{p['kind']} on frame {p['frame']}" for p in o["prompts"])
            for o in report["objects"]
        ]
        lines.append(f"objects  {'; '.join(said)}")
    found = report.get("concepts")
    if found:
        per = found["per_chunk"]
        done = [n for n in per if n >= 0]
        lines.append(
            f"concepts {', '.join(found['concepts'])}: {len(found['instance_ids'])} instances "
            f"so far (ids {_ids(found['instance_ids'])}); per chunk tracked: "
            + (" ".join(map(str, done)) if done else "none yet")
        )
    draft = report.get("draft")
    if draft:
        n = "unreadable" if draft["prompts"] is None else f"{draft['prompts']} prompts"
        lines.append(
            f"draft    segpipe studio's saved prompts ({n}, {draft['path']}): `segpipe track` "
            f"without --prompts tracks them, starting over"
        )
    return lines


def _stage_lines(report: dict) -> list[str]:
    """Per stage: chunks done / total and, while it advances, frames/s and the ETA."""
    width = max(map(len, report["stages"]))
    lines = [f"{'stage':<{width + 2}}  chunks done / total  frames/s  ETA"]
    for name, s in report["stages"].items():
        total = "?" if s["total"] is None else s["total"]
        line = f"  {name:<{width}}  {s['done']:>11} / {total:<5}"
        p = report["progress"].get(name)
        if p is not None:
            ago = f"last commit {clock(p['last_commit_s_ago'])} ago"
            if p["frames_per_s"] is None:
                line += f"  (measuring: {ago})"
            elif p["stalled"]:
                line += f"  {p['frames_per_s']:>8.2f}  not advancing: {ago}"
            elif p.get("stopped"):
                line += f"  {p['frames_per_s']:>8.2f}  stopped, no ETA ({ago})"
            else:
                eta = clock(p["eta_s"]) if p["eta_s"] is not None else "?"
                about = " (about)" if name == "decode" and s["total"] is None else ""
                line += f"  {p['frames_per_s']:>8.2f}  {eta}{about}  ({ago})"
        lines.append(line.rstrip())
    return lines


def _export_lines(report: dict) -> list[str]:
    return [
        f"export   {name}: {e['out']}{'' if e['complete'] else ' (unfinished)'}"
        for name, e in report["exports"].items()
    ]


def _storage_lines(report: dict) -> list[str]:
    """The storage estimate by array group beside the bytes on disk."""
    est, disk = report["estimate"], report["on_disk"]
    if est is None:
        return ["storage  no estimate: the frame count is unknown"]
    per = "" if est["objects"] is not None else "; memory and masks per object"
    lines = [
        f"storage          estimate      on disk   ({est['frames']:,} frames, "
        f"{est['frames_basis']}{per})"
    ]
    for g, part in est["groups"].items():
        lines.append(
            f"  {g:<9} {estimate.human(part['bytes']):>14} {estimate.human(disk[g]):>12}"
            f"   {part['basis']}"
        )
    lines.append(
        f"  {'total':<9} {estimate.human(est['total']):>14} {estimate.human(disk['total']):>12}"
    )
    return lines
