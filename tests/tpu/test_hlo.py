"""The HLO walk's collectives in the forms XLA:TPU writes them (hand-written HLO, no
compile): an FSDP gather as an all-reduce of a zero buffer holding the chip's shard, and a
reduce-scatter as a fusion around an all-reduce."""

import pytest

from bert_jax.tpu import hlo

HLO = """\
HloModule step

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%all-reduce-scatter.1 (input.1: f32[1024,256]) -> f32[256,256] {
  %input.1 = f32[1024,256]{1,0} parameter(0)
  %ar.9 = f32[1024,256]{1,0} all-reduce(%input.1), replica_groups={{0,1,2,3}},\
    to_apply=%add
  %zero = s32[] constant(0)
  ROOT %ds = f32[256,256]{1,0} dynamic-slice(%ar.9, %zero, %zero), \
    dynamic_slice_sizes={256,256}
}

ENTRY %main (shard: bf16[256,256], grad: f32[1024,256], bias: f32[256]) -> f32[256,256] {
  %shard = bf16[256,256]{1,0} parameter(0)
  %grad = f32[1024,256]{1,0} parameter(1)
  %bias = f32[256]{0} parameter(2)
  %zeros = bf16[1024,256]{1,0} broadcast(bf16[] constant(0)), dimensions={}
  %offset = s32[] partition-id()
  %dus = bf16[1024,256]{1,0} dynamic-update-slice(%zeros, %shard, %offset, %offset)
  %cs = (bf16[1024,256], bf16[1024,256], u32[]) copy-start(%dus)
  %cd = bf16[1024,256]{1,0} copy-done(%cs)
  %ar = (bf16[1024,256]{1,0}, f32[256]{0}) all-reduce(%cd, %bias), replica_groups={{0,1,2,3}},\
    to_apply=%add
  ROOT %fusion.1 = f32[256,256]{1,0} fusion(%grad), kind=kCustom, calls=%all-reduce-scatter.1
}
"""


def test_collectives_in_xla_tpu_forms():
    b = hlo.breakdown(HLO, devices=4)
    kinds = {c.kind: c for c in b.collectives}
    assert set(kinds) == {hlo.GATHER_AS_ALL_REDUCE, "all-reduce", "reduce-scatter"}
    gather = kinds[hlo.GATHER_AS_ALL_REDUCE]  # the gathered array, moved as an all-reduce
    assert gather.payload_bytes == 1024 * 256 * 2 and not gather.asynchronous
    assert gather.link_bytes == pytest.approx(2 * 0.75 * 1024 * 256 * 2)
    assert kinds["all-reduce"].payload_bytes == 256 * 4  # the bias: a sum
    scatter = kinds["reduce-scatter"]  # the unreduced operand, (n-1)/n of it on the links
    assert scatter.payload_bytes == 1024 * 256 * 4 and scatter.group == 4
    assert scatter.link_bytes == pytest.approx(0.75 * 1024 * 256 * 4)
    # the fusion's reads and writes are the collective's, not the model's
    assert b.parts["collectives"] >= 1024 * 256 * 4 + 256 * 256 * 4


MOVES = """\
HloModule moves

ENTRY %main (x: bf16[128,1024], y: bf16[64,1024]) -> bf16[32,1024] {
  %x = bf16[128,1024]{1,0} parameter(0)
  %y = bf16[64,1024]{1,0:S(3)} parameter(1)
  %alloc = bf16[24,128,1024]{2,1,0} custom-call(), custom_call_target="AllocateBuffer"
  %cs = (bf16[128,1024]{1,0}, bf16[128,1024]{1,0}, u32[]{:S(2)}) copy-start(%x)
  %cd = bf16[128,1024]{1,0} copy-done(%cs)
  %cmem = (bf16[128,1024]{1,0:S(3)}, bf16[128,1024]{1,0}, u32[]{:S(2)}) copy-start(%cd)
  %evict = (bf16[64,1024]{1,0}, bf16[64,1024]{1,0:S(3)}, u32[]{:S(2)}) copy-start(%y)
  %ss = ((bf16[128,1024]{1,0}), bf16[32,1024]{1,0}, s32[]{:S(2)}) slice-start(%cd), \\
    slice={[0:32], [0:1024]}
  ROOT %sd = bf16[32,1024]{1,0} slice-done(%ss)
}
"""


