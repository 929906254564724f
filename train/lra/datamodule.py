"""One LightningDataModule for the five LRA tasks, on the resumable pattern of train/data.py.

    LRADataModule(task, data_dir, seq_len, cls_token, ...)

Reads what scripts/prepare_lra.py wrote (train/lra/__init__.py lists the formats) and yields dict
batches for train.task.ClassificationTask:

    listops, text   input_ids, attention_mask (seq_len), labels   variable length, padded
    retrieval       + input_ids_2, attention_mask_2               two documents, one padded shape
    image           input_ids (1,024 pixels [+ CLS]), labels      fixed length: no mask, dense kernels
    pathfinder      input_ids (R * R pixels), labels              split 80/10/10 by index

Pixel batches leave the DataLoader as uint8 `pixels` and become `input_ids` on the device
(on_after_batch_transfer, which Lightning calls after the copy).

Token ids: ListOps its own 17-word vocabulary (train.lra.listops.VOCAB); bytes as 1 + byte (0 is
padding), [CLS] 257; pixels as their value 0-255, [CLS] 256. With cls_token, [CLS] is prepended (LRA's
CLS pooling; LRA prepends a learned vector, the same thing as a learned token) and seq_len counts it.
Sequences longer than seq_len are cut, as LRA's pipelines cut them.

Training sample i is a pure function of (seed, i) (a seeded permutation of the train split per pass),
so a resumed run reads what an uninterrupted run would have (samples_seen is checkpointed).
`auto_prepare` (the debug=smoke configs) builds tiny data in data_dir when it is missing: ListOps and
Pathfinder generated, Text / Retrieval / Image from each module's fixture(); never a download.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from train.data import ResumableDataModule
from train.lra import SPLITS, TASKS, read_meta

BYTE_CLS, PIXEL_CLS = 257, 256


def prepare_command(task: str, data_dir) -> str:
    return f"python scripts/prepare_lra.py {task} --out {data_dir}"


def is_ready(task: str, data_dir) -> bool:
    d = Path(data_dir)
    if task == "listops":
        return all((d / f"basic_{s}.tsv").exists() for s in SPLITS)
    if task == "pathfinder":
        return (d / "images.npy").exists() and (d / "labels.npy").exists() and (d / "meta.json").exists()
    return read_meta(d) is not None and all((d / f"{s}.npz").exists() for s in SPLITS)


def auto_prepare(task: str, data_dir, **kw):
    """Tiny data without downloads (smoke runs, tests)."""
    if task == "listops":
        from train.lra import listops

        return listops.generate(data_dir, **{"num_train": 64, "num_val": 16, "num_test": 16, "workers": 1, **kw})
    if task == "pathfinder":
        from train.lra import pathfinder

        kw = {"resolution": 32, "difficulty": "easy", "num": 96, "seed": 0, "workers": 1, **kw}
        return pathfinder.generate(out_dir=data_dir, **kw)
    import importlib

    return importlib.import_module(f"train.lra.{task}").fixture(data_dir, **kw)


class TokenSplit(torch.utils.data.Dataset):
    """Flat variable-length token data (one or two inputs) -> padded model inputs."""

    def __init__(self, arrays: dict, seq_len: int, shift: int, cls: int | None):
        self.seq_len, self.shift, self.cls = seq_len, shift, cls
        self.labels = arrays["labels"]
        # Row numbers into the sequences of tokens/offsets: example i reads sequence i, or with two documents
        # per example (Retrieval), sequences doc_1[i] and doc_2[i] of one document table.
        self.tokens, self.offsets = arrays["tokens"], arrays["offsets"]
        self.rows = [arrays["doc_1"], arrays["doc_2"]] if "doc_1" in arrays else [None]
        if "doc_1" in arrays and not len(arrays["doc_1"]) == len(arrays["doc_2"]) == len(self.labels):
            raise ValueError(f"document-table split: {len(arrays['doc_1'])} first and {len(arrays['doc_2'])} "
                             f"second documents for {len(self.labels)} labels")

    def __len__(self):
        return len(self.labels)

    def _pad(self, j, suffix):
        body = self.tokens[self.offsets[j]:self.offsets[j + 1]].astype(np.int64) + self.shift
        if self.cls is not None:
            body = np.concatenate([[self.cls], body])
        body = body[:self.seq_len]
        ids = np.zeros(self.seq_len, dtype=np.int64)
        ids[:len(body)] = body
        mask = np.zeros(self.seq_len, dtype=bool)
        mask[:len(body)] = True
        return {f"input_ids{suffix}": torch.from_numpy(ids), f"attention_mask{suffix}": torch.from_numpy(mask)}

    def __getitem__(self, i):
        out = {}
        for rows, suffix in zip(self.rows, ("", "_2")):
            out.update(self._pad(i if rows is None else int(rows[i]), suffix))
        out["labels"] = torch.tensor(int(self.labels[i]))
        return out


class ImageSplit(torch.utils.data.Dataset):
    """uint8 images (N, R, R) -> R * R pixel tokens (row-major) [+ CLS first], no padding."""

    def __init__(self, images, labels, index, cls: int | None, seq_len: int):
        self.images, self.labels, self.index, self.cls = images, labels, np.asarray(index), cls
        n = images.shape[1] * images.shape[2] + (cls is not None)
        if n != seq_len:
            raise ValueError(f"{images.shape[1]}x{images.shape[2]} images give {n} tokens"
                             f"{' with [CLS]' if cls is not None else ''}, but seq_len is {seq_len}")

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        return {k: v[0] for k, v in pixel_ids(self.__getitems__([i]), self.cls).items()}

    def __getitems__(self, items):
        """A whole batch in one gather; the DataLoader calls this instead of __getitem__ per sample.
        The batch holds the raw uint8 `pixels`; LRADataModule.on_after_batch_transfer makes them token ids
        on the device. Built on the host, int64 ids and the [CLS] column made loading cost LRA Image (a ~5 ms
        GPU step) 3.5 ms of host time a step; this way 0.2-0.9 ms (results/lra/host_overhead/)."""
        rows = self.index[np.asarray(items, dtype=np.int64)]
        pixels = torch.from_numpy(np.ascontiguousarray(self.images[rows]).reshape(len(rows), -1))
        return {"pixels": pixels, "labels": torch.from_numpy(np.asarray(self.labels[rows], dtype=np.int64))}


def pixel_ids(batch: dict, cls: int | None) -> dict:
    """{"pixels": uint8 (B, R * R), ...} -> {"input_ids": int64 (B, R * R [+ 1]), ...} on the batch's device."""
    batch = dict(batch)
    ids = batch.pop("pixels").long()
    if cls is not None:
        ids = torch.cat([ids.new_full((len(ids), 1), cls), ids], dim=1)
    return {"input_ids": ids, **batch}


