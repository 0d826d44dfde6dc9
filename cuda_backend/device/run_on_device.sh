#!/usr/bin/env bash
# Everything cuda_backend needs a GPU for, in one call on the lent machine; logs go to $OUT.
#   run(command="bash cuda_backend/device/run_on_device.sh [tests|aoti|bench|lower]...", carry=[".whl"])
# With no argument it runs tests, aoti and bench. Wheels come from cuda_backend/device/setup.sh.
#   tests: the CUDA kernel tests, full-size cases included, and the checks of gdn-bench cuda's decode
#          columns (TESTS overrides the files, TESTS_K the -k expression, default cuda)
#   conformance: the conformance table's op-cuda rows (211: the table and its cases at 64-dim heads and the 27 attention cases;
#          81 of them refused head dims, checked without a launch; each other compiles its own kernel
#          variants on a fresh machine, so it takes a call of its own, on 6 pytest-xdist workers:
#          one at a time does not fit in 10 minutes, and 12 workers ran the GPU out of memory)
#   variants: every chunked launch shape of cuda_backend.LAUNCH_SHAPE_SWEEPS (what gdn-bench cuda
#          --chunked-sweep times) against the fp64 reference
#   cuda-layers: python -m gdn_bench.cuda_layers for each of CUDA_LAYERS (default "linear attention"): the decode
#          linear kernel against cuBLAS on a 0.8B and 4B decode step's linear shapes, and the cached-attention
#          kernels' launch shapes against PyTorch's flash attention (prefill chunks deep into an 8192 prompt, decode);
#          "gemm": the prefill chunk's matrix products, cuBLAS against AOTInductor's Triton templates
#          (CUDA_LAYERS_ARGS adds options, e.g. --shapes 4b)
#   decode-profile: Nsight Compute's kernel durations of a decode step of a program cuda-bench built
#          (PROFILE_PROGRAM, default the first build/e2e_cuda/${PROFILE_SHAPE:-0.8b}/ours_* folder; its
#          checkpoint's tokenizer), summed by kernel (cuda_backend/device/profile_decode.py)
#   prefill-profile: the same for one prefill call of PROFILE_TOKENS (default 2048) tokens, also by kernel family
#   runtime: ExecuTorch's CUDA runtime (skipped when up to date) and the C++ runner, built and waited for
#   aoti:  the tiny model's decode/prefill programs through AOTInductor, loaded and matched with eager
#   bench: gdn-bench cuda (BENCH_ARGS adds arguments, e.g. --sweep)
#   lower: export_qwen35 --backend cuda on a tiny checkpoint: the .pte + .ptd through ExecuTorch's
#          CudaBackend, as a user makes them
#   e2e:   builds ExecuTorch's CUDA runtime from the source folder (EXECUTORCH_SRC, default
#          build/executorch-src, made beforehand with `python -m cuda_backend.executorch_runtime source`:
#          the machine has no network), exports a tiny dense checkpoint with --backend cuda (fp32, and
#          with --prefill-chunk 4), runs it in that runtime (gdn-run too) and compares with
#          transformers' generate, and prompts in chunks with one prefill
#   e2e-models: the same for the MoE and Hv/Hk = 3 checkpoints (fp32) and the dense one in bf16
#   e2e-all: both in one call (the dense fp32 export alone first, the other four at once)
#   cpp-e2e: the C++ runner (no torch in the process) on the tiny models of e2e_check.CHECKPOINTS named in
#            CPP_MODELS (default dense; also moe, ratio3), exported at once with --dtype fp32
#            --prefill-chunk ${CPP_PREFILL_CHUNK:-1} (1: decode only, the fastest compile), built beside the
#            runtime; with a prefill method the prompt is fed in its chunks, in chunks of 3 and one token
#            at a time (CPP_FEEDS: a subset of whole chunk3 decode-only); each run's greedy token ids must
#            equal transformers' generate (fp32, GPU); CPP_RUNNER_ARGS adds runner options (e.g. --cuda-graph)
#   cuda-bench: gdn-bench e2e --device cuda (issue 17) on the shapes of CUDA_BENCH_SHAPES (default 0.8b; also 4b,
#            comma-separated), in CUDA_BENCH_WORKDIR (default build/e2e_cuda, git-ignored: kept between calls on a
#            warm machine, which goes back after 30 s idle, so send the next call at once). CUDA_BENCH_MODE:
#              build: ExecuTorch's CUDA runtime (from EXECUTORCH_SRC, as e2e), the C++ runner (kept when one is built), and each shape's
#                checkpoint and .pte + .ptd (--build-only; the shapes at once, each logging to build_SHAPE.log and
#                then into build.log: an export is mostly single-threaded compiles and waits on the
#                GPU's autotuning, and the machine has 16 cores), in a process of its own session: an export may outlast
#                the 10-minute call, and this one runs on; the call waits for it CUDA_BENCH_WAIT_S seconds (default:
#                until 560 s into the call), and a later build call waits for the same build again
#              time: times what was built (--time-only; refused while a build runs, so the timings have the GPU
#                alone): $OUT/cuda_e2e.md, cuda_e2e.png (where matplotlib is), results.json, cuda_bench.log
#              build-time (default): build, then time in the same call if the build is done with at least
#                CUDA_BENCH_TIME_S (default 300) seconds of the call left
#            CUDA_BENCH_ARGS adds gdn-bench e2e options to both (the same in each call: the program's folder is
#            named after --prompts, --decode-steps and --prefill-chunk)
#   cpu-bench: gdn-bench e2e on this machine's CPU (issue 20's floors with AVX-512), 2 cores: our programs in the
#            C++ runner against llama.cpp, both built here (CPU_BENCH_MODE build, then time or profile; see the
#            step below).
#            Carry .gdn-carry too (the llama.cpp source tarball): carry=[".whl", ".gdn-carry"]
# WHEELS names the wheel folder (default .whl).
set -uo pipefail
OUT=${OUT:-build/cuda_device}
mkdir -p "$OUT"
# Installed once per machine and set of wheels: cuda-bench's build outlives its call and imports from
# /tmp/site as it goes, so reinstalling under it would swap its files mid-run.
wheels_id=$(ls -l "${WHEELS:-.whl}"/*.whl 2>/dev/null | awk '{print $5, $NF}' | md5sum | cut -c1-32)
if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels_id" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${WHEELS:-.whl}"/*.whl || exit 1
  mkdir -p /tmp/site && echo "$wheels_id" > /tmp/site/.wheels
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
# ExecuTorch's CUDA runtime (log $OUT/$1.log), then the C++ runner in the background: $builder to wait for.
build_runtime_and_runner() {
  python3 -m cuda_backend.executorch_runtime build ${EXECUTORCH_SRC:+--executorch-src "$EXECUTORCH_SRC"} \
      > "$OUT/$1.log" 2>&1 || { tail -5 "$OUT/$1.log"; return 1; }
  python3 -m examples.cpp_runner.build > "$OUT/cpp_runner_build.log" 2>&1 &
  builder=$!
}
# Exports run side by side (cpp-e2e's models, cuda-bench's shapes) each get Inductor and Triton cache folders
# of their own: sharing one, two of three tiny-model exports once failed to link, a Triton kernel's object
# file listed twice ("multiple definition of __decode_linear_kernel_8_start"); each exported alone.
# A build that outlives its call (cuda-bench's, cpu-bench's): a session of its own, so it is not killed when the call
# returns, recorded in its folder: build.pid while it runs, then build.status (its exit status); output in build.log.
building() { [ -f "$1/build.pid" ] && kill -0 "$(cat "$1/build.pid")" 2>/dev/null; }
start_build() {  # DIR SCRIPT [ARGS...]: bash -c SCRIPT, given DIR and ARGS as $1, $2...
  local dir=$1 script=$2
  shift 2
  rm -f "$dir/build.status"
  # The pid file goes last: a pid reused later must not look like this build.
  setsid bash -c 'echo $$ > "$1/build.pid"
    ( '"$script"'
    ) > "$1/build.log" 2>&1
    echo $? > "$1/build.status"; rm -f "$1/build.pid"' bash "$dir" "$@" < /dev/null &
}
await_build() {  # DIR UNTIL: waits until $SECONDS reaches UNTIL; 0: built, 1: it failed or was killed, 2: still running
  while [ ! -f "$1/build.status" ] && [ "$SECONDS" -lt "$2" ]; do
    sleep 5
    # Gone without a status (5 s is long enough for a started build to record its pid): killed.
    if ! building "$1" && [ ! -f "$1/build.status" ]; then rm -f "$1/build.pid"; return 1; fi
  done
  [ -f "$1/build.status" ] || return 2
  [ "$(cat "$1/build.status")" = 0 ]
}
status=0
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests aoti bench)
for step in "${steps[@]}"; do
  case "$step" in
    runtime)
      # ExecuTorch's CUDA runtime and the C++ runner, waited for: run first in a call that then starts a
      # cuda-bench build (CUDA_BENCH_WAIT_S=1) and runs cpp-e2e beside it, so the two never compile the same folder.
      build_runtime_and_runner runtime_build && wait $builder || { status=1; tail -20 "$OUT/cpp_runner_build.log"; } ;;
    tests|conformance)
      # -v: a call cut off at its time limit still shows which cases ran.
      [ "$step" = tests ] && selection=${TESTS:-tests/test_cuda_kernels.py tests/test_bench_cuda.py} || selection=tests/conformance
      workers=()
      [ "$step" = conformance ] && python3 -c "import xdist" 2>/dev/null && workers=(-n 6)
      python3 -m pytest -v -x -p no:cacheprovider --durations=10 "${workers[@]}" $selection -k "${TESTS_K:-cuda}" \
          > "$OUT/$step.log" 2>&1 || status=1
      tail -15 "$OUT/$step.log" ;;
    variants)
      python3 -m cuda_backend.device.chunked_variants > "$OUT/variants.log" 2>&1 || status=1
      grep -v "Warning\|^ *from \|^ *\"\"\"" "$OUT/variants.log" | tail -60 ;;
    cuda-layers)
      for bench in ${CUDA_LAYERS:-linear attention}; do
        python3 -m gdn_bench.cuda_layers "$bench" ${CUDA_LAYERS_ARGS:-} 2>&1 | tee "$OUT/cuda_layers_$bench.log" || status=1
      done ;;
    decode-profile|prefill-profile)
      program=${PROFILE_PROGRAM:-$(ls -d build/e2e_cuda/${PROFILE_SHAPE:-0.8b}/ours_* 2>/dev/null | head -1)}
      [ -d "$program" ] || { echo "$step: no program folder ($program); run cuda-bench first"; status=1; continue; }
      prefill=()
      [ "$step" = prefill-profile ] && prefill=(--prefill-tokens "${PROFILE_TOKENS:-2048}")
      python3 -m cuda_backend.device.profile_decode --program "$program" "${prefill[@]}" \
          --tokenizer "$(dirname "$program")/checkpoint/tokenizer.json" --out "$OUT/${step}.csv" 2>&1 \
          | tee "$OUT/${step}.log" || status=1 ;;
    aoti)
      python3 -X faulthandler -m cuda_backend.device.aoti_check "$OUT" > "$OUT/aoti.log" 2>&1 || status=1
      grep -v "^W1\|Warning\|triton_\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel" "$OUT/aoti.log" | tail -30 ;;
    lower)
      python3 -c "import sys; from gdn_export.tiny import make_tiny_checkpoint as make
make(sys.argv[1], key_head_dim=64, value_head_dim=64)" "$OUT/tiny" > "$OUT/lower.log" 2>&1 \
        && python3 -X faulthandler -c "import sys; from gdn_export.cli import export_main; sys.exit(export_main())" \
             --checkpoint "$OUT/tiny" --output "$OUT/tiny_qwen35_cuda.pte" --backend cuda --max-seq-len 128 \
             >> "$OUT/lower.log" 2>&1 || status=1
      rm -rf "$OUT/tiny"
      grep -v "^W1\|Warning\|triton_\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel" "$OUT/lower.log" | tail -12
      ls -l "$OUT"/*.pte "$OUT"/*.ptd 2>/dev/null ;;
    e2e|e2e-models|e2e-all)
      started=$SECONDS
      echo "c++: $(command -v "${CXX:-g++}") $("${CXX:-g++}" --version | head -1); nvcc: $(command -v nvcc)"
      python3 -m cuda_backend.executorch_runtime build ${EXECUTORCH_SRC:+--executorch-src "$EXECUTORCH_SRC"} \
          2>&1 | tee "$OUT/e2e_build.log" || { status=1; continue; }
      echo "runtime built in $((SECONDS - started)) s"
      python3 -X faulthandler -m cuda_backend.device.e2e_check "$OUT" --set "$(case $step in e2e) echo core;; e2e-models) echo models;; *) echo all;; esac)" \
          --deadline-s "${E2E_DEADLINE_S:-$((550 - SECONDS))}" || status=1 ;;
    cpp-e2e)
      started=$SECONDS
      build_runtime_and_runner cpp_e2e_build || { status=1; continue; }
      # The checkpoints of e2e_check.CHECKPOINTS named in CPP_MODELS, exported at once (fp32).
      exporters=()
      for model in ${CPP_MODELS:-dense}; do
        mkdir -p /tmp/cuda_$model
        python3 -c "import sys; from gdn_export.tiny import make_tiny_checkpoint as make
from cuda_backend.device.e2e_check import CHECKPOINTS
make(sys.argv[1], **CHECKPOINTS[sys.argv[2]])" /tmp/tiny_$model $model > "$OUT/cpp_e2e_$model.log" 2>&1
        TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$model TRITON_CACHE_DIR=/tmp/triton_$model \
          python3 -X faulthandler -c "import sys; from gdn_export.cli import export_main; sys.exit(export_main())" \
            --checkpoint /tmp/tiny_$model --output /tmp/cuda_$model/model.pte --backend cuda --dtype fp32 \
            --max-seq-len 128 --prefill-chunk "${CPP_PREFILL_CHUNK:-1}" >> "$OUT/cpp_e2e_$model.log" 2>&1 &
        exporters+=($!)
      done
      for pid in "${exporters[@]}"; do wait $pid || status=1; done
      echo "runtime + exports in $((SECONDS - started)) s"
      wait $builder || { status=1; tail -20 "$OUT/cpp_runner_build.log"; }
      for model in ${CPP_MODELS:-dense}; do
        [ -f /tmp/cuda_$model/model.pte ] || { echo "FAIL cpp-e2e $model: no program"; tail -5 "$OUT/cpp_e2e_$model.log"; continue; }
        # The prompt in the program's largest chunks, in chunks of 3 (a length the prefill was not traced at),
        # and one token per call (decode only).
        for feed in ${CPP_FEEDS:-whole chunk3 decode-only}; do
          extra=(); [ $feed = chunk3 ] && extra=(--prefill-chunk 3); [ $feed = decode-only ] && extra=(--prefill-chunk 1)
          build/cpp_runner/gdn_cpp_runner --model /tmp/cuda_$model/model.pte --data /tmp/cuda_$model/aoti_cuda_blob.ptd \
              --backend-lib build/cuda_runtime/libgdn_executorch_cuda.so --tokenizer /tmp/tiny_$model/tokenizer.json \
              --prompt "Once upon a time there was a little model that" --max-new-tokens 32 --temperature 0 \
              --print-token-ids --verbose "${extra[@]}" ${CPP_RUNNER_ARGS:-} > "$OUT/cpp_run_${model}_$feed.out" \
              2> "$OUT/cpp_run_${model}_$feed.err" || status=1
          echo "$model, prompt fed $feed:"; grep "tok/s" "$OUT/cpp_run_${model}_$feed.err"
          python3 -m cuda_backend.device.e2e_check --compare-cpp /tmp/tiny_$model "$OUT/cpp_run_${model}_$feed.err" \
              2>> "$OUT/cpp_e2e_$model.log" || status=1
          [ "${CPP_PREFILL_CHUNK:-1}" = 1 ] && break  # a decode-only program: every feed is the same
        done
      done
      echo "cpp-e2e in $((SECONDS - started)) s" ;;
    prefill-probe)
      # Which part of the prefill method goes wrong (cuda_backend/device/prefill_probe.py): the two-method
      # program with its prefill static at T = 4, with the chunked kernels and with plain tensor ops.
      started=$SECONDS
      build_runtime_and_runner probe_build || { status=1; continue; }
      python3 -c "import sys; from gdn_export.tiny import make_tiny_checkpoint as make
make(sys.argv[1], key_head_dim=64, value_head_dim=64, seed=0)" /tmp/tiny_dense > /dev/null 2>&1
      mkdir -p /tmp/probe
      timeout 460 python3 -m cuda_backend.device.prefill_probe /tmp/tiny_dense /tmp/probe --chunk 4 || status=1
      for log in /tmp/probe/*.log; do tail -2 "$log"; cp "$log" "$OUT/"; done
      echo "runtime + exports in $((SECONDS - started)) s"
      wait $builder || { status=1; tail -20 "$OUT/cpp_runner_build.log"; }
      for variant in static-chunked static-reference; do
        [ -f /tmp/probe/$variant/model.pte ] || continue
        build/cpp_runner/gdn_cpp_runner --model /tmp/probe/$variant/model.pte --data /tmp/probe/$variant/aoti_cuda_blob.ptd \
            --backend-lib build/cuda_runtime/libgdn_executorch_cuda.so --tokenizer /tmp/tiny_dense/tokenizer.json \
            --prompt "Once upon a time there was a little model that" --max-new-tokens 8 --temperature 0 \
            --prefill-chunk 4 --print-token-ids --verbose > /dev/null 2> "$OUT/probe_$variant.err" || status=1
        echo "prefill $variant:"
        python3 -m cuda_backend.device.e2e_check --compare-cpp /tmp/tiny_dense "$OUT/probe_$variant.err" \
            2>> "$OUT/probe_compare.log" || status=1
      done
      echo "prefill-probe in $((SECONDS - started)) s" ;;
    cuda-bench)
      bench_dir=${CUDA_BENCH_WORKDIR:-build/e2e_cuda}
      shapes=${CUDA_BENCH_SHAPES:-0.8b}
      mode=${CUDA_BENCH_MODE:-build-time}
      case "$mode" in
        build|time|build-time) ;;
        *) echo "cuda-bench: CUDA_BENCH_MODE must be build, time or build-time, got $mode"; status=1; continue ;;
      esac
      mkdir -p "$bench_dir"
      if [ "$mode" != time ]; then
        if building "$bench_dir"; then
          echo "cuda-bench: joining the build in progress (pid $(cat "$bench_dir/build.pid"))"
        else
          start_build "$bench_dir" '
            build_shapes() {
              local pids=() shape rc=0
              for shape in ${2//,/ }; do
                TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$shape TRITON_CACHE_DIR=/tmp/triton_$shape \
                  python3 -m gdn_bench.cli e2e --device cuda --workdir "$1" --shapes "$shape" --build-only $3 \
                    > "$1/build_$shape.log" 2>&1 &
                pids+=($!)
              done
              for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
              for shape in ${2//,/ }; do echo "== $shape"; cat "$1/build_$shape.log"; done
              return $rc
            }
            python3 -m cuda_backend.executorch_runtime build ${EXECUTORCH_SRC:+--executorch-src "$EXECUTORCH_SRC"} \
              && { [ -x build/cpp_runner/gdn_cpp_runner ] || python3 -m examples.cpp_runner.build; } \
              && build_shapes "$1" "$2" "$3"' "$shapes" "${CUDA_BENCH_ARGS:-}"
          echo "cuda-bench: building $shapes (log $bench_dir/build.log)"
        fi
        await_build "$bench_dir" $((SECONDS + ${CUDA_BENCH_WAIT_S:-$((560 - SECONDS))}))
        built=$?
        grep -v "^W1\|Warning\|triton_\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel" "$bench_dir/build.log" | tail -25
        if [ ! -f "$bench_dir/build.status" ]; then  # the shapes' own logs while they build
          for shape in ${shapes//,/ }; do
            echo "-- $shape so far:"; grep -v "^W1\|Warning\|triton_\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel" \
                "$bench_dir/build_$shape.log" 2>/dev/null | tail -4
          done
        fi
        cp "$bench_dir/build.log" "$OUT/cuda_bench_build.log"
        for shape in ${shapes//,/ }; do
          cp "$bench_dir/$shape/builds.json" "$OUT/builds_$shape.json" 2>/dev/null
          # A failed build's logs (the export's tells which method failed), the last 200 kB of each: only then,
          # since a call brings back 8 files at most and the timing's results come first.
          [ -f "$bench_dir/build.status" ] && [ "$(cat "$bench_dir/build.status")" != 0 ] || continue
          for log in "$bench_dir/$shape"/*.log "$bench_dir/$shape"/*/*.log; do
            [ -f "$log" ] && tail -c 200000 "$log" > "$OUT/${shape}_$(basename "$(dirname "$log")")_$(basename "$log")"
          done
        done
        if [ $built = 2 ]; then
          echo "cuda-bench: still building $SECONDS s into this call; call cuda-bench again at once to wait on"
          continue
        elif [ ! -f "$bench_dir/build.status" ]; then
          echo "cuda-bench: the build was killed before it finished (its log is above)"; status=1; continue
        fi
        echo "cuda-bench: the build exited with $(cat "$bench_dir/build.status"), $SECONDS s into this call"
        [ $built = 0 ] || { status=1; continue; }
        if [ "$mode" = build ]; then continue; fi
        if [ $((590 - SECONDS)) -lt "${CUDA_BENCH_TIME_S:-300}" ]; then
          echo "cuda-bench: built, too little of this call left to time; call CUDA_BENCH_MODE=time at once"
          continue
        fi
      fi
      if building "$bench_dir"; then
        echo "cuda-bench: a build is still running (pid $(cat "$bench_dir/build.pid"));" \
             "CUDA_BENCH_MODE=build waits for it"
        status=1; continue
      fi
      plot=(); python3 -c "import matplotlib" 2>/dev/null && plot=(--plot "$OUT/cuda_e2e.png")
      # Stopped before the call's limit, so the files below still come back; results.json grows system by system.
      timeout --signal=INT $((590 - SECONDS)) python3 -m gdn_bench.cli e2e --device cuda --workdir "$bench_dir" \
          --shapes "$shapes" --time-only --markdown "$OUT/cuda_e2e.md" "${plot[@]}" ${CUDA_BENCH_ARGS:-} 2>&1 \
          | grep -v "^W1\|Warning" | tee "$OUT/cuda_bench.log" || status=1
      cp "$bench_dir/results.json" "$OUT/" 2>/dev/null ;;
    cpu-bench)
      # Issue 20's CPU floors on an AVX-512 machine: this machine's CPU, with our programs and llama.cpp held to the
      # cores of CPU_BENCH_CPUS (default 0,1) and 2 threads, as on the 2-core hosts the floors were set on. Our
      # programs run in the C++ runner (gdn-bench e2e --runner): the wheel's Python runtime, built for torch 2.13,
      # fails beside this machine's torch 2.11. llama.cpp is built here natively from the source tarball
      # LLAMA_CPP_SRC (default .gdn-carry/llama.cpp-src.tar.xz, carried; gdn_bench/README.md says how to make it),
      # and so are runtime_ops and the runner, in CPU_BENCH_WORKDIR (default build/e2e_cpu). CPU_BENCH_MODE:
      #   build (default): llama.cpp, runtime_ops and the runner, then gdn-bench e2e --build-only (checkpoint,
      #     programs, GGUFs) on every core, in a build that outlives the call (start_build), waited for until 560 s
      #     into the call; a later build call waits for the same build again
      #   time: gdn-bench e2e on what was built: $OUT/cpu_e2e.md, cpu_bench.log, results.json
      #   profile: where a prompt's time goes in each program built, by operator and delegate: the runner's
      #     --etdump of 3 runs of each of PROFILE_TOKENS (default "512 2048") random tokens, on the same 2 cores,
      #     and gdn-bench profile over the calls after the first run: $OUT/profile_<program>_<tokens>.md (and .etdp)
      # CPU_BENCH_ONLY names our programs (default ours,ours_8da4w,ours_8da4w_avx2,ours_16da8w); CPU_BENCH_ARGS
      # replaces the timing's options (default: prompts of 128, 512 and 2048 tokens, decode also alternated in 6
      # rounds, llama-bench's tests repeated twice: all four programs in one call).
      bench_dir=${CPU_BENCH_WORKDIR:-build/e2e_cpu}
      only=${CPU_BENCH_ONLY:-ours,ours_8da4w,ours_8da4w_avx2,ours_16da8w}
      mkdir -p "$bench_dir"
      lscpu > "$OUT/lscpu.txt"
      grep -o "avx512[a-z_]*" "$OUT/lscpu.txt" | sort -u | tr "\n" " "; grep "^Model name" "$OUT/lscpu.txt"
      case "${CPU_BENCH_MODE:-build}" in
        build)
          if building "$bench_dir"; then
            echo "cpu-bench: joining the build in progress (pid $(cat "$bench_dir/build.pid"))"
          else
            start_build "$bench_dir" '
              if [ ! -x build/llama.cpp/build/bin/llama-bench ]; then
                rm -rf build/llama.cpp && mkdir -p build/llama.cpp && tar xJf "$2" -C build/llama.cpp \
                  && cmake -S build/llama.cpp -B build/llama.cpp/build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release \
                       -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
                  && cmake --build build/llama.cpp/build -j --target llama-bench llama-quantize llama-perplexity &
                llama=$!
              fi
              python3 -m runtime_ops.build && python3 -m examples.cpp_runner.build && { [ -z "$llama" ] || wait $llama; } \
                && python3 -m gdn_bench.cli e2e --workdir "$1" --only "$3" --llama-cpp build/llama.cpp --build-only' \
              "${LLAMA_CPP_SRC:-.gdn-carry/llama.cpp-src.tar.xz}" "$only"
            echo "cpu-bench: building (log $bench_dir/build.log)"
          fi
          await_build "$bench_dir" 560
          built=$?
          grep -v "^W1\|Warning\|^ *warnings.warn\|^ *return cls" "$bench_dir/build.log" | tail -25
          cp "$bench_dir/build.log" "$OUT/cpu_bench_build.log"
          case $built in
            0) echo "cpu-bench: built, $SECONDS s into this call; CPU_BENCH_MODE=time times it" ;;
            2) echo "cpu-bench: still building $SECONDS s into this call; call cpu-bench again at once to wait on" ;;
            *) echo "cpu-bench: the build failed or was killed"; status=1 ;;
          esac ;;
        time)
          if building "$bench_dir" || [ "$(cat "$bench_dir/build.status" 2>/dev/null)" != 0 ]; then
            echo "cpu-bench: nothing built to time (or a build still runs); CPU_BENCH_MODE=build first"; status=1; continue
          fi
          options=(--prompts 128,512,2048 --interleave "" --llama-repetitions 2 --llama-rounds 6)
          [ -n "${CPU_BENCH_ARGS:-}" ] && read -r -a options <<< "$CPU_BENCH_ARGS"
          # Stopped before the call's limit, so the files below still come back.
          timeout --signal=INT $((590 - SECONDS)) taskset -c "${CPU_BENCH_CPUS:-0,1}" python3 -m gdn_bench.cli e2e \
              --workdir "$bench_dir" --only "$only" --llama-cpp build/llama.cpp --threads 2 \
              --runner build/cpp_runner/gdn_cpp_runner \
              --markdown "$OUT/cpu_e2e.md" "${options[@]}" 2>&1 | grep -v "^W1\|Warning" | tee "$OUT/cpu_bench.log" \
              || status=1
          cp "$bench_dir/results.json" "$OUT/" 2>/dev/null ;;
        profile)
          if building "$bench_dir" || [ "$(cat "$bench_dir/build.status" 2>/dev/null)" != 0 ]; then
            echo "cpu-bench: nothing built to profile (or a build still runs); CPU_BENCH_MODE=build first"; status=1; continue
          fi
          for system in ${only//,/ }; do
            [ "$system" = ours ] && program=$bench_dir/ours_fp32.pte || program=$bench_dir/$system.pte
            for tokens in ${PROFILE_TOKENS:-512 2048}; do
              # One token generated: each run is the prompt's prefill calls alone, ceil(tokens / 512) of them (the
              # bench's programs take 512 tokens a call), and the first run's are left out as warm-up.
              taskset -c "${CPU_BENCH_CPUS:-0,1}" build/cpp_runner/gdn_cpp_runner --model "$program" \
                  --tokenizer "$bench_dir/checkpoint/tokenizer.json" --random-prompt-tokens "$tokens" --seed 1 \
                  --max-new-tokens 1 --ignore-eos --runs 3 --threads 2 --etdump "$OUT/profile_${system}_$tokens.etdp" \
                  > /dev/null 2> "$OUT/profile_${system}_$tokens.log" || { tail -5 "$OUT/profile_${system}_$tokens.log"; status=1; continue; }
              echo "== $system, $tokens tokens: $(grep "prefill:" "$OUT/profile_${system}_$tokens.log" | tail -1)"
              python3 -m gdn_bench.cli profile "$OUT/profile_${system}_$tokens.etdp" "$program" \
                  --skip $(((tokens + 511) / 512)) --top 12 2>> "$OUT/profile_${system}_$tokens.log" \
                  | tee "$OUT/profile_${system}_$tokens.md" || status=1
            done
          done ;;
        *) echo "cpu-bench: CPU_BENCH_MODE must be build, time or profile, got ${CPU_BENCH_MODE}"; status=1 ;;
      esac ;;
    bench)
      python3 -m gdn_bench.cli cuda --json "$OUT/bench.json" --markdown "$OUT/bench.md" \
          --plot "$OUT/cuda_bench.png" ${BENCH_ARGS:-} 2>"$OUT/bench.err" | tee "$OUT/bench.log" || status=1 ;;
  esac
done
exit $status
