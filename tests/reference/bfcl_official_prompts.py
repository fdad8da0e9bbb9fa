#!/usr/bin/env python3
"""Print what the official BFCL v4 harness shows the model, per non-live entry.

Our own thin driver (like bfcl_official_check.py): it imports the
`bfcl-eval` wheel and calls its functions, so that `sala bfcl`'s prompt
building can be compared with the reference byte for byte.

Usage:

    /tmp/bfclenv/bin/python tests/reference/bfcl_official_prompts.py /tmp/bfclwheel/unz > prompts.jsonl

Output, one JSON object per entry of every non-live category:

    {"id": ..., "messages": [...],   # prompt mode: default system prompt + question
     "tools": [...]}                 # FC mode: OpenAI chat-completions tools

The docs are loaded the way inference loads them (with the language
hints); the messages come from `system_prompt_pre_processing_chat_model`
with the default prompt format, the tools from `convert_to_tool` with the
OpenAI chat-completions style.
"""

import json
import os
import sys
import tempfile
import types

NON_LIVE = [
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
]


def main():
    wheel_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BFCL_WHEEL_DIR")
    if not wheel_dir or not os.path.isdir(os.path.join(wheel_dir, "bfcl_eval")):
        sys.exit("give the unpacked bfcl-eval wheel directory (argv or $BFCL_WHEEL_DIR)")
    sys.path.insert(0, os.path.abspath(wheel_dir))
    # As in bfcl_official_check.py: keep the wheel dir clean, and stand in
    # for the model config module (it imports every API SDK).
    os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="bfcl_root_"))
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {}
    sys.modules["bfcl_eval.constants.model_config"] = stub

    from bfcl_eval import utils as bu
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import (
        convert_to_tool,
        system_prompt_pre_processing_chat_model,
    )

    for category in NON_LIVE:
        for entry in bu.load_dataset_entry(category, include_prereq=False):
            messages = system_prompt_pre_processing_chat_model(
                [dict(m) for m in entry["question"][0]], entry["function"], entry["id"]
            )
            tools = convert_to_tool(entry["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
            print(json.dumps({"id": entry["id"], "messages": messages, "tools": tools}))


if __name__ == "__main__":
    main()
