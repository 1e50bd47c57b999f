"""A wheel built from the repository offers the demo model with its weights: installed into a
fresh venv that sees the project's dependencies but not this checkout, `segpipe run --model
segpipe_tiny` works there from the weights inside the installed package.

The venv: `python -m venv --without-pip`, plus a `.pth` file in its site-packages listing the
site-packages of the interpreter running the tests (torch, sam2, zarr, av, ...). Python adds a
directory listed in a `.pth` file to sys.path without processing the `.pth` files inside it, so
the editable install's finder (a `.pth` there) never runs: `import segpipe` fails in the venv
until the wheel is installed (checked), and afterwards no module it loads comes from here.
The wheel is built from a copy of the source tree without build outputs: setuptools builds in
the tree (build/lib, segpipe.egg-info), and files left there by an earlier build would reach
the wheel whatever pyproject says. pip never asks an index (--no-index)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import make_sample
import pytest
from conftest import ROOT, read_checked

FRAMES, WIDTH, HEIGHT = 8, 96, 72
WEIGHTS = ROOT / "pipeline" / "weights" / "segpipe_tiny.pt"
# what the venv reports: where segpipe and the shipped files are, and every loaded module's file
PROBE = """
import json, sys
out = {"finders": [getattr(f, "__module__", "") for f in sys.meta_path]}  # classes, instances
try:
    import segpipe, segpipe.cli, segpipe.models.sam2.catalog, segpipe.stages.track
except ImportError as e:
    out["error"] = repr(e)
else:
    out["file"] = segpipe.__file__
    out["shipped"] = [str(p) for p in segpipe.models.sam2.catalog.SHIPPED["segpipe_tiny"]]
import sam2, zarr, av  # the project's dependencies, from the tests' interpreter's site-packages
out["modules"] = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())})
print(json.dumps(out))
"""


def clean_env(**extra) -> dict:
    """No PYTHONPATH (or any PYTHON* setting), no user site, no pip configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    return {**env, "PYTHONNOUSERSITE": "1", "PIP_CONFIG_FILE": os.devnull, **extra}


def run(args, cwd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def probe(python: Path, cwd: Path) -> dict:
    return json.loads(run([python, "-c", PROBE], cwd).stdout)


def inside(path: str, folder: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """The venv: its python, its site-packages, the dependencies' site-packages it lists, what
    it saw before the wheel was installed and after, and a work folder outside the repo."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(
        ROOT,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*cache",
            ".whl",
            "*.partial.pt",
            "*.tmp",
        ),
    )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            tmp / "dist",
            src,
        ],
        tmp,
    )
    (wheel,) = (tmp / "dist").glob("segpipe-*.whl")

    run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], tmp)
    python = tmp / "venv" / "bin" / "python"
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp
        ).stdout.strip()
    )
    deps = run(
        [sys.executable, "-c", "import site; print('\\n'.join(site.getsitepackages()))"], tmp
    ).stdout.splitlines()
    (site / "segpipe_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    work = tmp / "work"  # outside the repository: nothing of it on sys.path via the cwd
    work.mkdir()
    before = probe(python, work)

    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "--target",
            site,
            wheel,
        ],
        tmp,
    )
    return SimpleNamespace(
        python=python, site=site, deps=deps, before=before, after=probe(python, work), work=work
    )


def from_checkout(venv, modules) -> list[str]:
    """The modules loaded from this repository (its .venv, where the dependencies are, aside)."""
    return [
        m for m in modules if m and inside(m, ROOT) and not any(inside(m, d) for d in venv.deps)
    ]


def test_the_venv_does_not_see_the_checkout(venv):
    """Before the wheel: no segpipe, no editable finder, but the dependencies import."""
    before = venv.before
    assert "error" in before and "segpipe" in before["error"], before
    assert not any("editable" in f for f in before["finders"]), before["finders"]
    assert from_checkout(venv, before["modules"]) == []
    assert any(inside(m, d) for m in before["modules"] if m for d in venv.deps)


def test_the_wheel_is_what_the_venv_imports(venv):
    after = venv.after
    assert "error" not in after, after
    assert inside(after["file"], venv.site) and not inside(after["file"], ROOT), after["file"]
    assert not any("editable" in f for f in after["finders"]), after["finders"]
    assert from_checkout(venv, after["modules"]) == []


def test_the_wheel_ships_the_config_the_weights_and_the_studio_page(venv):
    site, after = venv.site, venv.after
    config, weights = map(Path, after["shipped"])
    assert inside(config, site) and config.is_file()
    installed = sorted(
        str(p.relative_to(site))
        for p in (site / "segpipe").rglob("*")
        if "__pycache__" not in p.parts
    )
    assert inside(weights, site) and weights.is_file(), installed
    assert weights.read_bytes() == WEIGHTS.read_bytes()
    page = ROOT / "pipeline" / "web" / "static"  # and segpipe studio's page
    shipped = {p.name: p.read_bytes() for p in (site / "segpipe" / "web" / "static").iterdir()}
    assert shipped == {p.name: p.read_bytes() for p in page.iterdir()}, installed


def test_the_installed_model_runs_from_its_shipped_weights(venv):
    """`segpipe run --model segpipe_tiny` (no --checkpoint) in the venv, one click on the clip's
    third shape: it exits 0, the store records the shipped weights, and the shape is followed
    (IoU about 0.82 over the tracked frames; random weights: 0)."""
    python, work = venv.python, venv.work
    frames, masks = make_sample.make_clip(num_frames=FRAMES, width=WIDTH, height=HEIGHT, seed=1)
    make_sample.write_video(work / "clip.mp4", frames)
    truth = masks[:, 2]
    point = make_sample.centroid(truth[0])
    (work / "prompts.json").write_text(
        json.dumps({"prompts": [{"object": 1, "frame": 0, "points": [point], "labels": [1]}]})
    )
    store = work / "clip.zarr"
    run(
        [
            python,
            "-m",
            "segpipe.cli",
            "run",
            "clip.mp4",
            "--store",
            store,
            "--prompts",
            "prompts.json",
            "--model",
            "segpipe_tiny",
            "--image-size",
            128,
            "--chunk-size",
            4,
            "--export",
            "none",
            "--quiet",
        ],
        work,
    )
    import zarr

    model = zarr.open_group(str(store), mode="r").attrs["model"]
    assert model["name"] == "segpipe_tiny"
    sha256 = hashlib.sha256(WEIGHTS.read_bytes()).hexdigest()
    assert model["weights"] == {"checkpoint_sha256": sha256}
    got = read_checked(store, "masks")
    assert got.shape == (FRAMES, 1, HEIGHT, WIDTH) and read_checked(store, "tracked").all()
    inter = (got[1:, 0] & truth[1:]).sum()
    union = (got[1:, 0] | truth[1:]).sum()
    assert inter / union >= 0.6, inter / union
