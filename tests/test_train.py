"""data/train_tiny.py resumes: a run killed -9 between saves and run again ends with the same
weights, bit for bit, as a run never stopped (the training's data, dropout and schedule all
continue from the saved state), with the image-level prompt task on (`--prompt-frames`) and
the IoU head learning every mask's IoU (`--all-iou`)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

TRAIN = Path(__file__).resolve().parents[1] / "data" / "train_tiny.py"


def _command(out: Path, state: Path, *more: str) -> list[str]:
    return [sys.executable, str(TRAIN), "--out", str(out), "--state", str(state), "--steps", "6",
            "--frames", "2", "--size", "64", "--log-every", "2", "--prompt-frames", "1",
            "--all-iou", "--batch", "2", *more]  # fmt: skip


def _train_in_process(monkeypatch, tmp_path, out: Path, *more: str) -> None:
    """train_tiny's main in this process (its functions can be watched), on tiny clips; the
    torch thread count it sets is put back."""
    import train_tiny

    argv = ["train_tiny.py", "--out", str(out), "--state", str(tmp_path / f"{out.stem}.st")]
    argv += ["--frames", "2", "--size", "64", "--log-every", "1", *more]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        train_tiny.main()
    finally:
        torch.set_num_threads(threads)


def test_a_killed_training_continues_to_the_same_weights(tmp_path):
    """Two clips a step; the killed run draws its clips in 2 DataLoader processes, the
    straight one in its own: clip k is clip k, and the run's random state (dropout) is
    untouched by the loader."""
    straight = tmp_path / "straight.pt"
    subprocess.run(_command(straight, tmp_path / "s.state.pt"), check=True, capture_output=True)
    out, state = tmp_path / "resumed.pt", tmp_path / "r.state.pt"
    workers = ("--workers", "2")
    proc = subprocess.Popen(  # (its own group: the kill takes its workers too)
        _command(out, state, *workers),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not state.exists():  # the first save (step 2 of 6) has landed
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = torch.load(state, weights_only=False)["step"]
    assert saved < 6 and not out.exists(), "the kill did not land mid-run"
    again = subprocess.run(
        _command(out, state, *workers), check=True, capture_output=True, text=True
    )
    assert f"resuming at step {saved}" in again.stdout
    assert not state.exists()
    a, b = torch.load(straight, weights_only=True), torch.load(out, weights_only=True)
    assert a["steps"] == b["steps"] == 6
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_all_iou_supervises_every_masks_predicted_iou():
    """`Losses(all_iou=True)` (SAM 2.1's supervise_all_iou): the IoU head's loss covers the
    three masks, not only the chosen one: here the chosen mask is right and rated right, the
    two others wrong and rated perfect, which only the whole loss sees."""
    import train_tiny

    target = torch.zeros(1, 8, 8)
    target[0, 2:6, 2:6] = 1
    logits = torch.full((1, 3, 8, 8), -20.0)
    logits[0, 0][target[0] > 0] = 20.0  # mask 0 is the object; masks 1 and 2 are empty
    ious, score = torch.ones(1, 3), torch.full((1, 1), 10.0)
    chosen = train_tiny.frame_losses(logits, ious, score, target, train_tiny.Losses())
    every = train_tiny.frame_losses(logits, ious, score, target, train_tiny.Losses(all_iou=True))
    assert float(chosen["iou"]) == 0.0
    assert abs(float(every["iou"]) - 2 / 3) < 1e-6
    assert torch.equal(chosen["focal"], every["focal"]) and torch.equal(
        chosen["dice"], every["dice"]
    )


def test_a_bounded_sitting_of_batched_bfloat16_training_continues_to_the_same_weights(tmp_path):
    """The GPU recipe's path, run on the CPU: `--batch 2` clips a step under bfloat16 autocast
    (`--precision`, what `--device cuda` uses), a first sitting ended by `--minutes` after one
    step (the weights written, the state kept), then the command without the bound (not one
    of the run's settings): the weights of a run never stopped, float32 tensors that load on a CPU; autocast really ran (a float32 run's
    first step differs), and the history counts the clips seen (two a step)."""
    args = ["--batch", "2", "--precision", "bfloat16"]

    def train(name, *more):
        command = _command(tmp_path / f"{name}.pt", tmp_path / f"{name}.state.pt")
        command[command.index("--steps") + 1] = "3"
        return subprocess.run(command + list(more), check=True, capture_output=True, text=True)

    train("straight", *args)
    first = train("bounded", *args, "--minutes", "0.0001")  # one step, then the bound
    assert "run the same command to continue" in first.stdout
    state = tmp_path / "bounded.state.pt"
    assert torch.load(state, weights_only=False)["step"] == 1, "the bound did not end it mid-run"
    assert torch.load(tmp_path / "bounded.pt", weights_only=True)["steps"] == 1
    after_one = torch.load(state, weights_only=False)["model"]
    assert "resuming at step 1" in train("bounded", *args).stdout
    assert not state.exists()
    a = torch.load(tmp_path / "straight.pt", weights_only=True)
    b = torch.load(tmp_path / "bounded.pt", weights_only=True)
    assert a["steps"] == b["steps"] == 3 and a["history"][-1]["clips"] == 6
    for k in a["model"]:
        assert a["model"][k].dtype == torch.float32 and a["model"][k].device.type == "cpu", k
        assert torch.equal(a["model"][k], b["model"][k]), k
    train("float32", "--batch", "2", "--stop-after", "1")
    plain = torch.load(tmp_path / "float32.pt", weights_only=True)["model"]
    assert any(not torch.equal(plain[k], after_one[k]) for k in plain), "autocast did nothing"


def test_a_batched_step_takes_the_next_clips_and_a_later_run_the_ones_after(tmp_path, monkeypatch):
    """`--batch 3`: step k trains on clips 3k, 3k+1, 3k+2, each once; a run from its weights
    (`--init`) starts on the first clip it never saw (the history counts clips, not steps)."""
    import train_tiny

    taken, real = [], train_tiny.training_clip
    monkeypatch.setattr(
        train_tiny, "training_clip", lambda k, *a: (taken.append(k), real(k, *a))[1]
    )

    def main(out, *more):
        _train_in_process(monkeypatch, tmp_path, out, *more)

    main(tmp_path / "a.pt", "--steps", "2", "--batch", "3")
    assert taken == [0, 1, 2, 3, 4, 5]
    taken.clear()
    main(tmp_path / "b.pt", "--steps", "1", "--batch", "2", "--init", str(tmp_path / "a.pt"))
    assert taken == [6, 7]


def test_locality_and_speed_set_what_they_say_and_are_recorded(tmp_path, monkeypatch):
    """`--locality S` sets memory attention's shared pull to where the object was (the four
    bias entries of `look_where_it_was`, each sqrt(S)), after `--init` weights or on a fresh
    run, and nothing else; `--speed LO HI` draws each clip's motion scale from [LO, HI) (the
    default draw unchanged, so earlier runs repeat); the weights' history records both."""
    import numpy as np
    import train_tiny
    from synthetic import make_clip

    speeds, real = [], train_tiny.training_clip
    monkeypatch.setattr(
        train_tiny, "training_clip", lambda k, *a: (speeds.append(tuple(a[2])), real(k, *a))[1]
    )

    def main(out, *more):
        _train_in_process(monkeypatch, tmp_path, out, "--steps", "1", *more)

    main(tmp_path / "a.pt")
    # at lr 1e-9 AdamW's one step moves no weight by more than about 1e-9
    main(tmp_path / "b.pt", "--init", str(tmp_path / "a.pt"), "--lr", "1e-9",
         "--locality", "9", "--speed", "2", "2.5")  # fmt: skip
    main(tmp_path / "c.pt", "--lr", "1e-9", "--locality", "2.25")
    assert speeds == [(0.5, 1.5), (2.0, 2.5), (0.5, 1.5)]
    a, b, c = (torch.load(tmp_path / f"{n}.pt", weights_only=True)["model"] for n in "abc")
    shared = train_tiny.SHARED_BIAS
    names = [k for k in a if "memory_attention" in k and "cross_attn_image" in k]
    names = [k for k in names if k.endswith(("q_proj.bias", "k_proj.bias"))]
    assert len(names) == 4
    rest = torch.ones(64, dtype=torch.bool)
    rest[shared] = False
    for k in names:
        assert torch.allclose(a[k][shared], torch.full((4,), 10.0), atol=1e-2), k
        assert torch.allclose(b[k][shared], torch.full((4,), 3.0), atol=1e-6), k
        assert torch.allclose(c[k][shared], torch.full((4,), 1.5), atol=1e-6), k
        assert torch.allclose(b[k][rest], a[k][rest], atol=1e-6), k
        assert a[k][rest].abs().max() > 1e-5, k  # learned entries, kept
    for k in a:  # nothing else moved
        if k not in names:
            assert torch.allclose(b[k], a[k], atol=1e-6), k
    runs = [
        torch.load(tmp_path / f"{n}.pt", weights_only=True)["history"][-1]["run"] for n in "abc"
    ]
    assert runs[1]["locality"] == 9.0 and runs[1]["speed"] == [2.0, 2.5]
    assert runs[2]["locality"] == 2.25 and "speed" not in runs[2]
    assert "speed" not in runs[0] and "locality" not in runs[0]
    for k, bounds in ((5, (0.5, 1.5)), (6, (2.0, 2.5))):  # the draw, as before: one uniform
        rng = np.random.default_rng(10_000_000 + k)
        occluder, speed = bool(rng.random() < 0.3), float(rng.uniform(*bounds))
        _, masks = make_clip(k, 2, 64, 64, motions=("drift", "wave"), occluder=occluder,
                             speed=speed)  # fmt: skip
        clip = real(k, 2, 64, bounds)
        keep = masks[0].reshape(masks.shape[1], -1).sum(1) >= 16
        assert np.array_equal(clip[1].numpy(), masks[:, keep]), k
        assert clip[2].random() == rng.random(), k
    still = real(3, 4, 64, (0.0, 0.0))[1]  # the speed reaches the clip: at 0 nothing moves
    fast = real(3, 4, 64, (3.0, 3.0))[1]
    assert all(torch.equal(still[t], still[0]) for t in range(4))
    assert not all(torch.equal(fast[t], fast[0]) for t in range(4))


