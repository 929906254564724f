"""Pathfinder generator (Linsley et al. 2018, "pathfinder" as used by LRA; Path-X = 128x128, Path-256).

    python -m train.lra.pathfinder --resolution 128 --difficulty hard --num 200000 --seed 0 --out data/pathx

An image holds two target curves and some distractor curves, each a chain of short dashes ("paddles")
grown one by one: the next dash turns at the centre of the gap after the last one, its direction drawn
with weight cos(min(|dtheta| * continuity, pi/2))^2 (so turns stay under 90 degrees) among the
directions whose dash keeps a minimum distance from every other dash. Two circular markers sit on curve
ends: label 1 when they are the two ends of one target curve, 0 when they are the start of one target
curve and the far end of the other. The two target curves start `seed_distance` apart and always have
the same length, so positives and negatives are built the same way and differ only in which ends carry
the markers; mean intensity and the number of lit pixels do not give the label away, nor does the
marker distance at 32x32 (tests/test_lra_pathfinder.py checks all three). Curves are drawn at 2x as
anti-aliased capsules (a distance field over each dash's small bounding box) and averaged down 2x2.

Departures from the original generator (drewlinsley/pathfinder, snakes2.py), all on purpose:
- overlap is tested exactly: centre lines of different curves keep 2 * margin + thickness (the
  original's "dash dilated by the margin may not touch the mask dilated by the margin", there on
  rasters), found through a spatial hash in plain Python floats: a step tests a handful of dashes, where
  numpy's per-call cost would dominate;
- a target curve that runs into the border or another curve backs up 1-3 dashes instead of restarting
  the pair (restarts almost never succeed at 64x64: a 14-dash curve is 1.6x the canvas width);
- no dash of another curve comes within marker_radius + 2 * margin + thickness / 2 of a target end, so a
  marker never touches a foreign curve (the original sometimes drew markers over distractors);
- the canvas is a float image, scaled so that its brightest pixel is 255, as the original saves it.
  Intensities follow the original: distractors at snake_contrast, the two target curves at snake_contrast
  x paddle_contrast, markers at 1. At 32x32 (snake 2, paddle 0.75) the targets are thus 3/4 as bright as the
  distractors, a cue the released images carry too; at the other sizes all curves are alike.

Sample i is a pure function of (seed, i) (numpy Generator seeded with both), so any split of the work
over processes writes identical bytes. Labels come in pairs (2k, 2k + 1) with one positive each, in an
order drawn from (seed, k): an even count is exactly balanced, and so is every even-aligned index range.

API: `generate(...)` -> out_dir/{images.npy, labels.npy, meta.json} (cached by a stamp of the settings
and GENERATOR_VERSION; an interrupted run resumes from its progress.json), `load(out_dir)`, `split(n)` (80/10/10 by index), `load_original(folder)` (the
LRA release layout: imgs/<batch>/sample_<k>.png plus metadata/<batch>.npy text lines), `sample(...)`
(one image; debug=True adds the curves), `save_preview(...)` (results/lra/pathfinder_preview_R.png).

Speed, hard, one process: 55 / 35 / 49 / 62 images per CPU-second at 32 / 64 / 128 / 256 (2-core CPU
box, 2026-11), so 200K images take about 4-6 minutes on 16 cores. 64x64 is the slowest: its curves are
the longest for the canvas and back up most.

Known limits: the marker distance carries a trace of the label where curves are short for the canvas
(128x128: mean 67 px in positives, 72 px in negatives, sd 21; a threshold gets ~55%), as in the
original: a negative's markers are one curve's length plus the seed distance apart. Distractors that
cannot be placed after a few tries are skipped (as in the original), so their number varies a little.
Markers on a curve end at the border are clipped by it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 2  # bump when a change alters the images; it is part of the cache stamp
DIFFICULTY = {"easy": 6, "intermediate": 9, "hard": 14}  # contour length in dashes
ORIGINAL_DIRS = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
AA = 2  # drawn at 2x, then averaged down


@dataclass(frozen=True)
class Settings:
    """One row of SETTINGS; lengths are in output pixels."""

    dash_length: int  # paddle_length: length of one dash's centre line
    thickness: float  # paddle_thickness: stroke width
    margins: tuple  # paddle_margin_list: gap after a dash is 2 * margin; one margin drawn per image
    marker_radius: float  # radius of the two circular markers
    seed_distance: int  # distance between the two target curves' starts; first start >= 2x this from the border
    continuity: float  # turn prior: weight cos(min(|dtheta| * continuity, pi/2))^2
    distractor_budget: int  # num distractor curves = budget // distractor length (Python 2 integer division)
    snake_contrast: float  # snake_contrast_list: every curve's intensity (markers are 1)
    paddle_contrast: float  # paddle_contrast_list: a further factor on the two target curves only
    padding: int = 1  # empty border


# From DATA.md / the LRA TFDS builders' docstrings (the settings the released images were made with).
SETTINGS = {
    32: Settings(2, 0.5, (1,), 1.5, 7, 1.0, 20, 2.0, 0.75),
    64: Settings(5, 1.0, (1,), 2.5, 12, 1.8, 22, 0.8, 1.0),  # paddle contrast: snakes2_wrapper's default 1
    128: Settings(5, 1.5, (2, 3), 3.0, 20, 1.8, 35, 0.9, 1.0),
    256: Settings(5, 2.0, (3,), 5.0, 27, 1.8, 30, 1.0, 1.0),
}


def _config(resolution: int, difficulty: str) -> dict:
    if resolution not in SETTINGS:
        raise ValueError(f"resolution must be one of {sorted(SETTINGS)}, got {resolution}")
    if difficulty not in DIFFICULTY:
        raise ValueError(f"difficulty must be one of {sorted(DIFFICULTY)}, got {difficulty!r}")
    s = SETTINGS[resolution]
    contour = DIFFICULTY[difficulty]
    distractor_len = contour // 3  # the original ran under Python 2: 14 / 3 == 4
    if 2 * min(s.margins) + s.thickness <= s.dash_length / 2:
        raise ValueError("gap <= dash / 2: _seg_seg would miss crossing dashes")
    return dict(resolution=resolution, difficulty=difficulty, contour_length=contour,
                distractor_length=distractor_len, num_distractors=s.distractor_budget // distractor_len,
                aa=AA, **asdict(s))


# ---------------------------------------------------------------- geometry

def _point_seg_dist(py, px, ay, ax, by, bx):
    """Distance from points p to segments a-b, numpy arrays broadcast against each other."""
    dy, dx = by - ay, bx - ax
    t = np.clip(((py - ay) * dy + (px - ax) * dx) / np.maximum(dy * dy + dx * dx, 1e-12), 0.0, 1.0)
    ey, ex = py - ay - t * dy, px - ax - t * dx
    return np.sqrt(ey * ey + ex * ex)


def _pt_seg(py, px, ay, ax, by, bx):
    """One point to one segment in plain floats: a curve step tests a handful of pairs, where numpy's
    per-call cost would dominate."""
    dy, dx = by - ay, bx - ax
    t = ((py - ay) * dy + (px - ax) * dx) / max(dy * dy + dx * dx, 1e-12)
    t = 0.0 if t < 0 else 1.0 if t > 1 else t
    ey, ex = py - ay - t * dy, px - ax - t * dx
    return math.sqrt(ey * ey + ex * ex)


def _seg_seg(ay, ax, by, bx, cy, cx, dy, dx):
    """Distance between segments a-b and c-d from their endpoints. It misses a crossing, which cannot
    happen below the gap tested (gap > dash / 2, checked in _config)."""
    return min(_pt_seg(ay, ax, cy, cx, dy, dx), _pt_seg(by, bx, cy, cx, dy, dx),
               _pt_seg(cy, cx, ay, ax, by, bx), _pt_seg(dy, dx, ay, ax, by, bx))


class _Canvas:
    """Dashes placed so far (exact centre lines in a spatial hash) and the target ends markers sit on.

    A dash fits when it lies inside the padded border, its centre line keeps `gap` = 2 * margin +
    thickness from every other curve's dashes and from its own but the one just before (the original's
    "dash dilated by the margin may not touch the mask dilated by the margin", made exact), and keeps
    `clear` from the target ends of other curves, so a marker never touches a foreign curve."""

    def __init__(self, cfg: dict, margin: int):
        self.cfg, self.margin = cfg, margin
        self.L, self.th = cfg["dash_length"], cfg["thickness"]
        self.gap = 2 * margin + self.th
        self.clear = cfg["marker_radius"] + 2 * margin + self.th / 2
        self.lo = cfg["padding"] + self.th / 2
        self.hi = cfg["resolution"] - self.lo
        self.bucket = self.L + self.gap  # dashes closer than gap have midpoints in neighbouring buckets
        self.grid: dict[tuple[int, int], list[int]] = {}
        self.dash: list[tuple[float, float, float, float, int]] = []  # (ay, ax, by, bx, curve)
        self.alive: list[bool] = []
        self.tips: list[tuple[float, float, int]] = []  # (y, x, curve) of target ends

    def _key(self, ay, ax, by, bx):
        return int((ay + by) / 2 // self.bucket), int((ax + bx) / 2 // self.bucket)

    def near(self, ay, ax, by, bx, reach=1):
        ky, kx = self._key(ay, ax, by, bx)
        for dy in range(-reach, reach + 1):
            for dx in range(-reach, reach + 1):
                yield from self.grid.get((ky + dy, kx + dx), ())

    def fits(self, ay, ax, by, bx, curve, prev=-1):
        lo, hi = self.lo, self.hi
        if not (lo <= ay <= hi and lo <= ax <= hi and lo <= by <= hi and lo <= bx <= hi):
            return False
        for ty, tx, c in self.tips:
            if c != curve and _pt_seg(ty, tx, ay, ax, by, bx) < self.clear:
                return False
        for j in self.near(ay, ax, by, bx):
            if j != prev and _seg_seg(ay, ax, by, bx, *self.dash[j][:4]) < self.gap:
                return False
        return True

    def end_clear(self, y, x, curve):
        """A target end must keep `clear` from the dashes of other curves as well."""
        reach = int(math.ceil((self.clear + self.L) / self.bucket))
        for j in self.near(y, x, y, x, reach):
            if self.dash[j][4] != curve and _pt_seg(y, x, *self.dash[j][:4]) < self.clear:
                return False
        return True

    def add(self, ay, ax, by, bx, curve):
        self.dash.append((ay, ax, by, bx, curve))
        self.alive.append(True)
        self.grid.setdefault(self._key(ay, ax, by, bx), []).append(len(self.dash) - 1)
        return len(self.dash) - 1

    def remove(self, j):
        self.alive[j] = False
        self.grid[self._key(*self.dash[j][:4])].remove(j)

    def dashes(self):
        """(a (n, 2), b (n, 2), curve (n,)) of the dashes in place."""
        d = np.asarray([x for x, keep in zip(self.dash, self.alive) if keep], np.float64).reshape(-1, 5)
        return d[:, 0:2], d[:, 2:4], d[:, 4].astype(np.int64)


class _Curve:
    """A chain of dashes; `history` holds (dash, pivot y, pivot x, theta) so that it can back up."""

    def __init__(self, canvas: _Canvas, curve: int, continuity: float):
        self.c, self.id = canvas, curve
        self.history: list[tuple] = []
        self.start = None
        k = max(16, int(math.ceil(2 * math.pi * (canvas.L + canvas.margin))))  # ~1 candidate per pixel of arc
        self.dphi = 2 * math.pi / k
        # the prior over the turn on the candidate grid: cos(min(|dtheta| * continuity, pi/2))^2
        self.turns = [t * self.dphi for t in range(-(k // 2), k // 2 + 1) if abs(t * self.dphi) * continuity < math.pi / 2]
        self.prior = [math.cos(t * continuity) ** 2 for t in self.turns]

    def __len__(self):
        return len(self.history)

    @property
    def end(self):
        d = self.c.dash[self.history[-1][0]]
        return np.array(d[2:4])

    def seed(self, ty, tx, theta):
        c = self.c
        hy, hx = ty + c.L * math.sin(theta), tx + c.L * math.cos(theta)
        if not c.fits(ty, tx, hy, hx, self.id):
            return False
        self.start = np.array([ty, tx])
        self.history = [(c.add(ty, tx, hy, hx, self.id), hy + c.margin * math.sin(theta), hx + c.margin * math.cos(theta), theta)]
        return True

    def extend(self, rng, final=False):
        """Add one dash after the gap, its turn drawn from the prior among the turns that fit (draw, and
        redraw without the misfits: the same as drawing from the prior restricted to what fits)."""
        c = self.c
        last, py, px, theta = self.history[-1]
        step = c.L + c.margin
        jitter = (rng.random() - 0.5) * self.dphi  # off the grid, so that no direction is preferred
        w = list(self.prior)
        total = sum(w)
        draws = rng.random(len(w))
        for u in draws:
            r, j = u * total, 0
            while j < len(w) - 1 and r >= w[j]:
                r -= w[j]
                j += 1
            phi = theta + self.turns[j] + jitter
            sy, sx = math.sin(phi), math.cos(phi)
            ay, ax, by, bx = py + c.margin * sy, px + c.margin * sx, py + step * sy, px + step * sx
            if c.fits(ay, ax, by, bx, self.id, prev=last) and (not final or c.end_clear(by, bx, self.id)):
                self.history.append((c.add(ay, ax, by, bx, self.id), by + c.margin * sy, bx + c.margin * sx, phi))
                return True
            total -= w[j]
            w[j] = 0.0
            if total <= 1e-9:
                break
        return False

    def back(self, steps, keep=1):
        """Take off up to `steps` dashes, keeping at least `keep`."""
        for _ in range(min(steps, len(self.history) - keep)):
            self.c.remove(self.history.pop()[0])


def _targets(rng, cfg, margin, max_backs=40):
    """Two target curves of contour_length dashes, grown in turns. A curve that cannot go on backs up
    1-3 dashes and tries again: plain restarts, as in the original, almost
    never succeed at 64x64, where a 14-dash curve is 1.6x the canvas width and most random walks run
    into the border. Returns (canvas, curves) or None."""
    c = _Canvas(cfg, margin)
    r, sd = cfg["resolution"], cfg["seed_distance"]
    start0 = rng.uniform(2 * sd, r - 2 * sd, size=2) if r > 4 * sd else np.full(2, r / 2) + rng.uniform(-1, 1, 2)
    psi = rng.uniform(0, 2 * math.pi)
    start1 = start0 + sd * np.array([math.sin(psi), math.cos(psi)])
    curves = [_Curve(c, 0, cfg["continuity"]), _Curve(c, 1, cfg["continuity"])]
    c.tips = [(*start0, 0), (*start1, 1)]
    for cur, s in zip(curves, (start0, start1)):
        if not any(cur.seed(*s, t) for t in rng.uniform(-math.pi, math.pi, 8)):
            return None
    n, backs = cfg["contour_length"], 0
    while len(curves[0]) < n or len(curves[1]) < n:
        cur = curves[0] if len(curves[0]) <= len(curves[1]) else curves[1]  # in turns: neither gets the room first
        final = len(cur) == n - 1
        if cur.extend(rng, final=final):
            if final:
                c.tips.append((*cur.end, cur.id))
            continue
        backs += 1
        if backs > max_backs or len(cur) == 1:
            return None
        cur.back(int(rng.integers(1, 4)))
    return c, curves


def _distractors(rng, c: _Canvas, cfg, tries=20, seeds=64):
    # 20 x 64 start points: at 32x32 hard 4.2 of the 5 distractors fit on average (4 x 16 placed 3.2; the
    # original, whose curves may touch, ~4.7), at 64 and 128 nearly all.
    for d in range(cfg["num_distractors"]):
        cur = _Curve(c, 2 + d, cfg["continuity"])
        for _ in range(tries):
            tails = rng.uniform(c.lo, c.hi, size=(seeds, 2))
            thetas = rng.uniform(-math.pi, math.pi, size=seeds)
            if not any(cur.seed(ty, tx, t) for (ty, tx), t in zip(tails.tolist(), thetas.tolist())):
                continue
            if all(cur.extend(rng) for _ in range(cfg["distractor_length"] - 1)):
                break
            cur.back(len(cur), keep=0)  # drop the half-grown curve
        # a distractor that never fits is skipped, as in the original (allow_incomplete)


# ---------------------------------------------------------------- drawing

def _coverage(dist, radius):
    """Anti-aliased coverage of a fine pixel at `dist` (output px) from a shape of edge `radius`."""
    return np.clip((radius - dist) * AA + 0.5, 0.0, 1.0)


def _draw_dashes(canvas_f, a, b, width):
    """Max-composite thick segments a-b (n, 2) (output px coords) onto the fine canvas (in place)."""
    if not len(a):
        return
    size = canvas_f.shape[0]
    rad = width / 2 + 1.0 / AA
    lo = np.floor((np.minimum(a, b) - rad) * AA).astype(np.int64)  # fine index of each box corner
    hi = np.ceil((np.maximum(a, b) + rad) * AA).astype(np.int64)
    p = int((hi - lo).max()) + 1
    grid = np.arange(p)
    ys = (lo[:, 0, None] + grid) # (n, p) fine rows
    xs = (lo[:, 1, None] + grid)
    cy, cx = (ys + 0.5) / AA, (xs + 0.5) / AA  # fine pixel centres in output px
    d = _point_seg_dist(cy[:, :, None], cx[:, None, :], *(v[:, None, None] for v in (a[:, 0], a[:, 1], b[:, 0], b[:, 1])))
    cov = _coverage(d, width / 2)
    inside = ((ys >= 0) & (ys < size))[:, :, None] & ((xs >= 0) & (xs < size))[:, None, :] & (cov > 0)
    flat = (ys[:, :, None] * size + xs[:, None, :])[inside]
    np.maximum.at(canvas_f.reshape(-1), flat, cov[inside])


def _downsample(fine):
    r = fine.shape[0] // AA
    return fine.reshape(r, AA, r, AA).mean((1, 3))


def sample(resolution: int, difficulty: str, seed: int, i: int, debug: bool = False):
    """Image i (uint8 (R, R)) and its label, a pure function of (seed, i); with debug, also a dict with
    the dashes (a, b, owner curve), the marker centres and their curves, and `curve_id`: per pixel, the
    curve drawn brightest there (-1 for background), computed from each curve drawn alone."""
    cfg = _config(resolution, difficulty)
    pair = np.random.default_rng([seed, i // 2, 1])
    label = int(pair.integers(2)) ^ (i % 2)
    rng = np.random.default_rng([seed, i, 0])
    for attempt in range(10_000):
        margin = int(rng.choice(cfg["margins"]))
        built = _targets(rng, cfg, margin)
        if built is not None:
            break
    else:  # pragma: no cover - never seen; would mean the settings cannot fit
        raise RuntimeError(f"could not place two target curves at R={resolution}")
    c, curves = built
    _distractors(rng, c, cfg)
    origin = int(rng.integers(2))
    other = origin if label else 1 - origin
    markers = np.stack([curves[origin].start, curves[other].end])
    r = cfg["resolution"]
    a, b, owner = c.dashes()
    is_target = owner < 2  # curves 0 and 1 are the targets (_targets)
    layers = []
    for keep, contrast in ((is_target, cfg["snake_contrast"] * cfg["paddle_contrast"]),
                           (~is_target, cfg["snake_contrast"])):
        lines = np.zeros((r * AA, r * AA), np.float32)
        _draw_dashes(lines, a[keep], b[keep], cfg["thickness"])
        layers.append(_downsample(lines) * contrast)
    dots = np.zeros((r * AA, r * AA), np.float32)
    _draw_markers(dots, markers, cfg["marker_radius"])
    img = np.maximum(np.maximum(*layers), _downsample(dots))
    img = np.round(img / img.max() * 255).astype(np.uint8)
    if not debug:
        return img, label
    per_curve = []
    for k in range(int(owner.max()) + 1):
        f = np.zeros_like(lines)
        _draw_dashes(f, a[owner == k], b[owner == k], cfg["thickness"])
        per_curve.append(_downsample(f))
    stack = np.stack(per_curve)
    curve_id = np.where(stack.max(0) > 0, stack.argmax(0), -1)
    info = dict(a=a, b=b, owner=owner, markers=markers,
                marker_curves=(curves[origin].id, curves[other].id), curve_id=curve_id, margin=c.margin,
                attempts=attempt + 1, cfg=cfg)
    return img, label, info


def _draw_markers(canvas_f, centres, radius):
    size = canvas_f.shape[0]
    for cy, cx in centres:
        y0 = max(int(math.floor((cy - radius - 1) * AA)), 0)
        x0 = max(int(math.floor((cx - radius - 1) * AA)), 0)
        y1 = min(int(math.ceil((cy + radius + 1) * AA)), size)
        x1 = min(int(math.ceil((cx + radius + 1) * AA)), size)
        yy = (np.arange(y0, y1) + 0.5) / AA - cy
        xx = (np.arange(x0, x1) + 0.5) / AA - cx
        d = np.sqrt(yy[:, None] ** 2 + xx[None, :] ** 2)
        np.maximum(canvas_f[y0:y1, x0:x1], _coverage(d, radius), out=canvas_f[y0:y1, x0:x1])


# ---------------------------------------------------------------- dataset files

def _stamp(cfg: dict, num: int, seed: int) -> str:
    key = json.dumps(dict(cfg, num=num, seed=seed, version=GENERATOR_VERSION), sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _chunk(args):
    """Worker: images start..stop written straight into the memmapped files; returns (start, stop)."""
    out_dir, resolution, difficulty, seed, start, stop = args
    images = np.load(Path(out_dir) / "images.npy", mmap_mode="r+")
    labels = np.load(Path(out_dir) / "labels.npy", mmap_mode="r+")
    for i in range(start, stop):
        images[i], labels[i] = sample(resolution, difficulty, seed, i)
    images.flush()
    labels.flush()
    return start, stop


def _resumable(out: Path, stamp: str, num: int, resolution: int):
    """(chunk size, finished chunk starts) of an interrupted generation with these settings, or None."""
    try:
        progress = json.loads((out / "progress.json").read_text())
        shapes = (np.load(out / "images.npy", mmap_mode="r").shape, np.load(out / "labels.npy", mmap_mode="r").shape)
    except (OSError, ValueError):
        return None
    if progress.get("stamp") != stamp or shapes != ((num, resolution, resolution), (num,)):
        return None
    return int(progress["chunk"]), set(progress["done"])


def generate(resolution: int, difficulty: str, num: int, seed: int, out_dir, workers: int | None = None,
             progress: bool = True, chunk: int | None = None) -> dict:
    """Write out_dir/images.npy (uint8 (num, R, R)), labels.npy (uint8 0/1) and meta.json.

    A second call with the same settings finds meta.json's stamp and does nothing. meta.json is written
    last. An interrupted run resumes: progress.json lists the chunks already written, and a call with the
    same settings makes only the rest (Path-256's images take hours). Returns stats (images per second
    over the images made by this call; cached; resumed: how many an earlier call had made)."""
    cfg = _config(resolution, difficulty)
    if num <= 0 or seed < 0:
        raise ValueError(f"need num > 0 and seed >= 0, got num={num}, seed={seed}")
    out = Path(out_dir)
    stamp = _stamp(cfg, num, seed)
    meta_path = out / "meta.json"
    if meta_path.exists() and (out / "images.npy").exists() and (out / "labels.npy").exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("stamp") == stamp:
            return dict(meta["stats"], cached=True)
    out.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    resume = _resumable(out, stamp, num, resolution)
    if resume is not None:
        chunk, done = resume  # the interrupted run's chunking, so its finished chunks line up
    else:
        chunk = chunk or max(8, min(256, -(-num // (max(workers, 1) * 16))))  # ~16 chunks per worker: even finish
        done = set()
        for name, shape in (("images", (num, resolution, resolution)), ("labels", (num,))):
            np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=np.uint8, shape=shape).flush()
    jobs = [(str(out), resolution, difficulty, seed, s, min(s + chunk, num)) for s in range(0, num, chunk)
            if s not in done]
    resumed = num - sum(stop - start for *_, start, stop in jobs)
    from tqdm import tqdm

    bar = tqdm(total=num, initial=resumed, desc=f"pathfinder{resolution} {difficulty}", unit="img",
               disable=not progress)
    progress_path = out / "progress.json"

    def save_progress():  # small next to the images; written whole, then renamed over the old one
        tmp = progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(stamp=stamp, chunk=chunk, done=sorted(done))))
        tmp.replace(progress_path)

    save_progress()  # from here on the files belong to these settings, whatever stops the run
    last_save = time.perf_counter()

    def finished(start_stop):
        nonlocal last_save
        done.add(start_stop[0])
        bar.update(start_stop[1] - start_stop[0])
        if time.perf_counter() - last_save > 5:
            save_progress()
            last_save = time.perf_counter()

    t0 = time.perf_counter()
    try:
        if workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                finished(_chunk(job))
        else:
            # fork where there is one: spawn would re-run a caller's unguarded script; the workers touch
            # only numpy, like torch's DataLoader workers, which fork too
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            with ctx.Pool(min(workers, len(jobs))) as pool:
                for start_stop in pool.imap_unordered(_chunk, jobs):
                    finished(start_stop)
    finally:
        save_progress()  # chunks still in flight when a run stops are not listed: a resume redoes them
    seconds = time.perf_counter() - t0
    bar.close()
    labels = np.load(out / "labels.npy", mmap_mode="r")
    made = num - resumed
    stats = dict(num=num, seconds=round(seconds, 3), images_per_s=round(made / seconds, 1) if made else 0.0,
                 workers=workers, positives=int(labels.sum()), cached=False, resumed=resumed)
    meta = dict(stamp=stamp, version=GENERATOR_VERSION, seed=seed, num=num, settings=cfg, stats=stats,
                files=dict(images="images.npy", labels="labels.npy"), split=_split_meta(num))
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    progress_path.unlink(missing_ok=True)
    return stats


def load(out_dir):
    """(images, labels) of a generated set; images memory-mapped (uint8 (N, R, R)), labels in memory."""
    out = Path(out_dir)
    return np.load(out / "images.npy", mmap_mode="r"), np.load(out / "labels.npy")


def split(n: int) -> dict:
    """Index ranges 80/10/10: train, val, test (LRA's split of each difficulty)."""
    a, b = int(n * 0.8), int(n * 0.9)
    return dict(train=range(0, a), val=range(a, b), test=range(b, n))


def _split_meta(n):
    return {k: [v.start, v.stop] for k, v in split(n).items()}


def load_original(folder, difficulty: str | None = None):
    """Images and labels of the original LRA Pathfinder release.

    `folder` is one difficulty folder (e.g. lra_release/pathfinder32/curv_contour_length_14) holding
    metadata/<batch>.npy and imgs/<batch>/sample_<k>.png, or the resolution folder with `difficulty`.
    Despite the name, the metadata files are text: one line per image, space-separated,
    "<image dir> <file name> <index> <label> ...", the image at folder/<image dir>/<file name>.
    Unreadable images (the release has an empty one) are skipped. Returns (uint8 (N, R, R), uint8 (N,))."""
    from PIL import Image

    root = Path(folder)
    if difficulty is not None:
        root = root / ORIGINAL_DIRS[difficulty]
    metas = sorted((root / "metadata").glob("*.npy"), key=lambda p: (len(p.stem), p.stem))
    if not metas:
        raise FileNotFoundError(f"no metadata/*.npy under {root}")
    images, labels = [], []
    for meta in metas:
        raw = meta.read_bytes()
        if raw.startswith(b"\x93NUMPY"):  # a real .npy array of strings, (N, >= 4)
            rows = [list(map(str, r)) for r in np.load(meta, allow_pickle=False)]
        else:
            rows = [line.split() for line in raw.decode().splitlines() if line.strip()]
        for row in rows:
            path = root / row[0] / row[1]
            try:
                with Image.open(path) as im:
                    images.append(np.asarray(im.convert("L"), dtype=np.uint8))
            except (OSError, ValueError):
                continue
            labels.append(int(float(row[3])))
    if not images:
        raise FileNotFoundError(f"no readable images listed under {root / 'metadata'}")
    return np.stack(images), np.asarray(labels, np.uint8)


def save_preview(resolution: int, path, difficulty: str = "hard", seed: int = 0, per_class: int = 4):
    """A PNG grid: top row positives, bottom row negatives, markers and all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {1: [], 0: []}
    i = 0
    while min(len(v) for v in rows.values()) < per_class:
        img, label = sample(resolution, difficulty, seed, i)
        if len(rows[label]) < per_class:
            rows[label].append(img)
        i += 1
    fig, axes = plt.subplots(2, per_class, figsize=(2 * per_class, 4.3))
    for r, label in enumerate((1, 0)):
        for k, img in enumerate(rows[label]):
            ax = axes[r, k]
            ax.imshow(img, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if k == 0:
                ax.set_ylabel("connected (1)" if label else "not connected (0)")
    fig.suptitle(f"Pathfinder {resolution}x{resolution}, {difficulty} ({DIFFICULTY[difficulty]} dashes), seed {seed}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--resolution", type=int, required=True, choices=sorted(SETTINGS))
    p.add_argument("--difficulty", default="hard", choices=list(DIFFICULTY))
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--preview", default=None, help="also save a PNG grid of a few samples here")
    a = p.parse_args(argv)
    if a.preview:
        save_preview(a.resolution, a.preview, a.difficulty, a.seed)
    stats = generate(a.resolution, a.difficulty, a.num, a.seed, a.out, workers=a.workers, progress=not a.no_progress)
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    main()
