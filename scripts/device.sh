#!/usr/bin/env bash
# The device harness: every run on the GPU machine starts here.
#   scripts/device.sh --list                 the stages, what each runs and its knobs
#   scripts/device.sh STAGE [STAGE...]       run them in order (headline = a set of them)
#   scripts/device.sh --prepare              on the development machine: fill .devdeps/ and .peer/
# Bench stages append their raw results (`tiermoe bench -o jsonl`, llama.cpp's
# `llama-bench -o jsonl`), one JSON object a test with the engine, case, exact command,
# environment, commit, date and machine (bench/record.py), to
# $RESULTS/<date>-<machine>-<stage>.jsonl; copy those to bench/results/ and print the
# tables with bench/tables.py. Logs go to $OUT/logs.
# Knobs (environment): OUT (/tmp/out), RESULTS ($OUT/results), BUILD (build/device),
# TM_CUDA (ON; OFF builds without CUDA), CUDA_ARCH (90-real), MODELS_DIR (/tmp),
# THREADS (the core count), REPS (2), P (512), N (128), CASES (names: only these cases
# of each stage), PEER (1; 0 = no llama.cpp), FILL (repeat: mkmodel --fill of the quant
# and qtypes files, whose weights then repeat; random: in full), TM_COMMIT (the commit,
# where there is no .git), SMOKE=1 (tiny models, 1 repetition, short tests: tries the
# harness anywhere).
# The GPU machine's image lacks some libraries and reaches no registry: carry .devdeps/
# (the Debian packages of DEBS below) and .peer/llama-bench.tar.xz (../shared/peer) with
# the working tree; --prepare makes both (git ignores them).
# shellcheck disable=SC2317 # the stages are called by name (need)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# ---------------------------------------------------------------- stages and their help
STAGES_ORDER=(build checks sanitize resources opbench cpu-kernels peer models
    full-gpu cpu-moe cache cpu long fetch lanes ssd parallel serve gptoss calibrate
    kernels ab profile quant qtypes qnext moearchs longprompt deepseek gpus)
declare -A HELP=(
    [build]="Release build of tiermoe with CUDA (TM_CUDA=OFF: without); the stages that run test_cuda_ops build it"
    [checks]="test_cuda_ops (every op, the placement matrix on the real kernels; CHECKS_ONLY=glob, CHECKS_MODEL=1 adds the 30b-a3b GPU-vs-CPU check) and tests/oracle/test_server_cache.py on the real GPU"
    [sanitize]="compute-sanitizer (SAN_TOOLS 'memcheck racecheck') on test_cuda_ops (SAN_ONLY '*gemm*')"
    [resources]="registers, stack and spills of every kernel (ptxas) to \$OUT/resources.txt"
    [opbench]="test_cuda_ops' kernel timings (TM_CUDA_BENCH=1) to \$OUT/logs/opbench.log"
    [cpu-kernels]="CPU kernels built with gcc -O3 alone: their tests and cpu_gemm_bench at LEVELS ('avx2 avx512 amx'); QUICK=1"
    [peer]="unpack llama.cpp's llama-bench (.peer/, shared/peer/ or PEER_TAR) to /tmp/llamacpp-peer"
    [models]="make the bench files in MODELS_DIR: MODELS ('m30 m30q'; also m30v m30k gptoss tiny)"
    [full-gpu]="m30 everything on the GPU: llama.cpp -ngl 99 / tiermoe -ngl all, pp512 / tg128"
    [cpu-moe]="m30 experts in RAM: llama.cpp -ncmoe 48 mmap and -lm none / tiermoe --cpu-moe (case cpu-moe); -ncmoe 35 / --n-cpu-moe 35 (case ncmoe35)"
    [cache]="m30q (Qwen3 routing profile), learn pass first: llama.cpp -ncmoe 35 / tiermoe --cpu-moe --moe-cache CACHE_MIB (4212) --moe-learn (case cache: the same VRAM); -ncmoe 23 / --moe-cache CACHE8_MIB (8100) (cache8); by name in CASES only: ncmoe35 (both engines) cache-nolearn cache-off cache-full cache-admit4 plan u-cache replay"
    [cpu]="m30 CPU only: llama.cpp -dev none / tiermoe -ngl 0 (CPU_THREADS for tiermoe, default THREADS)"
    [long]="m30 everything on the GPU, pp2048 / tg512, both engines"
    [fetch]="m30 --cpu-moe prompts (pp P, tg 0) with each --moe-fetch of FETCH_MODES ('auto copy pcie off') and TIERMOE_FETCH_CPU_SHARE of FETCH_SHARES (''); llama.cpp -ncmoe 48 mmap and pinned"
    [lanes]="decode lanes: --moe-pcie PCIE ('auto 0 2') with --cpu-moe on m30 and with the cache on m30q; --moe-ahead AHEAD ('off 1 2') with the cache; TIERMOE_LANE_ROWS LANE_ROWS ('')"
    [ssd]="the SSD tier on m30q: calibrate --drive, then -ngl all --cpu-moe --ram-cache with SSD_RUNS ('half:auto half:off mmap:auto': budget half|all|mmap : --moe-fetch), page cache dropped before each, under each of SSD_ENVS ('' or e.g. 'TIERMOE_STORE_PREDICT=1 TIERMOE_STORE_PREDICT=0') and SSD_THREADS (THREADS; e.g. '16 12 8'); SSD_P (512), SSD_N (64)"
    [parallel]="m30v: bench -np 1,2,4,8 full GPU and --cpu-moe (cases gpu-np, cpu-moe-np), then serve --parallel through bench/serve_parallel.py (serve-all-gpu, serve-cpu-moe; TOKENS 128; SERVE=0 skips it), full GPU again under each VAR=V of SERVE_ENVS"
    [serve]="m30v: bench and serve (bench/serve_bench.py) full GPU, and the cache with a plan applied by POST /moe-hot-cache"
    [gptoss]="gpt-oss-20b: -ngl 99 / -ngl all (gpu), -ncmoe 99 / --cpu-moe (cpu-moe), -ncmoe 12 / --n-cpu-moe 12 (ncmoe12); extra: cache12 (--moe-cache 5064), cpu (-dev none / -ngl 0)"
    [calibrate]="tiermoe calibrate on m30 (full, saved where the executor looks) and --quick; profiles and tables to \$OUT"
    [kernels]="A/B rounds (ROUNDS 2) of kernel switches: q8x-decode (TIERMOE_MMVQ_Q8X 0/1, -ngl all; llama.cpp -ngl 99), moe-q8x (TIERMOE_MOE_Q8X 0/1, tg64 -np 1,8), dense-q4k (m30k, TIERMOE_MMVQ_Q8X 1/q4_K), attn-tc (TIERMOE_ATTN_TC 1/0, pp512,2048; llama.cpp too), graph and graph-cpu-moe (TIERMOE_CUDA_GRAPH 1/0, tg)"
    [ab]="interleaved A/B of any cases: AB='name|model|flags|VAR=V ...;name|...' ROUNDS (3)"
    [quant]="the low-bit mixes: for each MIX of QMIXES ('Q2_K IQ4_XS dynamic') the file m30-MIX (mkmodel --preset 30b-a3b --mix MIX --fill FILL; its mkmodel time in the log) everything on the GPU (llama.cpp -ngl 99 / -ngl all, case gpu-MIX) and experts in RAM (-ncmoe 48 / --cpu-moe, case cpu-moe-MIX); each file is deleted after its cases (disk)"
    [qtypes]="the routed experts' types: for each T of QTYPES ('Q4_K Q2_K Q3_K IQ4_XS IQ3_XXS IQ2_XXS IQ1_M') the file m30x-T (mkmodel --preset 30b-a3b --type-experts T --fill FILL: the rest as the preset; its time in the log), pp P and tg N everything on the GPU (llama.cpp -ngl 99 / -ngl all, case gpu-T) and experts in RAM (-ncmoe 48 / --cpu-moe, case cpu-moe-T; P=0: tg only); the records carry the file's expert bytes a token (bench/tables.py: the RAM bound); each file is deleted after its cases (disk). Estimate on the H200 machine: about a minute a type (file I/O-bound, ~4 bench runs): split QTYPES over calls, e.g. 'Q4_K IQ2_XXS Q2_K IQ1_M' then 'Q3_K IQ4_XS IQ3_XXS' (the IQ2_XXS / Q4_K ratio from one call)"
    [qnext]="the hybrid linear-attention models: qn80 (mkmodel --preset qwen3-next-80b-a3b --fill FILL) and, with QNEXT_35=1, qn35 (qwen3.5-35b-a3b): pp P and tg N everything on the GPU (llama.cpp -ngl 99 / -ngl all, case gpu-qn80) and experts in RAM (-ngl 99 -ncmoe 99 / --cpu-moe, case cpu-moe-qn80); QNEXT_MODELS names the files (e.g. qn35); case gpu-M-scan: -ngl all with the delta rule's token-by-token scan for prompts too (TIERMOE_DELTA_CHUNKED=0); the files are deleted after their cases"
    [moearchs]="issue 32's families: glma (mkmodel --preset glm-4.5-air --n-layer GLMA_LAYERS (24) --fill FILL) everything on the GPU (llama.cpp -ngl 99 / -ngl all, case gpu-glma) and experts in RAM (-ngl 99 -ncmoe 99 / --cpu-moe, cpu-moe-glma); glmaq (the same with --skew 4.2 --skew-offset 70, Qwen3's popularity without its locality), learn pass first: llama.cpp -ngl 99 -ncmoe GLMA_LAYERS-3 (3 layers' experts in VRAM) / tiermoe --cpu-moe --moe-cache GLMA_CACHE_MIB (3834: the same bytes) (cache-glmaq); mix (mixtral-8x7b), olmoe (olmoe-1b-7b) and g4 (gemma-4-26b-a4b): gpu-M and cpu-moe-M; MOEARCH_MODELS ('glma glmaq mix olmoe'; g4 by name) picks; each file is deleted after its cases"
    [longprompt]="issue 34's long prompts with every expert in RAM, m30r (30b-a3b --fill FILL): pp512 and pp4096 (tg 0) with default flags: llama.cpp -ngl 99 -ncmoe 48 (case default) / tiermoe --cpu-moe (the engine's batch); llama.cpp -b 4096 -ub 4096 (case b4096), tiermoe with a ring of 4 x 64 experts (case ring64: TIERMOE_FETCH_RING=64x4), and LONG_P (e.g. 16384) as pp too when set"
    [deepseek]="issue 32's DeepSeek-V3 shape: ds (mkmodel --preset deepseek-v3 --n-layer DS_LAYERS (9: 3 dense, 6 MoE) --fill FILL) everything on the GPU (llama.cpp -ngl 99 / -ngl all, case gpu-ds) and experts in RAM (-ngl 99 -ncmoe 99 / --cpu-moe, cpu-moe-ds), pp P / tg N; then latent-attention decode at depth: tg DS_N (32) after a DS_DEPTHS ('8192') prompt everything on the GPU (-d D, both engines, case dD; DS_AB=1: also tiermoe's f32 kernel, TIERMOE_ATTN_TC=0, case dD-f32); the file is deleted after its cases"
    [gpus]="two GPUs (the nvidia-h200-x2 kind): test_cuda_ops' check_gpus (spans against one GPU and the f64 reference; with the 30b file m30), then m30 on one GPU and over both: llama.cpp -sm none -mg 0 / -dev CUDA0 (case gpu1), llama.cpp -sm layer / -dev CUDA0,CUDA1 -ts 1,1 (case gpu2); GPUS_CHECK=0 skips check_gpus; GPUS_NCMOE=N adds --n-cpu-moe N / -ncmoe N on one GPU (ncmoe1) and both (ncmoe2); GPUS_CACHE_MIB=C adds m30 --cpu-moe with --moe-cache C,C on both (cache2) against --moe-cache 2C on one (cache1); GPUS_BIG=1 adds g235 (the 235B-class layer shape, G235_LAYERS (40) layers) both ways; with GPUS_BIG_CACHE_MIB=B also g235's learn pass, then --cpu-moe --moe-cache B --moe-learn on one GPU (cache1-g235) and B,B on both (cache2-g235); GPUS_PROFILE=1: m30 bench --profile over both GPUs, -ngl all and --n-cpu-moe GPUS_NCMOE (24), to \$OUT/logs/gpus-profile.log"
    [profile]="where the time goes: tiermoe --profile (cases gpu, cpu-moe, cache on m30q) and, with Nsight Compute (NCU=0 skips), one decode step's time per kernel (NCU_ARGS '-p 0 -n 4', e.g. '-p 0 -n 4 -np 8'; NCU_SKIP 2000, NCU_COUNT 640) and NCU_KERNEL's sections (a regex)"
)
# Aliases: a set of stages under one name.
declare -A ALIAS=(
    [headline]="build peer models full-gpu cpu-moe cache cpu"
)

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "Stages:"
    for s in "${STAGES_ORDER[@]}"; do printf '  %-12s %s\n' "$s" "${HELP[$s]}"; done
    echo "Aliases:"
    for a in "${!ALIAS[@]}"; do printf '  %-12s %s\n' "$a" "${ALIAS[$a]}"; done
}

