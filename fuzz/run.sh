#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS seconds each (libFuzzer's fork mode with one job, so
# that a finding is saved and fuzzing goes on), then the Python readers under atheris for the
# same time. New corpus entries go to fuzz/corpus/<target> (not kept in git); findings to
# fuzz/artifacts/<target>. Exits 1 if any target found something, naming the inputs; triage them
# with `cargo run -p npumem-fuzz --example replay -- <target> <input>`.
#
# Usage: fuzz/run.sh SECONDS [TARGET...]   (run from the repository root; `make fuzz` does)
set -u
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(device_actions page_table alloc_conf plan_problem plan_graph tlb_config readers trace_readers)
fi
# Each input must finish in seconds; a single allocation above 2 GiB, or a process above 2 GiB,
# is a finding (the TLB target exists to catch allocations sized by unchecked fields).
# Long inputs from the start (a device program is a few bytes per action).
limits=(-rss_limit_mb=2048 -timeout=10 -len_control=0)
fork=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
found=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t" "fuzz/regressions/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    echo "== $t: ${seconds}s"
    # The kept regression inputs seed the corpus (new entries go to the first directory only).
    if [ "$t" = readers ] || [ "$t" = trace_readers ]; then
        if ! python -c "import atheris" 2>/dev/null; then
            echo "atheris is not installed (pip install atheris): $t was not fuzzed"
            continue
        fi
        # atheris has no fork mode: a finding ends a run, so run again until the time is up.
        end=$((SECONDS + seconds))
        : > "fuzz/artifacts/$t.log"
        while [ $SECONDS -lt $end ]; do
            python "fuzz/$t.py" "fuzz/corpus/$t" "fuzz/regressions/$t" \
                -max_total_time=$((end - SECONDS)) -dict="fuzz/$t.dict" -max_len=8192 \
                -artifact_prefix="fuzz/artifacts/$t/" "${limits[@]}" >> "fuzz/artifacts/$t.log" 2>&1
        done
    else
        cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/regressions/$t" -- \
            -max_total_time="$seconds" -malloc_limit_mb=2048 -max_len=4096 "${limits[@]}" "${fork[@]}" \
            > "fuzz/artifacts/$t.log" 2>&1
    fi
    grep -E "cov: " "fuzz/artifacts/$t.log" | tail -1
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    if [ "$after" -gt "$before" ]; then
        found+=("$t: $((after - before)) new in fuzz/artifacts/$t")
    fi
done
if [ ${#found[@]} -gt 0 ]; then
    echo "findings:"
    printf '  %s\n' "${found[@]}"
    exit 1
fi
echo "no findings"