def test_a_batched_step_is_the_mean_of_its_clips_steps():
    """Issue 50: a step's clips go through the networks together (their frames one batch
    of the image encoder, their objects one batch of `_track_step` a frame, frame 0's by
    kind of prompt) and give the loss and gradients of the mean of each clip's step alone,
    within float tolerance. The clips: prompted by masks, two points (a box or a click and an
    outside one), a click, and masks again (so frame 0's kinds interleave and its outputs go
    back into the objects' order), SAM's image-level task on 2 frames each, and one with no
    object seen (it counts 0). Dropout is off: a batch draws its masks in other shapes.
    Tolerance: each gradient within 1e-4 of the largest one's size (an attention's key bias,
    whose true gradient is 0, gets float noise)."""
    import train_tiny

    model = train_tiny.build(0, 64)
    train_tiny.look_where_it_was(model)
    model.train()
    for m in model.modules():  # (SAM 2's attention drops out by its own `dropout_p`)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "dropout_p"):
            m.dropout_p = 0.0
    drawn = [train_tiny.draw(k, 3, 64, train_tiny.SPEED, 2, False) for k in (1, 2, 5, 6)]
    kinds = [d.first[1] is not None or d.first[0]["point_coords"].shape[1] for d in drawn]
    assert kinds == [True, 2, 1, True] and all(d.prompted for d in drawn)
    drawn.append(None)
    encoded, forward_image = [], model.forward_image
    model.forward_image = lambda x: (encoded.append(len(x)), forward_image(x))[1]

    def step(clips):
        model.zero_grad(set_to_none=True)
        loss, parts = train_tiny.step_loss(model, clips)
        loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads, parts

    batched, grads, parts = step(drawn)
    assert encoded == [4 * 3, 4 * 2]  # every clip's frames at once, then the picked frames
    assert len(parts) == 4 and all("prompted_iou" in p and "focal" in p for p in parts)
    alone = [step([d]) for d in drawn[:4]]
    mean = sum(loss for loss, _, _ in alone) / len(drawn)
    assert torch.allclose(batched, mean, rtol=1e-5), (batched, mean)
    assert len(grads) > 100 and grads.keys() == set().union(*(each for _, each, _ in alone))
    means = {  # (a clip prompted by masks gives the point encoder none)
        k: sum(each.get(k, torch.zeros_like(g)) for _, each, _ in alone) / len(drawn)
        for k, g in grads.items()
    }
    largest = max(float(m.abs().max()) for m in means.values())
    for k, g in grads.items():
        assert torch.allclose(g, means[k], rtol=1e-3, atol=1e-4 * largest), k
