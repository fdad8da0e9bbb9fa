_sala() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="sala"
                ;;
            sala,bench)
                cmd="sala__subcmd__bench"
                ;;
            sala,bfcl)
                cmd="sala__subcmd__bfcl"
                ;;
            sala,chat)
                cmd="sala__subcmd__chat"
                ;;
            sala,completions)
                cmd="sala__subcmd__completions"
                ;;
            sala,doctor)
                cmd="sala__subcmd__doctor"
                ;;
            sala,help)
                cmd="sala__subcmd__help"
                ;;
            sala,list)
                cmd="sala__subcmd__list"
                ;;
            sala,needle)
                cmd="sala__subcmd__needle"
                ;;
            sala,pack)
                cmd="sala__subcmd__pack"
                ;;
            sala,pull)
                cmd="sala__subcmd__pull"
                ;;
            sala,quantize)
                cmd="sala__subcmd__quantize"
                ;;
            sala,rm)
                cmd="sala__subcmd__rm"
                ;;
            sala,run)
                cmd="sala__subcmd__run"
                ;;
            sala,serve)
                cmd="sala__subcmd__serve"
                ;;
            sala,show)
                cmd="sala__subcmd__show"
                ;;
            sala__subcmd__help,bench)
                cmd="sala__subcmd__help__subcmd__bench"
                ;;
            sala__subcmd__help,bfcl)
                cmd="sala__subcmd__help__subcmd__bfcl"
                ;;
            sala__subcmd__help,chat)
                cmd="sala__subcmd__help__subcmd__chat"
                ;;
            sala__subcmd__help,completions)
                cmd="sala__subcmd__help__subcmd__completions"
                ;;
            sala__subcmd__help,doctor)
                cmd="sala__subcmd__help__subcmd__doctor"
                ;;
            sala__subcmd__help,help)
                cmd="sala__subcmd__help__subcmd__help"
                ;;
            sala__subcmd__help,list)
                cmd="sala__subcmd__help__subcmd__list"
                ;;
            sala__subcmd__help,needle)
                cmd="sala__subcmd__help__subcmd__needle"
                ;;
            sala__subcmd__help,pack)
                cmd="sala__subcmd__help__subcmd__pack"
                ;;
            sala__subcmd__help,pull)
                cmd="sala__subcmd__help__subcmd__pull"
                ;;
            sala__subcmd__help,quantize)
                cmd="sala__subcmd__help__subcmd__quantize"
                ;;
            sala__subcmd__help,rm)
                cmd="sala__subcmd__help__subcmd__rm"
                ;;
            sala__subcmd__help,run)
                cmd="sala__subcmd__help__subcmd__run"
                ;;
            sala__subcmd__help,serve)
                cmd="sala__subcmd__help__subcmd__serve"
                ;;
            sala__subcmd__help,show)
                cmd="sala__subcmd__help__subcmd__show"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        sala)
            opts="-h -V --help --version run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__bench)
            opts="-m -p -n -d -r -o -h -V --model --synthetic --bits --n-prompt --n-gen --n-depth --n-seq --draft-layers --num-draft --repetitions --profile --output --output-file --suite --cache-dir --cache-memory --tokenizer --max-tokens --no-think --limit --samples --device --dtype --prefill-step --kv-bits --prompt-fp8 --tp --tp-backend --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --synthetic)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --n-prompt)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --n-gen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --n-depth)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -d)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --n-seq)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-layers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repetitions)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -r)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -W "md csv json jsonl" -- "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -W "md csv json jsonl" -- "${cur}"))
                    return 0
                    ;;
                --output-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --suite)
                    COMPREPLY=($(compgen -W "speed prefix-cache grammar quality" -- "${cur}"))
                    return 0
                    ;;
                --cache-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cache-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tokenizer)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp-backend)
                    COMPREPLY=($(compgen -W "auto ring nccl" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__bfcl)
            opts="-m -h -V --model --device --dtype --prefill-step --kv-bits --prompt-fp8 --mode --categories --limit --data --max-tokens --think --csv --samples --constrain --tool-call-parser --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "prompt fc" -- "${cur}"))
                    return 0
                    ;;
                --categories)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --data)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --csv)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tool-call-parser)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__chat)
            opts="-m -h -V --model --device --dtype --prefill-step --kv-bits --prompt-fp8 --context-size --num-sink-tokens --no-pull --temperature --top-p --top-k --min-p --repeat-penalty --seed --draft-layers --num-draft --prompt-cache --prompt-cache-ro --system --no-think --max-tokens --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-sink-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temperature)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repeat-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-layers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --system)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__completions)
            opts="-h -V --help --version bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__doctor)
            opts="-h -V --json --tp --tp-backend --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp-backend)
                    COMPREPLY=($(compgen -W "auto ring nccl" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help)
            opts="run chat serve quantize pack show pull list rm bench needle bfcl doctor completions help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__bench)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__bfcl)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__chat)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__doctor)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__needle)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__pack)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__pull)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__quantize)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__rm)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__run)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__help__subcmd__show)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__list)
            opts="-h -V --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__needle)
            opts="-m -h -V --model --device --dtype --prefill-step --kv-bits --prompt-fp8 --context-size --num-sink-tokens --no-pull --context-len --depth --depths --haystack --variant --needle --question --answer --max-tokens --think --seed --csv --svg --resume --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-sink-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context-len)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --depth)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --depths)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --haystack)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --variant)
                    COMPREPLY=($(compgen -W "single multi-key multi-value uuid" -- "${cur}"))
                    return 0
                    ;;
                --needle)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --question)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --answer)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --csv)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --svg)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resume)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__pack)
            opts="-m -o -h -V --model --extract --info --output --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --extract)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --info)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__pull)
            opts="-h -V --revision --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__quantize)
            opts="-m -o -h -V --model --bits --group-size --output --quantize-embeddings --dtype --report --csv --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --csv)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__rm)
            opts="-h -V --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__run)
            opts="-m -h -V --model --device --dtype --prefill-step --kv-bits --prompt-fp8 --context-size --num-sink-tokens --no-pull --max-tokens --temperature --top-p --top-k --min-p --repeat-penalty --seed --draft-layers --num-draft --prompt-cache --prompt-cache-ro --system --raw --no-think --ignore-eos --input-ids --logits-out --json --json-schema --grammar --tp --tp-backend --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-sink-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temperature)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repeat-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --draft-layers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-draft)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --system)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --input-ids)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --logits-out)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --json-schema)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grammar)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp-backend)
                    COMPREPLY=($(compgen -W "auto ring nccl" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__serve)
            opts="-m -h -V --model --device --dtype --prefill-step --kv-bits --prompt-fp8 --context-size --num-sink-tokens --no-pull --host --port --api-key --max-tokens --parallel --timeout --shutdown-timeout --cache-memory --kv-memory --prompt-cache-dir --tool-call-parser --max-models --keep-alive --alias --log-format --log-level --tp --tp-backend --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cpu gpu" -- "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "f32 bf16 f16" -- "${cur}"))
                    return 0
                    ;;
                --prefill-step)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --context-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-sink-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --host)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --port)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --api-key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --parallel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --shutdown-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cache-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kv-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-cache-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tool-call-parser)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-models)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --keep-alive)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --alias)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                --log-level)
                    COMPREPLY=($(compgen -W "error warn info debug" -- "${cur}"))
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tp-backend)
                    COMPREPLY=($(compgen -W "auto ring nccl" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        sala__subcmd__show)
            opts="-h -V --context --tensors --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _sala -o nosort -o bashdefault -o default sala
else
    complete -F _sala -o bashdefault -o default sala
fi
