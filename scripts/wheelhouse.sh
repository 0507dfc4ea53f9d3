#!/usr/bin/env bash
# Build, on a machine that reaches a package index, a folder of wheels that installs vLLM on a GPU
# host that reaches none (scripts/install-vllm.sh --wheelhouse DIR on that host).
#
#   scripts/wheelhouse.sh --python 3.12 --platform manylinux_2_31_x86_64 --vllm 0.26.0 \
#       --skip-installed host-freeze.txt --drop flashinfer-cubin --drop 'nvidia-cutlass-dsl*' \
#       --allow-unmet 'numba=only imported for ngram drafting' \
#       --allow-unmet 'mistral-common=only used for Mistral tokenizers' --split 58M --out wheelhouse
#
# --python X.Y          the host's python (CPython)
# --platform TAG        the host's newest manylinux tag (glibc: `ldd --version`); older manylinux
#                       tags and pure-python wheels are accepted too. vLLM 0.26.0 needs 2_31 or
#                       newer (llguidance 1.7 wheels are manylinux_2_31).
# --vllm VERSION        carry vllm==VERSION; or --spec REQUIREMENT for another requirement
# --skip-installed LIST what the host already has (`pip freeze` on the host; NAME or NAME==VERSION
#                       lines, globs like nvidia-* allowed): resolved but not carried
# --drop PATTERN        resolved but not carried, not needed on the host (repeatable); flashinfer-cubin
#                       and the CUTLASS DSL are not needed with --gdn-prefill-backend triton
# --allow-unmet NAME[=WHY]  carry NAME although a requirement of it is not met on the host (e.g. it
#                       pins numpy below the host's): checked by you, recorded in wheelhouse.json
# --split SIZE          cut wheels larger than SIZE (split(1) sizes: 58M, 100K) into pieces
# --find-links DIR      also look for wheels in DIR (repeatable); --no-index: only there (a local mirror)
# --out DIR             the wheelhouse to create (must not exist)
# PYTHON                the python whose pip resolves and downloads (pip >= 23; default python3)
#
# The wheelhouse holds the wheels (or their pieces NAME.whl.part-000, -001, ...), SHA256SUMS (every
# file, `sha256sum -c` format) and wheelhouse.json: the requirement, target, every wheel with its
# sha256 (of the whole wheel when split), what was skipped or dropped and why, and which packages
# are installed with a requirement unmet and why. The closure is resolved here, once, for the
# target; the installer installs exactly this set (pip --no-deps) and runs pip check.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

PYVER="" PLATFORM="" SPEC="" LIST="" SPLIT="" OUT="" NO_INDEX=0
DROPS=() ALLOW=() LINKS=()
die() { echo "error: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python) need "$@"; PYVER=$2; shift 2 ;;
    --platform) need "$@"; PLATFORM=$2; shift 2 ;;
    --vllm) need "$@"; SPEC="vllm==$2"; shift 2 ;;
    --spec) need "$@"; SPEC=$2; shift 2 ;;
    --skip-installed) need "$@"; LIST=$2; shift 2 ;;
    --drop) need "$@"; DROPS+=("$2"); shift 2 ;;
    --allow-unmet) need "$@"; ALLOW+=("$2"); shift 2 ;;
    --split) need "$@"; SPLIT=$2; shift 2 ;;
    --find-links) need "$@"; LINKS+=("$2"); shift 2 ;;
    --no-index) NO_INDEX=1; shift ;;
    --out) need "$@"; OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ -n "$PYVER" ] && [ -n "$PLATFORM" ] && [ -n "$SPEC" ] && [ -n "$OUT" ] \
  || die "--python, --platform, --vllm (or --spec) and --out are required"
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "--python wants X.Y, got $PYVER"
[[ "$PLATFORM" =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]] || die "--platform wants manylinux_2_N_ARCH, got $PLATFORM"
GLIBC_MINOR=${BASH_REMATCH[1]} ARCH=${BASH_REMATCH[2]}
[ -z "$SPLIT" ] || [[ "$SPLIT" =~ ^[0-9]+[KMG]?$ ]] || die "--split wants a size like 58M, got $SPLIT"
[ -z "$LIST" ] || [ -f "$LIST" ] || die "--skip-installed $LIST: no such file"
[ ! -e "$OUT" ] || die "$OUT exists; remove it or pick another --out"
PY=${PYTHON:-python3}

# pip matches --platform exactly: list every manylinux tag the host's glibc accepts.
PLAT_ARGS=()
for ((n = GLIBC_MINOR; n >= 5; n--)); do PLAT_ARGS+=(--platform "manylinux_2_${n}_${ARCH}"); done
for legacy in manylinux2014 manylinux2010 manylinux1; do PLAT_ARGS+=(--platform "${legacy}_${ARCH}"); done
SRC_ARGS=()
for d in "${LINKS[@]}"; do SRC_ARGS+=(--find-links "$d"); done
[ "$NO_INDEX" = 1 ] && SRC_ARGS+=(--no-index)
TARGET_ARGS=(--only-binary=:all: --python-version "$PYVER" --implementation cp "${PLAT_ARGS[@]}" "${SRC_ARGS[@]}")
PIP=("$PY" -m pip --disable-pip-version-check)

STAGE="$OUT.partial.$$"
mkdir -p "$STAGE/wheels"
trap 'rm -rf "$STAGE"' EXIT
log() { echo "==> $*" >&2; }

log "resolving $SPEC for CPython $PYVER on $PLATFORM"
# --target only to allow the platform options; --dry-run installs nothing and reads wheel metadata
if ! "${PIP[@]}" install -q --dry-run --ignore-installed --target "$STAGE/unused" --report "$STAGE/report.json" \
    "${TARGET_ARGS[@]}" "$SPEC" 2> "$STAGE/resolve.err"; then
  grep -v 'is ignored: it is neither a file' "$STAGE/resolve.err" | tail -n 5 >&2
  echo "error: pip could not resolve $SPEC for CPython $PYVER on $PLATFORM; a dependency may need a newer" \
    "glibc (raise --platform to the host's, \`ldd --version\`) or another python" >&2
  exit 1
fi
plan_args=(--python "$PYVER" --platform "$PLATFORM" --out "$STAGE/plan.json" --keep "$STAGE/keep.txt")
[ -n "$LIST" ] && plan_args+=(--skip-installed "$LIST")
for d in "${DROPS[@]}"; do plan_args+=(--drop "$d"); done
for a in "${ALLOW[@]}"; do plan_args+=(--allow-unmet "$a"); done
"$PY" "$HERE/wheelhouse/plan.py" "$STAGE/report.json" "${plan_args[@]}" || exit 1

log "downloading $(wc -l < "$STAGE/keep.txt") wheels"
"${PIP[@]}" download -q --no-deps -d "$STAGE/wheels" "${TARGET_ARGS[@]}" -r "$STAGE/keep.txt" \
  2> >(grep -v 'is ignored: it is neither a file' >&2)

log "checking, splitting and listing"
"$PY" "$HERE/wheelhouse/seal.py" "$STAGE" --requirement "$SPEC" --python "$PYVER" --platform "$PLATFORM" \
  ${SPLIT:+--split "$SPLIT"}
rm -rf "$STAGE/unused" "$STAGE/keep.txt" "$STAGE/plan.json" "$STAGE/report.json" "$STAGE/resolve.err"
mv "$STAGE/wheels" "$OUT"
rm -rf "$STAGE"
trap - EXIT
log "wrote $OUT: $(grep -c . "$OUT/SHA256SUMS") files, $(du -sh "$OUT" | cut -f1)"
