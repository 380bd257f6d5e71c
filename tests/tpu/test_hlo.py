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

ENTRY %main (x: bf16[128,1024]) -> bf16[32,1024] {
  %x = bf16[128,1024]{1,0} parameter(0)
  %alloc = bf16[24,128,1024]{2,1,0} custom-call(), custom_call_target="AllocateBuffer"
  %cs = (bf16[128,1024]{1,0}, bf16[128,1024]{1,0}, u32[]{:S(2)}) copy-start(%x)
  %cd = bf16[128,1024]{1,0} copy-done(%cs)
  %cmem = (bf16[128,1024]{1,0}, bf16[128,1024]{1,0:S(3)}, u32[]{:S(2)}) copy-start(%cd)
  %ss = ((bf16[128,1024]{1,0}), bf16[32,1024]{1,0}, s32[]{:S(2)}) slice-start(%cd), \\
    slice={[0:32], [0:1024]}
  ROOT %sd = bf16[32,1024]{1,0} slice-done(%ss)
}
"""


def test_what_moves_no_hbm_bytes():
    """Allocations move nothing; a copy reads and writes its array once (its -start tuple
    repeats the operand), into on-chip memory (S(3): v4's CMEM) it only reads; a slice reads
    only the rows it writes."""
    array = 128 * 1024 * 2
    b = hlo.breakdown(MOVES, devices=1)
    assert b.parts["other"] == 2 * array + array + 2 * (array // 4)
