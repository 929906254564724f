"""Pathfinder-32 shortcut probe: can the label be read without tracing a curve?

    python results/lra/probes/pathfinder-shortcuts/shortcuts.py              # image mode, ~10 min on 2 cores
    python results/lra/probes/pathfinder-shortcuts/shortcuts.py --pairs 4000 # pair mode, ~10 min
    python results/lra/probes/pathfinder-shortcuts/shortcuts.py --n 600 --n-orig 600   # quick look

Sources, all at the LRA Pathfinder-32 hard settings (14 dashes; lra_benchmarks/data/pathfinder.py):
1. ours: train.lra.pathfinder.generate (GENERATOR_VERSION 2) writes n images under --work (not the repo);
   sample(debug=True) gives the marker centres and curves of the same images (checked byte for byte).
2. a port of the original generator's target pair and markers (drewlinsley/pathfinder snakes2.py:
   two_snakes / initialize_two_seeds; snakes.py: extend_snake, get_coords_cmf, draw_line_n_mask,
   translate_coord, binary_dilate_custom), written here from a reading of that code, in two readings of
   one detail (`--borders`, see OriginalTargets). Only geometry: no distractors (drawn after the
   targets, they cannot move them) and no pixels, so only marker (and tip) features are compared.

Image mode: for every feature the best single threshold (either direction) fitted on the first 3/4 of
the images and scored on the last 1/4; for marker distance also a 16-bin histogram classifier; a
logistic regression on all the features of a source; kNN on the two markers' coordinates; (ours only)
a logistic regression on the 1,024 raw pixels; and the same on the four target tips (`tip_features`).
Pair mode: `pair_probe`, four marker placements per target pair. Chance +- 2 sd on 1,000 test images is
0.50 +- 0.032, on 4,000 placements 0.50 +- 0.016.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # repo root, so train.lra imports
from train.lra import pathfinder as pf  # noqa: E402

R = 32
CENTRE = (R - 1) / 2  # image centre in pixel-index coordinates (pixel k's centre is at k)


# ------------------------------------------------------------------ classifiers (numpy only)

def threshold_accuracy(v_tr, y_tr, v_te, y_te):
    """Best cut on the training values, either direction; returns (train acc, test acc)."""
    order = np.argsort(v_tr, kind="stable")
    v, y = v_tr[order], y_tr[order]
    # "predict 1 above the cut": correct = negatives at or below + positives above
    neg_below = np.concatenate([[0], np.cumsum(1 - y)])
    pos_above = y.sum() - np.concatenate([[0], np.cumsum(y)])
    acc_up = (neg_below + pos_above) / len(y)
    valid = np.concatenate([[True], v[1:] != v[:-1], [True]])  # cut only between distinct values
    acc = np.where(valid, np.maximum(acc_up, 1 - acc_up), 0)
    k = int(np.argmax(acc))
    cut = -np.inf if k == 0 else np.inf if k == len(v) else (v[k - 1] + v[k]) / 2
    sign = 1 if acc_up[k] >= 1 - acc_up[k] else -1
    pred = (sign * (v_te - cut) > 0).astype(int)  # infinite cuts predict one class throughout
    return float(acc[k]), float(np.mean(pred == y_te))


def histogram_accuracy(v_tr, y_tr, v_te, y_te, bins=16):
    """Majority label per quantile bin of the training values: catches a cue that is not monotone."""
    edges = np.unique(np.quantile(v_tr, np.linspace(0, 1, bins + 1)[1:-1]))
    b_tr, b_te = np.searchsorted(edges, v_tr), np.searchsorted(edges, v_te)
    vote = np.array([y_tr[b_tr == b].mean() > 0.5 if (b_tr == b).any() else 0 for b in range(len(edges) + 1)])
    return float(np.mean(vote[b_te] == y_te))


def logistic_accuracy(x_tr, y_tr, x_te, y_te, l2=1e-3, iters=25):
    """L2-regularised logistic regression by Newton steps on standardised features; test accuracy."""
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-9
    a_tr = np.c_[(x_tr - mu) / sd, np.ones(len(x_tr))]
    a_te = np.c_[(x_te - mu) / sd, np.ones(len(x_te))]
    w = np.zeros(a_tr.shape[1])
    reg = l2 * len(y_tr) * np.eye(len(w))
    reg[-1, -1] = 0  # no penalty on the bias
    for _ in range(iters):
        p = 1 / (1 + np.exp(-np.clip(a_tr @ w, -30, 30)))
        grad = a_tr.T @ (p - y_tr) + reg @ w
        hess = (a_tr * (p * (1 - p))[:, None]).T @ a_tr + reg
        w -= np.linalg.solve(hess, grad)
    return float(np.mean(((a_tr @ w) > 0) == y_tr)), float(np.mean(((a_te @ w) > 0) == y_te))


def knn_accuracy(x_tr, y_tr, x_te, y_te, ks=(15, 31, 61, 121)):
    """k nearest neighbours (majority vote), k picked on the last fifth of the training images: a
    non-linear ceiling for a few raw coordinates. Returns (test accuracy, k)."""
    def predict(a, ya, b, k):
        out = []
        for s in range(0, len(b), 1000):  # squared distances a chunk of test rows at a time
            q = b[s:s + 1000]
            d = (q ** 2).sum(1)[:, None] + (a ** 2).sum(1)[None, :] - 2 * q @ a.T
            near = np.argpartition(d, k, axis=1)[:, :k]
            out.append((ya[near].mean(1) > 0.5).astype(int))
        return np.concatenate(out)
    cut = int(len(y_tr) * 0.8)
    ks = [k for k in ks if k < cut] or [1]
    k = max(ks, key=lambda k: np.mean(predict(x_tr[:cut], y_tr[:cut], x_tr[cut:], k) == y_tr[cut:]))
    return float(np.mean(predict(x_tr, y_tr, x_te, k) == y_te)), int(k)


def marker_positions(m0, m1):
    """Both markers' (y, x), the one nearer the centre first (the labels never tell which is which)."""
    near, far = sorted((m0, m1), key=lambda m: float(np.hypot(*(m - CENTRE))))
    return [float(near[0]), float(near[1]), float(far[0]), float(far[1])]


