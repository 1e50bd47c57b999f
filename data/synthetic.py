"""Synthetic tracking clips with ground truth: textured objects that move, turn, grow and
occlude one another over a cluttered background, plus untracked distractors.

Everything is drawn from one seed (`numpy.random.default_rng(seed)`), so a clip is the same on
every machine. `make_clip` returns frames (T, H, W, 3) uint8 and the tracked objects' visible
masks (T, O, H, W) bool (an object hidden by another one in front has no pixels there).

Motions: "drift" (constant velocity, turning and scaling), "wave" (drift plus a sinusoid),
"orbit" (round an ellipse) and "bounce" (constant velocity, reflected at the borders).
`data/train_tiny.py` trains on "drift" and "wave"; the held-out clips of
`benchmarks/bench_quality.py` use "orbit" and "bounce", other seeds and a forced occlusion.
"""

from __future__ import annotations

import numpy as np

MOTIONS = ("drift", "wave", "orbit", "bounce")
SHAPES = ("ellipse", "box", "blob")
TEXTURES = ("solid", "stripes", "checker", "noise")


def make_clip(
    seed: int,
    num_frames: int = 8,
    height: int = 256,
    width: int = 256,
    num_objects: int | None = None,
    motions=("drift", "wave"),
    distractors: int | None = None,
    occluder: bool = False,
    speed: float = 1.0,
):
    """A clip and its ground truth. `num_objects` tracked objects (1-3 drawn by the seed when
    None), `distractors` untracked moving ones (0-3), `occluder` adds one untracked object
    that crosses in front of tracked object 1 half-way through the clip."""
    rng = np.random.default_rng(seed)
    O = int(rng.integers(1, 4)) if num_objects is None else num_objects
    D = int(rng.integers(0, 4)) if distractors is None else distractors
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    background = _background(rng, yy, xx)
    scale = min(height, width) / 256
    things = [
        _thing(rng, height, width, scale, rng.choice(motions), num_frames, speed)
        for _ in range(O + D)
    ]
    if occluder:
        things.append(_occluder(rng, things[0], num_frames, scale))
    depth = rng.permutation(len(things))  # drawing order: later is in front
    if occluder:  # the occluder is drawn last, in front of everything
        depth = np.concatenate([depth[depth != len(things) - 1], [len(things) - 1]])
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    masks = np.zeros((num_frames, O, height, width), bool)
    gain = rng.uniform(0.85, 1.15)
    for t in range(num_frames):
        img = background.copy()
        owner = np.full((height, width), -1, np.int16)
        for i in depth:
            inside, colour = things[i].draw(t, yy, xx)
            img[inside] = colour[inside]
            owner[inside] = i
        for o in range(O):
            masks[t, o] = owner == o
        noise = rng.normal(0, 3.0, img.shape)
        frames[t] = np.clip(img * gain + noise, 0, 255).astype(np.uint8)
    return frames, masks


def _background(rng, yy, xx):
    """A smooth colour field, low-frequency texture and clutter shapes that stay put."""
    h, w = yy.shape
    base = rng.uniform(40, 200, 3)
    tilt = rng.uniform(-60, 60, (2, 3))
    img = base + tilt[0] * (yy[..., None] / h - 0.5) + tilt[1] * (xx[..., None] / w - 0.5)
    for _ in range(3):  # waves
        f = rng.uniform(0.02, 0.12, 2)
        img = (
            img
            + rng.uniform(5, 25, 3) * np.sin(f[0] * yy + f[1] * xx + rng.uniform(0, 6.3))[..., None]
        )
    for _ in range(int(rng.integers(4, 12))):  # clutter
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(6, 30) * min(h, w) / 256
        shape = rng.choice(SHAPES)
        inside = _inside(
            shape, (yy - cy) / r, (xx - cx) / r, rng.uniform(0.5, 1.5), _blob_coeffs(rng)
        )
        img[inside] = _texture(rng, rng.choice(TEXTURES))((yy - cy) / r, (xx - cx) / r)[inside]
    return np.clip(img, 0, 255).astype(np.float32)


class _Thing:
    """A textured shape with a path: centre, angle and scale per frame."""

    def __init__(self, shape, aspect, coeffs, texture, radius, path):
        self.shape, self.aspect, self.coeffs = shape, aspect, coeffs
        self.texture, self.radius, self.path = texture, radius, path

    def draw(self, t, yy, xx):
        cy, cx, angle, scale = self.path[t]
        r = self.radius * scale
        dy, dx = (yy - cy) / r, (xx - cx) / r
        c, s = np.cos(angle), np.sin(angle)
        v, u = c * dy - s * dx, s * dy + c * dx  # object coordinates: the texture moves with it
        return _inside(self.shape, v, u, self.aspect, self.coeffs), self.texture(v, u)


