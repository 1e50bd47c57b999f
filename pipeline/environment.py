"""The compute environment a result's last bits depend on, recorded in the store's model
record (`model.environment`) when the store is first computed, and checked before any later
computation of it (a resume, a new tracking, a repair, every Dask worker).

CPU results change in their last bits with torch's thread count and the instruction set its
kernels dispatch to (`torch.backends.cpu.get_cpu_capability()`); GPU results with the
device and the CUDA, cuDNN and torch versions. A store whose chunks came from two
environments equals no uninterrupted run, so another environment is refused in one line
naming the difference (`EnvironmentChanged`); `allow_env_change` (`--allow-env-change`)
continues, records the new environment in `model.environment_changes`, and says the result
is no longer bit-identical to an uninterrupted run (`segpipe status` says so too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from segpipe import log
from segpipe.errors import EnvironmentChanged

# what each key is called in a message, in the order it is said
NAMES = {
    "device": "device",
    "name": "device name",
    "torch": "torch",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "threads": "torch threads",
    "isa": "CPU capability",
}


def current(device: str) -> dict:
    """This process's environment for computing on `device` ("cpu", "cuda", "cuda:1",
    "mps"): at this moment's torch thread count, on CPU."""
    import torch

    kind = torch.device(device).type
    env = {"device": kind, "torch": torch.__version__}
    if kind == "cuda":
        env["name"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    elif kind == "cpu":
        env["name"] = _cpu_name()
        env["threads"] = torch.get_num_threads()
        env["isa"] = torch.backends.cpu.get_cpu_capability()
    return env


def _cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else the machine type."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def differences(recorded: dict, now: dict, where=("in the store", "here")) -> list[str]:
    """Each key that differs, said as `torch threads 2 in the store, 1 here` (`where`)."""
    keys = [k for k in NAMES if k in recorded or k in now]
    keys += sorted(k for k in {*recorded, *now} if k not in NAMES)
    return [
        f"{NAMES.get(k, k)} {recorded.get(k, 'none')} {where[0]}, {now.get(k, 'none')} {where[1]}"
        for k in keys
        if recorded.get(k) != now.get(k)
    ]


def said(env: dict) -> str:
    """One environment in a line: `cpu (Intel Xeon, AVX2), 2 torch threads, torch 2.13.0`."""
    if env["device"] == "cpu":
        return (
            f"cpu ({env.get('name')}, {env.get('isa')}), "
            f"{log.count(env.get('threads', 0), 'torch thread')}, torch {env['torch']}"
        )
    if env["device"] == "cuda":
        return (
            f"cuda ({env.get('name')}), torch {env['torch']}, CUDA {env.get('cuda')}, "
            f"cuDNN {env.get('cudnn')}"
        )
    return f"{env['device']}, torch {env['torch']}"


@dataclass(frozen=True)
class Work:
    """Where a stage's work computes: its environment `env`, the `place` a message names
    ("here", "on the Dask workers"), and `others`, further environments of Dask workers
    that differ from the first (allowed by `--allow-env-change` when the cluster started)."""

    env: dict
    place: str = "here"
    others: tuple = ()


def check(store, work: Work, allow: bool = False, quiet: bool = False, record: bool = True):
    """Before computing into `store` (whose model record exists) as `work` does: a store
    recorded in another environment is refused (`EnvironmentChanged`), or with `allow` said
    and recorded among its changes (with `work.others`); an environment it has been computed
    in before passes. A store that has no record yet (made before segpipe recorded one)
    takes this one, marked as recorded late. `record` False: check only, write nothing."""
    model = store.attrs["model"]
    recorded, changes = model.get("environment"), model.get("environment_changes", [])
    if recorded is None:
        if record:
            store.set_attrs(model={**model, "environment": work.env, "environment_late": True})
        return
    new = [e for e in (work.env, *work.others) if e != recorded and e not in changes]
    if not new:
        return
    changed = differences(recorded, new[0], ("in the store", work.place))
    if not allow:
        raise EnvironmentChanged(
            f"store {store.path} was computed in another environment ({'; '.join(changed)}): "
            f"going on here would mix bits from both, equal to no uninterrupted run; run it "
            f"where it was made, or pass --allow-env-change"
        )
    if record:
        log.warn(
            f"the environment changed ({'; '.join(changed)}): going on as --allow-env-change "
            f"asks; the results are no longer bit-identical to an uninterrupted run"
        )
        store.set_attrs(model={**model, "environment_changes": [*changes, *new]})


def mixed(model: dict | None) -> bool:
    """Whether the store's chunks were computed in more than one environment."""
    return bool((model or {}).get("environment_changes"))


def of_work(device: str, predictor=None, cluster=None) -> Work:
    """Where a stage's work computes: on the Dask workers (`cluster.environments`), else on
    the predictor's device, else on `device`, here."""
    if cluster is not None:
        first, *others = cluster.environments
        return Work(first, "on the Dask workers", tuple(others))
    if predictor is not None:
        return Work(current(str(predictor.device)))
    from segpipe.model import pick_device

    return Work(current(pick_device(device)))
