"""Text -> GPT-2 tokens -> uint16 memmaps, and the LightningDataModule that reads them.

One pipeline serves every source (the committed embedded corpus, the registry corpus of
scripts/prepare_corpus.py, OpenWebText): a HF `datasets.Dataset` with a "text" column is tokenized
with a batched (optionally multi-process) `.map`, each document ends with <|endoftext|>, documents
are split into train/val by a seeded permutation (a fixed fraction, 0.5% as the paper does for
OpenWebText), and the ids are written to `train.bin` / `val.bin` (uint16) with a `meta.json` whose
stamp (a hash of the inputs and settings) makes a second run a no-op.

Training samples are non-overlapping windows of seq_len + 1 tokens, visited in a seeded permutation
per pass; sample i is a pure function of (seed, i), so a resumed run sees exactly the samples an
uninterrupted run would have seen (the datamodule checkpoints how many it has consumed).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
BPE_DIR = REPO / "data" / "gpt2"
EOT_ID = 50256
PREPARE_CMD = {
    "embedded": "python train/run.py data=embedded  (prepares it automatically from data/embedded/)",
    "corpus": "python scripts/prepare_corpus.py",
    "openwebtext": "python scripts/prepare_corpus.py --source openwebtext",
}


# ---- tokenizer -----------------------------------------------------------------------------------
_TOKENIZER = {}


def gpt2_tokenizer(bpe_dir: str | os.PathLike = BPE_DIR):
    """The GPT-2 byte-level BPE from the committed encoder.json + vocab.bpe (no hub access)."""
    key = str(bpe_dir)
    if key not in _TOKENIZER:
        from tokenizers import ByteLevelBPETokenizer

        _TOKENIZER[key] = ByteLevelBPETokenizer(
            os.path.join(bpe_dir, "encoder.json"), os.path.join(bpe_dir, "vocab.bpe")
        )
    return _TOKENIZER[key]


def encode(text: str) -> list[int]:
    return gpt2_tokenizer().encode(text).ids


def decode(ids) -> str:
    return gpt2_tokenizer().decode([int(i) for i in ids])


def _tokenize_batch(batch):
    encs = gpt2_tokenizer().encode_batch(batch["text"])
    ids = [e.ids + [EOT_ID] for e in encs]
    return {"ids": ids, "len": [len(x) for x in ids]}


# ---- pipeline ------------------------------------------------------------------------------------
def file_digest(paths) -> str:
    """Digest of what the files hold: each file's name (not its folder) and bytes, in a fixed order.

    Where the checkout lives does not enter it, so a moved or copied checkout finds its prepared data
    up to date instead of tokenizing again (which needs `datasets`)."""
    entries = []
    for p in map(Path, paths):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        entries.append(f"{p.name}\0{h.hexdigest()}\n")
    return hashlib.sha256("".join(sorted(entries)).encode()).hexdigest()[:16]


def make_stamp(inputs: str, val_fraction: float, seed: int) -> str:
    """What a prepared folder was made from: the inputs' digest (content, never paths) and the split settings."""
    return hashlib.sha256(f"{inputs}|{val_fraction}|{seed}".encode()).hexdigest()[:16]


def is_prepared(out_dir, stamp: str | None = None) -> bool:
    meta = Path(out_dir) / "meta.json"
    if not meta.exists():
        return False
    m = json.loads(meta.read_text())
    return stamp is None or m.get("stamp") == stamp


