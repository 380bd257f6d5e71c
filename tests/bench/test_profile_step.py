"""``bench profile``: the trace summary on a hand-written GPU-like Chrome trace, and one
real profiled step of the tiny model on CPU (the XLA CPU op fallback)."""

from __future__ import annotations

import json

import pytest

from bench import profile_step


@pytest.mark.parametrize("name,category", [
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn>", "gemm"),
    ("gemm_fusion_dot_12", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0", "attention"),
    ("bert_flash_dkdv", "attention"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "collective"),
    ("all-gather-start", "collective"),
    ("cu_threefry2x32_kernel", "rng"),
    ("input_reduce_fusion_2", "reduce/norm"),
    ("loop_multiply_fusion_7", "other fusion"),
    ("MemcpyD2D", "memcpy/memset"),
    ("Memset", "memcpy/memset"),
    ("some_custom_kernel", "other"),
])
def test_categorize(name, category):
    assert profile_step.categorize(name) == category


def _meta(pid, name, tid=None):
    event = {"ph": "M", "pid": pid, "name": "process_name" if tid is None else "thread_name",
             "args": {"name": name}}
    return event if tid is None else dict(event, tid=tid)


def _x(pid, tid, name, ts, dur, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


# One step's kernels on /device:GPU:0: (thread, name, start us, duration us). The NCCL kernel
# on its own stream runs inside the flash kernel, so it adds kernel time but no busy time.
STEP = [(13, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", 0, 100),
        (13, "bert_flash_forward", 110, 50),
        (15, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 120, 30),
        (13, "loop_add_fusion_3", 170, 10),
        (13, "input_reduce_fusion_1", 190, 20),
        (13, "cu_threefry2x32_kernel", 220, 5),
        (13, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", 230, 60),
        (14, "MemcpyD2D", 300, 4),
        (13, "some_custom_kernel", 310, 1)]


def _gpu_trace(steps=2, step_us=1000):
    events = [_meta(1, "/host:CPU"), _meta(1, "python", 7),
              _meta(1001, "/device:GPU:0"), _meta(1001, "Stream #13(Kernel)", 13),
              _meta(1001, "Stream #14(MemcpyD2D)", 14), _meta(1001, "Stream #15(Kernel)", 15),
              _meta(1001, "CUPTI overhead", 99)]
    for step in range(steps):
        base = step * step_us
        events += [_x(1001, tid, name, base + ts, dur, hlo_op="fusion")
                   for tid, name, ts, dur in STEP]
        # Ignored: host-side op events (a GPU is present) and CUPTI's own overhead line.
        events += [_x(1, 7, "loop_add_fusion_3", base, 500, hlo_op="fusion.3"),
                   _x(1001, 99, "CUPTI overhead", base + 400, 300)]
    return {"displayTimeUnit": "ns", "traceEvents": events}


def test_summary_of_gpu_trace():
    s = profile_step.summarize_trace(_gpu_trace(steps=2), steps=2, wall_s_per_step=0.5e-3)
    assert s["source"] == "gpu" and s["devices"] == ["/device:GPU:0"] and not s["warnings"]
    assert s["kernels_per_step"] == len(STEP)
    assert s["kernel_ms_per_step"] == pytest.approx(0.280)  # sum of STEP durations
    assert s["busy_ms_per_step"] == pytest.approx(0.250)  # NCCL hidden under flash
    assert s["wall_ms_per_step"] == pytest.approx(0.5)
    assert s["idle_ms_per_step"] == pytest.approx(0.25)
    assert s["device_span_ms_per_step"] == pytest.approx((1000 + 311) / 2 / 1e3)
    per_category = {c["category"]: c["ms_per_step"] for c in s["categories"]}
    assert per_category == pytest.approx({
        "gemm": 0.160, "attention": 0.050, "collective": 0.030, "reduce/norm": 0.020,
        "other fusion": 0.010, "rng": 0.005, "memcpy/memset": 0.004, "other": 0.001})
    assert s["categories"][0]["category"] == "gemm"
    assert s["categories"][0]["share"] == pytest.approx(160 / 280)
    top = s["top_kernels"][0]
    assert top["name"].startswith("sm90_xmma_gemm") and top["calls_per_step"] == 2
    assert top["ms_per_step"] == pytest.approx(0.160)
    assert "| gemm | 0.160 | 57.1% | 2 |" in profile_step.render_markdown(s)


def test_cpu_fallback_counts_leaf_ops_per_device():
    # Two CPU devices; a while thunk encloses its body ops and must not count twice.
    events = [_meta(1, "/host:CPU"), _meta(1, "tf_XLAEigen", 5), _meta(1, "tf_XLAEigen", 6)]
    for ordinal, tid in (("0", 5), ("1", 6)):
        events += [_x(1, tid, "while.3", 0, 100, hlo_op="while.3", device_ordinal=ordinal),
                   _x(1, tid, "add_fusion", 10, 40, hlo_op="add_fusion",
                      device_ordinal=ordinal),
                   _x(1, tid, "ynn_fusion", 60, 30, hlo_op="ynn_fusion",
                      device_ordinal=ordinal),
                   _x(1, tid, "end: ynn_fusion", 90, 1, device_ordinal=ordinal),
                   _x(1, tid, "ThreadpoolListener::Record", 0, 500)]
    s = profile_step.summarize_trace({"traceEvents": events}, steps=1)
    assert s["source"] == "cpu" and s["devices"] == ["cpu:0", "cpu:1"]
    assert s["kernels_per_step"] == 2
    assert s["kernel_ms_per_step"] == pytest.approx(0.070)
    assert s["wall_is_device_span"] and s["wall_ms_per_step"] == pytest.approx(0.080)


def test_profile_tiny_pretrain_step_on_cpu(tmp_path):
    summary = profile_step.main(["--task", "pretrain", "--model", "tiny", "--seq-len", "32",
                                 "--batch-size", "8", "--steps", "1", "--warmup", "1",
                                 "--devices", "1", "--layers", "1", "--vocab-size", "100",
                                 "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["source"] == "cpu" and saved["steps"] == 1
    assert saved["kernel_ms_per_step"] > 0 and 0 < saved["busy_ms_per_step"]
    assert saved["top_kernels"] and saved["top_kernels"][0]["ms_per_step"] > 0
    assert saved["run"]["model"] == "tiny" and saved["run"]["seq_len"] == 32
    assert (tmp_path / saved["trace_file"]).is_file()
    assert "| category | ms/step |" in (tmp_path / "summary.md").read_text()
    assert summary["kernels_per_step"] == saved["kernels_per_step"]
    # op attribution needs the HLO dump, which XLA honours only if it starts after
    # profile_step set its flags (not the case when an earlier test started it)
    assert saved.get("phases") or any("no optimized HLO" in w for w in saved["warnings"])


def test_overlapping_gpu_kernels_are_all_counted():
    """Hopper kernels may start before their predecessor on the same stream ends
    (programmatic dependent launch): both are kernels, neither encloses the other."""
    trace = {"traceEvents": [
        _meta(1, "/device:GPU:0"), _meta(1, "Stream #7(Kernel)", tid=7),
        _x(1, 7, "nvjet_sm90_gemm", 0, 100), _x(1, 7, "loop_add_fusion", 90, 50),
        _x(1, 7, "bert_flash_forward", 140, 60)]}
    summary = profile_step.summarize_trace(trace, steps=1)
    assert summary["kernels_per_step"] == 3
    assert summary["kernel_ms_per_step"] == pytest.approx(0.210)
    assert summary["busy_ms_per_step"] == pytest.approx(0.200)


_OP = "jit(train_step)/{}(BertForPreTraining){}/bert/encoder/{}"
# Three optimized-HLO instruction lines as XLA dumps them (one per line, op_name metadata).
HLO = "\n".join([
    '  %input_reduce_fusion.16 = (f32[768]{0}) fusion(%a), kind=kInput, metadata={op_name="'
    + _OP.format("transpose(jvp", ")", "layer_11/attention_norm/reduce_sum") + '"}',
    '  %loop_multiply_fusion.3 = bf16[8,3072]{1,0} fusion(%b), kind=kLoop, metadata={op_name="'
    + _OP.format("jvp", "", "layer_0/mul") + '"}',
    '  %loop_select_fusion = f32[768]{0} fusion(%e), kind=kLoop, '
    'metadata={op_name="jit(train_step)/jit(_where)/select_n"}', ""])


def test_kernels_attributed_to_ops_and_phases():
    names = profile_step.hlo_op_names(HLO)
    assert profile_step.short_op(names["input_reduce_fusion_16"]) == \
        "bwd bert/encoder/layer_11/attention_norm/reduce_sum"
    assert profile_step.short_op(names["loop_multiply_fusion_3"]) == \
        "fwd bert/encoder/layer_0/mul"
    trace = {"traceEvents": [
        _meta(1, "/device:GPU:0"), _meta(1, "Stream #7(Kernel)", tid=7),
        _x(1, 7, "loop_multiply_fusion_3", 0, 100), _x(1, 7, "nvjet_sm90_gemm", 100, 300),
        _x(1, 7, "input_reduce_fusion_16", 400, 50), _x(1, 7, "loop_select_fusion", 450, 20)]}
    summary = profile_step.summarize_trace(trace, steps=1, op_names=names)
    phases = {p["phase"]: p["ms_per_step"] for p in summary["phases"]}
    assert phases == pytest.approx({"forward": 0.1, "backward": 0.05,
                                    "optimizer / other": 0.02,
                                    "not attributed (library kernels)": 0.3})
    ops = {k["name"]: k["op"] for k in summary["top_kernels"]}
    assert ops["nvjet_sm90_gemm"] == "" and ops["loop_select_fusion"] == "select_n"
    assert "| backward | 0.050 |" in profile_step.render_markdown(summary)
