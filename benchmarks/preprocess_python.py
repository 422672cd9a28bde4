#!/usr/bin/env python3
"""The Python side of benchmarks/run_preprocess.sh: Megatron's tools/preprocess_data.py loop and
the HF `tokenizers` batch encoding, on the same JSONL, GPT-2 BPE, timed; one JSON line per run.

  python preprocess_python.py megatron --input X.jsonl --vocab V --merges M --workers W --output-prefix P
  python preprocess_python.py hf       --input X.jsonl --vocab V --merges M --workers W

megatron: tools/preprocess_data.py is not in the megatron-core wheel, so its Encoder / main loop is
reproduced here statement for statement (json.loads per line, tokenize each sentence, append EOD,
multiprocessing.Pool(workers).imap(encode, fin, 32), IndexedDatasetBuilder.add_document, finalize)
around megatron-core's own library pieces: the tokenizer is megatron-core 0.16's
HuggingFaceTokenizer (what --tokenizer-type HuggingFaceTokenizer builds; its default
use_fast=False) over a local folder holding the same vocab.json / merges.txt, and the writer is
megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder. Megatron-LM's legacy
GPT2BPETokenizer (megatron/training, pure-Python BPE) is not in the wheel either.

hf: tokenizers.Tokenizer(BPE(vocab, merges)) with the GPT-2 ByteLevel pre-tokenizer, encode_batch
over batches of 1,000 documents, RAYON_NUM_THREADS = workers; json parsing included, no writing.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def build_tokenizer(tokdir):
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer(tokdir)


class Encoder(object):
    """tools/preprocess_data.py's Encoder (json key "text", --append-eod, no sentence splitting)."""

    def __init__(self, tokdir):
        self.tokdir = tokdir

    def initializer(self):
        Encoder.tokenizer = build_tokenizer(self.tokdir)

    def encode(self, json_line):
        data = json.loads(json_line)
        ids = {}
        lens = {}
        for key in ["text"]:
            text = data[key]
            if isinstance(text, list):
                sentences = text
            else:
                sentences = [text]
            doc_ids = []
            sentence_lens = []
            for sentence in sentences:
                sentence_ids = Encoder.tokenizer.text_to_ids(sentence)
                if len(sentence_ids) > 0:
                    doc_ids.extend(sentence_ids)
                    sentence_lens.append(len(sentence_ids))
            if len(doc_ids) > 0:  # --append-eod
                doc_ids.append(Encoder.tokenizer.eod)
                sentence_lens[-1] += 1
            ids[key] = doc_ids
            lens[key] = sentence_lens
        return ids, lens, len(json_line)


def run_megatron(args):
    import multiprocessing

    import numpy
    import torch  # noqa: F401  (IndexedDatasetBuilder writes numpy arrays it gets from lists)

    from megatron.core.datasets import indexed_dataset

    tokdir = tempfile.mkdtemp(prefix="mg_bench_gpt2_")
    for src, dst in ((args.vocab, "vocab.json"), (args.merges, "merges.txt")):
        os.symlink(os.path.abspath(src), os.path.join(tokdir, dst))
    with open(os.path.join(tokdir, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "eos_token": "<|endoftext|>",
                "bos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
            },
            f,
        )

    encoder = Encoder(tokdir)
    tokenizer = build_tokenizer(tokdir)
    start = time.time()
    fin = open(args.input, "r", encoding="utf-8")
    pool = multiprocessing.Pool(args.workers, initializer=encoder.initializer)
    encoded_docs = pool.imap(encoder.encode, fin, 32)
    builder = indexed_dataset.IndexedDatasetBuilder(
        args.output_prefix + "_text_document.bin",
        dtype=indexed_dataset.DType.optimal_dtype(tokenizer.vocab_size),
    )
    total_bytes = 0
    docs = 0
    tokens = 0
    for doc, sentence_lens, bytes_processed in encoded_docs:
        total_bytes += bytes_processed
        docs += 1
        for key in doc.keys():
            builder.add_document(doc[key], sentence_lens[key])
            tokens += len(doc[key])
    fin.close()
    builder.finalize(args.output_prefix + "_text_document.idx")
    pool.close()
    pool.join()
    wall = time.time() - start
    import importlib.metadata

    return {
        "impl": "megatron-core preprocess_data loop",
        "tokenizer": type(tokenizer.tokenizer).__module__ + "." + type(tokenizer.tokenizer).__name__,
        "megatron_core": importlib.metadata.version("megatron-core"),
        "transformers": importlib.metadata.version("transformers"),
        "numpy": numpy.__version__,
        "workers": args.workers,
        "docs": docs,
        "bytes": total_bytes,
        "tokens": tokens,
        "wall_s": wall,
    }


def run_hf(args):
    os.environ["RAYON_NUM_THREADS"] = str(args.workers)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    import importlib.metadata

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(args.vocab, args.merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    eod = tok.token_to_id("<|endoftext|>")
    start = time.time()
    docs = tokens = total_bytes = 0
    batch = []

    def flush():
        nonlocal tokens
        for enc in tok.encode_batch(batch):
            tokens += len(enc.ids) + (1 if enc.ids else 0)  # + EOD, as --append-eod
        batch.clear()

    with open(args.input, "r", encoding="utf-8") as fin:
        for line in fin:
            total_bytes += len(line)
            docs += 1
            batch.append(json.loads(line)["text"])
            if len(batch) == 1000:
                flush()
    flush()
    wall = time.time() - start
    assert eod is not None
    return {
        "impl": "HF tokenizers encode_batch",
        "tokenizers": importlib.metadata.version("tokenizers"),
        "workers": args.workers,
        "docs": docs,
        "bytes": total_bytes,
        "tokens": tokens,
        "wall_s": wall,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["megatron", "hf"])
    p.add_argument("--input", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--merges", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--output-prefix")
    args = p.parse_args()
    if args.mode == "megatron" and not args.output_prefix:
        p.error("megatron mode needs --output-prefix")
    r = run_megatron(args) if args.mode == "megatron" else run_hf(args)
    r["mb_per_s"] = r["bytes"] / 1e6 / r["wall_s"]
    r["tokens_per_s"] = r["tokens"] / r["wall_s"]
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
