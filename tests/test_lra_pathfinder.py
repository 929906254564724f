"""Pathfinder generator (train/lra/pathfinder.py): balance, determinism across workers, the stamp cache,
no label in simple statistics, markers joined along one curve exactly in positives, the LRA release
loader on files written here."""
import json
import math

import numpy as np
import pytest

from train.lra import pathfinder as pf


def _dilate(mask, radius):
    """Binary dilation by a disc of `radius` pixels (numpy shifts; scipy is not a dependency)."""
    out = np.zeros_like(mask)
    r = int(math.floor(radius))
    h, w = mask.shape
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            if dy * dy + dx * dx > radius * radius:
                continue
            out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] |= mask[max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)]
    return out


def _flood(mask, start):
    """Pixels of `mask` 8-connected to `start`."""
    reach = np.zeros_like(mask)
    if not mask[start]:
        return reach
    reach[start] = True
    while True:
        grown = _dilate(reach, 1.5) & mask
        if (grown == reach).all():
            return reach
        reach = grown


def _pixel(p):
    return int(p[0]), int(p[1])


def test_settings_table_matches_data_md():
    cfg = pf._config(128, "hard")
    assert (cfg["dash_length"], cfg["thickness"], cfg["margins"], cfg["marker_radius"]) == (5, 1.5, (2, 3), 3.0)
    assert (cfg["seed_distance"], cfg["continuity"], cfg["num_distractors"]) == (20, 1.8, 35 // 4)
    assert pf._config(32, "easy")["num_distractors"] == 20 // 2
    assert [pf._config(64, d)["contour_length"] for d in ("easy", "intermediate", "hard")] == [6, 9, 14]
    with pytest.raises(ValueError):
        pf._config(48, "hard")
    with pytest.raises(ValueError):
        pf._config(32, "medium")


def test_generate_balanced_split_and_cached(tmp_path):
    out = tmp_path / "pf"
    stats = pf.generate(32, "easy", 40, 0, out, workers=1, progress=False)
    images, labels = pf.load(out)
    assert images.shape == (40, 32, 32) and images.dtype == np.uint8 and isinstance(images, np.memmap)
    assert labels.dtype == np.uint8 and set(np.unique(labels)) == {0, 1} and labels.sum() == 20
    assert stats["positives"] == 20 and not stats["cached"] and stats["images_per_s"] > 0
    assert (images.reshape(40, -1).max(1) == 255).all()  # markers are drawn at full intensity
    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["resolution"] == 32 and meta["seed"] == 0 and meta["version"] == pf.GENERATOR_VERSION
    # every even-aligned range is balanced too (pairs 2k, 2k + 1 hold one positive each)
    assert (labels.reshape(-1, 2).sum(1) == 1).all()
    sp = pf.split(40)
    assert [len(sp[k]) for k in ("train", "val", "test")] == [32, 4, 4] and sp["test"].stop == 40

    # same settings: a no-op (files untouched); other settings: regenerated
    images = np.array(images)  # the memmap would see the file rewritten in place
    before = (out / "images.npy").stat().st_mtime_ns
    again = pf.generate(32, "easy", 40, 0, out, workers=1, progress=False)
    assert again["cached"] and (out / "images.npy").stat().st_mtime_ns == before
    other = pf.generate(32, "easy", 40, 1, out, workers=1, progress=False)
    assert not other["cached"] and not np.array_equal(np.load(out / "images.npy"), images)
    # an interrupted run (no meta.json) is redone
    (out / "meta.json").unlink()
    assert not pf.generate(32, "easy", 40, 1, out, workers=1, progress=False)["cached"]


def test_interrupted_generation_resumes(tmp_path, monkeypatch):
    """A run stopped part way keeps the chunks it finished (progress.json); the same call again makes only
    the rest, and the result is byte for byte a run that was never stopped."""
    clean, out = tmp_path / "clean", tmp_path / "out"
    pf.generate(32, "easy", 40, 2, clean, workers=1, progress=False, chunk=8)
    real_chunk, calls = pf._chunk, []

    def stop_after_two(args):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(args[-2])
        return real_chunk(args)

    monkeypatch.setattr(pf, "_chunk", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        pf.generate(32, "easy", 40, 2, out, workers=1, progress=False, chunk=8)
    assert not (out / "meta.json").exists()
    assert json.loads((out / "progress.json").read_text())["done"] == [0, 8]
    calls.clear()
    monkeypatch.setattr(pf, "_chunk", lambda args: calls.append(args[-2]) or real_chunk(args))
    stats = pf.generate(32, "easy", 40, 2, out, workers=1, progress=False, chunk=4)  # its own chunking is kept
    assert calls == [16, 24, 32] and stats["resumed"] == 16 and not stats["cached"]
    for f in ("images.npy", "labels.npy"):
        assert (out / f).read_bytes() == (clean / f).read_bytes()
    assert not (out / "progress.json").exists()
    # progress of other settings is not trusted: a different seed starts over
    monkeypatch.setattr(pf, "_chunk", stop_after_two)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        pf.generate(32, "easy", 40, 3, out, workers=1, progress=False, chunk=8)
    calls.clear()
    monkeypatch.setattr(pf, "_chunk", lambda args: calls.append(args[-2]) or real_chunk(args))
    assert pf.generate(32, "easy", 40, 2, out, workers=1, progress=False, chunk=8)["resumed"] == 0
    assert calls == [0, 8, 16, 24, 32]


def test_deterministic_across_workers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    pf.generate(32, "hard", 24, 5, a, workers=1, progress=False)
    pf.generate(32, "hard", 24, 5, b, workers=2, progress=False, chunk=5)
    for f in ("images.npy", "labels.npy"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    img, label = pf.sample(32, "hard", 5, 7)
    images, labels = pf.load(a)
    assert np.array_equal(img, images[7]) and label == labels[7]
    assert not np.array_equal(pf.sample(32, "hard", 6, 7)[0], img)


def test_cli(tmp_path):
    stats = pf.main(["--resolution", "32", "--difficulty", "easy", "--num", "6", "--seed", "3", "--out",
                     str(tmp_path), "--workers", "1", "--no-progress"])
    assert stats["num"] == 6 and pf.load(tmp_path)[0].shape == (6, 32, 32)


@pytest.mark.parametrize("resolution,n", [(32, 16), (64, 8), (128, 4), (256, 2)])
def test_markers_on_one_curve_iff_positive(resolution, n):
    """Geometry: curves keep the gap, target curves have contour_length dashes, markers sit on the ends.
    Pixels: walking along the lit pixels of marker A's curve (gaps between its dashes bridged by the
    margin, no other curve's pixels allowed) reaches marker B exactly in positives."""
    for i in range(n):
        img, label, info = pf.sample(resolution, "hard", 11, i, debug=True)
        cfg, m = info["cfg"], info["margin"]
        a, b, owner = info["a"], info["b"], info["owner"]
        ca, cb = info["marker_curves"]
        assert (ca == cb) == bool(label) and {ca, cb} <= {0, 1}
        for c in (0, 1):
            assert (owner == c).sum() == cfg["contour_length"]
        assert np.allclose(info["markers"][0], a[owner == ca][0])  # start of curve A ...
        assert np.allclose(info["markers"][1], b[owner == cb][-1])  # ... and the far end of curve B
        # dashes of different curves keep the gap (exact, all pairs)
        gap = 2 * m + cfg["thickness"]
        for j in range(len(a)):
            for k in range(j + 1, len(a)):
                if owner[j] != owner[k]:
                    assert pf._seg_seg(*a[j], *b[j], *a[k], *b[k]) >= gap - 1e-9
        # consecutive dashes of a curve are one gap of 2 * margin apart
        for c in np.unique(owner):
            ac, bc = a[owner == c], b[owner == c]
            assert np.all(np.linalg.norm(ac[1:] - bc[:-1], axis=1) <= 2 * m + 1e-9)

        lit = img > 0
        curve_a = lit & (info["curve_id"] == ca)
        assert curve_a.sum() >= cfg["contour_length"]  # the curve is drawn
        walk = _flood(_dilate(curve_a, m + 0.5), _pixel(info["markers"][0]))
        assert walk[_pixel(info["markers"][1])] == bool(label), (resolution, i, label)


def test_target_curves_three_quarters_as_bright_as_distractors_at_32_only():
    """The original's intensities: distractors at snake contrast (2 at 32x32), targets at snake x paddle
    contrast (2 x 0.75), markers at 1, the image scaled to a brightest pixel of 255. Means over the lit
    pixels of each kind of curve away from the markers, over 8 images: ~0.75 at 32, ~1 at 128."""
    for resolution, lo, hi in ((32, 0.68, 0.82), (128, 0.95, 1.05)):
        ratios = []
        for i in range(8):
            img, _, info = pf.sample(resolution, "hard", 5, i, debug=True)
            assert img.max() == 255
            cid = info["curve_id"]
            yy, xx = np.mgrid[:resolution, :resolution] + 0.5
            near = np.zeros(img.shape, bool)
            for cy, cx in info["markers"]:
                near |= (yy - cy) ** 2 + (xx - cx) ** 2 <= (info["cfg"]["marker_radius"] + 1.5) ** 2
            t = img[(cid >= 0) & (cid < 2) & ~near].astype(float)
            d = img[(cid >= 2) & ~near].astype(float)
            if (d > 0).any():
                ratios.append(t[t > 0].mean() / d[d > 0].mean())
        assert lo < np.mean(ratios) < hi, (resolution, ratios)


def _features(resolution, n, seed):
    f, y = [], []
    for i in range(n):
        img, label, info = pf.sample(resolution, "hard", seed, i, debug=True)
        mk = info["markers"]
        f.append([img.mean(), (img > 127).sum(), (img > 0).sum(), np.linalg.norm(mk[0] - mk[1])])
        y.append(label)
    return np.asarray(f, np.float64), np.asarray(y)


def _logistic_accuracy(x_tr, y_tr, x_te, y_te, steps=2000, lr=0.1):
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-9
    x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
    w, b = np.zeros(x_tr.shape[1]), 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(x_tr @ w + b)))
        w -= lr * x_tr.T @ (p - y_tr) / len(y_tr)
        b -= lr * np.mean(p - y_tr)
    return np.mean(((x_te @ w + b) > 0) == y_te)


def _threshold_accuracy(v_tr, y_tr, v_te, y_te):
    """Best threshold (either direction) fitted on the first half, scored on the second."""
    best, th, sign = 0.0, 0.0, 1
    for t in np.unique(v_tr):
        for s in (1, -1):
            acc = np.mean(((s * (v_tr - t)) > 0) == y_tr)
            if acc > best:
                best, th, sign = acc, t, s
    return np.mean(((sign * (v_te - th)) > 0) == y_te)


def test_simple_statistics_do_not_give_the_label_away():
    """Mean intensity, lit pixels and marker distance: a threshold on each, and a logistic regression on
    all four, stay near chance on held-out 32x32 images (150 fitted, 150 scored; chance +- 2.45 sd is
    0.4-0.6; with 500 + 500 they score 0.49-0.52). Fixed seeds, so the numbers do not move from run to run."""
    x, y = _features(32, 300, seed=3)
    tr, te = slice(0, 150), slice(150, 300)
    for k in range(x.shape[1]):
        assert 0.4 < _threshold_accuracy(x[tr, k], y[tr], x[te, k], y[te]) < 0.6, k
    assert 0.4 < _logistic_accuracy(x[tr], y[tr], x[te], y[te]) < 0.6


def test_load_original_layout(tmp_path):
    """The LRA release: <res>/<difficulty dir>/imgs/<batch>/sample_<k>.png and metadata/<batch>.npy, text
    lines '<image dir> <file> <index> <label> ...' (one true .npy array accepted too; empty PNGs skipped)."""
    from PIL import Image

    root = tmp_path / "pathfinder32"
    d = root / pf.ORIGINAL_DIRS["hard"]
    rng = np.random.default_rng(0)
    want_img, want_lab = [], []
    lines = {0: [], 1: []}
    for batch in (0, 1):
        (d / "imgs" / str(batch)).mkdir(parents=True)
        for k in range(3):
            img = rng.integers(0, 256, (32, 32), dtype=np.uint8)
            label = int(rng.integers(2))
            Image.fromarray(img).save(d / "imgs" / str(batch) / f"sample_{k}.png")
            lines[batch].append([f"imgs/{batch}", f"sample_{k}.png", str(k), str(label), "1.8", "14", "4", "2", "0.5", "1", "1"])
            want_img.append(img)
            want_lab.append(label)
    (d / "imgs" / "0" / "sample_9.png").write_bytes(b"")  # the release has an empty file
    lines[0].append(["imgs/0", "sample_9.png", "9", "1", "1.8", "14", "4", "2", "0.5", "1", "1"])
    (d / "metadata").mkdir()
    (d / "metadata" / "0.npy").write_text("".join(" ".join(r) + "\n" for r in lines[0]))
    np.save(d / "metadata" / "1.npy", np.array(lines[1]))
    for got in (pf.load_original(d), pf.load_original(root, "hard")):
        images, labels = got
        assert images.dtype == np.uint8 and images.shape == (6, 32, 32)
        assert np.array_equal(images, np.stack(want_img)) and labels.tolist() == want_lab
    with pytest.raises(FileNotFoundError):
        pf.load_original(root, "easy")