def test_what_moves_no_hbm_bytes():
    """Allocations move nothing; a copy reads and writes its array once (copy-start's tuple:
    destination, source, context), into on-chip memory (S(3): v4's CMEM) it only reads, out
    of it only writes; a slice reads only the rows it writes."""
    array = 128 * 1024 * 2
    b = hlo.breakdown(MOVES, devices=1)
    assert b.parts["other"] == 2 * array + array + array // 2 + 2 * (array // 4)


NESTED = """\
HloModule nested

%slice_layer (stack: f32[4,256,256], i: s32[]) -> f32[256,256] {
  %stack = f32[4,256,256]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %zero = s32[] constant(0)
  %layer = f32[1,256,256]{2,1,0} dynamic-slice(%stack, %i, %zero, %zero), \\
    dynamic_slice_sizes={1,256,256}
  ROOT %squeezed = f32[256,256]{1,0} bitcast(%layer)
}

%matmul_layer (stack.1: f32[4,256,256], x.1: f32[256,256], i.1: s32[]) -> f32[256,256] {
  %stack.1 = f32[4,256,256]{2,1,0} parameter(0)
  %x.1 = f32[256,256]{1,0} parameter(1)
  %i.1 = s32[] parameter(2)
  %w = f32[256,256]{1,0} fusion(%stack.1, %i.1), kind=kLoop, calls=%slice_layer
  ROOT %dot = f32[256,256]{1,0} dot(%x.1, %w), lhs_contracting_dims={1}, \\
    rhs_contracting_dims={0}
}

%body_inner (c: (s32[])) -> (s32[]) {
  ROOT %c = (s32[]) parameter(0)
}

%cond_inner (c.1: (s32[])) -> pred[] {
  %c.1 = (s32[]) parameter(0)
  %j = s32[] get-tuple-element(%c.1), index=0
  %two = s32[] constant(2)
  ROOT %lt.1 = pred[] compare(%j, %two), direction=LT
}

%body (carry: (s32[], f32[256,256], f32[4,256,256])) -> (s32[], f32[256,256], f32[4,256,256]) {
  %carry = (s32[], f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) parameter(0)
  %i.2 = s32[] get-tuple-element(%carry), index=0
  %x.2 = f32[256,256]{1,0} get-tuple-element(%carry), index=1
  %stack.2 = f32[4,256,256]{2,1,0} get-tuple-element(%carry), index=2
  %inner = (s32[]) while((s32[]) tuple(%i.2)), condition=%cond_inner, body=%body_inner
  %y = f32[256,256]{1,0} fusion(%stack.2, %x.2, %i.2), kind=kOutput, calls=%matmul_layer
  %one = s32[] constant(1)
  %next = s32[] add(%i.2, %one)
  ROOT %out = (s32[], f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) tuple(%next, %y, %stack.2)
}

%cond (carry.1: (s32[], f32[256,256], f32[4,256,256])) -> pred[] {
  %carry.1 = (s32[], f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) parameter(0)
  %i.3 = s32[] get-tuple-element(%carry.1), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i.3, %n), direction=LT
}

ENTRY %main (x: f32[256,256], stack: f32[4,256,256]) -> f32[256,256] {
  %x = f32[256,256]{1,0} parameter(0)
  %stack.3 = f32[4,256,256]{2,1,0} parameter(1)
  %zero.1 = s32[] constant(0)
  %init = (s32[], f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) tuple(%zero.1, %x, %stack.3)
  %loop = (s32[], f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) while(%init), condition=%cond, \\
    body=%body
  ROOT %result = f32[256,256]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_reads_one_layer_of_a_stack_a_nested_fusion_slices():
    """Scanned layers keep their weights (and saved activations) stacked on a layers axis;
    each iteration's fusion reads one layer of the stack, also where the dynamic slice sits
    in a fusion nested in it, and after a loop nested in the body (a windowed collective
    matmul's): 4 iterations x (x, one layer, y), not the whole stack."""
    b = hlo.breakdown(NESTED.replace("\\\n    ", ""), devices=1)
    layer = 256 * 256 * 4
    assert b.parts["other"] == pytest.approx(4 * 3 * layer, abs=1024)  # + the counter
    assert b.flops == 4 * 2 * 256 ** 3


WINDOWED = """\
HloModule windowed

%write_window (out.1: f32[256,512], part.1: f32[256,256], w.1: f32[256,64], i.1: s32[]) \\
    -> f32[256,512] {
  %out.1 = f32[256,512]{1,0} parameter(0)
  %part.1 = f32[256,256]{1,0} parameter(1)
  %w.1 = f32[256,64]{1,0} parameter(2)
  %i.1 = s32[] parameter(3)
  %window = f32[256,64]{1,0} dot(%part.1, %w.1), lhs_contracting_dims={1}, \\
    rhs_contracting_dims={0}
  %zero.2 = s32[] constant(0)
  ROOT %dus.1 = f32[256,512]{1,0} dynamic-update-slice(%out.1, %window, %zero.2, %i.1)
}

%body (carry: (s32[], f32[256,256], f32[256,64], f32[256,512])) \\
    -> (s32[], f32[256,256], f32[256,64], f32[256,512]) {
  %carry = (s32[], f32[256,256]{1,0}, f32[256,64]{1,0}, f32[256,512]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %x = f32[256,256]{1,0} get-tuple-element(%carry), index=1
  %w = f32[256,64]{1,0} get-tuple-element(%carry), index=2
  %out = f32[256,512]{1,0} get-tuple-element(%carry), index=3
  %next_w = f32[256,64]{1,0} collective-permute(%w), source_target_pairs={{0,1},{1,0}}
  %written = f32[256,512]{1,0} fusion(%out, %x, %w, %i), kind=kOutput, calls=%write_window
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[256,256]{1,0}, f32[256,64]{1,0}, f32[256,512]{1,0}) \\
    tuple(%next, %x, %next_w, %written)
}

%cond (carry.1: (s32[], f32[256,256], f32[256,64], f32[256,512])) -> pred[] {
  %carry.1 = (s32[], f32[256,256]{1,0}, f32[256,64]{1,0}, f32[256,512]{1,0}) parameter(0)
  %i.3 = s32[] get-tuple-element(%carry.1), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i.3, %n), direction=LT
}

ENTRY %main (x.2: f32[256,256], w.2: f32[256,64], out.2: f32[256,512]) -> f32[256,512] {
  %x.2 = f32[256,256]{1,0} parameter(0)
  %w.2 = f32[256,64]{1,0} parameter(1)
  %out.2 = f32[256,512]{1,0} parameter(2)
  %zero.1 = s32[] constant(0)
  %init = (s32[], f32[256,256]{1,0}, f32[256,64]{1,0}, f32[256,512]{1,0}) \\
    tuple(%zero.1, %x.2, %w.2, %out.2)
  %loop = (s32[], f32[256,256]{1,0}, f32[256,64]{1,0}, f32[256,512]{1,0}) while(%init), \\
    condition=%cond, body=%body
  ROOT %result = f32[256,512]{1,0} get-tuple-element(%loop), index=3
}
"""


def test_a_windowed_matmul_writes_one_window_per_iteration():
    """A windowed collective matmul (XLA's choice for FSDP on v4): each of 8 iterations
    computes one 256 x 64 window of the output, writes it in place into the 256 x 512
    buffer and passes the weight window on. The walk counts per iteration the inputs read
    (x, the weight window) and the window written, not the whole output buffer."""
    b = hlo.breakdown(WINDOWED.replace("\\\n    ", ""), devices=2)
    x, window = 256 * 256 * 4, 256 * 64 * 4
    fused = x + window + window + 4  # reads x, the weight window, the index; writes a window
    permute = 2 * window  # reads and writes the weight window
    assert b.parts["other"] + b.parts["collectives"] == pytest.approx(
        8 * (fused + permute), abs=1024)  # + the counter
    assert b.flops == 8 * 2 * 256 * 256 * 64
    [c] = b.collectives
    assert c.kind == "collective-permute" and c.payload_bytes == 8 * window


WINDOW_READ = """\
HloModule window_read

%window (x.3: f32[512,1024], i.4: s32[]) -> f32[512,256] {
  %x.3 = f32[512,1024]{1,0} parameter(0)
  %i.4 = s32[] parameter(1)
  %zero.4 = s32[] constant(0)
  ROOT %cut = f32[512,256]{1,0} dynamic-slice(%x.3, %zero.4, %i.4), \\
    dynamic_slice_sizes={512,256}
}

%partial (x.2: f32[512,1024], dy.2: f32[512,64], acc.2: f32[256,64], i.2: s32[]) \\
    -> f32[256,64] {
  %x.2 = f32[512,1024]{1,0} parameter(0)
  %dy.2 = f32[512,64]{1,0} parameter(1)
  %acc.2 = f32[256,64]{1,0} parameter(2)
  %i.2 = s32[] parameter(3)
  %xw = f32[512,256]{1,0} fusion(%x.2, %i.2), kind=kLoop, calls=%window
  %grad = f32[256,64]{1,0} dot(%xw, %dy.2), lhs_contracting_dims={0}, \\
    rhs_contracting_dims={0}
  ROOT %sum.2 = f32[256,64]{1,0} add(%grad, %acc.2)
}

%body (carry: (s32[], f32[512,1024], f32[512,64], f32[256,64])) \\
    -> (s32[], f32[512,1024], f32[512,64], f32[256,64]) {
  %carry = (s32[], f32[512,1024]{1,0}, f32[512,64]{1,0:S(3)}, f32[256,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %x = f32[512,1024]{1,0} get-tuple-element(%carry), index=1
  %dy = f32[512,64]{1,0:S(3)} get-tuple-element(%carry), index=2
  %acc = f32[256,64]{1,0} get-tuple-element(%carry), index=3
  %summed = f32[256,64]{1,0} fusion(%x, %dy, %acc, %i), kind=kOutput, calls=%partial
  %passed = f32[256,64]{1,0} collective-permute(%summed), \\
    source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[512,1024]{1,0}, f32[512,64]{1,0:S(3)}, f32[256,64]{1,0}) \\
    tuple(%next, %x, %dy, %passed)
}

%cond (carry.1: (s32[], f32[512,1024], f32[512,64], f32[256,64])) -> pred[] {
  %carry.1 = (s32[], f32[512,1024]{1,0}, f32[512,64]{1,0:S(3)}, f32[256,64]{1,0}) \\
    parameter(0)
  %i.3 = s32[] get-tuple-element(%carry.1), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i.3, %n), direction=LT
}

ENTRY %main (x.5: f32[512,1024], dy.5: f32[512,64], acc.5: f32[256,64]) -> f32[256,64] {
  %x.5 = f32[512,1024]{1,0} parameter(0)
  %dy.5 = f32[512,64]{1,0:S(3)} parameter(1)
  %acc.5 = f32[256,64]{1,0} parameter(2)
  %zero.1 = s32[] constant(0)
  %init = (s32[], f32[512,1024]{1,0}, f32[512,64]{1,0:S(3)}, f32[256,64]{1,0}) \\
    tuple(%zero.1, %x.5, %dy.5, %acc.5)
  %loop = (s32[], f32[512,1024]{1,0}, f32[512,64]{1,0:S(3)}, f32[256,64]{1,0}) \\
    while(%init), condition=%cond, body=%body
  ROOT %result = f32[256,64]{1,0} get-tuple-element(%loop), index=3
}
"""


def test_a_windowed_reduce_scatter_reads_one_window_of_the_activation():
    """A windowed reduce-scatter (XLA's FSDP weight gradient on v4): each of 4 iterations
    multiplies one 256-column window of the activation x, which a fusion nested in the
    iteration's fusion slices out of it, by the output gradient (in v4's on-chip memory:
    no HBM bytes), adds the partial sum passed on by the neighbour and passes it on. Per
    iteration the fusion reads a quarter of x (x's leading dimension is not the trip count)
    and the partial sum and writes one; the permute reads and writes the partial sum."""
    b = hlo.breakdown(WINDOW_READ.replace("\\\n    ", ""), devices=4)
    window, partial = 512 * 256 * 4, 256 * 64 * 4
    fused = window + partial + 4 + partial  # the window of x, the sum, the index; the sum
    assert b.parts["other"] + b.parts["collectives"] == pytest.approx(
        4 * (fused + 2 * partial), abs=1024)  # + the counter
    assert b.flops == 4 * 2 * 512 * 256 * 64


DCN = """\
HloModule dcn

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (g: f32[1024,256]) -> f32[1024,256] {
  %g = f32[1024,256]{1,0} parameter(0)
  %in_slice = f32[1024,256]{1,0} all-reduce(%g), replica_groups={{0,1,2,3},{4,5,6,7}}, \\
    to_apply=%add
  %token = token[] after-all()
  %send = (f32[1024,256]{1,0}, u32[], token[]) send(%in_slice, %token), channel_id=3, \\
    is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name=\\
"xla_megascale_runtime",_xla_megascale_reduce_operation="SUM",\\
_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[1024,256]{1,0}, u32[], token[]) recv(%token), channel_id=2, \\
    is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
  %send-done = token[] send-done(%send), channel_id=3, is_host_transfer=true
  %recv-done = (f32[1024,256]{1,0}, token[]) recv-done(%recv), channel_id=2, \\
    is_host_transfer=true
  ROOT %across = f32[1024,256]{1,0} get-tuple-element(%recv-done), index=0
}
"""


def test_multislice_dcn_transfers_are_the_collective_across_slices():
    """Two slices of four chips: the gradient all-reduce inside each slice (ICI), then its
    DCN part, a send/recv pair for the megascale runtime: listed once (the send), as an
    all-reduce over the 2 slices, asynchronous."""
    b = hlo.breakdown(DCN.replace("\\\n    ", "").replace("\\\n", ""), devices=8, slices=2)
    kinds = {(c.kind, c.group): c for c in b.collectives}
    assert set(kinds) == {("all-reduce", 4), ("all-reduce", 2)}
    dcn = kinds[("all-reduce", 2)]
    assert dcn.payload_bytes == 1024 * 256 * 4 and dcn.asynchronous and dcn.count == 1
    assert dcn.link_bytes == 1024 * 256 * 4  # 2 (n - 1) / n of it, n = 2


MULTI = """\
HloModule multi

%save_layer (saved.1: bf16[4,32,64], other.1: bf16[4,32,64], x.1: bf16[32,64], \\
    weights.1: bf16[4,64,64], i.1: s32[]) -> (bf16[4,32,64], bf16[4,32,64], bf16[32,64]) {
  %saved.1 = bf16[4,32,64]{2,1,0} parameter(0)
  %other.1 = bf16[4,32,64]{2,1,0} parameter(1)
  %x.1 = bf16[32,64]{1,0} parameter(2)
  %weights.1 = bf16[4,64,64]{2,1,0} parameter(3)
  %i.1 = s32[] parameter(4)
  %zero.2 = s32[] constant(0)
  %w = bf16[1,64,64]{2,1,0} dynamic-slice(%weights.1, %i.1, %zero.2, %zero.2), \\
    dynamic_slice_sizes={1,64,64}
  %w2 = bf16[64,64]{1,0} bitcast(%w)
  %y = bf16[32,64]{1,0} dot(%x.1, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %y3 = bf16[1,32,64]{2,1,0} bitcast(%y)
  %x3 = bf16[1,32,64]{2,1,0} bitcast(%x.1)
  %dus.1 = bf16[4,32,64]{2,1,0} dynamic-update-slice(%saved.1, %y3, %i.1, %zero.2, %zero.2)
  %dus.2 = bf16[4,32,64]{2,1,0} dynamic-update-slice(%other.1, %x3, %i.1, %zero.2, %zero.2)
  ROOT %out = (bf16[4,32,64]{2,1,0}, bf16[4,32,64]{2,1,0}, bf16[32,64]{1,0}) \\
    tuple(%dus.1, %dus.2, %y)
}

%body (c: (s32[], bf16[32,64], bf16[4,64,64], bf16[4,32,64], bf16[4,32,64])) \\
    -> (s32[], bf16[32,64], bf16[4,64,64], bf16[4,32,64], bf16[4,32,64]) {
  %c = (s32[], bf16[32,64]{1,0}, bf16[4,64,64]{2,1,0}, bf16[4,32,64]{2,1,0}, \\
    bf16[4,32,64]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %x = bf16[32,64]{1,0} get-tuple-element(%c), index=1
  %weights = bf16[4,64,64]{2,1,0} get-tuple-element(%c), index=2
  %saved = bf16[4,32,64]{2,1,0} get-tuple-element(%c), index=3
  %other = bf16[4,32,64]{2,1,0} get-tuple-element(%c), index=4
  %f = (bf16[4,32,64]{2,1,0}, bf16[4,32,64]{2,1,0}, bf16[32,64]{1,0}) \\
    fusion(%saved, %other, %x, %weights, %i), kind=kOutput, calls=%save_layer
  %s = bf16[4,32,64]{2,1,0} get-tuple-element(%f), index=0
  %o = bf16[4,32,64]{2,1,0} get-tuple-element(%f), index=1
  %y.2 = bf16[32,64]{1,0} get-tuple-element(%f), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[32,64]{1,0}, bf16[4,64,64]{2,1,0}, bf16[4,32,64]{2,1,0}, \\
    bf16[4,32,64]{2,1,0}) tuple(%next, %y.2, %weights, %s, %o)
}

%cond (c.1: (s32[], bf16[32,64], bf16[4,64,64], bf16[4,32,64], bf16[4,32,64])) -> pred[] {
  %c.1 = (s32[], bf16[32,64]{1,0}, bf16[4,64,64]{2,1,0}, bf16[4,32,64]{2,1,0}, \\
    bf16[4,32,64]{2,1,0}) parameter(0)
  %i.3 = s32[] get-tuple-element(%c.1), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i.3, %n), direction=LT
}

ENTRY %main (x.0: bf16[32,64], w.0: bf16[4,64,64], s.0: bf16[4,32,64], o.0: bf16[4,32,64]) \\
    -> bf16[4,32,64] {
  %x.0 = bf16[32,64]{1,0} parameter(0)
  %w.0 = bf16[4,64,64]{2,1,0} parameter(1)
  %s.0 = bf16[4,32,64]{2,1,0} parameter(2)
  %o.0 = bf16[4,32,64]{2,1,0} parameter(3)
  %zero.1 = s32[] constant(0)
  %init = (s32[], bf16[32,64]{1,0}, bf16[4,64,64]{2,1,0}, bf16[4,32,64]{2,1,0}, \\
    bf16[4,32,64]{2,1,0}) tuple(%zero.1, %x.0, %w.0, %s.0, %o.0)
  %loop = (s32[], bf16[32,64]{1,0}, bf16[4,64,64]{2,1,0}, bf16[4,32,64]{2,1,0}, \\
    bf16[4,32,64]{2,1,0}) while(%init), condition=%cond, body=%body
  ROOT %r = bf16[4,32,64]{2,1,0} get-tuple-element(%loop), index=3
}
"""


def test_a_multi_output_fusion_saves_one_layer_of_each_stack():
    """A scanned layer's forward fusion (as XLA:TPU fuses it on v6e): it reads its layer of
    the stacked weights, writes one layer into each of two saved-activation stacks in place
    and its output whole. Per iteration: x, one weight layer, two saved layers and the
    output; neither stack whole."""
    b = hlo.breakdown(MULTI.replace("\\\n    ", ""), devices=1)
    act, layer = 32 * 64 * 2, 64 * 64 * 2
    per_iteration = act + layer + 2 * act + act + 4  # + the index
    assert b.parts["other"] == pytest.approx(4 * per_iteration, abs=256)  # + the counter


CARRIED = """\
HloModule carried

%async_collective_fusion.1 (shard: f32[256,64], carried: f32[1024,1024]) \\
    -> (f32[256,256], f32[1024,1024]) {
  %shard = f32[256,64]{1,0} parameter(0)
  %carried = f32[1024,1024]{1,0} parameter(1)
  %gathered = f32[256,256]{1,0} all-gather(%shard), replica_groups={{0,1,2,3}}, \\
    dimensions={1}
  ROOT %out = (f32[256,256]{1,0}, f32[1024,1024]{1,0}) tuple(%gathered, %carried)
}

ENTRY %main (s: f32[256,64], c: f32[1024,1024]) -> (f32[256,256], f32[1024,1024]) {
  %s = f32[256,64]{1,0} parameter(0)
  %c = f32[1024,1024]{1,0} parameter(1)
  ROOT %f = (f32[256,256]{1,0}, f32[1024,1024]{1,0}) fusion(%s, %c), kind=kCustom, \\
    calls=%async_collective_fusion.1
}
"""


def test_a_collective_fusion_sends_only_its_collectives_arrays():
    """XLA:TPU's async collective fusions carry other buffers through beside the collective
    (a gathered weight of the previous iteration, activations): the payload is the
    all-gather's gathered array, not every operand of the fusion."""
    b = hlo.breakdown(CARRIED.replace("\\\n    ", ""), devices=4)
    [c] = b.collectives
    assert c.kind == "all-gather" and c.group == 4 and c.payload_bytes == 256 * 256 * 4


STEP_BY_TWO = """\
HloModule step_by_two

%body (carry: (s32[], f32[64,64])) -> (s32[], f32[64,64]) {
  %carry = (s32[], f32[64,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %x = f32[64,64]{1,0} get-tuple-element(%carry), index=1
  %y = f32[64,64]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %two = s32[] constant(2)
  %next = s32[] add(%i, %two)
  ROOT %t = (s32[], f32[64,64]{1,0}) tuple(%next, %y)
}

%cond (carry.1: (s32[], f32[64,64])) -> pred[] {
  %carry.1 = (s32[], f32[64,64]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%carry.1), index=0
  %bound = s32[] constant(8)
  ROOT %lt = pred[] compare(%i.1, %bound), direction=LT
}

ENTRY %main (x.2: f32[64,64]) -> f32[64,64] {
  %x.2 = f32[64,64]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64,64]{1,0}) tuple(%zero, %x.2)
  %loop = (s32[], f32[64,64]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[64,64]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_counting_by_two_runs_half_its_bound():
    """A loop without a known trip count runs its bound over its counter's step (XLA's
    windowed collective matmuls compute two windows an iteration and count by 2): 4
    iterations of a 64 x 64 matmul here, not 8."""
    b = hlo.breakdown(STEP_BY_TWO, devices=1)
    assert b.flops == 4 * 2 * 64 ** 3
    assert b.parts["other"] == pytest.approx(4 * 3 * 64 * 64 * 4, abs=64)  # + the counter


HEADS = """\
HloModule heads

