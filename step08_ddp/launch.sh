#!/usr/bin/env bash
# launch.sh — run a data-parallel training job under mpirun, and when it fails (a rank killed, a
# watchdog timeout, any non-zero exit) restart every rank from the last complete checkpoint, at
# most --max-restarts times (torchelastic's model: the whole job restarts, not one rank).
#
#   step08_ddp/launch.sh --np 2 --max-restarts 2 -- build/bin/train --preset tiny --steps 300 --ckpt-dir /tmp/ck
#   step08_ddp/launch.sh --np 2 --max-restarts 1 --kill-rank 1 --kill-after-step 45 -- build/bin/train ... --ckpt-dir D
#
# What it adds to the program's arguments: --event-log and --pid-dir (in --log-dir; without it in
# a new /tmp/ddp_launch_XXXXXX, removed when the launcher exits), and --resume when they hold
# --ckpt-dir (the first attempt then also continues whatever complete checkpoint D already has). --kill-rank R --kill-after-step S is
# fault injection: once rank 0 logged step S, SIGKILL goes to rank R's process (first attempt
# only). After a restart it prints the failure timeline from the ranks' event log: the kill (or
# the moment the job was seen down), the restart, the first completed step after the resume, the
# recovery time between them and the steps lost (trained since the checkpoint, trained again).
#
# mpirun's options: --oversubscribe (more ranks than cores is fine for these runs), --bind-to none
# (each rank's OpenMP threads float), odls_base_sigkill_timeout 0 (when one rank dies, the others
# get SIGKILL at once instead of SIGTERM and a 1 s grace they do not use: nothing to flush, and a
# checkpoint caught half-written has no DONE and is skipped), btl_vader_single_copy_mechanism none
# (the shared-memory transport's single-copy mode needs ptrace rights a container may lack),
# and as root OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 (OpenMPI refuses root without them). Each rank
# gets OMP_NUM_THREADS = cores / ranks unless it is set.
set -euo pipefail
np=2 max_restarts=0 kill_rank=-1 kill_after=0 log_dir=""
say() { echo "launch: $*"; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while (($#)); do
    case "$1" in
    --np) np=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --kill-rank) kill_rank=$2; shift 2 ;;
    --kill-after-step) kill_after=$2; shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "launch: unknown option $1 (the program and its arguments go after --)" >&2; exit 2 ;;
    esac
done
(($#)) || usage
[[ $np =~ ^[1-9][0-9]*$ && $max_restarts =~ ^[0-9]+$ ]] || { echo "launch: --np and --max-restarts take numbers" >&2; exit 2; }
if ((kill_rank >= np)) || { ((kill_rank >= 0)) && ((kill_after < 1)); }; then
    echo "launch: --kill-rank R (< --np) needs --kill-after-step S (>= 1)" >&2; exit 2
fi
command -v mpirun >/dev/null || { echo "launch: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 2; }
own_dir=0
if [ -z "$log_dir" ]; then  # a directory of our own, removed at the end
    own_dir=1 log_dir=$(mktemp -d /tmp/ddp_launch_XXXXXX)
    trap 'rm -rf "$log_dir"' EXIT
fi
mkdir -p "$log_dir/pids"
events=$log_dir/events.log
: >"$events"
prog=("$@")
for a in "${prog[@]}"; do [[ $a == --ckpt-dir ]] && prog+=(--resume) && break; done
prog+=(--event-log "$events" --pid-dir "$log_dir/pids")

export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cores=$(nproc 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / np > 0 ? cores / np : 1))}
now() { date +%s.%N; }

t_fail="" fail_what="" attempt=0
while :; do
    rm -f "$log_dir"/pids/*.pid
    mpirun --oversubscribe --bind-to none --mca odls_base_sigkill_timeout 0 -np "$np" "${prog[@]}" &
    mp=$!
    if ((attempt == 0 && kill_rank >= 0)); then  # fault injection: wait for rank 0's "step S" event
        while kill -0 "$mp" 2>/dev/null; do
            if grep -q "^[0-9.]* step $kill_after " "$events" && [ -s "$log_dir/pids/rank-$kill_rank.pid" ]; then
                pid=$(cat "$log_dir/pids/rank-$kill_rank.pid")
                t_fail=$(now)
                kill -KILL "$pid"
                fail_what="SIGKILL sent to rank $kill_rank (pid $pid) once step $kill_after was logged"
                say "$fail_what"
                break
            fi
            sleep 0.01
        done
    fi
    rc=0
    wait "$mp" || rc=$?
    t_down=$(now)
    if ((rc == 0)); then break; fi
    [ -n "$t_fail" ] || { t_fail=$t_down; fail_what="the job was seen down (mpirun rc $rc)"; }
    if ((attempt >= max_restarts)); then
        say "attempt $((attempt + 1)) failed (mpirun rc $rc) and --max-restarts $max_restarts is spent: giving up"
        exit "$rc"
    fi
    attempt=$((attempt + 1))
    say "attempt $attempt failed (mpirun rc $rc): restart $attempt of $max_restarts, every rank from the last complete checkpoint"
    echo "$t_down down rc=$rc" >>"$events"
done

if ((attempt > 0)); then
    # the timeline: the last attempt's start and first step; the steps the failed attempt had done
    awk -v tf="$t_fail" -v what="$fail_what" '
        $2 == "start" { n_start++; for (i = 3; i <= NF; i++) if ($i ~ /^resume_from=/) { split($i, kv, "="); from = kv[2] }
                        t_start = $1; first = ""; t_first = "" ; next }
        $2 == "down"  { t_down = $1; if (!seen_down) { lost_to = last; seen_down = 1 } ; next }
        $2 == "step"  { if (!seen_down) last = $3; else if (first == "") { first = $3; t_first = $1 } }
        END {
            if (t_first == "") { print "launch: no step completed after the restart"; exit 1 }
            printf "launch: failure timeline (seconds after the failure):\n"
            printf "launch:   +%.3f  %s\n", 0, what
            printf "launch:   +%.3f  mpirun ended: every rank is down (the last step completed: %d)\n", t_down - tf, lost_to
            printf "launch:   +%.3f  ranks restarted, resumed from the checkpoint of step %d\n", t_start - tf, from
            printf "launch:   +%.3f  first step after the resume (step %d) completed\n", t_first - tf, first
            printf "launch: recovery time %.3f s (failure -> first completed step after the resume); steps lost %d%s\n",
                   t_first - tf, lost_to - from, (lost_to > from ? sprintf(" (steps %d..%d trained again)", from + 1, lost_to) : "")
        }' "$events"
fi
if ((own_dir)); then say "done after $((attempt + 1)) attempt(s)"; else say "done after $((attempt + 1)) attempt(s); events in $events"; fi
