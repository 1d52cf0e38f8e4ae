#!/usr/bin/env bash
# Fuzzes one of Mosaic's file loaders with AFL++ (through `cargo afl`) for a while, then prints
# what the run did. Usage (from anywhere):
#
#   fuzz/run.sh TARGET SECONDS     # one target: profiles colocations plans calibration checkpoint data samples
#   fuzz/run.sh all SECONDS        # every target, one after another, SECONDS each
#   fuzz/run.sh stats [TARGET]     # only print the last run's numbers
#   EXECS=1000000 fuzz/run.sh T S  # stop at about that many executions, or after S seconds
#
# Needs `cargo install cargo-afl --locked` and `cargo afl config --build` once. Builds with
# `cargo afl build --release` into fuzz/target, fuzzes from fuzz/seeds/TARGET into fuzz/out/TARGET
# (both git-ignored: out/TARGET/default/{queue,crashes,hangs,fuzzer_stats}). A run resumes
# where the last one stopped when out/TARGET exists (AFL_AUTORESUME); delete it to start over.
# Each execution may take 2 s (-t 2000) and 4 GiB (-m 4096): an input that makes a loader take
# longer is a hang, one that makes it allocate more a crash (Rust aborts on a failed allocation).
# The JSON targets splice in dicts/TARGET.dict (field names, zoo names, numbers at the limits).
# Runs at the lowest CPU priority (nice 19): the fuzzers are meant to share a machine.
# Exits 1 if the run found a crash or a hang.
set -euo pipefail

TARGETS=(profiles colocations plans calibration checkpoint data samples)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

usage() {
    echo "usage: $0 TARGET|all SECONDS   (targets: ${TARGETS[*]})" >&2
    echo "       $0 stats [TARGET]" >&2
    exit 2
}

# One line per target: executions, time, speed, corpus, crashes, hangs (from fuzzer_stats).
stats() {
    local t="$1" f="out/$1/default/fuzzer_stats"
    if [[ ! -f "$f" ]]; then
        echo "$t: no run yet ($f missing)"
        return
    fi
    awk -v t="$t" -F' *: *' '
        { v[$1] = $2 }
        END {
            printf "%s: execs_done %s, run_time %s s, execs_per_sec %.0f, corpus_count %s, saved_crashes %s, saved_hangs %s, stability %s, bitmap_cvg %s\n",
                t, v["execs_done"], v["run_time"], v["execs_done"] / (v["run_time"] > 0 ? v["run_time"] : 1),
                v["corpus_count"], v["saved_crashes"], v["saved_hangs"], v["stability"], v["bitmap_cvg"]
        }' "$f"
}

build() {
    nice -n 19 cargo afl build --release --bins
}

fuzz() {
    local t="$1" secs="$2"
    [[ -d "seeds/$t" ]] || { echo "no seeds/$t" >&2; exit 2; }
    mkdir -p out
    local dict=() execs=()
    [[ -f "dicts/$t.dict" ]] && dict=(-x "dicts/$t.dict")
    [[ -n "${EXECS:-}" ]] && execs=(-E "$EXECS")
    # The checkpoint and data targets write each input to /dev/shm/mosaic-fuzz-PID-*; remove
    # what the fuzzer's processes leave there.
    AFL_SKIP_CPUFREQ=1 \
    AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_NO_UI=1 \
    AFL_AUTORESUME=1 \
    AFL_NO_AFFINITY=1 \
        nice -n 19 cargo afl fuzz -i "seeds/$t" -o "out/$t" -V "$secs" -t 2000 -m 4096 \
            "${dict[@]}" "${execs[@]}" "target/release/$t" > "out/$t.log" 2>&1 || {
        echo "afl-fuzz failed; the end of out/$t.log:" >&2
        tail -30 "out/$t.log" >&2
        exit 1
    }
    rm -f /dev/shm/mosaic-fuzz-* 2>/dev/null || true
    stats "$t"
    local crashes hangs
    crashes=$(find "out/$t/default/crashes" -type f -name 'id:*' | wc -l)
    hangs=$(find "out/$t/default/hangs" -type f -name 'id:*' | wc -l)
    if ((crashes + hangs > 0)); then
        echo "$t: FOUND $crashes crash(es) and $hangs hang(s) in out/$t/default/{crashes,hangs}" >&2
        return 1
    fi
}

[[ $# -ge 1 ]] || usage
case "$1" in
stats)
    if [[ $# -ge 2 ]]; then stats "$2"; else for t in "${TARGETS[@]}"; do stats "$t"; done; fi
    ;;
all)
    [[ $# -eq 2 ]] || usage
    build
    status=0
    for t in "${TARGETS[@]}"; do fuzz "$t" "$2" || status=1; done
    exit $status
    ;;
*)
    [[ $# -eq 2 ]] || usage
    [[ " ${TARGETS[*]} " == *" $1 "* ]] || usage
    build
    fuzz "$1" "$2"
    ;;
esac