def pixel_logistic(x_tr, y_tr, x_te, y_te):
    """Raw pixels: the ridge picked on a held-out fifth of the training images, then refitted."""
    cut = int(len(y_tr) * 0.8)
    best = max((logistic_accuracy(x_tr[:cut], y_tr[:cut], x_tr[cut:], y_tr[cut:], l2=l2, iters=12)[1], l2)
               for l2 in (1e-3, 1e-2, 1e-1, 1.0))
    return logistic_accuracy(x_tr, y_tr, x_te, y_te, l2=best[1], iters=12), best[1]


# ------------------------------------------------------------------ features

def geometry_features(m0, m1):
    """Marker geometry; both markers in pixel-index coordinates. Symmetric in the two markers."""
    d = float(np.hypot(*(m0 - m1)))
    c0, c1 = float(np.hypot(*(m0 - CENTRE))), float(np.hypot(*(m1 - CENTRE)))
    return dict(marker_distance=d, marker_centre_min=min(c0, c1), marker_centre_max=max(c0, c1))


def tip_features(om, tm, ou, tu):
    """The four target-curve tips: marked origin and terminal, unmarked origin and terminal. Not a simple
    cue: a model must first find the unmarked tips (the targets are 3/4 as bright as distractors at 32),
    but no tracing. own_minus_other < 0 when the marked terminal is nearer the marked origin."""
    d = lambda p, q: float(np.hypot(*(np.asarray(p, float) - np.asarray(q, float))))
    return dict(own_minus_other=d(tm, om) - d(tm, ou), d_om_tm=d(om, tm), d_ou_tm=d(ou, tm),
                d_om_tu=d(om, tu), d_ou_tu=d(ou, tu), d_tm_tu=d(tm, tu))


def image_features(img, m0, m1):
    """Global ink and the ink around each marker (7x7 window, the marker itself included)."""
    f = dict(mean_intensity=float(img.mean()), lit_pixels=int((img > 0).sum()), bright_pixels=int((img > 127).sum()))
    local = []
    for y, x in (m0, m1):
        y, x = int(round(y)), int(round(x))
        local.append(float(img[max(y - 3, 0):y + 4, max(x - 3, 0):x + 4].mean()))
    f.update(local_ink_min=min(local), local_ink_max=max(local))
    return f