ENTRY %main (x: f32[4,8,48,1], w: f32[48,12,16,1]) -> f32[4,8,12,16] {
  %x = f32[4,8,48,1]{3,2,1,0} parameter(0)
  %w = f32[48,12,16,1]{3,2,1,0} parameter(1)
  ROOT %q = f32[4,8,12,16]{3,2,1,0} convolution(%x, %w), \\
    window={size=1x12 pad=0_0x11_11 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}
"""


def test_a_projection_into_heads_counts_each_head_once():
    """XLA:TPU's form of a projection into attention heads (x [32 tokens, 48] times
    [48, 12 heads x 16]): a convolution whose window is as wide as the heads, padded on
    both sides, so each output position meets one input position. Its FLOPs are the
    matmul's, 2 x 32 x 48 x 192, not twelve times them."""
    b = hlo.breakdown(HEADS.replace("\\\n    ", ""), devices=1)
    assert b.flops == 2 * 32 * 48 * 12 * 16


CHAIN = """\
HloModule chain

%gather_start (shard.1: bf16[1,64,256]) -> (bf16[1,64,256], bf16[4,64,256], u32[]) {
  %shard.1 = bf16[1,64,256]{2,1,0} parameter(0)
  %g.1 = bf16[4,64,256]{2,1,0} all-gather(%shard.1), channel_id=7, \\
    replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc = (bf16[1,64,256]{2,1,0}, bf16[4,64,256]{2,1,0}, u32[]{:S(2)}) \\
    custom-call(%g.1), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.3 (x.4: bf16[128,64], w.4: bf16[64,64], shard.4: bf16[1,64,256], \\
    flight.4: bf16[4,64,256]) -> (bf16[128,64], bf16[1,64,256], bf16[4,64,256]) {
  %x.4 = bf16[128,64]{1,0} parameter(0)
  %w.4 = bf16[64,64]{1,0} parameter(1)
  %shard.4 = bf16[1,64,256]{2,1,0} parameter(2)
  %flight.4 = bf16[4,64,256]{2,1,0} parameter(3)
  %y.4 = bf16[128,64]{1,0} dot(%x.4, %w.4), lhs_contracting_dims={1}, \\
    rhs_contracting_dims={0}
  %g.4 = bf16[4,64,256]{2,1,0} all-gather(%shard.4), channel_id=7, \\
    replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t.4 = (bf16[128,64]{1,0}, bf16[1,64,256]{2,1,0}, bf16[4,64,256]{2,1,0}) \\
    tuple(%y.4, %shard.4, %g.4)
}

%gather_done (shard.5: bf16[1,64,256], flight.5: bf16[4,64,256]) -> bf16[4,64,256] {
  %shard.5 = bf16[1,64,256]{2,1,0} parameter(0)
  %flight.5 = bf16[4,64,256]{2,1,0} parameter(1)
  ROOT %g.5 = bf16[4,64,256]{2,1,0} all-gather(%shard.5), channel_id=7, \\
    replica_groups={{0,1,2,3}}, dimensions={0}
}

%body (carry: (s32[], bf16[128,64], bf16[64,64], bf16[1,64,256], bf16[4,64,256])) \\
    -> (s32[], bf16[128,64], bf16[64,64], bf16[1,64,256], bf16[4,64,256]) {
  %carry = (s32[], bf16[128,64]{1,0}, bf16[64,64]{1,0}, bf16[1,64,256]{2,1,0}, \\
    bf16[4,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %x = bf16[128,64]{1,0} get-tuple-element(%carry), index=1
  %w = bf16[64,64]{1,0} get-tuple-element(%carry), index=2
  %shard = bf16[1,64,256]{2,1,0} get-tuple-element(%carry), index=3
  %flight = bf16[4,64,256]{2,1,0} get-tuple-element(%carry), index=4
  %fusion.3 = (bf16[128,64]{1,0}, bf16[1,64,256]{2,1,0}, bf16[4,64,256]{2,1,0}) \\
    fusion(%x, %w, %shard, %flight), kind=kCustom, calls=%async_collective_fusion.3
  %y = bf16[128,64]{1,0} get-tuple-element(%fusion.3), index=0
  %shard.2 = bf16[1,64,256]{2,1,0} get-tuple-element(%fusion.3), index=1
  %flight.2 = bf16[4,64,256]{2,1,0} get-tuple-element(%fusion.3), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[128,64]{1,0}, bf16[64,64]{1,0}, bf16[1,64,256]{2,1,0}, \\
    bf16[4,64,256]{2,1,0}) tuple(%next, %y, %w, %shard.2, %flight.2)
}

%cond (carry.1: (s32[], bf16[128,64], bf16[64,64], bf16[1,64,256], bf16[4,64,256])) \\
    -> pred[] {
  %carry.1 = (s32[], bf16[128,64]{1,0}, bf16[64,64]{1,0}, bf16[1,64,256]{2,1,0}, \\
    bf16[4,64,256]{2,1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%carry.1), index=0
  %n = s32[] constant(24)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (x.0: bf16[128,64], w.0: bf16[64,64], e.0: bf16[1,64,256]) -> bf16[4,64,256] {
  %x.0 = bf16[128,64]{1,0} parameter(0)
  %w.0 = bf16[64,64]{1,0} parameter(1)
  %e.0 = bf16[1,64,256]{2,1,0} parameter(2)
  %async-collective-start = (bf16[1,64,256]{2,1,0}, bf16[4,64,256]{2,1,0}, u32[]{:S(2)}) \\
    fusion(%e.0), kind=kCustom, calls=%gather_start
  %s0 = bf16[1,64,256]{2,1,0} get-tuple-element(%async-collective-start), index=0
  %f0 = bf16[4,64,256]{2,1,0} get-tuple-element(%async-collective-start), index=1
  %zero = s32[] constant(0)
  %init = (s32[], bf16[128,64]{1,0}, bf16[64,64]{1,0}, bf16[1,64,256]{2,1,0}, \\
    bf16[4,64,256]{2,1,0}) tuple(%zero, %x.0, %w.0, %s0, %f0)
  %loop = (s32[], bf16[128,64]{1,0}, bf16[64,64]{1,0}, bf16[1,64,256]{2,1,0}, \\
    bf16[4,64,256]{2,1,0}) while(%init), condition=%cond, body=%body
  %s1 = bf16[1,64,256]{2,1,0} get-tuple-element(%loop), index=3
  %f1 = bf16[4,64,256]{2,1,0} get-tuple-element(%loop), index=4
  ROOT %async-collective-done = bf16[4,64,256]{2,1,0} fusion(%s1, %f1), kind=kCustom, \\
    calls=%gather_done
}
"""


def test_an_async_collective_chain_gathers_once():
    """XLA:TPU's chained asynchronous all-gather (as it gathers the tied word embeddings
    for the MLM head under the layer loop with FSDP on v5e): a start fusion before the
    loop, a step inside each of the loop's 24 matmul fusions (the same channel: each moves
    a part of the one gather and carries the shard and the result in flight through) and
    a done fusion after it. It is one asynchronous gather of the table per step, and each
    step fusion moves its matmul's bytes only."""
    b = hlo.breakdown(CHAIN.replace("\\\n    ", ""), devices=4)
    table, shard = 4 * 64 * 256 * 2, 64 * 256 * 2
    [c] = b.collectives
    assert (c.kind, c.asynchronous, c.payload_bytes, c.count) == (
        "all-gather", True, table, 1)
    matmul = 128 * 64 * 2 + 64 * 64 * 2 + 128 * 64 * 2  # x and w read, y written
    assert b.parts["collectives"] == shard + table  # the start reads the shard, fills the table
    assert b.parts["other"] == pytest.approx(24 * matmul, abs=512)  # + the counter
