"""Synthetic padded-batch tasks for the encoder families, generated on the fly, nothing to download.

    data=synthetic-classification  SyntheticClassification: which marker token occurs most (cls/mean pooling can count)
    data=synthetic-retrieval       SyntheticRetrieval: two inputs; do they carry the same key token?
    data=synthetic-mlm             SyntheticMLM: masked LM (15%, 80/10/10) on repeated motifs, optional NSP

Example i of a split is a pure function of (seed, split, i) (a numpy generator seeded with the three),
so training resumes exactly like train.data.LMDataModule: the datamodule checkpoints how many samples
it has consumed and continues from there. Lengths are uniform in [min_len, seq_len] and every example
is padded to seq_len (id 0, attention_mask 0), so a batch carries real padding of varied amounts.

Token ids: 0 pad, 1 [CLS], 2 [SEP], 3 [MASK]; content ids are 4 .. vocab_size - 1.
"""
from __future__ import annotations

import numpy as np
import torch

from train.data import ResumableDataModule

PAD, CLS, SEP, MASK = 0, 1, 2, 3
FIRST = 4  # first content id
IGNORE = -100
SPLITS = {"train": 0, "val": 1, "test": 2}


class Examples(torch.utils.data.Dataset):
    """`length` examples of one split; `example(rng)` returns a dict of numpy arrays."""

    def __init__(self, length: int, seed: int, split: int, vocab_size: int, seq_len: int, min_len: int | None = None):
        self.length, self.seed, self.split = length, seed, split
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.min_len = min_len or seq_len // 2
        if not 2 <= self.min_len <= seq_len:
            raise ValueError(f"need 2 <= min_len <= seq_len, got min_len {self.min_len}, seq_len {seq_len}")

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, self.split, i])
        return {k: torch.from_numpy(np.asarray(v)) for k, v in self.example(rng).items()}

    def draw_len(self, rng) -> int:
        return int(rng.integers(self.min_len, self.seq_len + 1))

    def pad(self, ids: np.ndarray, prefix: str = "") -> dict:
        out = np.full(self.seq_len, PAD, dtype=np.int64)
        out[:len(ids)] = ids
        suffix = f"_{prefix}" if prefix else ""
        return {f"input_ids{suffix}": out, f"attention_mask{suffix}": out != PAD}


class CountingExamples(Examples):
    """[CLS] + random filler with marker tokens FIRST .. FIRST + C - 1 inserted c_0 .. c_{C-1} times
    (distinct counts in 0 .. max_count); label = the marker that occurs most often (uniform over C)."""

    def __init__(self, *args, num_classes: int = 2, max_count: int = 8, **kw):
        super().__init__(*args, **kw)
        self.num_classes, self.max_count = num_classes, max_count
        if max_count + 1 < num_classes:
            raise ValueError(f"max_count {max_count} cannot give {num_classes} distinct counts")
        if self.min_len < 1 + num_classes * max_count:
            raise ValueError(f"min_len {self.min_len} < 1 + num_classes x max_count: the markers may not fit")
        if self.vocab_size <= FIRST + num_classes:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no filler tokens")

    def example(self, rng):
        n = self.draw_len(rng)
        body = rng.integers(FIRST + self.num_classes, self.vocab_size, n - 1)
        counts = rng.choice(self.max_count + 1, self.num_classes, replace=False)
        slots = rng.choice(n - 1, counts.sum(), replace=False)
        body[slots] = np.repeat(np.arange(FIRST, FIRST + self.num_classes), counts)
        return {**self.pad(np.concatenate([[CLS], body])), "labels": np.int64(counts.argmax())}


class RetrievalExamples(Examples):
    """Two inputs, each [CLS] + filler with one key token (of n_keys) at `repeats` random places;
    label 1 when both carry the same key (half the pairs)."""

    def __init__(self, *args, n_keys: int = 16, repeats: int = 4, **kw):
        super().__init__(*args, **kw)
        self.n_keys, self.repeats = n_keys, repeats
        if self.min_len < 1 + repeats:
            raise ValueError(f"min_len {self.min_len} < 1 + repeats")
        if self.vocab_size <= FIRST + n_keys:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no filler tokens")

    def _one(self, rng, key):
        n = self.draw_len(rng)
        body = rng.integers(FIRST + self.n_keys, self.vocab_size, n - 1)
        body[rng.choice(n - 1, self.repeats, replace=False)] = FIRST + key
        return np.concatenate([[CLS], body])

    def example(self, rng):
        same = bool(rng.integers(2))
        k1 = int(rng.integers(self.n_keys))
        k2 = k1 if same else int((k1 + rng.integers(1, self.n_keys)) % self.n_keys)
        return {**self.pad(self._one(rng, k1)), **self.pad(self._one(rng, k2), "2"), "labels": np.int64(same)}