def ours(n, seed, work):
    """Generate n hard 32x32 images with the project's generator; features and labels."""
    out = Path(work) / "ours"
    stats = pf.generate(R, "hard", n, seed, out, workers=1, progress=False)
    images, labels = pf.load(out)
    rows, tips, pos, e2e = [], [], [], []
    for i in range(n):
        img, label, info = pf.sample(R, "hard", seed, i, debug=True)
        assert label == labels[i] and np.array_equal(img, images[i]), i  # the very images generate wrote
        m0, m1 = info["markers"] - 0.5  # continuous (pixel k spans [k, k+1)) -> pixel-index coordinates
        rows.append(dict(geometry_features(m0, m1), **image_features(img, m0, m1)))
        pos.append(marker_positions(m0, m1))
        a, b, owner = info["a"], info["b"], info["owner"]
        o, t = info["marker_curves"]
        starts = [a[owner == c][0] for c in (0, 1)]
        ends = [b[owner == c][-1] for c in (0, 1)]
        tips.append(tip_features(starts[o], ends[t], starts[1 - o], ends[1 - t]))
        for c in (0, 1):  # end-to-end distance of each target curve: start of dash 0 to end of the last
            e2e.append(float(np.hypot(*(a[owner == c][0] - b[owner == c][-1]))))
    return rows, tips, pos, np.asarray(labels, int), np.asarray(images[:n], np.float64).reshape(n, -1), stats, e2e


# ------------------------------------------------------------------ port of the original's targets

