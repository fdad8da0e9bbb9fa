#!/usr/bin/env python3
"""Score decoded BFCL v4 non-live answers with the *official* checker.

This is our own thin driver around the `bfcl-eval` PyPI wheel: it does not
contain any of the wheel's logic, it imports the wheel's modules and calls
them, so that `sala bfcl` (Rust) can be compared verdict by verdict with the
reference implementation.  See /work/notes/bfcl.md for the rules themselves.

Setup (once; the checker itself needs only the standard library plus
`filelock`; `tree_sitter*` and `tenacity` are only for the optional "raw"
input that runs the official prompt-mode decoder):

    python3 -m venv /tmp/bfclenv
    /tmp/bfclenv/bin/pip download bfcl-eval --no-deps -d /tmp/bfclwheel
    (cd /tmp/bfclwheel && mkdir -p unz && cd unz && unzip -q ../bfcl_eval-*.whl)
    /tmp/bfclenv/bin/pip install filelock==3.20.0 tenacity \
        tree_sitter==0.21.3 tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4

Usage:

    /tmp/bfclenv/bin/python tests/reference/bfcl_official_check.py \
        /tmp/bfclwheel/unz [--underscore-to-dot] [--verbose] [--summary] \
        < answers.jsonl > verdicts.jsonl

    (the wheel directory may instead be given as $BFCL_WHEEL_DIR)

Input, one JSON object per line:

    {"id": "simple_python_97", "category": "simple_python",
     "decoded": [{"math.factorial": {"number": 5}}]}

  * "category" is optional (derived from the id the official way).
  * "decoded" is the model's calls as [{name: {arg: value}}], or null when the
    model output could not be decoded.  Note JSON has no tuples: a Python
    tuple value must be sent as a list (the checker turns tuples into lists
    only for parameters of type "tuple", so this loses nothing there).
  * Instead of "decoded" a line may carry "raw": the model's prompt-mode text;
    it is then decoded here with the official `default_decode_ast_prompting`
    (python / java / javascript chosen from the category, as the eval runner
    does).  The decoded value is echoed back as "decoded".

Output, one JSON object per input line:

    {"id": ..., "valid": true|false, "error_type": null|"..."}
  (+ "error": [...] with --verbose, + "decoded" for "raw" input)

--underscore-to-dot: act like a model whose config has underscore_to_dot=True
  (OpenAI/Claude/Mistral... FC models): the expected name "math.factorial"
  is then looked for as "math_factorial" in the decoded output.
--summary: print per-category accuracy and the data_non_live.csv numbers to
  stderr (the aggregation follows the wheel's generate_leaderboard_csv).
"""

import argparse
import json
import os
import sys
import tempfile
import types


def _parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel_dir", nargs="?", default=os.environ.get("BFCL_WHEEL_DIR"))
    ap.add_argument("--underscore-to-dot", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args()
    if not args.wheel_dir or not os.path.isdir(os.path.join(args.wheel_dir, "bfcl_eval")):
        ap.error("give the unpacked bfcl-eval wheel directory (argv or $BFCL_WHEEL_DIR)")
    return args


def _import_official(wheel_dir, underscore_to_dot):
    """Import just the checker parts of the wheel, avoiding its heavy deps."""
    sys.path.insert(0, os.path.abspath(wheel_dir))

    # bfcl_eval.constants.eval_config creates result/, score/ and .file_locks/
    # under BFCL_PROJECT_ROOT (default: next to the package) at import time;
    # point it at a throw-away directory so the wheel dir stays untouched.
    os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="bfcl_root_"))

    # ast_checker imports MODEL_CONFIG_MAPPING from constants.model_config,
    # which imports every model handler (openai, anthropic, vllm helpers...).
    # The checker only reads `.underscore_to_dot` from it, so we register a
    # stand-in module whose mapping answers that one field for any model name.
    stub = types.ModuleType("bfcl_eval.constants.model_config")

    class _AnyModel(dict):
        def __missing__(self, key):
            return types.SimpleNamespace(underscore_to_dot=underscore_to_dot)

    stub.MODEL_CONFIG_MAPPING = _AnyModel()
    sys.modules["bfcl_eval.constants.model_config"] = stub

    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval import utils as bu  # needs `filelock`

    return types.SimpleNamespace(
        Language=Language,
        ReturnFormat=ReturnFormat,
        ast_checker=ast_checker,
        utils=bu,
    )


_decoder = None


def _official_prompt_decoder():
    # Lazy: pulls in tenacity and the tree-sitter java/js parsers.
    global _decoder
    if _decoder is None:
        from bfcl_eval.model_handler.utils import default_decode_ast_prompting

        _decoder = default_decode_ast_prompting
    return _decoder


class Dataset:
    """Question entries and possible answers per category, as the runner loads them."""

    def __init__(self, off):
        self.off = off
        self.cache = {}

    def get(self, category):
        if category not in self.cache:
            u = self.off.utils
            # Exactly the runner's call: no language hints in the docs it checks against.
            prompts = u.load_dataset_entry(
                category, include_prereq=False, include_language_specific_hint=False
            )
            by_id = {p["id"]: {"function": p["function"]} for p in prompts}
            if not u.is_relevance_or_irrelevance(category):
                answers = u.load_ground_truth_entry(category)
                # The runner pairs question and answer files by line index.
                for p, a in zip(prompts, answers):
                    by_id[p["id"]]["ground_truth"] = a["ground_truth"]
            self.cache[category] = by_id
        return self.cache[category]