def split_documents(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Bool mask of validation documents: a seeded permutation's first max(1, round(f * n)) docs."""
    n_val = max(1, int(round(val_fraction * n_docs))) if val_fraction > 0 else 0
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


def tokenize_to_memmaps(dataset, out_dir, *, val_fraction=0.005, seed=2357, num_proc=None,
                        stamp: str = "", batch_size=256, desc="tokenizing") -> dict:
    """Tokenize a `datasets.Dataset` with a "text" column into out_dir/{train,val}.bin (uint16).

    Idempotent: returns the existing meta when out_dir holds a run with the same stamp.
    """
    out_dir = Path(out_dir)
    stamp = make_stamp(stamp, val_fraction, seed)
    if is_prepared(out_dir, stamp):
        print(f"{out_dir} is up to date (stamp {stamp}); nothing to do")
        return json.loads((out_dir / "meta.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    if num_proc is not None and num_proc <= 1:
        num_proc = None
    tok = dataset.map(_tokenize_batch, batched=True, batch_size=batch_size, num_proc=num_proc,
                      remove_columns=dataset.column_names, desc=desc)
    lens = np.asarray(tok["len"], dtype=np.int64)
    is_val = split_documents(len(lens), val_fraction, seed)
    from tqdm.auto import tqdm

    meta = {"stamp": stamp, "documents": int(len(lens)), "val_documents": int(is_val.sum()),
            "val_fraction": val_fraction, "seed": seed, "dtype": "uint16", "eot_id": EOT_ID}
    for split, mask in (("train", ~is_val), ("val", is_val)):
        total = int(lens[mask].sum())
        path = out_dir / f"{split}.bin.tmp"
        arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(max(total, 1),))
        pos = 0
        idx = np.nonzero(mask)[0]
        sel = tok.select(idx).with_format("numpy")
        step = 1024
        for start in tqdm(range(0, len(sel), step), desc=f"writing {split}.bin", leave=False):
            ids = sel[start:start + step]["ids"]
            chunk = np.concatenate(list(ids)) if len(ids) else np.zeros(0, np.uint16)
            arr[pos:pos + len(chunk)] = chunk
            pos += len(chunk)
        arr.flush()
        del arr
        if total == 0:  # a zero-length memmap cannot be created; keep an empty file instead
            open(path, "wb").close()
        os.replace(path, out_dir / f"{split}.bin")
        meta[f"{split}_tokens"] = total
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def prepare_embedded(out_dir=REPO / "data" / "cache" / "embedded", val_fraction=0.02, seed=2357,
                     num_proc=None, source=REPO / "data" / "embedded" / "corpus.jsonl.gz") -> dict:
    """Tokenize the committed corpus (State of the Union + Moby Dick) once into data/cache/."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"embedded corpus {source} is missing (it is committed to the repo)")
    stamp = "embedded|" + file_digest([source, BPE_DIR / "encoder.json", BPE_DIR / "vocab.bpe"])
    if is_prepared(out_dir, make_stamp(stamp, val_fraction, seed)):
        return json.loads((Path(out_dir) / "meta.json").read_text())
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(source), split="train")
    return tokenize_to_memmaps(ds, out_dir, val_fraction=val_fraction, seed=seed, num_proc=num_proc,
                               stamp=stamp, desc="tokenizing embedded corpus")


def load_tokens(data_dir, split: str, source: str = "corpus") -> np.memmap:
    """Open data_dir/{split}.bin, failing with the command that prepares it when missing or empty."""
    path = Path(data_dir) / f"{split}.bin"
    how = PREPARE_CMD.get(source, PREPARE_CMD["corpus"])
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist; prepare it with: {how}")
    if path.stat().st_size < 4:
        raise ValueError(f"data file {path} is empty; prepare it again with: {how}")
    return np.memmap(path, dtype=np.uint16, mode="r")


# ---- datasets and sampler ------------------------------------------------------------------------
class TrainWindows(torch.utils.data.Dataset):
    """Sample i = a (seq_len + 1)-token window; windows are visited in a seeded permutation per pass."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, length: int):
        self.tokens, self.seq_len, self.seed, self.length = tokens, seq_len, seed, length
        self.n_windows = (len(tokens) - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"{len(tokens)} training tokens are fewer than one window of {seq_len + 1}")
        self._perm_epoch, self._perm = -1, None

    def __len__(self):
        return self.length

    def window(self, i: int) -> int:
        epoch, j = divmod(i, self.n_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._perm_epoch = epoch
        return int(self._perm[j])

    def __getitem__(self, i):
        s = self.window(i) * self.seq_len
        return torch.from_numpy(self.tokens[s:s + self.seq_len + 1].astype(np.int64))


class EvalWindows(torch.utils.data.Dataset):
    """Consecutive non-overlapping windows covering the split (the final partial window is dropped)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise ValueError(f"{len(tokens)} validation tokens are fewer than one window of {seq_len + 1}")

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = i * self.seq_len
        return torch.from_numpy(self.tokens[s:s + self.seq_len + 1].astype(np.int64))


class ResumableSampler(torch.utils.data.Sampler):
    """Yields global sample indices start, start+1, ... (strided over ranks); `start` comes from the checkpoint.

    A run is one epoch of `total` samples. Its length is the whole epoch's, not what is left after `start`:
    a resumed Lightning loop restores its batch counter within the epoch (the batches already done) and ends
    the epoch when that counter reaches the loader's length. A length of only what is left ended the epoch
    early whenever fewer batches were done than left (any resume before half-way), and the next epoch read
    the same samples again from `start`."""

    def __init__(self, total: int, start: int = 0, rank: int = 0, world_size: int = 1):
        self.total, self.start, self.rank, self.world = total, start, rank, world_size

    def __iter__(self):
        return iter(range(self.start + self.rank, self.total, self.world))

    def __len__(self):
        return len(range(self.rank, self.total, self.world))


class ShardSampler(torch.utils.data.Sampler):
    """Evaluation: rank r of w visits samples r, r + w, ..., so the ranks together see every sample once.

    Unlike DistributedSampler nothing is repeated to even out the shards: the split metrics are sums
    and counts, exact however unevenly the ranks share the samples.
    """

    def __init__(self, n: int, rank: int = 0, world_size: int = 1):
        self.n, self.rank, self.world = n, rank, world_size

    def __iter__(self):
        return iter(range(self.rank, self.n, self.world))

    def __len__(self):
        return len(range(self.rank, self.n, self.world))


# ---- LightningDataModules ------------------------------------------------------------------------
import lightning as L  # noqa: E402


def own_process_group(_worker_id: int) -> None:
    """DataLoader workers leave the job's process group. A SIGTERM sent to the whole group (a scheduler
    preempting the run, `kill -- -PGID`, Ctrl-C's SIGINT in a terminal) would otherwise end them first, and
    training would fail on a dead worker instead of stopping at the next optimizer step with a checkpoint
    (train.callbacks.CallLog). The main process still ends them at shutdown (by pid), and a worker whose
    parent dies exits by itself (PyTorch's worker loop watches it). Ignoring SIGTERM in the worker instead
    would hang that shutdown, which terminates workers that do not stop in time."""
    os.setpgrp()


def collate(samples):
    """default_collate, except that a dataset's `__getitems__` may hand over a finished batch dict."""
    return samples if isinstance(samples, dict) else torch.utils.data.default_collate(samples)


class ResumableDataModule(L.LightningDataModule):
    """What every datamodule shares: training sample i is a pure function of (seed, i), read in order
    from `samples_seen` (checkpointed), strided over ranks; evaluation splits sharded over ranks.

    Subclasses build the datasets; `num_samples` (set by run.py: max_steps x accumulation x
    micro-batch x world size) is the length of the training stream.
    """

    def __init__(self, batch_size: int = 16, eval_batch_size: int | None = None, num_workers: int = 2,
                 seed: int = 1234, num_samples: int | None = None):
        super().__init__()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.seed = num_workers, seed
        self.num_samples = num_samples
        self.samples_seen = 0
        self.resumed_accumulation: int | None = None  # from the checkpoint (written since session 28)

    @property
    def _rank_world(self):
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)

    def _loader(self, ds, batch_size, sampler=None):
        return torch.utils.data.DataLoader(
            ds, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers, drop_last=False,
            pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0, collate_fn=collate,
            worker_init_fn=own_process_group,
        )

    def train_loader(self, ds):
        if self.trainer is not None and self.resumed_accumulation not in (None, self.trainer.accumulate_grad_batches):
            # Lightning restores its micro-batch counter (steps x the old accumulation) and steps the optimizer on
            # it: with another accumulation it would step mid-way through a step's micro-batches and end the data
            # epoch at the wrong place. The data position itself (samples_seen) would carry over.
            raise ValueError(
                f"the checkpoint was written with gradient accumulation {self.resumed_accumulation} and this run has "
                f"{self.trainer.accumulate_grad_batches} (global_batch_size / (data.batch_size x devices)): resume "
                "with the same accumulation, or start the run over")
        return self._loader(ds, self.batch_size, ResumableSampler(len(ds), self.samples_seen, *self._rank_world))

    def eval_loader(self, ds):
        return self._loader(ds, self.eval_batch_size, ShardSampler(len(ds), *self._rank_world))

    def state_dict(self):
        # Checkpoints are written after optimizer steps, so this counts exactly the samples consumed.
        t = self.trainer
        per_step = self.batch_size * t.accumulate_grad_batches * t.world_size
        return {"samples_seen": t.global_step * per_step, "accumulation": t.accumulate_grad_batches}

    def load_state_dict(self, state):
        self.samples_seen = int(state["samples_seen"])
        self.resumed_accumulation = state.get("accumulation")


class LMDataModule(ResumableDataModule):
    """Language-modelling batches (batch, seq_len + 1) of token ids from train.bin / val.bin."""

    def __init__(self, data_dir: str, source: str = "corpus", seq_len: int = 1024, batch_size: int = 16,
                 eval_batch_size: int | None = None, num_workers: int = 2, seed: int = 1234,
                 num_samples: int | None = None, val_fraction: float = 0.005, prepare_num_proc: int | None = None):
        super().__init__(batch_size, eval_batch_size, num_workers, seed, num_samples)
        self.data_dir, self.source, self.seq_len = str(data_dir), source, seq_len
        self.val_fraction, self.prepare_num_proc = val_fraction, prepare_num_proc

    def prepare_data(self):
        if self.source == "embedded":
            prepare_embedded(self.data_dir, val_fraction=self.val_fraction, num_proc=self.prepare_num_proc)

    def setup(self, stage=None):
        self.train_tokens = load_tokens(self.data_dir, "train", self.source)
        self.val_tokens = load_tokens(self.data_dir, "val", self.source)

    def train_dataloader(self):
        return self.train_loader(TrainWindows(self.train_tokens, self.seq_len, self.seed, self.num_samples or 10**12))

    def val_dataloader(self):
        return self.eval_loader(EvalWindows(self.val_tokens, self.seq_len))
