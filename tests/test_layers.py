"""The house rule: each layer imports only from the layers below it.

Every module of the package is listed below, bottom first; a module may import (at the top
or inside a function) only modules listed before it, so no cycle can hide behind a
function-level import. Imports under `if TYPE_CHECKING:` are for annotations only and are
not counted. A new module must be placed here.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    # what everything uses: errors, limits, files, messages, the chunk plan, the prompts format
    "base": [
        "segpipe.errors",
        "segpipe.fsutil",
        "segpipe.limits",
        "segpipe.log",
        "segpipe.interrupt",
        "segpipe.behind",
        "segpipe.plan",
        "segpipe.labels",
        "segpipe.prompts",
    ],
    # the source kinds (a video file, a frame folder, a TIFF stack) and their registry
    "sources": [
        "segpipe.sources",
        "segpipe.sources.info",
        "segpipe.sources.identity",
        "segpipe.sources.base",
        "segpipe.sources.folder",
        "segpipe.sources.tiff",
        "segpipe.sources.video",
        "segpipe.sources.frames",
        "segpipe.sources.registry",
    ],
    # the zarr store: its lock, ledger, layout and what it records
    "store": [
        "segpipe.store.lock",
        "segpipe.store.ledger",
        "segpipe.store.migrate",
        "segpipe.store.runstore",
        "segpipe.store",
        "segpipe.store.layout",
        "segpipe.store.features",
        "segpipe.store.retention",
        "segpipe.store.masks",
        "segpipe.store.tracking",
        "segpipe.store.labels",
        "segpipe.store.edits",
        "segpipe.store.source",
        "segpipe.settings",
    ],
    # weights to a SAM 2 predictor, and the compute environment it runs in
    # model families, one room each, and the one way from weights to a predictor
    "model": [
        "segpipe.models",
        "segpipe.models.base",
        "segpipe.models.sam2",
        "segpipe.models.sam2.frames",
        "segpipe.models.sam2.catalog",
        "segpipe.models.sam2.build",
        "segpipe.models.sam2.family",
        "segpipe.models.hf",
        "segpipe.models.hf.configs",
        "segpipe.models.hf.family",
        "segpipe.models.registry",
        "segpipe.model",
        "segpipe.environment",
    ],
    # the four stages: each reads its inputs from the store and writes its outputs to it
    "stages": [
        "segpipe.stages",
        "segpipe.stages.executor",
        "segpipe.stages.decode",
        "segpipe.stages.alongside",
        "segpipe.stages.encode",
        "segpipe.stages.track",
        "segpipe.stages.track.memory",
        "segpipe.stages.track.groups",
        "segpipe.stages.track.supply",
        "segpipe.stages.track.shared",
        "segpipe.stages.track.batch",
        "segpipe.stages.track.passes",
        "segpipe.stages.track.tracker",
        "segpipe.stages.track.session",
        "segpipe.stages.track.clicks",
        "segpipe.stages.track.concepts",
        "segpipe.stages.track.stage",
        "segpipe.stages.export",
        "segpipe.stages.export.formats",
        "segpipe.stages.export.writers",
        "segpipe.stages.export.stage",
        "segpipe.stages.export.as_tracked",
    ],
    # what calls the stages: estimates, status, results, repair, datasets, Dask, the run
    "orchestration": [
        "segpipe.defaults",
        "segpipe.estimate",
        "segpipe.space",
        "segpipe.flags",
        "segpipe.status",
        "segpipe.results",
        "segpipe.repairs",
        "segpipe.vos",
        "segpipe.vos.inputs",
        "segpipe.vos.davis",
        "segpipe.vos.dataset",
        "segpipe.dask",
        "segpipe.dask.tasks",
        "segpipe.dask.client",
        "segpipe.runner",
        "segpipe.snapshot",
    ],
    # segpipe studio: the page's session over a store (no web), its previews, the web app
    "studio": [
        "segpipe.web",
        "segpipe.web.preview",
        "segpipe.web.session",
        "segpipe.web.app",
        "segpipe.web.server",
    ],
    "api": ["segpipe.api"],
    "cli": ["segpipe.cli", "segpipe"],
}
ORDER = [m for layer in LAYERS.values() for m in layer]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = ["segpipe", "stages"] if rel.parts[0] == "stages" else ["segpipe"]
    parts += list(rel.with_suffix("").parts[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for folder in ("pipeline", "stages")
        for p in sorted((ROOT / folder).rglob("*.py"))
    }


def type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under `if TYPE_CHECKING:`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports, anywhere in it."""
    tree = ast.parse(path.read_text())
    skip, found = type_checking_only(tree), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "segpipe"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "segpipe":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found - {name}


def test_every_module_has_a_layer():
    assert sorted(set(modules()) - set(ORDER)) == []
    assert sorted(set(ORDER) - set(modules())) == []


def test_imports_only_go_down():
    found = modules()
    rank = {m: i for i, m in enumerate(ORDER)}
    layer = {m: name for name, ms in LAYERS.items() for m in ms}
    upward = []
    for name, path in found.items():
        for dep in sorted(imports(name, path, set(found))):
            assert dep in rank, f"{name} imports {dep}, which is no module of segpipe"
            if rank[dep] > rank[name]:
                upward.append(f"{name} ({layer[name]}) imports {dep} ({layer[dep]})")
    assert upward == []


def test_the_walk_sees_function_level_imports(tmp_path):
    """The check itself: an import inside a function counts, one under TYPE_CHECKING not."""
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from segpipe.api import run\n"
        "def f():\n    from segpipe.stages import decode\n"
        "    from .store import runstore\n"
    )
    known = {"segpipe.stages.decode", "segpipe.store.runstore", "segpipe.api"}
    assert imports("segpipe.x", path, known) == {"segpipe.stages.decode", "segpipe.store.runstore"}


def test_a_module_imports_no_more_than_it_needs():
    """`import segpipe.errors` in a fresh process (what the CLI's error handling, the
    studio's, and a caller catching `segpipe.SegpipeError` import) loads neither the API nor
    its estimate, zarr or torch: the package's names are imported when first used. Then
    `segpipe.run` is there, the API with it."""
    import subprocess
    import sys

    code = (
        "import sys, segpipe.errors\n"
        "print(sorted(m for m in ('segpipe.api', 'segpipe.estimate', 'zarr', 'torch') "
        "if m in sys.modules))\n"
        "import segpipe\n"
        "print(callable(segpipe.run), 'segpipe.api' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True True"], out.stdout


def test_no_private_name_crosses_a_module():
    """A name with a leading underscore is its module's own: no other module of the package
    imports it (`from segpipe.m import _x`; a name two modules share is public)."""
    found = modules()
    crossing = []
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("segpipe"):
                crossing += [
                    f"{name} imports {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert crossing == []


TABLES: set[str] = set()  # functions longer than LONGEST that are declarative tables: none now
LONGEST = 60


def test_no_function_is_longer_than_a_screen():
    """Issue 46: no function of the package is over 60 lines (its docstring included), but
    declarative tables named in TABLES: a function one can read in one sitting."""
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = f"{name}.{node.name}"
                if lines > LONGEST and where not in TABLES:
                    long.append(f"{where} ({path.name}:{node.lineno}): {lines} lines")
    assert long == []
