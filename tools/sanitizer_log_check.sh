#!/usr/bin/env bash
# sanitizer_log_check.sh LOG — the verdict of `make check SANITIZE=1` on its test log: exit 1 (and
# print the reports) on any AddressSanitizer error, UBSan runtime error, or LeakSanitizer report of
# a leak allocated by the project's code. A LeakSanitizer report all of whose leaks were allocated
# by libcriterion itself (the allocator's caller, frame #1, inside libcriterion.so: the test
# framework's runner process leaks 48 bytes now and then at exit) is the framework's, not ours: it is
# named and does not fail the check. (The tests run with LSAN_OPTIONS=exitcode=0, so the leak check's
# verdict is this script's, and a failing test still fails through Criterion's exit code.)
set -uo pipefail
log=${1:?usage: sanitizer_log_check.sh LOG}
[ -r "$log" ] || { echo "sanitizer_log_check: cannot read $log" >&2; exit 2; }
awk '
/ERROR: LeakSanitizer/ { inrep = 1; ours = 0; want = 0; start = NR; next }
inrep && /^(Direct|Indirect) leak/ { want = 1; next }
inrep && want && /^ *#1 / { if ($0 !~ /libcriterion\.so/) ours = 1; want = 0; next }
inrep && /^SUMMARY: AddressSanitizer/ {
    if (ours) { bad = 1; print "leak allocated by the project (report at line " start ")" }
    else { print "ignored: a LeakSanitizer report inside libcriterion (line " start "): " $0 }
    inrep = 0; next
}
/ERROR: AddressSanitizer|runtime error:|SUMMARY: UndefinedBehaviorSanitizer/ { bad = 1; print NR ": " $0 }
END { exit bad ? 1 : 0 }' "$log"
