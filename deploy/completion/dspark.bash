# deploy/completion/dspark.bash — bash completion for dspark, dspark-edge and
# dspark-center, installed as /usr/share/bash-completion/completions/dspark
# (and under the daemons' names). The commands, subcommands and options come
# from the installed programs' own --help at completion time (cached per
# shell), so the completion follows the flags of the binary on the PATH. What
# a flag's value is: an enumerated set from the table below, else from its
# metavar in --help ("a|b|c" = those, PATH/FILE/DIR/KEY... = files or folders,
# anything else (N, TEXT, URI) = nothing to offer: no file names there).

declare -gA _dspark_help_cache 2>/dev/null || true

# _dspark_help PROG [ARGS...]: PROG ARGS --help, cached.
_dspark_help()
{
    local key="$*"
    if [[ -z ${_dspark_help_cache[$key]+set} ]]; then
        _dspark_help_cache[$key]=$("$@" --help 2>&1 </dev/null)
    fi
    printf '%s\n' "${_dspark_help_cache[$key]}"
}

# _dspark_list HELP SECTION: the first words of the lines under "SECTION:".
_dspark_list()
{
    printf '%s\n' "$1" | awk -v s="$2:" '$0 == s { f = 1; next } f && /^  [a-z]/ { print $1; next } f { f = 0 }'
}

# _dspark_opts HELP: every option the help text lists at the start of a line.
_dspark_opts()
{
    printf '%s\n' "$1" | awk '/^ +-/ && match($0, /^ +/) && RLENGTH <= 6 {
        l = $0; sub(/^ +/, "", l); if (match(l, /  /)) l = substr(l, 1, RSTART - 1)
        n = split(l, w, " ")
        for (i = 1; i <= n; i++) { t = w[i]; sub(/,$/, "", t); if (t ~ /^--?[a-zA-Z0-9]/) print t } }' | sort -u
}

# _dspark_metavar HELP OPTION: the word after OPTION in the help text.
_dspark_metavar()
{
    printf '%s\n' "$1" | awk -v o="$2" '/^ +-/ && match($0, /^ +/) && RLENGTH <= 6 {
        l = $0; sub(/^ +/, "", l); if (match(l, /  /)) l = substr(l, 1, RSTART - 1)
        n = split(l, w, " ")
        for (i = 1; i <= n; i++) { t = w[i]; sub(/,$/, "", t)
            if (t == o) { for (j = i + 1; j <= n && w[j] ~ /^-/; j++); if (j <= n) print w[j]; exit } } }'
}

# _dspark_value OPTION HELP: sets COMPREPLY for OPTION's value; 1 when OPTION takes none.
_dspark_value()
{
    local opt=$1 help=$2 cur=${COMP_WORDS[COMP_CWORD]} mv
    case $opt in
        --precision)          COMPREPLY=($(compgen -W "native fp32 int8" -- "$cur")); return 0 ;;
        --kv-cache|--kv)      COMPREPLY=($(compgen -W "f32 f16" -- "$cur")); return 0 ;;
        --backend)            COMPREPLY=($(compgen -W "auto cpu cuda" -- "$cur")); return 0 ;;
        --priority)           COMPREPLY=($(compgen -W "high normal low" -- "$cur")); return 0 ;;
        --route)              COMPREPLY=($(compgen -W "auto edge center" -- "$cur")); return 0 ;;
        --log-format)         COMPREPLY=($(compgen -W "text json" -- "$cur")); return 0 ;;
        --log-level)          COMPREPLY=($(compgen -W "error warn info debug" -- "$cur")); return 0 ;;
        --draft)              _dspark_files "$cur"; COMPREPLY+=($(compgen -W int8 -- "$cur")); return 0 ;;
    esac
    mv=$(_dspark_metavar "$help" "$opt")
    case $mv in
        ''|-*|'['*)           return 1 ;;
        *'|'*)                COMPREPLY=($(compgen -W "${mv//|/ }" -- "$cur")) ;;
        DIR*|*_DIR)           COMPREPLY=($(compgen -d -- "$cur")) ;;
        PATH*|FILE*|PREFIX*|*.sec|*.pub|*.ini|*FILE|*PATH|KEY*|CERT*|CA*|*.bin|*.gguf)
                              _dspark_files "$cur" ;;
        [A-Z]*)               COMPREPLY=() ;;
        *)                    return 1 ;;
    esac
    return 0
}

_dspark_files()
{
    local IFS=$'\n'
    COMPREPLY=($(compgen -f -- "$1"))
    compopt -o filenames 2>/dev/null || true
}

_dspark()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local prog=${COMP_WORDS[0]} i w cmd="" sub="" cmd_at=0 help
    COMPREPLY=()
    # the command: the first word that is not an option (--log-format X is one)
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [[ $w == --log-format ]]; then ((i++)); continue; fi
        [[ $w == -* ]] && continue
        if [[ -z $cmd ]]; then cmd=$w; cmd_at=$i
        elif [[ $cmd == model && -z $sub && $i == $((cmd_at + 1)) ]]; then sub=$w
        fi
    done
    if [[ -z $cmd ]]; then
        if [[ $prev == --log-format ]]; then _dspark_value --log-format ""; return; fi
        help=$(_dspark_help "$prog")
        COMPREPLY=($(compgen -W "$(_dspark_list "$help" commands) --help --version --log-format" -- "$cur"))
        return
    fi
    if [[ $cmd == model && -z $sub ]]; then
        help=$(_dspark_help "$prog" model)
        COMPREPLY=($(compgen -W "$(_dspark_list "$help" subcommands) --help" -- "$cur"))
        return
    fi
    help=$(_dspark_help "$prog" $cmd $sub)
    if [[ $prev == -* ]] && _dspark_value "$prev" "$help"; then return; fi
    COMPREPLY=($(compgen -W "$(_dspark_opts "$help")" -- "$cur"))
}

# dspark-edge, dspark-center: options, -c CONFIG files, --set KEY= from the keys in --help
_dspark_node()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} help
    COMPREPLY=()
    help=$(_dspark_help "${COMP_WORDS[0]}")
    if [[ $prev == --set ]]; then
        COMPREPLY=($(compgen -S = -W "$(printf '%s\n' "$help" | sed -nE 's/^  \[([a-z_]+)\] ([a-z_0-9]+) .*/\1.\2/p')" -- "$cur"))
        compopt -o nospace 2>/dev/null || true
        return
    fi
    if [[ $prev == -* ]] && _dspark_value "$prev" "$help"; then return; fi
    COMPREPLY=($(compgen -W "$(_dspark_opts "$help")" -- "$cur"))
}

complete -F _dspark dspark
complete -F _dspark_node dspark-edge dspark-center