DEBS="libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev libcmocka0
libcmocka-dev libmicrohttpd12 libmicrohttpd-dev liburing2 liburing-dev"

# .devdeps/ and .peer/ for the GPU machine, made here (apt-get reaches the registry here).
prepare() {
    local f
    mkdir -p .devdeps .peer
    # shellcheck disable=SC2086 # DEBS: words
    (cd .devdeps && apt-get download $DEBS) || { echo "--prepare: apt-get download FAILED"; return 1; }
    for f in "${PEER_TAR:-}" ../shared/peer/llama-bench.tar.xz ../../shared/peer/llama-bench.tar.xz; do
        [ -n "$f" ] && [ -f "$f" ] && cp "$f" .peer/ && break
    done
    [ -f .peer/llama-bench.tar.xz ] || { echo "--prepare: no llama-bench.tar.xz (set PEER_TAR)"; return 1; }
    du -sh .devdeps .peer
}

# ---------------------------------------------------------------- settings
OUT=${OUT:-/tmp/out}
RESULTS=${RESULTS:-$OUT/results}
BUILD=${BUILD:-build/device}
TM_CUDA=${TM_CUDA:-ON}
CUDA_ARCH=${CUDA_ARCH:-90-real}
MODELS_DIR=${MODELS_DIR:-/tmp}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-2}
P=${P:-512}
N=${N:-128}
PEER=${PEER:-1}
FILL=${FILL:-repeat}
SMOKE=${SMOKE:-0}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
if [ "$SMOKE" = 1 ]; then REPS=1 P=16 N=8; fi
TM=$BUILD/tiermoe
LB=/tmp/llamacpp-peer/llama-bench
CALL=$(date -u +%Y-%m-%dT%H:%M:%SZ)
DAY=${CALL%%T*}
T0=$(date +%s)
STAGE=none
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT

stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
has() { [[ " $1 " == *" $2 "* ]]; }
# Whether case $1 runs: every case of the stage unless CASES names some.
want() { [ -z "${CASES:-}" ] || has "$CASES" "$1"; }

