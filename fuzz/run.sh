#!/usr/bin/env bash
# Run the cargo-fuzz targets (fuzz/README.md).
#
#   fuzz/run.sh TARGET [RUNS]   one target for RUNS executions (default 10000000), at the
#                               lowest priority and one job, so others can build meanwhile
#   fuzz/run.sh --smoke         every target for a few seconds (CI; installs cargo-fuzz
#                               when it is missing)
#   fuzz/run.sh --list          the targets
#
# FUZZ_SANITIZER=none builds without AddressSanitizer (3-10x more executions per second, for
# the long runs; its own target dir). The memory cap holds either way: every target
# installs fuzz_targets/alloc_cap.rs as its allocator.
#
# cargo-fuzz needs a nightly compiler (-Zsanitizer). With a nightly toolchain installed it
# is used; otherwise the stable one with RUSTC_BOOTSTRAP=1, which accepts the same flags.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(frame_decoder http_request jsonrpc_envelope worker_rpc config_loader)

# Per target: most input bytes (a head is at most 16 KiB by default), and the memory any one
# input may allocate at once (the decoders' own limits are far below it).
max_len() {
    case "$1" in
        http_request) echo 20000 ;;
        config_loader) echo 8192 ;;
        worker_rpc | frame_decoder) echo 65536 ;;
        *) echo 8192 ;;
    esac
}

cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
        return 127
    fi
    if cargo +nightly --version >/dev/null 2>&1; then
        cargo +nightly fuzz "$@"
    else
        RUSTC_BOOTSTRAP=1 cargo fuzz "$@"
    fi
}

run_target() {
    local target=$1 runs=$2 seconds=${3:-0}
    local corpus=fuzz/corpus/$target
    mkdir -p "$corpus"
    local limit=(-runs="$runs")
    [ "$seconds" -gt 0 ] && limit=(-max_total_time="$seconds")
    local build=()
    [ "${FUZZ_SANITIZER:-address}" = none ] && build=(-s none --target-dir fuzz/target-none)
    cargo_fuzz run --fuzz-dir fuzz --jobs 1 "${build[@]}" "$target" "$corpus" fuzz/seeds/"$target" -- \
        "${limit[@]}" -max_len="$(max_len "$target")" -timeout=10 \
        -rss_limit_mb=1024 -malloc_limit_mb=256 -print_final_stats=1
}

case "${1:-}" in
    --list) printf '%s\n' "${TARGETS[@]}" ;;
    --smoke)
        if ! cargo fuzz --version >/dev/null 2>&1; then
            echo "installing cargo-fuzz"
            cargo install cargo-fuzz --locked
        fi
        for t in "${TARGETS[@]}"; do
            echo "-- $t"
            run_target "$t" 0 "${FUZZ_SMOKE_SECS:-5}"
        done
        ;;
    "" | -h | --help)
        sed -n '2,16p' "$0"
        ;;
    *)
        nice -n 19 env CARGO_BUILD_JOBS=1 bash -c "$(declare -f max_len cargo_fuzz run_target); run_target '$1' '${2:-10000000}'"
        ;;
esac