class Permuted(torch.utils.data.Dataset):
    """Training stream: sample i = the split's item at a seeded permutation (a new one per pass)."""

    def __init__(self, base, seed: int, length: int):
        self.base, self.seed, self.length = base, seed, length
        self._epoch, self._perm = -1, None

    def __len__(self):
        return self.length

    def _item(self, i) -> int:
        epoch, j = divmod(i, len(self.base))
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.base))
            self._epoch = epoch
        return int(self._perm[j])

    def __getitem__(self, i):
        return self.base[self._item(i)]

    def __getitems__(self, items):
        if not hasattr(self.base, "__getitems__"):
            return [self.base[self._item(i)] for i in items]
        return self.base.__getitems__([self._item(i) for i in items])


class LRADataModule(ResumableDataModule):
    def __init__(self, task: str, data_dir: str, seq_len: int, cls_token: bool = True, batch_size: int = 32,
                 eval_batch_size: int | None = None, num_workers: int = 2, seed: int = 1234,
                 num_samples: int | None = None, auto_prepare: dict | None = None, source: str | None = None):
        super().__init__(batch_size, eval_batch_size, num_workers, seed, num_samples)
        if task not in TASKS:
            raise ValueError(f"unknown LRA task {task!r}; choose from {TASKS}")
        self.task, self.data_dir, self.seq_len, self.cls_token = task, str(data_dir), seq_len, cls_token
        self.auto_prepare = dict(auto_prepare) if auto_prepare is not None else None
        self.source = source  # what the config says the folder holds (recorded with the run)
        self.splits: dict = {}

    def prepare_data(self):
        if not is_ready(self.task, self.data_dir) and self.auto_prepare is not None:
            auto_prepare(self.task, self.data_dir, **self.auto_prepare)

    def setup(self, stage=None):
        if self.splits:
            return
        if not is_ready(self.task, self.data_dir):
            raise FileNotFoundError(f"no prepared LRA {self.task} data in {self.data_dir}; prepare it with: "
                                    f"{prepare_command(self.task, self.data_dir)}")
        self.splits = {s: self.load(s) for s in SPLITS}

    def load(self, split: str):
        d = Path(self.data_dir)
        if self.task == "listops":
            from train.lra import listops

            return TokenSplit(listops.load_split(d, split), self.seq_len, 0, listops.CLS if self.cls_token else None)
        if self.task in ("text", "retrieval"):
            with np.load(d / f"{split}.npz") as z:
                arrays = {k: z[k] for k in z.files}
            return TokenSplit(arrays, self.seq_len, 1, BYTE_CLS if self.cls_token else None)
        cls = self.pixel_cls
        if self.task == "image":
            with np.load(d / f"{split}.npz") as z:
                images, labels = z["images"], z["labels"]
            return ImageSplit(images, labels, np.arange(len(labels)), cls, self.seq_len)
        from train.lra import pathfinder

        images, labels = pathfinder.load(d)
        return ImageSplit(images, labels, np.asarray(pathfinder.split(len(labels))[split]), cls, self.seq_len)

    @property
    def pixel_cls(self) -> int | None:
        return PIXEL_CLS if self.cls_token else None

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if isinstance(batch, dict) and "pixels" in batch:
            return pixel_ids(batch, self.pixel_cls)
        return batch

    def train_dataloader(self):
        self.setup()
        return self.train_loader(Permuted(self.splits["train"], self.seed, self.num_samples or 10**12))

    def val_dataloader(self):
        self.setup()
        return self.eval_loader(self.splits["val"])

    def test_dataloader(self):
        self.setup()
        return self.eval_loader(self.splits["test"])