# The libraries the GPU machine's image lacks, from the Debian packages in .devdeps/.
deps_env() {
    if ! pkg-config --exists jansson libpcre2-8 libutf8proc cmocka libmicrohttpd liburing 2> /dev/null &&
        ls .devdeps/*.deb > /dev/null 2>&1; then
        mkdir -p /tmp/deps
        for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/deps; done
        # libmicrohttpd's .pc names gnutls for static links only; the image has the library
        sed -i '/^Requires.private/d' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc 2> /dev/null || true
        export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
        export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
        export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    [ -d /usr/local/cuda/bin ] && export PATH=$PATH:/usr/local/cuda/bin
    return 0
}

commit_id() {
    if [ -n "${TM_COMMIT:-}" ]; then
        echo "$TM_COMMIT"
    elif c=$(git rev-parse --short=12 HEAD 2> /dev/null); then
        git diff --quiet HEAD 2> /dev/null && echo "$c" || echo "$c+dirty"
    else
        echo unknown
    fi
}

# ---------------------------------------------------------------- recording
# Append a bench's raw JSONL ($TMPD/raw.jsonl) to this stage's results file.
# $1 engine, $2 case, $3 model name, $4 model file, $5 environment, the rest the command.
record() {
    local engine=$1 case=$2 model=$3 file=$4 envs=$5
    shift 5
    [ "$SMOKE" = 1 ] && model="$model (SMOKE: tiny)"
    local info=() kv
    for kv in ${REC_INFO:-}; do info+=(--info "$kv"); done
    python3 bench/record.py wrap --out "$RESULTS/$DAY-$SLUG-$STAGE.jsonl" --engine "$engine" \
        --stage "$STAGE" --case "$case" --model "$model" --model-file "$file" --env "$envs" \
        --round "${ROUND:-1}" --machine "$OUT/machine.json" --commit "$COMMIT" \
        --call "$CALL" "${info[@]}" -- "$@" < "$TMPD/raw.jsonl"
}

# Keep a text output the docs quote ($1) as $RESULTS/<date>-<machine>-<stage>-$2, under a
# line that says the stage, commit, call and machine.
keep() {
    [ -s "$1" ] || return 0
    { echo "# scripts/device.sh $STAGE | commit $COMMIT | call $CALL | machine $(cat "$OUT/machine.json")"
      cat "$1"; } >> "$RESULTS/$DAY-$SLUG-$STAGE-$2"
}

FAILED_CASES=()
case_failed() {
    echo "  $1: no result (rc $2):"
    tail -3 "$TMPD/raw.err" | sed 's/^/    /'
    FAILED_CASES+=("$STAGE/$1")
    return 1
}

# tiermoe bench on model $2 as case $1 under environment $3 (VAR=V ...), the rest its
# flags after -p $P -n $N -r $REPS -t $THREADS (a later -p, -n or -t replaces those).
tm_case() {
    local case=$1 model=$2 envs=$3 file rc
    shift 3
    want "$case" || return 0
    file=$(model_path "$model") || return 1
    ensure_model "$model" || return 1
    local cmd=("$TM" bench -m "$file" -p "$P" -n "$N" -r "$REPS" -t "$THREADS" -o jsonl "$@")
    stamp "tiermoe $case: ${envs:+$envs }-p $P -n $N $*"
    # shellcheck disable=SC2086 # envs: VAR=V words
    env $envs timeout "$BENCH_TIMEOUT" "${cmd[@]}" > "$TMPD/raw.jsonl" 2> "$TMPD/raw.err"
    rc=$?
    { echo "## $case (rc $rc): ${envs:+$envs }${cmd[*]}"; cat "$TMPD/raw.err"; } >> "$OUT/logs/$STAGE.err"
    grep -E "VRAM cache, routed|SSD tier|copies ahead|host steal|moe-pcie auto: decode" "$TMPD/raw.err" | cut -c1-200 | sed 's/^/  /'
    record tiermoe "$case" "$model" "$file" "$envs" "${cmd[@]}" || case_failed "$case" "$rc"
}

# llama.cpp's llama-bench on model $2 as case $1 (-fa 1, -p $P -n $N -r $REPS -t $THREADS),
# the rest its flags.
peer_case() {
    local case=$1 model=$2 file rc
    shift 2
    want "$case" || return 0
    [ "$PEER" = 1 ] || return 0
    need peer || return 0
    file=$(model_path "$model") || return 1
    ensure_model "$model" || return 1
    local cmd=("$LB" -m "$file" -fa 1 -p "$P" -n "$N" -r "$REPS" -t "${PEER_THREADS:-$THREADS}" -o jsonl "$@")
    stamp "llama.cpp $case: -p $P -n $N $*"
    timeout "$BENCH_TIMEOUT" "${cmd[@]}" > "$TMPD/raw.jsonl" 2> "$TMPD/raw.err"
    rc=$?
    { echo "## $case (rc $rc): ${cmd[*]}"; cat "$TMPD/raw.err"; } >> "$OUT/logs/$STAGE.peer.err"
    record llama.cpp "$case" "$model" "$file" "" "${cmd[@]}" || case_failed "$case" "$rc"
}

# ---------------------------------------------------------------- models
model_path() {
    case $1 in
    m30 | m30q | m30v | m30k | m30-* | m30x-* | qn80 | qn35 | glma | glmaq | mix | olmoe | m30r | ds | g4 | g235) echo "$MODELS_DIR/$1.gguf" ;;
    gptoss) echo "$MODELS_DIR/gptoss20b.gguf" ;;
    tiny) echo "$MODELS_DIR/tiny.gguf" ;;
    *) echo "device.sh: unknown model '$1' (m30 m30q m30v m30k gptoss tiny)" >&2 && return 1 ;;
    esac
}

# Make model $1 unless its file is there (a warm machine keeps /tmp). SMOKE=1: tiny
# stand-ins of the same kind.
ensure_model() {
    local f args
    f=$(model_path "$1") || return 1
    [ -f "$f" ] && return 0
    need build || return 1
    case $1 in
    m30) args=(--preset 30b-a3b) ;;
    m30q) args=(--preset 30b-a3b --routing qwen3-30b-a3b) ;;
    m30k) args=(--preset 30b-a3b --type-attn q4_K) ;;
    m30v)
        python3 -c "
import lzma
for n in ('tokenizer.json', 'tokenizer_config.json'):
    open('$TMPD/' + n, 'wb').write(lzma.open('tests/data/vocab/qwen3/' + n + '.xz').read())" || return 1
        args=(--preset 30b-a3b --routing qwen3-30b-a3b --vocab "$TMPD/tokenizer.json")
        ;;
    gptoss) args=(--preset gpt-oss-20b) ;;
    tiny) args=(--preset tiny) ;;
    m30-*) args=(--preset 30b-a3b --mix "${1#m30-}" --fill "$FILL") ;;
    m30x-*) args=(--preset 30b-a3b --type-experts "${1#m30x-}" --fill "$FILL") ;;
    qn80) args=(--preset qwen3-next-80b-a3b --fill "$FILL") ;;
    qn35) args=(--preset qwen3.5-35b-a3b --fill "$FILL") ;;
    glma) args=(--preset glm-4.5-air --n-layer "${GLMA_LAYERS:-24}" --fill "$FILL") ;;
    glmaq) args=(--preset glm-4.5-air --n-layer "${GLMA_LAYERS:-24}" --fill "$FILL" --skew 4.2 --skew-offset 70) ;;
    mix) args=(--preset mixtral-8x7b --fill "$FILL") ;;
    m30r) args=(--preset 30b-a3b --fill "$FILL") ;;
    olmoe) args=(--preset olmoe-1b-7b --fill "$FILL") ;;
    ds) args=(--preset deepseek-v3 --n-layer "${DS_LAYERS:-9}" --fill "$FILL") ;;
    g4) args=(--preset gemma-4-26b-a4b --fill "$FILL") ;;
    g235) args=(--preset 30b-a3b --routing qwen3-30b-a3b --n-layer "${G235_LAYERS:-40}" --n-embd 4096
        --n-head 64 --n-head-kv 4 --head-dim 128 --n-expert 128 --n-expert-used 8 --n-ff-exp 1536 --fill "$FILL") ;;
    esac
    if [ "$SMOKE" = 1 ]; then
        case $1 in gptoss) args=(--preset tiny-gpt-oss) ;; qn80) args=(--preset tiny-qwen3next) ;; glma | glmaq) args=(--preset tiny-glm4moe) ;; mix) args=(--preset tiny-mixtral) ;; olmoe) args=(--preset tiny-olmoe) ;; ds) args=(--preset tiny-deepseek-v3) ;; qn35) args=(--preset tiny-qwen35moe) ;; g4) args=(--preset tiny-gemma-4) ;; m30-* | m30x-*) args=(--preset tiny "${args[@]:2}") ;; m30v) args=(--preset tiny "${args[@]:4}") ;; *) args=(--preset tiny) ;; esac
    fi
    stamp "model $1: mkmodel ${args[*]}"
    if ! "$TM" mkmodel "${args[@]}" -q -o "$f.part"; then
        rm -f "$f.part"
        echo "mkmodel $1 FAILED"
        return 1
    fi
    mv "$f.part" "$f"
}

# The routing of 16 random 64-token prompts (64 tokens generated each) on model $1,
# --cpu-moe: the learn file the cache stages load ($MODELS_DIR/<model>.learn.json).
learn_file() {
    local f out
    f=$(model_path "$1") || return 1
    out=$MODELS_DIR/$1.learn.json
    [ -f "$out" ] && { echo "$out"; return 0; }
    python3 -c "
import random; r = random.Random(1)
print('\n'.join(','.join(str(r.randrange(200 if $SMOKE else ${LEARN_VOCAB:-151936})) for _ in range(64)) for _ in range(16)))" > "$TMPD/prompts.txt"
    stamp "learn pass on $1 (16 prompts, 64 + 64 tokens, --cpu-moe)" >&2
    timeout 300 "$TM" trace -m "$f" --prompts "$TMPD/prompts.txt" -n 64 --cpu-moe \
        --routing-log "$MODELS_DIR/$1.routing.bin" -o "$out" >> "$OUT/logs/$STAGE.err" 2>&1 \
        || { echo "learn pass FAILED (log $OUT/logs/$STAGE.err)" >&2; return 1; }
    echo "$out"
}

# ---------------------------------------------------------------- stages
declare -A STAGE_RC=()
# test_cuda_ops, for the stages that run it (the bench stages need tiermoe alone).
build_tests() {
    need build || return 1
    [ -x "$BUILD/tests/test_cuda_ops" ] && [ -n "${TESTS_BUILT:-}" ] && return 0
    stamp "build: test_cuda_ops"
    cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_ops > "$OUT/logs/build-tests.log" 2>&1 \
        || { grep -E "error" -A3 "$OUT/logs/build-tests.log" | head -40; echo "build: test_cuda_ops FAILED"; return 1; }
    TESTS_BUILT=1
}

# Run stage $1 once per harness call (the stages the others depend on).
need() {
    [ -n "${STAGE_RC[$1]:-}" ] && return "${STAGE_RC[$1]}"
    local saved=$STAGE
    STAGE=$1
    "stage_${1//-/_}"
    STAGE_RC[$1]=$?
    STAGE=$saved
    return "${STAGE_RC[$1]}"
}

stage_build() {
    local targets=(tiermoe)
    stamp "build: Release, TM_CUDA=$TM_CUDA, ${targets[*]}"
    local arch=()
    [ "$TM_CUDA" = ON ] && arch=(-DTM_CUDA_ARCHITECTURES="$CUDA_ARCH")
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA="$TM_CUDA" "${arch[@]}" \
        > "$OUT/logs/cmake.log" 2>&1 || { tail -30 "$OUT/logs/cmake.log"; echo "build: cmake FAILED"; return 1; }
    if [ "$TM_CUDA" = ON ] && ! grep -q "CUDA backend ON" "$OUT/logs/cmake.log"; then
        grep -i cuda "$OUT/logs/cmake.log" | head -5
        echo "build: CUDA backend not found by cmake (TM_CUDA=OFF to build without)"
        return 1
    fi
    grep -E "not found" "$OUT/logs/cmake.log" | sed 's/^/  /'
    cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}" > "$OUT/logs/build.log" 2>&1 \
        || { grep -E "error" -A3 "$OUT/logs/build.log" | head -40; echo "build: FAILED"; return 1; }
    stamp "build: done ($TM)"
}

stage_checks() {
    need build || return 1
    local rc rc2=skipped
    if [ "$TM_CUDA" = ON ]; then
        build_tests || return 1
        local only=()
        [ -n "${CHECKS_ONLY:-}" ] && only=(TM_CUDA_ONLY="$CHECKS_ONLY")
        [ "${CHECKS_MODEL:-0}" = 1 ] && ensure_model m30 && only+=(TM_CUDA_MODEL="$(model_path m30)")
        stamp "checks: test_cuda_ops ${only[*]}"
        env "${only[@]}" TM_TEST_TMP=/tmp TM_TEST_DATA="$PWD/tests/data" timeout 420 \
            "$BUILD/tests/test_cuda_ops" > "$OUT/logs/checks.log" 2>&1
        rc=$?
        grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|Failure|SKIPPED" "$OUT/logs/checks.log" | head -40
        grep -q "SKIPPED" "$OUT/logs/checks.log" && [ "$rc" -eq 0 ] && rc="skipped (no device?)"
    else
        rc="skipped (TM_CUDA=OFF)"
    fi
    if [ "$TM_CUDA" != ON ]; then
        rc2="skipped (TM_CUDA=OFF: CI runs it on the host mock)"
    elif grep -q "libmicrohttpd not found" "$OUT/logs/cmake.log" 2> /dev/null; then
        rc2="skipped (no libmicrohttpd: carry .devdeps)"
    else
        stamp "checks: tests/oracle/test_server_cache.py on this build (the real GPU, not the mock)"
        mkdir -p /tmp/serve_cache
        TM_BIN_DIR=$BUILD TM_SERVE_BINARY=$TM TM_TEST_DATA=tests/data TM_TEST_TMP=/tmp/serve_cache \
            timeout 420 python3 tests/oracle/test_server_cache.py > "$OUT/logs/server_cache.log" 2>&1
        rc2=$?
        tail -3 "$OUT/logs/server_cache.log"
    fi
    keep "$OUT/logs/checks.log" test_cuda_ops.txt
    echo "checks: test_cuda_ops rc=$rc | test_server_cache.py rc=$rc2"
    [ "$rc" = 0 ] || [[ $rc == skipped* ]]
}

stage_sanitize() {
    build_tests || return 1
    command -v compute-sanitizer > /dev/null || { echo "sanitize: no compute-sanitizer"; return 0; }
    local tool rc failed=0
    for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        stamp "compute-sanitizer $tool, TM_CUDA_ONLY='${SAN_ONLY:-*gemm*}'"
        TM_CUDA_ONLY="${SAN_ONLY:-*gemm*}" TM_TEST_TMP=/tmp TM_TEST_DATA="$PWD/tests/data" \
            timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
            --print-limit 20 "$BUILD/tests/test_cuda_ops" > "$OUT/logs/$tool.log" 2>&1
        rc=$?
        echo "$tool rc $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/logs/$tool.log" | tr '\n' ' ')"
        # gVisor machines refuse the tool: that is no kernel bug
        grep -qi "device not supported" "$OUT/logs/$tool.log" && echo "  ($tool unavailable: the tool refused the device)"
        [ "$rc" = 0 ] || failed=1
    done
    return "$failed"
}

stage_resources() {
    local f
    for f in src/cuda/*.cu; do
        nvcc -arch=sm_90 -std=c++17 -I src --resource-usage -c "$f" -o /dev/null 2>&1 |
            awk '/Function properties for/ {f=$NF} /Used/ {sub(/.*Used/, "Used"); print "  " f ": " $0}'
    done | sed 's/_Z[0-9]*//' | cut -c1-150 > "$OUT/resources.txt"
    cat "$OUT/resources.txt"
}

