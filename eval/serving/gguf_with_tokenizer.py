#!/usr/bin/env python3
"""A Qwen3-8B-shaped GGUF of random weights that tokenizes text as sala does.

    gguf_with_tokenizer.py OUT.gguf --tokenizer DIR [--kit .llamacpp-bench] [make_gguf.py's flags]

llamacpp-bench's make_gguf.py writes the model (its shapes, types and random blocks) with a
tokenizer of dummy pieces, which is enough for llama-bench (it draws random ids) but not for a
server that is sent text: there every character would be a byte token. This runs make_gguf.py
with its tokenizer calls answered from DIR's sentencepiece model (`tokenizer.model`, with
`added_tokens.json` and `tokenizer_config.json`), the files sala's synthetic models tokenize
with, so the same prompt is the same tokens in llama-server and in `sala serve`.

The pieces follow llama.cpp's own conversion of sentencepiece vocabularies: each piece with its
score and kind (normal, unknown, control, unused, byte), added tokens as user-defined (control
where the config marks them special), and rows past the tokenizer as unused `[PAD{id}]` pieces,
which decode to nothing, as ids past the tokenizer do in sala. With --tiny the vocabulary grows
to hold the tokenizer (a small model for testing the harness on a CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# GGUF token kinds (gguf.TokenType): the values llama.cpp's loader reads.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def vocabulary(tokenizer_dir: str) -> tuple[list[str], list[float], list[int], dict]:
    """Pieces, scores and kinds of the tokenizer in `tokenizer_dir`, and its config."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor()
    sp.Load(os.path.join(tokenizer_dir, "tokenizer.model"))
    pieces, scores, kinds = [], [], []
    for i in range(sp.GetPieceSize()):
        pieces.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        kind = NORMAL
        if sp.IsUnknown(i):
            kind = UNKNOWN
        elif sp.IsControl(i):
            kind = CONTROL
        elif sp.IsUnused(i):
            kind = UNUSED
        elif sp.IsByte(i):
            kind = BYTE
        kinds.append(kind)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    special = {int(i) for i, t in config.get("added_tokens_decoder", {}).items() if t.get("special")}
    added_path = os.path.join(tokenizer_dir, "added_tokens.json")
    added = json.load(open(added_path)) if os.path.exists(added_path) else {}
    for piece, i in sorted(added.items(), key=lambda kv: kv[1]):
        while len(pieces) <= i:
            pieces.append(f"[PAD{len(pieces)}]")
            scores.append(-1000.0)
            kinds.append(UNUSED)
        pieces[i], scores[i] = piece, -1000.0
        kinds[i] = CONTROL if i in special else USER_DEFINED
    return pieces, scores, kinds, config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.model and tokenizer_config.json")
    ap.add_argument("--kit", default=".llamacpp-bench", help="llamacpp-bench's folder (make_gguf.py)")
    args, rest = ap.parse_known_args()

    sys.path.insert(0, os.path.abspath(args.kit))
    import make_gguf

    pieces, scores, kinds, config = vocabulary(args.tokenizer)
    if "--tiny" in rest:
        make_gguf.TINY["n_vocab"] = -(-len(pieces) // 32) * 32
    gguf_py = None
    if "--gguf-py" in rest:
        gguf_py = rest[rest.index("--gguf-py") + 1]
    sys.path.insert(0, make_gguf.find_gguf_py(gguf_py))
    import gguf

    ids = {p: i for i, p in enumerate(pieces)}

    class Writer(gguf.GGUFWriter):
        """make_gguf.py's writer, its tokenizer replaced by ours padded to its vocabulary."""

        def add_token_list(self, tokens):
            n = len(tokens)
            if n < len(pieces):
                sys.exit(f"gguf_with_tokenizer: the model's vocabulary ({n}) is smaller than the tokenizer's ({len(pieces)})")
            self.n_vocab = n
            pad = range(len(pieces), n)
            super().add_token_list(pieces + [f"[PAD{i}]" for i in pad])

        def add_token_scores(self, _scores):
            super().add_token_scores(scores + [-1000.0] * (self.n_vocab - len(pieces)))

        def add_token_types(self, _kinds):
            super().add_token_types(kinds + [UNUSED] * (self.n_vocab - len(pieces)))

        def add_unk_token_id(self, _id):
            super().add_unk_token_id(ids[config.get("unk_token", "<unk>")])

        def add_bos_token_id(self, _id):
            super().add_bos_token_id(ids[config["bos_token"]])

        def add_eos_token_id(self, _id):
            super().add_eos_token_id(ids[config["eos_token"]])

        def add_add_bos_token(self, _value):
            super().add_add_bos_token(bool(config.get("add_bos_token", False)))

    gguf.GGUFWriter = Writer
    sys.argv = ["make_gguf.py"] + rest
    make_gguf.main()
    print(f"gguf_with_tokenizer: {len(pieces)} pieces from {args.tokenizer}", flush=True)


if __name__ == "__main__":
    main()
