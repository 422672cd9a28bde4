#!/usr/bin/env python3
# Checks that preprocess_data with --tokenizer-type HuggingFaceTokenizer writes exactly the ids the
# PyPI `tokenizers` library gives (tokenizer(text).input_ids, no eod) for every document of a JSONL
# file ({"text": ...} per line), for one or more tokenizer.json directories. Needs `tokenizers`
# and numpy (e.g. the venv of tests/fixtures/hf_tokenizers/gen_hf_tokenizers.py). Prints one line
# per tokenizer and exits 1 on the first document that differs, naming it.
#   python3 scripts/hf_tokenizer_parity.py --preprocess build/bin/preprocess_data \
#       --input docs.jsonl tests/fixtures/hf_tokenizers/t5_precompiled ...
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preprocess", required=True, help="the preprocess_data binary")
    ap.add_argument("--input", required=True, help="JSONL with a 'text' key")
    ap.add_argument("tokenizers", nargs="+", help="directories holding tokenizer.json")
    args = ap.parse_args()
    with open(args.input, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.tokenizers:
            prefix = os.path.join(tmp, os.path.basename(os.path.normpath(d)))
            subprocess.run([args.preprocess, "--input", args.input, "--output-prefix", prefix,
                            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", d,
                            "--workers", "2"], check=True, capture_output=True)
            tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            want = [tok.encode(t).ids for t in docs]
            with open(prefix + "_text_document.idx", "rb") as f:
                f.seek(9 + 8)  # magic, version
                dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                         6: np.float64, 7: np.float32, 8: np.uint16}[f.read(1)[0]]
            got = np.fromfile(prefix + "_text_document.bin", dtype=dtype).astype(np.int64)
            pos = 0
            for i, ids in enumerate(want):
                if not ids:
                    continue  # preprocess_data writes no document for an empty one
                if got[pos:pos + len(ids)].tolist() != ids:
                    sys.exit(f"{d}: document {i} differs from what tokenizers gives")
                pos += len(ids)
            if pos != len(got):
                sys.exit(f"{d}: {len(got)} ids written, tokenizers gives {pos}")
            print(f"{d}: {len(docs)} documents, {pos} ids, equal to tokenizers")


if __name__ == "__main__":
    main()