class OriginalTargets:
    """The original's two target curves and markers at LRA Pathfinder-32 (hard), geometry only.

    Settings: window 32, padding 1, antialias 2, paddle length 2, thickness 0.5, margin 1, seed distance 7,
    continuity 1.0, 14 dashes (LRA's TFDS docstring); max_paddle_retrial 2 (snakes2_wrapper's Args default).

    Exact (as read): integer pixel coordinates everywhere, `translate_coord`'s ceil; the first seed drawn
    uniformly among the pixels left by the 2 x seed_distance band after dilating it with the head-centred
    segment mask (cv2.dilate semantics: anchor at the kernel centre, taps off the image ignored, a pixel
    with no tap on the image takes the most negative value, and any negative value makes
    find_available_coordinates report nothing, i.e. a failed pair); 3 tries for the in-bounds check; the
    second seed at round(seed + 7 (sin, cos)(random whole degree)) with only an in-bounds check; the
    snakes extended in turns (A, B, A, B, ...) from pivots length + 2 margin ahead; candidates on the
    circle of radius length + margin (one per pixel of arc, truncated to int, made unique), weights
    cos(min(d theta * continuity, pi/2))^2 x (1 - dilated mask); 3 draws, each accepted when
    max(mask + segment mask) < 1.8; a snake's previous segment joins the shared mask only after its next
    one is accepted; any failure restarts the whole pair. Markers: label 50/50, origin tip of a random
    snake, terminal tip of the same (label 1) or the other (label 0) snake.

    Approximated: segment masks are drawn with today's Pillow (ImageDraw.line at 2x, dilated by the
    margin disc, LANCZOS resize after scipy.misc.imresize's bytescale), not the 2018 scipy/Pillow/cv2
    stack, so which pixels saturate at 1.0 may differ slightly; the random stream is numpy's
    RandomState but not the original's order of draws where draws do not affect the geometry
    (distractors, contrasts), so only the distribution is comparable, not individual images.
    """

    def __init__(self, seed, border="cv2"):
        # border: what the seed's dilation reads off the image. "cv2" = cv2.dilate's default constant
        # border for float images (-DBL_MAX; my reading of OpenCV's createMorphologyFilter), which with
        # the off-centre struct makes the last row/column negative for most orientations and so fails
        # the seed; "occupied" = off-image counts as masked (what the band and padding intend).
        self.off = -np.inf if border == "cv2" else 1.0
        self.rng = np.random.RandomState(seed)
        self.L, self.th, self.m, self.aa, self.sd, self.cont, self.n = 2, 0.5, 1, 2, 7, 1.0, 14
        self.trials = 2
        self.small = self._disc(self.m)
        self.large = self._disc(self.m * self.aa)
        self.border = np.zeros((R, R))
        self.border[:1, :] = self.border[-1:, :] = self.border[:, :1] = self.border[:, -1:] = 1
        self.attempts = 0
        self.seed_fail = 0

    @staticmethod
    def _disc(r):
        y, x = np.ogrid[-r:r + 1, -r:r + 1]
        return (x * x + y * y <= r * r).astype(np.uint8)

    @staticmethod
    def _dilate(img, kernel, off=-np.inf):
        """Grey dilation with cv2's conventions: out[p] = max over taps k of img[p + k - anchor], a tap
        off the image reading `off` (cv2's default border for dilation: the type's lowest value)."""
        h, w = img.shape
        ay, ax = kernel.shape[0] // 2, kernel.shape[1] // 2
        out = np.full(img.shape, -np.inf)
        for ky, kx in zip(*np.nonzero(kernel)):
            if off > -np.inf:  # pixels whose tap falls off the image read `off`
                outside = np.ones(img.shape, bool)
                outside[max(0, -(ky - ay)):min(h, h - (ky - ay)), max(0, -(kx - ax)):min(w, w - (kx - ax))] = False
                out[outside] = np.maximum(out[outside], off)
            dy, dx = ky - ay, kx - ax
            ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
            yd, xd = slice(max(0, dy), min(h, h + dy)), slice(max(0, dx), min(w, w + dx))
            np.maximum(out[ys, xs], img[yd, xd], out=out[ys, xs])
        return out

    @staticmethod
    def _move(p, theta, dist):
        return [int(math.ceil(p[0] + dist * math.sin(theta))), int(math.ceil(p[1] + dist * math.cos(theta)))]

    @staticmethod
    def _flip(theta):
        return theta + math.pi if theta < 0 else theta - math.pi

    @staticmethod
    def _resize(arr, size):
        """scipy.misc.imresize(arr, (size, size), 'lanczos'): bytescale unless uint8, then Pillow."""
        if arr.dtype != np.uint8:
            lo, hi = float(arr.min()), float(arr.max())
            scale = 255.0 / ((hi - lo) or 1.0)
            arr = (np.clip((arr - lo) * scale, 0, 255) + 0.5).astype(np.uint8)
        return np.asarray(Image.fromarray(arr, "L").resize((size, size), Image.LANCZOS))

    def _segment_mask(self, shape, start, theta):
        """draw_line_n_mask's mask: the dash from `start` along theta, dilated by the margin, in `shape`."""
        half = self.L + int(math.ceil(self.th)) + self.m  # 4: the small window's half width
        big_c = half * self.aa
        big = Image.new("F", (2 * big_c + 1, 2 * big_c + 1), "black")
        head = self._move([big_c, big_c], theta, self.L * self.aa)
        ImageDraw.Draw(big).line([(big_c, big_c), (head[1], head[0])], fill="white",
                                 width=int(round(self.th * self.aa)))
        blown = self._dilate(np.asarray(big, np.float64), self.large).astype(np.uint8)
        small = self._resize(blown, 2 * half + 1).astype(np.float64) / 255
        out = np.zeros(shape)
        y0, x0 = start[0] - half, start[1] - half
        ys, xs = slice(max(y0, 0), min(y0 + 2 * half, shape[0] - 1) + 1), slice(max(x0, 0), min(x0 + 2 * half, shape[1] - 1) + 1)
        out[ys, xs] = small[ys.start - y0:ys.stop - y0, xs.start - x0:xs.stop - x0]
        return out

    def _inside(self, *pts):
        return all(0 <= p[0] < R and 0 <= p[1] < R for p in pts)

    def _seeds(self):
        """initialize_two_seeds: (segment masks, pivots, orientations, origin tips) or None."""
        rnd, L, m, sd = self.rng, self.L, self.m, self.sd
        tries = 0
        while tries <= self.trials:
            th1 = rnd.randint(-180, 180) * math.pi / 180
            back1 = th1 + math.pi if th1 + math.pi < math.pi else th1 - math.pi
            k = L + m
            struct = self._segment_mask((2 * k + 1, 2 * k + 1), [k + 1, k + 1], th1).astype(np.uint8)
            band = self.border.copy()
            band[:2 * sd, :] = band[R - 2 * sd:, :] = band[:, :2 * sd] = band[:, R - 2 * sd:] = 1
            dil = self._dilate(band, struct, self.off) if struct.any() else np.full((R, R), -np.inf)
            with np.errstate(invalid="ignore"):
                if dil.min() < 0:  # find_available_coordinates: any negative value -> nothing available
                    self.seed_fail += 1
                    return None
            free = np.nonzero(np.ceil(dil - 0.3) == 0)
            if len(free[0]) == 0:
                self.seed_fail += 1
                return None
            j = rnd.randint(0, len(free[0]))
            tail1 = [int(free[0][j]), int(free[1][j])]
            head1 = self._move(tail1, th1, L)
            piv1 = self._move(head1, back1, L + m)
            if not self._inside(head1, piv1):
                tries += 1
                continue
            break
        if tries > self.trials:
            return None
        tries = 0
        while tries <= self.trials:
            th2 = rnd.randint(-180, 180) * math.pi / 180
            back2 = th2 + math.pi if th2 + math.pi < math.pi else th2 - math.pi
            phi = rnd.randint(0, 360) * math.pi / 180
            tail2 = [int(np.round(tail1[0] + sd * math.sin(phi))), int(np.round(tail1[1] + sd * math.cos(phi)))]
            head2 = self._move(tail2, th2, L)
            piv2 = self._move(head2, back2, L + m)
            if not self._inside(head2, piv2):
                tries += 1
                continue
            break
        if tries > self.trials:
            return None
        masks = [self._segment_mask((R, R), tail1, th1), self._segment_mask((R, R), tail2, th2)]
        return masks, [piv1, piv2], [th1, th2], [tail1, tail2]

    def _candidates(self, pivot, theta, dmask):
        """get_coords_cmf: candidate heads on the circle, their orientations and the cumulative weights."""
        step = self.L + self.m
        deg = 360.0 / (2 * step * math.pi)
        ang = np.arange(0, 360, deg) * math.pi / 180
        fy, fx = pivot[0] + step * np.sin(ang), pivot[1] + step * np.cos(ang)
        keep = (fy < R) & (fy >= 0) & (fx < R) & (fx >= 0)
        if not keep.any():
            return None
        pts = np.unique(np.stack([fy, fx], 1).astype(int)[keep], axis=0)
        ori = np.arctan2(pts[:, 0] - pivot[0], pts[:, 1] - pivot[1])
        turn = np.minimum(np.abs(ori - theta), 2 * np.pi - np.abs(ori - theta))
        w = np.maximum(np.cos(np.minimum(turn * self.cont, np.pi / 2)), 0) ** 2
        p = (1 - dmask[pts[:, 0], pts[:, 1]]) * w
        if p.sum() < 1e-4:
            return None
        return pts, ori, np.cumsum(p / p.sum())

    def _extend(self, pivot, theta, last_mask, mask):
        """extend_snake: (mask, new segment mask, new pivot, new orientation, head) or None."""
        new_pivot = self._move(pivot, theta, self.L + 2 * self.m)
        cand = self._candidates(new_pivot, theta, self._dilate(mask, self.small))
        if cand is None:
            return None
        pts, ori, cmf = cand
        for _ in range(self.trials + 1):
            k = int(np.argmax(cmf - self.rng.rand() > 0))
            head = [int(pts[k, 0]), int(pts[k, 1])]
            seg = self._segment_mask((R, R), head, self._flip(float(ori[k])))
            if np.max(mask + seg) < 1.8:
                return np.maximum(mask, last_mask), seg, new_pivot, float(ori[k]), head
        return None

    def _pair(self):
        """two_snakes: (origin tips, terminal tips) or None."""
        seeds = self._seeds()
        if seeds is None:
            return None
        segs, pivots, thetas, origins = seeds
        mask, ends = self.border.copy(), [None, None]
        for _ in range(self.n - 1):
            self.rng.randint(0, 1)  # the per-dash contrast draw (one contrast in the list)
            for s in (0, 1):
                step = self._extend(pivots[s], thetas[s], segs[s], mask)
                if step is None:
                    return None
                mask, segs[s], pivots[s], thetas[s], ends[s] = step
        return origins, ends

    def sample(self):
        """One image's markers (pixel-index coordinates) and label, as snakes2.from_wrapper picks them."""
        label = self.rng.randint(0, 2)
        self.rng.randint(0, 1)  # the margin draw (one margin in the list)
        while True:
            self.attempts += 1
            pair = self._pair()
            if pair is not None:
                break
        origins, ends = pair
        o = self.rng.randint(0, 2)
        t = o if label else 1 - o
        # draw_circle centres the disc on fine pixel tip * aa; after the 2x Lanczos resize that is
        # tip - 0.25 in pixel-index coordinates (the same shift for both markers)
        m0 = np.asarray(origins[o], float) - 0.25
        m1 = np.asarray(ends[t], float) - 0.25
        e2e = [float(np.hypot(*np.subtract(origins[c], ends[c]))) for c in (0, 1)]
        return m0, m1, int(label), e2e, tip_features(origins[o], ends[t], origins[1 - o], ends[1 - t])