stage_opbench() {
    build_tests || return 1
    stamp "test_cuda_ops TM_CUDA_BENCH=1"
    TM_CUDA_BENCH=1 TM_TEST_DATA="$PWD/tests/data" timeout 400 "$BUILD/tests/test_cuda_ops" > "$OUT/logs/opbench.log" 2>&1
    echo "opbench rc $?"
    grep -E "^\||^\(H" "$OUT/logs/opbench.log"
}

stage_cpu_kernels() {
    local d=$TMPD/cpuk cf cm_inc="" cm_lib="" src o objs=() status=0 level
    mkdir -p "$d"
    lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|L2 cache|L3 cache|NUMA node\(s\)"
    if ! printf '#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>\n' |
        gcc -E -x c - > /dev/null 2>&1; then
        ls .devdeps/libcmocka*.deb > /dev/null 2>&1 || { echo "cpu-kernels: no cmocka (carry .devdeps)"; return 1; }
        for f in .devdeps/libcmocka*.deb; do dpkg -x "$f" "$d/root"; done
        cm_inc="-I$d/root/usr/include"
        cm_lib="-L$d/root/usr/lib/x86_64-linux-gnu -Wl,-rpath,$d/root/usr/lib/x86_64-linux-gnu"
    fi
    stamp "cpu-kernels: build (gcc $(gcc -dumpversion), -O3, no -march)"
    cf="-std=c11 -O3 -DNDEBUG -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Isrc -Iinclude -Wall -Wextra -Wno-unused-parameter"
    for src in src/core/*.c src/quant/*.c src/cpu/*.c; do
        o="$d/$(echo "$src" | tr / _).o"
        # shellcheck disable=SC2086 # cf: flags
        gcc $cf -c "$src" -o "$o" || return 1
        objs+=("$o")
    done
    ar rcs "$d/libcpu.a" "${objs[@]}"
    for t in test_cpu_gemm test_cpu_pool test_cpu_ops; do
        # shellcheck disable=SC2086
        gcc $cf $cm_inc "tests/$t.c" "$d/libcpu.a" $cm_lib -lcmocka -lm -lpthread -o "$d/$t" || return 1
        stamp "cpu-kernels: $t"
        "$d/$t" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
    done
    # shellcheck disable=SC2086
    gcc $cf tests/tools/cpu_gemm_bench.c "$d/libcpu.a" -lm -lpthread -o "$d/cpu_gemm_bench" || return 1
    for level in ${LEVELS:-avx2 avx512 amx}; do
        stamp "cpu_gemm_bench, level $level, $THREADS threads (Qwen3-30B-A3B shapes)"
        "$d/cpu_gemm_bench" -t "$THREADS" -l "$level" -q -s 0.3 -m 2048 | tee -a "$d/bench.log"
    done
    if [ -z "${QUICK:-}" ]; then
        stamp "cpu_gemm_bench, best level, 8 threads; other types"
        "$d/cpu_gemm_bench" -t 8 -q -s 0.3 -m 2048 | tee -a "$d/bench.log"
        "$d/cpu_gemm_bench" -t "$THREADS" -s 0.2 -m 1024 | sed -n '1,4p;17,$p' | tee -a "$d/bench.log"
    fi
    keep "$d/bench.log" gemm.txt
    echo "cpu-kernels: tests status $status"
    return "$status"
}

stage_peer() {
    [ -x "$LB" ] && return 0
    local f
    for f in "${PEER_TAR:-}" .peer/llama-bench.tar.xz shared/peer/llama-bench.tar.xz ../shared/peer/llama-bench.tar.xz; do
        [ -n "$f" ] && [ -f "$f" ] && break
        f=
    done
    [ -n "$f" ] || { echo "peer: no llama-bench.tar.xz (carry .peer/ or set PEER_TAR): llama.cpp cases skipped"; return 1; }
    stamp "peer: unpack $f"
    if ! tar xJf "$f" -C /tmp || [ ! -x "$LB" ]; then
        echo "peer: unpacking $f FAILED"
        return 1
    fi
}

stage_models() {
    need build || return 1
    local m
    for m in ${MODELS:-m30 m30q}; do ensure_model "$m" || return 1; done
    ls -la "$MODELS_DIR"/*.gguf
}

stage_full_gpu() {
    peer_case gpu m30 -ngl 99
    tm_case gpu m30 "" -ngl all
}

stage_cpu_moe() {
    peer_case cpu-moe m30 -ngl 99 -ncmoe 48
    peer_case cpu-moe-pinned m30 -ngl 99 -ncmoe 48 -lm none
    tm_case cpu-moe m30 "" --cpu-moe
    peer_case ncmoe35 m30 -ngl 99 -ncmoe 35
    tm_case ncmoe35 m30 "" --n-cpu-moe 35
}

stage_cache() {
    local learn mib=${CACHE_MIB:-4212}
    ensure_model m30q || return 1
    learn=$(learn_file m30q) || return 1
    # llama.cpp's nearest placement to each budget: the experts of as many layers in VRAM
    peer_case cache m30q -ngl 99 -ncmoe 35
    tm_case cache m30q "" --cpu-moe --moe-cache "$mib" --moe-learn "$learn"
    peer_case cache8 m30q -ngl 99 -ncmoe 23
    tm_case cache8 m30q "" --cpu-moe --moe-cache "${CACHE8_MIB:-8100}" --moe-learn "$learn"
    if [ -n "${CASES:-}" ]; then # the variants, by name only
        peer_case ncmoe35 m30q -ngl 99 -ncmoe 35
        tm_case ncmoe35 m30q "" --n-cpu-moe 35
        tm_case cache-nolearn m30q "" --cpu-moe --moe-cache "$mib"
        tm_case cache-off m30q "" --cpu-moe --moe-cache "$mib" --moe-learn "$learn" --moe-cache-update off
        tm_case cache-full m30q "" --cpu-moe --moe-cache "$mib" --moe-learn "$learn" --moe-cache-update full
        tm_case cache-admit4 m30q "" --cpu-moe --moe-cache "$mib" --moe-learn "$learn" --moe-cache-admit 4
        if want plan; then
            "$TM" plan "$learn" --budget "$mib" --model "$(model_path m30q)" -o "$MODELS_DIR/m30q.plan.json" 2>&1 | tail -2
            tm_case plan m30q "" --cpu-moe --moe-cache-plan "$MODELS_DIR/m30q.plan.json"
        fi
        tm_case u-cache m30 "" --cpu-moe --moe-cache "$mib"
        if want replay; then
            stamp "policy replay (lag 1, one upload a layer a step)"
            "$TM" report --replay "$MODELS_DIR/m30q.routing.bin" --max-admit 1 2>&1 | tee "$OUT/replay.txt" | tail -14
            keep "$OUT/replay.txt" replay.txt
        fi
    fi
}

stage_cpu() {
    peer_case cpu m30 -dev none
    THREADS=${CPU_THREADS:-$THREADS} tm_case cpu m30 "" -ngl 0
}

stage_long() {
    P=2048 N=512 peer_case gpu-long m30 -ngl 99
    P=2048 N=512 tm_case gpu-long m30 "" -ngl all
}

stage_fetch() {
    local f
    N=0 peer_case cpu-moe m30 -ngl 99 -ncmoe 48
    N=0 peer_case cpu-moe-pinned m30 -ngl 99 -ncmoe 48 -lm none
    for f in ${FETCH_MODES:-auto copy pcie off}; do
        N=0 tm_case "fetch-$f" m30 "" --cpu-moe --moe-fetch "$f"
    done
    for f in ${FETCH_SHARES:-}; do
        N=0 tm_case "fetch-cpu-$f" m30 "TIERMOE_FETCH_CPU_SHARE=$f" --cpu-moe
    done
}

stage_lanes() {
    local n learn r
    for n in ${PCIE:-auto 0 2}; do P=0 tm_case "cpu-moe-pcie-$n" m30 "" --cpu-moe --moe-pcie "$n"; done
    ensure_model m30q || return 1
    learn=$(learn_file m30q) || return 1
    for n in ${PCIE:-auto 0 2}; do
        P=0 tm_case "cache-pcie-$n" m30q "" --cpu-moe --moe-cache "${CACHE_MIB:-4212}" --moe-learn "$learn" --moe-pcie "$n"
    done
    for n in ${AHEAD:-off 1 2}; do
        P=0 tm_case "cache-ahead-$n" m30q "" --cpu-moe --moe-cache "${CACHE_MIB:-4212}" --moe-learn "$learn" --moe-ahead "$n"
    done
    for r in ${LANE_ROWS:-}; do
        P=0 tm_case "cache-rows-$r" m30q "TIERMOE_LANE_ROWS=$r" --cpu-moe --moe-cache "${CACHE_MIB:-4212}" --moe-learn "$learn"
        P=0 tm_case "cpu-moe-rows-$r" m30 "TIERMOE_LANE_ROWS=$r" --cpu-moe
    done
}

stage_ssd() {
    local f exp_gib half all run budget fetch mib e g t
    need build || return 1
    ensure_model m30q || return 1
    f=$(model_path m30q)
    exp_gib=$("$TM" inspect "$f" 2> /dev/null | awk '/expert bytes/ {print $3; exit}')
    half=$(awk -v g="${exp_gib:-15.19}" 'BEGIN {printf "%d", g * 1024 / 2}')
    all=$(awk -v g="${exp_gib:-15.19}" 'BEGIN {printf "%d", g * 1024 * 1.05 + 64}')
    g=none
    ls /usr/local/cuda/lib64/libcufile* > /dev/null 2>&1 && g=lib
    lsmod 2> /dev/null | grep -q nvidia_fs && g="$g+nvidia_fs"
    echo "expert bytes ${exp_gib:-?} GiB: half $half MiB, all $all MiB | cuFile / GDS: $g"
    stamp "drive: calibrate --drive"
    timeout 120 "$TM" calibrate -m "$f" --drive --drive-seconds 1 > "$OUT/logs/drive.log" 2>&1
    grep -E "^drive|1024 KiB" "$OUT/logs/drive.log" | head -4
    keep "$OUT/logs/drive.log" drive.txt
    local envs=()
    read -r -a envs <<< "${SSD_ENVS:-}"
    [ ${#envs[@]} = 0 ] && envs=("")
    for e in "${envs[@]}"; do
        for t in ${SSD_THREADS:-$THREADS}; do
            for run in ${SSD_RUNS:-half:auto half:off mmap:auto}; do
                budget=${run%%:*} fetch=${run#*:}
                mib=()
                [ "$budget" = half ] && mib=(--ram-cache "$half")
                [ "$budget" = all ] && mib=(--ram-cache "$all")
                sync
                echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || echo "  (cannot drop the page cache)"
                P=${SSD_P:-512} N=${SSD_N:-64} REPS=1 THREADS=$t tm_case "ssd-$budget-$fetch" m30q "$e" \
                    -ngl all --cpu-moe --moe-fetch "$fetch" "${mib[@]}"
            done
        done
    done
}

stage_parallel() {
    local mv
    ensure_model m30v || return 1
    mv=$(model_path m30v)
    P=0 N=64 tm_case gpu-np m30v "" -ngl all -np 1,2,4,8
    P=0 N=32 tm_case cpu-moe-np m30v "" --cpu-moe -np 1,2,4,8
    [ "${SERVE:-1}" = 1 ] || return 0
    local runs=("all-gpu|${TOKENS:-128}|-ngl all|" "cpu-moe|$((${TOKENS:-128} / 2))|--cpu-moe|") e
    for e in ${SERVE_ENVS:-}; do runs+=("all-gpu $e|${TOKENS:-128}|-ngl all|$e"); done
    for pl in "${runs[@]}"; do
        IFS='|' read -r label n flags e <<< "$pl"
        want "serve-${label%% *}" || continue
        stamp "serve --parallel, $label: $flags"
        # shellcheck disable=SC2086 # flags, e: words
        env $e timeout 300 python3 bench/serve_parallel.py "$mv" --build "$BUILD" --tokens "$n" --label "$label" \
            -- $flags -t "$THREADS" --no-expert-trace 2>&1 | tee "$TMPD/serve.log" | grep -E "streams|RESULT|rror|exited"
        { echo "## serve_parallel.py $label: $flags"; cat "$TMPD/serve.log"; } > "$TMPD/serve.keep"
        keep "$TMPD/serve.keep" serve.txt
    done
}

stage_serve() {
    local mv
    ensure_model m30v || return 1
    mv=$(model_path m30v)
    tm_case gpu m30v "" -ngl all
    tm_case cache m30v "" --cpu-moe --moe-cache "${CACHE_MIB:-4212}"
    for s in "all-gpu||-ngl all" "all-gpu-no-trace||-ngl all --no-expert-trace" \
        "cache|--apply-plan|--cpu-moe --moe-cache ${CACHE_MIB:-4212} --moe-cache-update off"; do
        IFS='|' read -r label extra flags <<< "$s"
        want "serve-$label" || continue
        stamp "serve $label: $flags"
        # shellcheck disable=SC2086 # extra, flags: words
        timeout 420 python3 bench/serve_bench.py "$mv" --build "$BUILD" --reqs "$REPS" --tokens "$N" \
            --label "$label" $extra -- $flags -t "$THREADS" 2>&1 | tee "$TMPD/serve.log" | grep -E "mean|applied|error|exited"
        { echo "## serve_bench.py $label: $extra -- $flags"; cat "$TMPD/serve.log"; } > "$TMPD/serve.keep"
        keep "$TMPD/serve.keep" serve.txt
    done
}

stage_gptoss() {
    peer_case gpu gptoss -ngl 99
    tm_case gpu gptoss "" -ngl all
    peer_case cpu-moe gptoss -ngl 99 -ncmoe 99
    tm_case cpu-moe gptoss "" --cpu-moe
    peer_case ncmoe12 gptoss -ngl 99 -ncmoe 12
    tm_case ncmoe12 gptoss "" --n-cpu-moe 12
    if [ -n "${CASES:-}" ]; then
        tm_case cache12 gptoss "" --cpu-moe --moe-cache 5064
        peer_case cpu gptoss -dev none # -ngl 0 still sends prompt products to the GPU
        tm_case cpu gptoss "" -ngl 0
    fi
}

stage_quant() {
    local mix m t0
    for mix in ${QMIXES:-Q2_K IQ4_XS dynamic}; do
        m=m30-$mix
        t0=$(date +%s)
        ensure_model "$m" || { FAILED_CASES+=("quant/$m"); continue; }
        stamp "model $m: $(($(date +%s) - t0)) s, $(du -h "$(model_path "$m")" | cut -f1)"
        peer_case "gpu-$mix" "$m" -ngl 99
        [ "$TM_CUDA" = ON ] && tm_case "gpu-$mix" "$m" "" -ngl all
        peer_case "cpu-moe-$mix" "$m" -ngl 99 -ncmoe 48
        tm_case "cpu-moe-$mix" "$m" "" --cpu-moe
        rm -f "$(model_path "$m")"
    done
}

# The routed experts' bytes one token reads from model file $1: the bytes of its
# ffn_{gate,up,down}_exps tensors x expert_used_count / expert_count (tiermoe inspect).
expert_token_bytes() {
    "$TM" inspect "$1" 2> /dev/null | awk '
        $1 ~ /^expert_used_count$/ {used = $2}
        $1 ~ /^expert_count$/ {n = $2}
        $1 ~ /ffn_(gate|up|down)_exps\.weight$/ {b += $(NF - 1)}
        END {if (n && used && b) printf "%.0f\n", b * used / n}'
}

stage_qtypes() {
    local ty m f t0 made bytes
    need build || return 1
    for ty in ${QTYPES:-Q4_K Q2_K Q3_K IQ4_XS IQ3_XXS IQ2_XXS IQ1_M}; do
        m=m30x-$ty
        f=$(model_path "$m")
        made=
        [ -f "$f" ] || made=1
        t0=$(date +%s)
        ensure_model "$m" || { FAILED_CASES+=("qtypes/$m"); continue; }
        [ -n "$made" ] && made=$(($(date +%s) - t0))
        bytes=$(expert_token_bytes "$f")
        stamp "model $m: ${made:+mkmodel $made s, }$(du -h "$f" | cut -f1), expert bytes a token ${bytes:-?}"
        REC_INFO="expert_type=$ty${bytes:+ expert_token_bytes=$bytes}${made:+ mkmodel_s=$made}"
        peer_case "gpu-$ty" "$m" -ngl 99
        [ "$TM_CUDA" = ON ] && tm_case "gpu-$ty" "$m" "" -ngl all
        peer_case "cpu-moe-$ty" "$m" -ngl 99 -ncmoe 48
        tm_case "cpu-moe-$ty" "$m" "" --cpu-moe
        REC_INFO=
        rm -f "$f"
    done
}

stage_qnext() {
    local m
    need build || return 1
    for m in ${QNEXT_MODELS:-qn80 ${QNEXT_35:+qn35}}; do
        ensure_model_timed "$m" || continue
        gpu_and_cpu_moe_cases "$m"
        # the delta rule's scan for prompts too, for comparison with its chunked form
        [ "$TM_CUDA" = ON ] && tm_case "gpu-$m-scan" "$m" "TIERMOE_DELTA_CHUNKED=0" -ngl all
        rm -f "$(model_path "$m")"
    done
}

# Make model $1 unless it is there (a failure counts as case $STAGE/$1) and say its size
# and how long mkmodel took.
ensure_model_timed() {
    local f made='' t0
    f=$(model_path "$1") || return 1
    [ -f "$f" ] || made=1
    t0=$(date +%s)
    ensure_model "$1" || { FAILED_CASES+=("$STAGE/$1"); return 1; }
    [ -n "$made" ] && made=$(($(date +%s) - t0))
    stamp "model $1: ${made:+mkmodel $made s, }$(du -h "$f" | cut -f1)"
}

# Model $1 everything on the GPU (case gpu-$1) and with every expert in RAM (cpu-moe-$1).
gpu_and_cpu_moe_cases() {
    peer_case "gpu-$1" "$1" -ngl 99
    [ "$TM_CUDA" = ON ] && tm_case "gpu-$1" "$1" "" -ngl all
    peer_case "cpu-moe-$1" "$1" -ngl 99 -ncmoe 99
    tm_case "cpu-moe-$1" "$1" "" --cpu-moe
}

stage_moearchs() {
    local m learn
    need build || return 1
    for m in ${MOEARCH_MODELS:-glma glmaq mix olmoe}; do
        ensure_model_timed "$m" || continue
        if [ "$m" != glmaq ]; then
            gpu_and_cpu_moe_cases "$m"
        elif learn=$(LEARN_VOCAB=151552 learn_file glmaq); then
            peer_case cache-glmaq glmaq -ngl 99 -ncmoe $((${GLMA_LAYERS:-24} - 3))
            tm_case cache-glmaq glmaq "" --cpu-moe --moe-cache "${GLMA_CACHE_MIB:-3834}" --moe-learn "$learn"
        fi
        rm -f "$(model_path "$m")"
    done
}

stage_gpus() {
    need build || return 1
    build_tests || return 1
    ensure_model m30 || return 1
    local m rc=0
    [ "${GPUS_CHECK:-1}" = 1 ] && { stage_gpus_check || rc=1; }
    for m in m30 ${GPUS_BIG:+g235}; do
        ensure_model_timed "$m" || continue
        peer_case "gpu1-$m" "$m" -ngl 99 -sm none -mg 0
        tm_case "gpu1-$m" "$m" "" -ngl all -dev CUDA0
        peer_case "gpu2-$m" "$m" -ngl 99 -sm layer
        tm_case "gpu2-$m" "$m" "" -ngl all -dev CUDA0,CUDA1 -ts 1,1
        # experts of GPUS_NCMOE layers in RAM (the CPU lane), both engines
        local n=${GPUS_NCMOE:-}
        [ -n "$n" ] || continue
        peer_case "ncmoe1-$m" "$m" -ngl 99 -sm none -mg 0 -ncmoe "$n"
        tm_case "ncmoe1-$m" "$m" "" -ngl all -dev CUDA0 --n-cpu-moe "$n"
        peer_case "ncmoe2-$m" "$m" -ngl 99 -sm layer -ncmoe "$n"
        tm_case "ncmoe2-$m" "$m" "" -ngl all -dev CUDA0,CUDA1 -ts 1,1 --n-cpu-moe "$n"
    done
    # every expert in RAM, each GPU caching GPUS_CACHE_MIB of its layers' experts, against
    # one GPU with both budgets (the same VRAM for experts)
    local c=${GPUS_CACHE_MIB:-}
    if [ -n "$c" ]; then
        tm_case cache1-m30 m30 "" -ngl all -dev CUDA0 --cpu-moe --moe-cache $((2 * c))
        tm_case cache2-m30 m30 "" -ngl all -dev CUDA0,CUDA1 -ts 1,1 --cpu-moe --moe-cache "$c,$c"
    fi
    # --profile over both GPUs: each GPU's lanes and the peer copies' time (eager steps)
    if [ "${GPUS_PROFILE:-0}" = 1 ]; then
        local pf
        for pf in "-ngl all" "--n-cpu-moe ${GPUS_NCMOE:-24}"; do
            stamp "tiermoe --profile m30 -dev CUDA0,CUDA1 -ts 1,1 $pf"
            # shellcheck disable=SC2086 # pf: words
            timeout 200 "$TM" bench -m "$(model_path m30)" -p 512 -n 32 -r 1 -t "$THREADS" -dev CUDA0,CUDA1 \
                -ts 1,1 $pf --profile > /dev/null 2>> "$OUT/logs/gpus-profile.log"
            grep -E "^  GPU [0-9]|^tg32|^pp512" "$OUT/logs/gpus-profile.log" | tail -4 | cut -c1-400
        done
        keep "$OUT/logs/gpus-profile.log" profile.txt
    fi
    # issue 35's second target, scaled to the disk: g235 with a learn file, every expert in
    # RAM and GPUS_BIG_CACHE_MIB of them cached on each GPU (two GPUs, cache2-g235) against
    # one of the two GPUs with its own budget (cache1-g235); llama.cpp's split with the
    # experts of GPUS_NCMOE layers in RAM above (ncmoe2-g235) is the same VRAM when
    # GPUS_BIG_CACHE_MIB is half of the other layers' experts
    local b=${GPUS_BIG_CACHE_MIB:-} learn
    if [ -n "${GPUS_BIG:-}" ] && [ -n "$b" ] && learn=$(learn_file g235); then
        tm_case cache1-g235 g235 "" -ngl all -dev CUDA0 --cpu-moe --moe-cache "$b" --moe-learn "$learn"
        tm_case cache2-g235 g235 "" -ngl all -dev CUDA0,CUDA1 -ts 1,1 --cpu-moe --moe-cache "$b,$b" --moe-learn "$learn"
    fi
    return "$rc"
}

stage_gpus_check() {
    stamp "gpus: test_cuda_ops check_gpus, TM_CUDA_MODEL=m30"
    TM_CUDA_ONLY=check_gpus TM_CUDA_MODEL="$(model_path m30)" TM_TEST_TMP=/tmp \
        TM_TEST_DATA="$PWD/tests/data" timeout 420 "$BUILD/tests/test_cuda_ops" \
        > "$OUT/logs/check_gpus.log" 2>&1
    local rc=$?
    echo "check_gpus rc $rc: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) |skipped' "$OUT/logs/check_gpus.log" | tr '\n' ' ')"
    grep -E "greedy|differ|Failure|error" "$OUT/logs/check_gpus.log" | head -20
    return "$rc"
}

stage_longprompt() {
    need build || return 1
    local p=${LONG_P:+,$LONG_P}
    P=512,4096$p N=0 peer_case default m30r -ngl 99 -ncmoe 48
    P=512,4096$p N=0 peer_case b4096 m30r -ngl 99 -ncmoe 48 -b 4096 -ub 4096
    P=512,4096$p N=0 tm_case default m30r "" --cpu-moe
    # the ring's grouped GEMM ran at half the full-GPU rate in 16-expert chunks (2026-11-29)
    P=4096$p N=0 tm_case ring64 m30r "TIERMOE_FETCH_RING=64x4" --cpu-moe
}

stage_deepseek() {
    local d
    need build || return 1
    ensure_model_timed ds || return 1
    gpu_and_cpu_moe_cases ds
    for d in ${DS_DEPTHS:-8192}; do
        P=0 N=${DS_N:-32} peer_case "d$d" ds -ngl 99 -d "$d"
        P=0 N=${DS_N:-32} tm_case "d$d" ds "" -ngl all -d "$d"
        # the f32 latent-attention kernel (mla.cu) instead of the tensor-core one, for comparison
        [ -n "${DS_AB:-}" ] && P=0 N=${DS_N:-32} tm_case "d$d-f32" ds "TIERMOE_ATTN_TC=0" -ngl all -d "$d"
    done
    rm -f "$(model_path ds)"
}

stage_calibrate() {
    local f profile
    need build || return 1
    ensure_model m30 || return 1
    f=$(model_path m30)
    stamp "calibrate (full; the profile goes where the executor looks)"
    timeout 400 "$TM" calibrate -m "$f" -t "$THREADS" 2>&1 | tee "$OUT/calibrate.log" | grep -E "^decode|share|GB/s|profile:|time:" | head -16
    profile=$(sed -n 's/^profile: \(.*\) ([0-9.]* s in all)$/\1/p' "$OUT/calibrate.log" | tail -1)
    [ -n "$profile" ] && [ -f "$profile" ] && cp "$profile" "$OUT/calib-full.json"
    stamp "calibrate --quick"
    timeout 120 "$TM" calibrate -m "$f" -t "$THREADS" --quick --profile-out "$OUT/calib-quick.json" \
        > "$OUT/calibrate-quick.log" 2>&1
    grep -E "^decode: |^time: " "$OUT/calibrate-quick.log" | tail -2
    keep "$OUT/calibrate.log" full.txt
    keep "$OUT/calibrate-quick.log" quick.txt
}

# A/B rounds: $1 case prefix, $2 model, $3 VAR, $4 values, the rest tm_case's flags.
ab_rounds() {
    local pre=$1 model=$2 var=$3 values=$4 v
    shift 4
    want "$pre" || return 0
    for ROUND in $(seq "${ROUNDS:-2}"); do
        for v in $values; do tm_case "$pre" "$model" "$var=$v" "$@"; done
    done
    ROUND=1
}

stage_kernels() {
    peer_case q8x-decode m30 -ngl 99
    ab_rounds q8x-decode m30 TIERMOE_MMVQ_Q8X "0 1" -ngl all
    P=0 N=64 ab_rounds moe-q8x m30 TIERMOE_MOE_Q8X "0 1" -ngl all -np 1,8
    P=0 N=64 ab_rounds dense-q4k m30k TIERMOE_MMVQ_Q8X "1 q4_K" -ngl all -np 1,8
    P=512,2048 N=0 peer_case attn-tc m30 -ngl 99
    P=512,2048 N=0 ab_rounds attn-tc m30 TIERMOE_ATTN_TC "1 0" -ngl all
    P=0 ab_rounds graph m30 TIERMOE_CUDA_GRAPH "1 0" -ngl all
    P=0 ab_rounds graph-cpu-moe m30 TIERMOE_CUDA_GRAPH "1 0" --cpu-moe
}

stage_ab() {
    local cases c name model flags envs
    [ -n "${AB:-}" ] || { echo "ab: set AB='name|model|flags|VAR=V ...;name|...'"; return 1; }
    IFS=';' read -r -a cases <<< "$AB"
    for ROUND in $(seq "${ROUNDS:-3}"); do
        for c in "${cases[@]}"; do
            IFS='|' read -r name model flags envs <<< "$c"
            # shellcheck disable=SC2086 # flags: words
            tm_case "$name" "$model" "$envs" $flags
        done
    done
    ROUND=1
}

stage_profile() {
    local c name model flags learn
    need build || return 1
    ensure_model m30 || return 1
    local cases=("gpu|m30|-ngl all" "cpu-moe|m30|--cpu-moe")
    if want cache && ensure_model m30q && learn=$(learn_file m30q); then
        cases+=("cache|m30q|--cpu-moe --moe-cache ${CACHE_MIB:-4212} --moe-learn $learn")
    fi
    for c in "${cases[@]}"; do
        IFS='|' read -r name model flags <<< "$c"
        want "$name" || continue
        stamp "tiermoe --profile $name: $flags"
        # shellcheck disable=SC2086 # flags: words
        timeout 200 "$TM" bench -m "$(model_path "$model")" -p "$P" -n 32 -r 1 -t "$THREADS" $flags --profile \
            > "$TMPD/p.md" 2> "$OUT/logs/profile-$name.log"
        grep -vE "^\| ---|info:" "$OUT/logs/profile-$name.log" | head -24
        keep "$OUT/logs/profile-$name.log" "$name.txt"
    done
    if [ "${NCU:-1}" != 1 ] || ! command -v ncu > /dev/null; then
        echo "profile: no Nsight Compute run (NCU=0 or no ncu)"
        return 0
    fi
    if [ -n "${NCU_KERNEL:-}" ]; then # one kernel's limits (e.g. 'tm_moe_(gate_up|down)_fast')
        stamp "ncu: sections of $NCU_KERNEL"
        # shellcheck disable=SC2086 # NCU_ARGS: words
        timeout 240 ncu --clock-control none --kernel-name "regex:$NCU_KERNEL" --launch-skip "${NCU_KSKIP:-200}" \
            --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            "$TM" bench -m "$(model_path m30)" -ngl all ${NCU_ARGS:--p 0 -n 4} -r 1 > "$OUT/ncu_kernel.txt" 2>&1
        grep -E "tm_|Grid Size|Duration|Throughput|Achieved Occupancy|Registers|Stall|L2 Hit|DRAM" "$OUT/ncu_kernel.txt" | head -40
    fi
    stamp "ncu: one decode step, gpu__time_duration per kernel (${NCU_ARGS:--p 0 -n 4})"
    # shellcheck disable=SC2086 # NCU_ARGS: words
    timeout 300 ncu --graph-profiling node --cache-control none --clock-control none \
        --metrics gpu__time_duration.sum --csv --launch-skip "${NCU_SKIP:-2000}" --launch-count "${NCU_COUNT:-640}" \
        "$TM" bench -m "$(model_path m30)" -ngl all ${NCU_ARGS:--p 0 -n 4} -r 1 > "$OUT/ncu.csv" 2> "$OUT/logs/ncu.err"
    echo "ncu rc $? ($(wc -l < "$OUT/ncu.csv") lines)"
    python3 - "$OUT/ncu.csv" << 'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
head, rows = rows[0], rows[1:]
ix = {n: i for i, n in enumerate(head)}
agg = collections.defaultdict(lambda: [0.0, 0])
unit = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
for r in rows:
    if r[ix["Metric Name"]] != "gpu__time_duration.sum":
        continue
    us = float(r[ix["Metric Value"]].replace(",", "")) * unit[r[ix["Metric Unit"]]]
    k = (r[ix["Kernel Name"]].split("(")[0][:60], r[ix["Grid Size"]], r[ix["Block Size"]])
    agg[k][0] += us
    agg[k][1] += 1
tot = sum(a[0] for a in agg.values()) or 1
print("%d kernels, %.1f us in all" % (sum(a[1] for a in agg.values()), tot))
for k, a in sorted(agg.items(), key=lambda kv: -kv[1][0])[:30]:
    print("%5.1f%% %9.1f us  x%4d  avg %7.2f us  %s grid %s block %s" % (100 * a[0] / tot, a[0], a[1], a[0] / a[1], *k))
PY
}

# ---------------------------------------------------------------- main
if [ "${1:-}" = --prepare ]; then
    prepare
    exit
fi
if [ $# = 0 ] || [ "$1" = -h ] || [ "$1" = --help ] || [ "$1" = --list ]; then
    usage
    [ $# = 0 ] && exit 2
    exit 0
fi
run=()
for a in "$@"; do
    if [ -n "${ALIAS[$a]:-}" ]; then
        read -r -a more <<< "${ALIAS[$a]}"
        run+=("${more[@]}")
    elif [ -n "${HELP[$a]:-}" ]; then
        run+=("$a")
    else
        echo "device.sh: unknown stage '$a' (--list lists them)" >&2
        exit 2
    fi
done
mkdir -p "$OUT/logs" "$RESULTS" "$MODELS_DIR"
deps_env
COMMIT=$(commit_id)
python3 bench/record.py machine > "$OUT/machine.json" || exit 1
SLUG=$(python3 bench/record.py slug "$OUT/machine.json")
echo "device.sh: ${run[*]} | commit $COMMIT | $(python3 -c "
import json; m = json.load(open('$OUT/machine.json'))
print(m['gpu'] or 'no GPU', '|', m['cpu'], '|', m['cores'], 'cores |', m['ram_gib'], 'GiB RAM')")"
summary=()
for s in "${run[@]}"; do
    [ -n "${STAGE_RC[$s]:-}" ] && continue
    STAGE=$s
    stamp "== $s"
    case $s in build | peer | models) ;; *) [ "$s" = cpu-kernels ] || need build || { summary+=("$s: no build"); continue; } ;; esac
    n_failed=${#FAILED_CASES[@]}
    need "$s"
    if [ "${STAGE_RC[$s]}" != 0 ]; then
        summary+=("$s: FAILED (${STAGE_RC[$s]})")
    elif [ ${#FAILED_CASES[@]} != "$n_failed" ]; then
        summary+=("$s: FAILED cases ${FAILED_CASES[*]:$n_failed}")
    else
        summary+=("$s: ok")
    fi
done
stamp "done"
find "$RESULTS" -name '*.jsonl' | sort | sed 's/^/results: /'
echo "SUMMARY: $(printf '%s; ' "${summary[@]}")logs in $OUT/logs"
for s in "${summary[@]}"; do [[ $s == *FAILED* ]] && exit 1; done
exit 0