def _thing(rng, h, w, scale, motion, T, speed):
    radius = rng.uniform(12, 34) * scale
    shape = rng.choice(SHAPES)
    y0, x0 = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w
    v = rng.normal(0, 2.5 * scale * speed, 2)
    spin, grow = rng.normal(0, 0.04 * speed), rng.normal(0, 0.01 * speed)
    angle0 = rng.uniform(0, 2 * np.pi)
    t = np.arange(T, dtype=np.float64)
    if motion in ("drift", "wave"):
        y, x = y0 + v[0] * t, x0 + v[1] * t
        if motion == "wave":
            amp, freq, phase = (
                rng.uniform(5, 25) * scale,
                rng.uniform(0.1, 0.5) * speed,
                rng.uniform(0, 6.3, 2),
            )
            y, x = y + amp * np.sin(freq * t + phase[0]), x + amp * np.cos(freq * t + phase[1])
    elif motion == "orbit":
        ry, rx = rng.uniform(0.1, 0.3) * h, rng.uniform(0.1, 0.3) * w
        omega, phase = rng.choice([-1, 1]) * rng.uniform(0.04, 0.12) * speed, rng.uniform(0, 6.3)
        y, x = h / 2 + ry * np.sin(omega * t + phase), w / 2 + rx * np.cos(omega * t + phase)
    elif motion == "bounce":
        y, x = _reflect(y0 + 1.6 * v[0] * t, h), _reflect(x0 + 1.6 * v[1] * t, w)
    else:
        raise ValueError(f"unknown motion {motion!r}")
    path = np.stack([y, x, angle0 + spin * t, np.clip(1 + grow * t, 0.6, 1.6)], 1)
    return _Thing(
        shape,
        rng.uniform(0.5, 1.6),
        _blob_coeffs(rng),
        _texture(rng, rng.choice(TEXTURES)),
        radius,
        path,
    )


def _occluder(rng, target, T, scale):
    """An untracked bar that passes over `target`'s centre at mid-clip, moving across it."""
    mid = T // 2
    cy, cx = target.path[mid, 0], target.path[mid, 1]
    direction = rng.normal(0, 1, 2)
    direction /= np.linalg.norm(direction)
    span = np.arange(T) - mid
    step = 2.2 * target.radius * target.path[mid, 3] / max(mid, 1)
    path = np.stack(
        [
            cy + direction[0] * step * span,
            cx + direction[1] * step * span,
            np.full(T, np.arctan2(direction[0], direction[1])),
            np.ones(T),
        ],
        1,
    )
    radius = 1.3 * target.radius * target.path[mid, 3]
    return _Thing("box", 0.45, _blob_coeffs(rng), _texture(rng, rng.choice(TEXTURES)), radius, path)


def _reflect(p, size):
    lo, hi = 0.1 * size, 0.9 * size
    span = hi - lo
    q = np.mod(p - lo, 2 * span)
    return lo + np.where(q > span, 2 * span - q, q)


def _blob_coeffs(rng):
    return rng.uniform(0, 0.25, 3), rng.uniform(0, 2 * np.pi, 3)


def _inside(shape, v, u, aspect, coeffs):
    if shape == "ellipse":
        return v * v + (u / aspect) ** 2 <= 1
    if shape == "box":
        return (np.abs(v) <= 0.85) & (np.abs(u) <= 0.85 * aspect)
    amp, phase = coeffs
    theta = np.arctan2(v, u)
    edge = 1 + sum(a * np.cos((k + 2) * theta + p) for k, (a, p) in enumerate(zip(amp, phase)))
    return np.hypot(v, u / aspect) <= edge


def _texture(rng, kind):
    """A colouring function of object coordinates, (v, u) -> (..., 3) float."""
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    if kind == "solid":
        return lambda v, u: np.broadcast_to(a, v.shape + (3,))
    if kind == "stripes":
        f, turn = rng.uniform(2, 6), rng.uniform(0, np.pi)
        return lambda v, u: np.where(
            (np.sin(f * (np.cos(turn) * v + np.sin(turn) * u)) > 0)[..., None], a, b
        )
    if kind == "checker":
        f = rng.uniform(1.5, 4)
        return lambda v, u: np.where(
            ((np.floor(f * v) + np.floor(f * u)) % 2 == 0)[..., None], a, b
        )
    table = rng.uniform(0, 1, (8, 8))  # noise: a coarse random pattern between two colours

    def noise(v, u):
        i = np.clip(((v + 1.6) * 2.5).astype(int), 0, 7)
        j = np.clip(((u + 1.6) * 2.5).astype(int), 0, 7)
        return a + table[i, j][..., None] * (b - a)

    return noise