class MaskedLMExamples(Examples):
    """BERT-style masked LM on text that is a random motif (2 .. max_period content ids) repeated, so a
    masked token is recoverable from one period away. Single segment: [CLS] A [SEP]. With nsp:
    [CLS] A [SEP] B [SEP], B either A's continuation (nsp label 0, "is next") or another motif's (1).

    Masking as BERT: mask_prob of the content tokens (at least 1, at most max_predictions) are chosen;
    80% become [MASK], 10% a random content id, 10% stay. mlm_positions lists them (0-padded to
    max_predictions), mlm_labels holds the originals (-100 in unused slots).
    """

    def __init__(self, *args, nsp: bool = False, mask_prob: float = 0.15, max_predictions: int = 20,
                 max_period: int = 8, **kw):
        super().__init__(*args, **kw)
        self.nsp, self.mask_prob, self.max_predictions, self.max_period = nsp, mask_prob, max_predictions, max_period
        if self.min_len < (5 if nsp else 3):
            raise ValueError(f"min_len {self.min_len} is too short for [CLS] A [SEP]{' B [SEP]' if nsp else ''}")

    def _motif_text(self, rng, start: int, n: int):
        motif = rng.integers(FIRST, self.vocab_size, int(rng.integers(2, self.max_period + 1)))
        return motif[(start + np.arange(n)) % len(motif)], motif

    def example(self, rng):
        n = self.draw_len(rng)
        out = {}
        if self.nsp:
            a = int(rng.integers(1, n - 3))  # n = 3 specials + a + b, b >= 1
            text_a, motif = self._motif_text(rng, 0, a)
            is_random = bool(rng.integers(2))
            if is_random:
                text_b, _ = self._motif_text(rng, 0, n - 3 - a)
            else:
                text_b = motif[(a + np.arange(n - 3 - a)) % len(motif)]
            ids = np.concatenate([[CLS], text_a, [SEP], text_b, [SEP]])
            types = np.concatenate([np.zeros(a + 2, np.int64), np.ones(n - a - 2, np.int64)])
            out["nsp_labels"] = np.int64(is_random)
        else:
            text, _ = self._motif_text(rng, 0, n - 2)
            ids = np.concatenate([[CLS], text, [SEP]])
            types = np.zeros(n, np.int64)
        content = np.nonzero(ids >= FIRST)[0]
        k = min(self.max_predictions, max(1, int(round(len(content) * self.mask_prob))))
        pos = np.sort(rng.choice(content, k, replace=False))
        labels = ids[pos].copy()
        r = rng.random(k)
        ids[pos[r < 0.8]] = MASK
        swap = (r >= 0.8) & (r < 0.9)
        ids[pos[swap]] = rng.integers(FIRST, self.vocab_size, int(swap.sum()))
        out.update(self.pad(ids))
        out["token_type_ids"] = np.pad(types, (0, self.seq_len - n))
        out["mlm_positions"] = np.pad(pos, (0, self.max_predictions - k))
        out["mlm_labels"] = np.pad(labels, (0, self.max_predictions - k), constant_values=IGNORE)
        return out


class SyntheticDataModule(ResumableDataModule):
    """Train / val / test splits of `examples` (train: num_samples long, val/test: fixed sizes)."""

    examples: type[Examples]

    def __init__(self, batch_size: int = 32, eval_batch_size: int | None = None, num_workers: int = 0,
                 seed: int = 1234, num_samples: int | None = None, val_samples: int = 1024,
                 test_samples: int = 1024, **params):
        super().__init__(batch_size, eval_batch_size, num_workers, seed, num_samples)
        self.sizes = {"val": val_samples, "test": test_samples}
        self.params = params
        self.split("val")  # checks the parameters now, not in a dataloader worker

    def split(self, name: str, length: int | None = None) -> Examples:
        length = self.sizes[name] if length is None else length
        return self.examples(length, self.seed, SPLITS[name], **self.params)

    def train_dataloader(self):
        return self.train_loader(self.split("train", self.num_samples or 10**12))

    def val_dataloader(self):
        return self.eval_loader(self.split("val"))

    def test_dataloader(self):
        return self.eval_loader(self.split("test"))


class SyntheticClassification(SyntheticDataModule):
    examples = CountingExamples


class SyntheticRetrieval(SyntheticDataModule):
    examples = RetrievalExamples


class SyntheticMLM(SyntheticDataModule):
    examples = MaskedLMExamples