def original(n, seed, border):
    port = OriginalTargets(seed, border)
    rows, tips, pos, labels, e2e = [], [], [], [], []
    for _ in range(n):
        m0, m1, label, ee, tip = port.sample()
        rows.append(geometry_features(m0, m1))
        pos.append(marker_positions(m0, m1))
        tips.append(tip)
        labels.append(label)
        e2e.extend(ee)
    return rows, tips, pos, np.asarray(labels), dict(pair_attempts_per_image=port.attempts / n,
                                          seed_failures_per_image=port.seed_fail / n), e2e


# ------------------------------------------------------------------ pair mode: joint marker placement

def pair_tips(source, n, seed):
    """n target pairs as (n, 4, 2) tips [origin A, origin B, terminal A, terminal B], pixel-index coords.
    A is the first target curve (ours: curve 0, grown from the start drawn in the central square; the
    original: the first seed, drawn there too), B the one started seed_distance away."""
    tips = []
    if source == "ours":
        for i in range(n):
            _, _, info = pf.sample(R, "hard", seed, i, debug=True)
            a, b, owner = info["a"], info["b"], info["owner"]
            tips.append([a[owner == 0][0], a[owner == 1][0], b[owner == 0][-1], b[owner == 1][-1]])
        return np.asarray(tips, float) - 0.5
    port = OriginalTargets(seed, source)
    for _ in range(n):
        while True:
            pair = port._pair()
            if pair is not None:
                break
        tips.append([*pair[0], *pair[1]])
    return np.asarray(tips, float) - 0.25


