# Progress lines for the install scripts (sourced): pip runs quiet (-q) and can take minutes, so
# every phase prints a step line with the elapsed time and a heartbeat line while it runs.
#   step "message"                      ==> [1m05s] message          (on stderr)
#   with_heartbeat "what" cmd args...   runs cmd; every QWENQUANT_HEARTBEAT seconds (default 30)
#                                       prints "    ... still what (N s)"; then "what: done in N s"
QQ_START=${QQ_START:-$SECONDS}

elapsed() {
  local s=$((SECONDS - QQ_START))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

step() {
  echo "==> [$(elapsed)] $*" >&2
}

with_heartbeat() {
  local what=$1
  shift
  local t0=$SECONDS rc=0 hb
  step "$what"
  (
    # `wait` returns at once on TERM (a foreground sleep would hold the stop for its full length).
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "${QWENQUANT_HEARTBEAT:-30}" </dev/null >/dev/null 2>&1 &
      s=$!
      wait "$s"
      echo "    ... still $what ($((SECONDS - t0)) s)" >&2
    done
  ) &
  hb=$!
  "$@" || rc=$?
  kill "$hb" 2>/dev/null || true
  wait "$hb" 2>/dev/null || true
  if [ "$rc" = 0 ]; then
    step "$what: done in $((SECONDS - t0)) s"
  else
    step "$what: failed (exit $rc) after $((SECONDS - t0)) s"
  fi
  return "$rc"
}
