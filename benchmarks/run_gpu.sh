#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks, each under its own time limit; logs and
# JSON land in $OUT (or ./results). Usage: benchmarks/run_gpu.sh [tests] [throughput] [sampling] ...
set -u
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOOLKIT_CACHE=/tmp/toolkit-cache
[ -d .cache/tokenizers ] && export TOOLKIT_TOKENIZER_CACHE=$PWD/.cache/tokenizers
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
for step in "$@"; do
  case $step in
    tests)      timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider ${TEST_PATHS:-tests} 2>&1 | tail -40 ;;
    # nano-vllm's protocol with HF on all 256 requests (about 4 min of HF): HF_NUM=256 THR_ARGS="--temperature 0.6" THR_TIMEOUT=560
    throughput) timeout ${THR_TIMEOUT:-420} python3 benchmarks/throughput.py --workload random --num 256 --hf-num ${HF_NUM:-64} ${THR_ARGS:-} --out $OUT/throughput_random.json 2>&1 | grep -v Warning | tail -30 ;;
    # repetition penalty on every request: penalised rows on the device vs rebuilt per step, same process
    penalties)  timeout ${PEN_TIMEOUT:-300} python3 benchmarks/throughput.py --workload random --num 256 --hf-num 0 --repetition-penalty 1.1 --penalty-ab --repeats ${PEN_REPEATS:-3} ${PEN_ARGS:-} --out $OUT/throughput_penalties.json 2>&1 | grep -v Warning | tail -20 ;;
    # #21: the TMA prefill path end to end on ShareGPT, A B A in separate processes (carry
    # benchmarks/data): the default, then paged-prefill (the path off), then the default again
    sharegpt_ab) i=0; for v in triton paged-prefill triton; do i=$((i + 1))
                   timeout ${SGAB_TIMEOUT:-110} python3 benchmarks/throughput.py --workload sharegpt --num 1000 --hf-num 0 --kv-fraction 0.5 --attention $v --out $OUT/throughput_sharegpt_ab$i-$v.json 2>&1 | grep -v Warning | grep "toolkit\|workload" | tail -3
                 done ;;
    sharegpt)   timeout ${SG_TIMEOUT:-420} python3 benchmarks/throughput.py --workload sharegpt --num 1000 --hf-num ${HF_NUM:-100} --kv-fraction 0.5 ${SG_ARGS:-} --out $OUT/throughput_sharegpt.json 2>&1 | grep -v Warning | tail -20 ;;
    engine_core) timeout ${EC_TIMEOUT:-300} python3 -m benchmarks.engine_core ${EC_ARGS:-} --out $OUT/engine_core${EC_TAG:-}.json 2>&1 | grep -v Warning | tee $OUT/engine_core${EC_TAG:-}.log | grep "^\[" | tail -12 ;;
    sampling)   timeout 180 python3 benchmarks/sampling.py ${SAMPLING_ARGS:-} --out $OUT/sampling.json 2>&1 | tail -20 ;;
    speculative) timeout ${SPEC_TIMEOUT:-300} python3 benchmarks/speculative.py ${SPEC_ARGS:-} --out $OUT/speculative.json 2>&1 | tail -35 ;;
    structured) timeout 300 python3 benchmarks/structured.py ${STRUCT_ARGS:-} --out $OUT/structured.json 2>&1 | tee $OUT/structured.log | tail -40 ;;
    profile)    timeout ${PROFILE_TIMEOUT:-200} python3 -m benchmarks.profile_step --batch ${BATCH:-256} ${PROFILE_ARGS:-} 2>&1 | tail -70 ;;
    # steps past the decode batch: eager vs captured (EngineConfig.max_cudagraph_capture_size, #16)
    capture_size) timeout ${CS_TIMEOUT:-300} python3 benchmarks/capture_size.py ${CS_ARGS:-} --out $OUT/capture_size.json 2>&1 | grep -v Warning | tail -20 ;;
    # the attention input's fused small ops (qk_norm_rotary, rotary of q and k in one launch) vs the previous kernels
    fused_ops)  timeout ${FO_TIMEOUT:-120} python3 benchmarks/fused_ops.py ${FO_ARGS:-} --out $OUT/fused_ops.json 2>&1 | tail -18 ;;
    attention)  timeout ${ATT_TIMEOUT:-300} python3 benchmarks/attention.py ${ATT_ARGS:-} --out $OUT/attention${ATT_TAG:-}.json 2>&1 | tail -40 ;;
    # tensor parallelism (needs nvidia-h200-x2; carry benchmarks/data for ShareGPT): TP=1 then TP=2
    tensor_parallel) timeout ${TP_TIMEOUT:-570} python3 benchmarks/tensor_parallel.py ${TP_ARGS:-} --out $OUT/tensor_parallel${TP_TAG:-}.json 2>&1 | grep -v Warning | tee $OUT/tensor_parallel${TP_TAG:-}.log | tail -30 ;;
    prefix_cache) timeout ${PC_TIMEOUT:-300} python3 benchmarks/prefix_cache.py ${PC_ARGS:-} --out $OUT/prefix_cache.json 2>&1 | grep -v Warning | tail -20 ;;
    # the host (CPU) tier under a device pool too small for the working set (#19)
    cpu_tier) timeout ${CT_TIMEOUT:-570} python3 benchmarks/prefix_cache.py --num ${CT_NUM:-300} --num-blocks ${CT_BLOCKS:-1536} --cpu-cache-gb 16 --allocators ${CT_ALLOCATORS:-hash_chain,hash_chain+cpu,radix+cpu} --out $OUT/prefix_cache_cpu_tier.json 2>&1 | grep -v Warning | tail -20 ;;
    # swap vs recompute preemption, one trace a call (SWAP_TRACE=long | short) (#19)
    swap) timeout ${SWAP_TIMEOUT:-570} python3 benchmarks/swap_vs_recompute.py --traces ${SWAP_TRACE:-long} ${SWAP_ARGS:-} --out $OUT/swap_vs_recompute_${SWAP_TRACE:-long}.json 2>&1 | grep -v Warning | tail -20 ;;
    # FP8 KV cache (#19), in two calls of ~5 min (carry benchmarks/data for ShareGPT):
    # FP8_PARTS="capacity sharegpt" FP8_TAG=_capacity, then FP8_PARTS="divergence decode" FP8_TAG=_divergence
    fp8_kv) timeout ${FP8_TIMEOUT:-570} python3 -m benchmarks.fp8_kv --mode gpu --parts ${FP8_PARTS:-capacity sharegpt divergence decode} ${FP8_ARGS:-} --out $OUT/fp8_kv_gpu${FP8_TAG:-}.json 2>&1 | grep -v Warning | tee $OUT/fp8_kv_gpu${FP8_TAG:-}.log | tail -30 ;;
    # the simulator's cost model: fit on both shapes, the updated JSON copied back to $OUT
    sim_calibrate) timeout ${CAL_TIMEOUT:-470} python3 benchmarks/sim_calibrate.py ${CAL_ARGS:---shapes qwen3,llama8b} --out $OUT/sim_calibrate.json 2>&1 | grep -v Warning | tail -50
                   cp toolkit/simulator/data/cost_models.json $OUT/ ;;
    # calibrate both shapes, find saturation, simulator vs engine for fcfs/sjf/vtc at 0.5x and 1.5x
    # (needs benchmarks/data carried); fitted models copied back to $OUT
    sim_gpu_all) timeout ${SIMALL_TIMEOUT:-580} python3 benchmarks/sim_gpu_all.py ${SIMALL_ARGS:-} --out $OUT/sim_gpu_all.json 2>&1 | grep -v Warning | tee $OUT/sim_gpu_all.log | tail -80
                 cp toolkit/simulator/data/cost_models.json $OUT/ ;;
    # #18 probe: each policy's engine steps, stream time against kernel time (the GPU waiting on the host)
    step_gaps) timeout ${SGAP_TIMEOUT:-300} python3 benchmarks/step_gaps.py ${SGAP_ARGS:---shape llama8b --rate 34 --policies vtc,fcfs} --out $OUT/step_gaps.json 2>&1 | grep -v Warning | tail -30 ;;
    # #18 probe: eager and decode steps' GPU time beside nvidia-smi's SM clock and the kernels' busy time
    step_clocks) timeout ${SC_TIMEOUT:-210} python3 benchmarks/step_clocks.py ${SC_ARGS:---shape llama8b --phases eager:35,decode:12,eager:20} --out $OUT/step_clocks.json 2>&1 | grep -v Warning | tee $OUT/step_clocks.log | tail -70 ;;
    # #18 / #21 probe: an eager step's host time (no sync), GPU time and a cProfile of its forward
    eager_host) timeout ${EH_TIMEOUT:-240} python3 -m benchmarks.eager_host ${EH_ARGS:---shape qwen3 --prompt 2048} --out $OUT/eager_host.json 2>&1 | grep -v Warning | tail -90 ;;
    # #21 probe: host cost of a graph replay (by node count, idle / in flight), a Triton launch, a torch op, an upload
    launch_costs) timeout ${LC_TIMEOUT:-200} python3 -m benchmarks.launch_costs ${LC_ARGS:-} --out $OUT/launch_costs.json 2>&1 | grep -v Warning | tail -30 ;;
    # #21 probe: a steady decode step's host pieces timed without a profiler, per batch size
    host_parts) timeout ${HP_TIMEOUT:-240} python3 -m benchmarks.host_parts ${HP_ARGS:---shape qwen3 --batches 1,16,64,256} --out $OUT/host_parts.json 2>&1 | grep -v Warning | tail -70 ;;
    # #44 at the Qwen3-30B-A3B shape: the MoE layer's kernels and the decode step (MOE_PARTS=kernel,decode),
    # then ShareGPT against HF in a second call (MOE_PARTS=sharegpt MOE_TAG=_sharegpt; carry benchmarks/data)
    moe) OUT=$OUT timeout ${MOE_TIMEOUT:-570} python3 -m benchmarks moe --parts ${MOE_PARTS:-kernel,decode} ${MOE_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/moe${MOE_TAG:-}.log | tail -40 ;;
    # #21 / #18 probe: the sweep's eager mixed steps with the TMA prefill path and without it, one process
    mixed_steps) timeout ${MS_TIMEOUT:-300} python3 benchmarks/mixed_steps.py ${MS_ARGS:---shape llama8b --profile} --out $OUT/mixed_steps.json 2>&1 | grep -v Warning | tail -30 ;;
    # simulator vs engine (needs the H200 cost models in toolkit/simulator/data and benchmarks/data carried)
    sim_validate) timeout ${VAL_TIMEOUT:-470} python3 benchmarks/sim_validate.py --num ${VAL_NUM:-300} ${VAL_ARGS:-} --out $OUT/sim_validate.json --plot $OUT/sim_validate_ttft.png 2>&1 | grep -v Warning | tail -60 ;;
  esac
  echo "== $step done (rc ${PIPESTATUS[0]})"
done
