# The GPU scripts' parts (sourced by gpu_check.sh and gpu_train.sh): `log` says a line into
# $OUT/$LOG and on the terminal; `part NAME SECONDS COMMAND...` runs the command under its own
# timeout (a slow part cannot eat the rest of a device call), its output into $OUT/NAME.txt,
# and logs how it ended.
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/$LOG"; }

part() {
    local name=$1 limit=$2
    shift 2
    log "$name: start (limit ${limit}s)"
    timeout --signal=KILL "$limit" "$@" >"$OUT/$name.txt" 2>&1
    log "$name: exit $? ($(tail -c 300 "$OUT/$name.txt" | tr '\n' ' '))"
}
