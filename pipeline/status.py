"""`segpipe status`: per stage, chunks done / total; per array, bytes on disk."""
from __future__ import annotations

from .chunks import ChunkPlan, pass_chunks, passes
from .store import RunStore


def describe(store_path) -> dict:
    store = RunStore.open(store_path)
    attrs = store.attrs
    T = attrs.get("frame_count")
    C = attrs["chunk_size"]
    total = ChunkPlan(T, C).num_chunks if T is not None else None
    stages = {"decode": {"done": store.ledger("decode").count(), "total": total},
              "encode": {"done": store.ledger("encode").count(), "total": total}}
    track = attrs.get("track")
    if track:
        start = track["start_frame"]
        for d in passes(track["direction"]):
            stages[f"track_{d}"] = {"done": store.ledger(f"track_{d}").count(),
                                    "total": len(pass_chunks(ChunkPlan(T, C), d, start))}
    warnings = []
    weights = (attrs.get("model") or {}).get("weights", {})
    if "random_seed" in weights:
        warnings.append(f"random weights (seed {weights['random_seed']}): masks from them mean nothing")
    if attrs.get("decode_warning"):
        warnings.append(attrs["decode_warning"])
    return {"store": str(store.path), "source": attrs["source"]["path"], "frames": T,
            "chunk_size": C, "image_size": attrs["image_size"], "model": attrs.get("model"),
            "stages": stages, "bytes": store.array_bytes(), "warnings": warnings}


def render(report: dict) -> str:
    lines = [f"store   {report['store']}", f"source  {report['source']}",
             f"frames  {report['frames'] if report['frames'] is not None else '? (decoding)'}"
             f"  chunk size {report['chunk_size']}  image size {report['image_size']}"]
    if report["model"]:
        lines.append(f"model   {report['model']['name']}  embeddings {report['model']['embedding_dtype']}")
    lines.append("stage            chunks done / total")
    for name, s in report["stages"].items():
        total = "?" if s["total"] is None else s["total"]
        lines.append(f"  {name:<14} {s['done']:>6} / {total}")
    lines.append("array                              bytes on disk")
    for name, size in report["bytes"].items():
        lines.append(f"  {name:<32} {size:>14,}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)