def check_line(off, data, obj):
    u = off.utils
    test_id = obj["id"]
    category = obj.get("category") or u.extract_test_category_from_id(test_id)
    entry = data.get(category)[test_id]

    # Language / return format are picked from the category name, as in ast_file_runner.
    if u.is_java(category):
        language, ret_fmt = off.Language.JAVA, off.ReturnFormat.JAVA
    elif u.is_js(category):
        language, ret_fmt = off.Language.JAVASCRIPT, off.ReturnFormat.JAVASCRIPT
    else:
        language, ret_fmt = off.Language.PYTHON, off.ReturnFormat.PYTHON

    out = {"id": test_id}
    decode_error = None
    if "raw" in obj:
        # Relevance/irrelevance entries are always decoded as Python by the runner.
        fmt = off.ReturnFormat.PYTHON if u.is_relevance_or_irrelevance(category) else ret_fmt
        # (The Java decoder recurses: the frames below it here, six with the
        # module's, set where it hits the recursion limit; sala's decode.rs
        # counts them as PY_BASE_FRAMES.  Keep the call this deep.)
        try:
            decoded = _official_prompt_decoder()(obj["raw"], fmt, False)
            decode_failed = False
        except Exception as e:  # any exception = decode failure, as in the runner
            decoded, decode_error = None, f"{type(e).__name__}: {e}"
            decode_failed = True
        # Note: the java/js decoders can *return* None or {} without raising;
        # that is not a decode failure but a wrong output format (below).
        out["decoded"] = decoded
    else:
        decoded = obj.get("decoded")
        decode_failed = decoded is None

    if u.is_relevance_or_irrelevance(category):
        # A function call was made iff decoding worked and the result is not
        # "empty" by the official is_empty_output ([], [{}], or not call-shaped).
        made_call = not decode_failed and not u.is_empty_output(decoded)
        valid = (not made_call) if "irrelevance" in category else made_call
        if valid:
            err_type, err = None, []
        elif "irrelevance" in category:
            err_type = "irrelevance_error:decoder_success"
            err = ["Valid syntax. Successfully decode AST when it should not."]
        else:
            err_type, err = "relevance_error:decoder_failed", ["Failed to decode AST."]
    elif decode_failed:
        valid, err_type = False, "ast_decoder:decoder_failed"
        err = ["Invalid syntax. Failed to decode AST." + (f" {decode_error}" if decode_error else "")]
    elif not u.is_function_calling_format_output(decoded):
        valid, err_type = False, "ast_decoder:decoder_wrong_output_format"
        err = ["Did not output in the specified format."]
    else:
        res = off.ast_checker(
            entry["function"],
            decoded,
            entry["ground_truth"],
            language,
            category,
            # Any name: our stub mapping answers underscore_to_dot for all.
            "sala-bfcl-driver",
        )
        valid = bool(res["valid"])
        err_type = None if valid else res.get("error_type")
        err = [] if valid else res.get("error", [])

    out["valid"] = valid
    out["error_type"] = err_type
    if obj.get("verbose") or _VERBOSE:
        out["error"] = err
    return category, out


_VERBOSE = False


def _summary(counts):
    # counts: category -> [correct, total]
    def acc(c):
        return counts[c][0] / counts[c][1] if c in counts and counts[c][1] else None

    lines = []
    for c in sorted(counts):
        lines.append(f"{c}: {counts[c][0]}/{counts[c][1]} = {100 * acc(c):.2f}%")

    # data_non_live.csv aggregation (generate_leaderboard_csv): Simple is the
    # unweighted mean of the three simple categories; Overall (= AST Summary)
    # the unweighted mean of Simple, Multiple, Parallel, Parallel Multiple.
    # Irrelevance is reported but not part of the Non-Live overall.  Missing
    # categories count as 0 (the official CSV shows them as N/A).
    z = lambda c: acc(c) or 0.0
    simple = (z("simple_python") + z("simple_java") + z("simple_javascript")) / 3
    overall = (simple + z("multiple") + z("parallel") + z("parallel_multiple")) / 4
    cols = [
        ("Non-Live Overall Acc", overall),
        ("AST Summary", overall),
        ("Simple AST", simple),
        ("Python Simple AST", z("simple_python")),
        ("Java Simple AST", z("simple_java")),
        ("JavaScript Simple AST", z("simple_javascript")),
        ("Multiple AST", z("multiple")),
        ("Parallel AST", z("parallel")),
        ("Parallel Multiple AST", z("parallel_multiple")),
        ("Irrelevance Detection", z("irrelevance")),
    ]
    lines += [f"{k}: {100 * v:.2f}%" for k, v in cols]
    print("\n".join(lines), file=sys.stderr)


def main():
    global _VERBOSE
    args = _parse_args()
    _VERBOSE = args.verbose
    off = _import_official(args.wheel_dir, args.underscore_to_dot)
    data = Dataset(off)
    counts = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        obj = json.loads(line)
        category, out = check_line(off, data, obj)
        c = counts.setdefault(category, [0, 0])
        c[0] += int(out["valid"])
        c[1] += 1
        print(json.dumps(out, default=repr), flush=True)
    if args.summary:
        _summary(counts)


if __name__ == "__main__":
    main()