def pair_probe(tips):
    """The label only picks which terminal carries the second marker, so every pair gives four marker
    placements: (O_A, T_A) and (O_B, T_B) positive, (O_A, T_B) and (O_B, T_A) negative. Pairs are split
    75/25 and all four placements of a pair stay on one side. Reports kNN on the joint positions (the
    two markers, nearer-the-centre first) and a logistic regression on a bag of marker positions (each
    marker one-hot in 4x4-px cells, the two summed: what a model with no interaction between the two
    markers can use)."""
    oa, ob, ta, tb = (tips[:, k] for k in range(4))

    def placements(idx):
        x, bag, y = [], [], []
        for m0, m1, label in ((oa, ta, 1), (ob, tb, 1), (oa, tb, 0), (ob, ta, 0)):
            for i in idx:
                x.append(marker_positions(m0[i], m1[i]))
                cells = np.zeros(64)
                for m in (m0[i], m1[i]):
                    c = np.clip(np.round(m).astype(int) // 4, 0, 7)
                    cells[c[0] * 8 + c[1]] += 1
                bag.append(cells)
                y.append(label)
        return np.asarray(x), np.asarray(bag), np.asarray(y)

    n_tr = int(len(tips) * 0.75)
    x_tr, bag_tr, y_tr = placements(range(n_tr))
    x_te, bag_te, y_te = placements(range(n_tr, len(tips)))
    knn, k = knn_accuracy(x_tr, y_tr, x_te, y_te, ks=(15, 31, 61, 121, 241))
    dist = lambda p, q: np.hypot(*(p - q).T)
    return dict(pairs=len(tips), placements_train=len(y_tr), placements_test=len(y_te),
                knn_joint_positions=dict(test=round(knn, 4), k=k),
                logistic_bag_of_positions_test=round(logistic_accuracy(bag_tr, y_tr, bag_te, y_te, l2=1e-2, iters=15)[1], 4),
                marker_distance_threshold_test=round(threshold_accuracy(
                    np.asarray([np.hypot(*(np.subtract(r[:2], r[2:]))) for r in x_tr]), y_tr,
                    np.asarray([np.hypot(*(np.subtract(r[:2], r[2:]))) for r in x_te]), y_te)[1], 4),
                origin_a_mean=[round(v, 2) for v in oa.mean(0)], origin_a_sd=[round(v, 2) for v in oa.std(0)],
                end_to_end_a=round(float(dist(ta, oa).mean()), 2), end_to_end_b=round(float(dist(tb, ob).mean()), 2),
                terminal_a_minus_origin_a_mean=[round(v, 2) for v in (ta - oa).mean(0)],
                terminal_b_minus_origin_b_mean=[round(v, 2) for v in (tb - ob).mean(0)])


# ------------------------------------------------------------------ report

def evaluate(name, rows, y, pixels=None, positions=None):
    keys = list(rows[0])
    x = np.asarray([[r[k] for k in keys] for r in rows], np.float64)
    n_tr = int(len(y) * 0.75)
    tr, te = slice(0, n_tr), slice(n_tr, len(y))
    out = dict(source=name, n_train=n_tr, n_test=len(y) - n_tr, positives=int(y.sum()), features={})
    for j, k in enumerate(keys):
        v = x[:, j]
        f = dict(mean_pos=round(float(v[y == 1].mean()), 3), mean_neg=round(float(v[y == 0].mean()), 3),
                 sd=round(float(v.std()), 3))
        f["threshold_train"], f["threshold_test"] = (round(a, 4) for a in threshold_accuracy(v[tr], y[tr], v[te], y[te]))
        if k == "marker_distance":
            f["histogram16_test"] = round(histogram_accuracy(v[tr], y[tr], v[te], y[te]), 4)
            f["quantiles_pos"] = [round(q, 2) for q in np.quantile(v[y == 1], [0.1, 0.25, 0.5, 0.75, 0.9])]
            f["quantiles_neg"] = [round(q, 2) for q in np.quantile(v[y == 0], [0.1, 0.25, 0.5, 0.75, 0.9])]
        out["features"][k] = f
    out["logistic_all_train"], out["logistic_all_test"] = (round(a, 4) for a in logistic_accuracy(x[tr], y[tr], x[te], y[te]))
    if positions is not None:
        xp = np.asarray(positions, np.float64)
        acc, k = knn_accuracy(xp[tr], y[tr], xp[te], y[te])
        out["knn_marker_positions"] = dict(test=round(acc, 4), k=k)
    if pixels is not None:
        (a_tr, a_te), l2 = pixel_logistic(pixels[tr], y[tr], pixels[te], y[te])
        out["logistic_pixels"] = dict(train=round(a_tr, 4), test=round(a_te, 4), l2=l2)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000, help="our images")
    p.add_argument("--n-orig", type=int, default=4000, help="images of the port of the original")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="/tmp/pathfinder-shortcuts", help="where our images go (not the repo)")
    p.add_argument("--borders", default="cv2,occupied", help="seed-dilation border readings of the port (OriginalTargets)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    p.add_argument("--pairs", type=int, default=0,
                   help="pair mode instead: this many target pairs per source (ours and each border), see pair_probe")
    a = p.parse_args(argv)
    report = {}
    if a.pairs:
        for source in ["ours"] + a.borders.split(","):
            t0 = time.perf_counter()
            report[f"pairs_{source}"] = dict(pair_probe(pair_tips(source, a.pairs, a.seed + 100)),
                                             seconds=round(time.perf_counter() - t0, 1))
            print(source, json.dumps(report[f"pairs_{source}"]), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
        return report
    t0 = time.perf_counter()
    rows, tips, pos, y, pixels, stats, e2e = ours(a.n, a.seed, a.work)
    report["ours"] = evaluate("ours (GENERATOR_VERSION %d)" % pf.GENERATOR_VERSION, rows, y, pixels, pos)
    report["ours"]["four_tips"] = evaluate("ours, four target tips", tips, y)
    report["ours"]["generate_stats"] = stats
    report["ours"]["target_end_to_end"] = dict(mean=round(float(np.mean(e2e)), 2), sd=round(float(np.std(e2e)), 2))
    report["ours"]["seconds"] = round(time.perf_counter() - t0, 1)
    for border in a.borders.split(","):
        t0 = time.perf_counter()
        rows, tips, pos, y, extra, e2e = original(a.n_orig, a.seed, border)
        key = f"original_port_{border}"
        report[key] = evaluate(f"port of snakes2.py targets + markers, seed border '{border}'", rows, y, positions=pos)
        report[key]["four_tips"] = evaluate("port, four target tips", tips, y)
        report[key].update({k: round(v, 3) for k, v in extra.items()})
        report[key]["target_end_to_end"] = dict(mean=round(float(np.mean(e2e)), 2), sd=round(float(np.std(e2e)), 2))
        report[key]["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
