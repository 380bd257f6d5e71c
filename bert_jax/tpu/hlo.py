"""Where a compiled step's HBM bytes and collectives go, from its optimized HLO text.

XLA's ``cost_analysis`` gives one total and counts a loop body once. This walks the
compiled module instead: every top-level instruction of the entry computation and of the
loops it runs (each while body weighted by its known trip count: scanned layers,
microbatches) reads its operands and writes its result, as XLA's cost model counts a
fusion; instructions that move no data (parameters, tuples, bitcasts, constants, the loop
and call wrappers themselves) count nothing. Each instruction's bytes go to one part of the
step, from its opcode and the JAX name stack in its metadata:

* ``forward`` / ``backward``: the model's passes (``jvp(...)`` / ``transpose(jvp(...))``),
  activations and the parameters they read;
* ``optimizer``: the update (``optimizer_update`` scope: moments, trust ratios, the new
  parameters) and ``accumulate``: the gradient sum over microbatches;
* ``collectives``: all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute
  (their HBM reads and writes; their link volume is in ``collectives``), also where XLA:TPU
  writes them differently: a reduce-scatter as a fusion around an all-reduce and a slice
  (``kind=kCustom, calls=%all-reduce-scatter...``), and an FSDP parameter all-gather as an
  all-reduce of a zero buffer holding the chip's shard (its operand a
  ``dynamic-update-slice``), listed as ``all-gather as all-reduce``; across the slices of
  a multislice program, the DCN part of a collective is a ``send``/``recv`` pair handed to
  the megascale runtime (``_xla_megascale_transfer_type="ALL_REDUCE"``...), listed as that
  collective with a group of the number of slices, asynchronous (send-done waits for it);
* ``other``: copies, casts, the loss, the gradient norm and the rest.

Only buffers in HBM count: the compiler's other memory spaces (``S(n)`` in the layout: 1 the
core's vector memory, 2 and 6 flags and scalars, 3 v4's on-chip CMEM, 5 host memory) move
nothing through HBM. Allocations (``AllocateBuffer``) and bitcast concatenations
(``ConcatBitcast``) move nothing; an asynchronous ``-start`` writes only the part of its result
tuple that is its output (the tuple also holds its operands as aliases), and a slice reads
only what it writes. Collectives are also listed with their
group size, their payload per chip and whether XLA
scheduled them asynchronously (a ``-start``/``-done`` pair that other work can overlap).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1,
               "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "bf16": 2,
               "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8,
               "u64": 8, "c64": 8, "c128": 16, "token": 0}
SHAPE = re.compile(r"\b(" + "|".join(sorted(DTYPE_BYTES, key=len, reverse=True))
                   + r")\[([\d,]*)\]")
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
NO_TRAFFIC = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
              "call", "conditional", "after-all", "partition-id", "replica-id",
              "opt-barrier", "iota"}
NO_TRAFFIC_CALLS = ("AllocateBuffer", "ConcatBitcast")  # custom calls that move no data
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
GATHER_AS_ALL_REDUCE = "all-gather as all-reduce"
# what an operand passes through unchanged on its way to a collective
PASS_THROUGH = ("copy-done", "copy-start", "copy", "bitcast", "get-tuple-element")
PARTS = ("forward", "backward", "optimizer", "accumulate", "collectives", "other")


def _bytes(text: str) -> float:
    """Bytes of the arrays a type text names, HBM ones only: a layout in another memory
    space (``{...S(n)}``, n > 0: on-chip memories, flags, host) moves nothing through HBM."""
    return sum(size for size, in_hbm in _arrays(text) if in_hbm)


def _arrays(text: str) -> list[tuple[float, bool]]:
    """(bytes, in HBM) of each array a type text names, in order."""
    out = []
    for match in SHAPE.finditer(text):
        layout = text[match.end():match.end() + 80]
        on_chip = layout.startswith("{") and re.search(r"S\([1-9]\)",
                                                        layout[:layout.find("}") + 1])
        n = 1
        for d in match[2].split(","):
            if d:
                n *= int(d)
        out.append((n * DTYPE_BYTES[match[1]], not on_chip))
    return out


def _logical_bytes(text: str) -> float:
    """Bytes of the arrays a type text names, in whatever memory (a collective's payload)."""
    return sum(size for size, _ in _arrays(text))


def _first_operand(operands: str) -> str:
    """The first of a comma-separated operand list (a send's data, before its token)."""
    depth = 0
    for i, ch in enumerate(operands):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            return operands[:i]
    return operands


def _split_operands(rest: str) -> tuple[str, str]:
    """``rest`` (after the opcode's "(") -> (operands, attributes)."""
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1:]
    return rest, ""


@dataclasses.dataclass
class Collective:
    # all-gather | reduce-scatter | all-reduce | all-to-all | collective-permute | all-gather
    # as all-reduce (XLA:TPU's form of an FSDP gather: an all-reduce of a zero buffer)
    kind: str
    group: int  # devices in each replica group
    payload_bytes: float  # per chip per step: the full (gathered / unreduced) array
    asynchronous: bool  # a -start/-done pair: other work may overlap it
    count: int = 1

    @property
    def link_bytes(self) -> float:
        """Bytes each chip sends over its links per step, ring algorithms: (n-1)/n of the
        payload for all-gather, reduce-scatter, all-to-all; twice that for all-reduce."""
        if self.group <= 1:
            return 0.0
        share = (self.group - 1) / self.group
        factor = {"all-reduce": 2 * share, GATHER_AS_ALL_REDUCE: 2 * share,
                  "collective-permute": 1.0}.get(self.kind, share)
        return factor * self.payload_bytes


@dataclasses.dataclass
class Breakdown:
    """A compiled step's HBM bytes per chip per step by part, its collectives and its
    matmul FLOPs (dots and convolutions, fused ones too, plus the FLOPs custom calls such as
    the Pallas attention kernel declare)."""

    parts: dict[str, float]
    collectives: list[Collective]
    flops: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def to_dict(self) -> dict:
        return {"parts": dict(self.parts), "total": self.total, "flops": self.flops,
                "collectives": [dict(dataclasses.asdict(c), link_bytes=c.link_bytes)
                                for c in self.collectives]}


def _group_size(attrs: str, devices: int) -> int:
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if mesh:  # mesh['axis_0'=8, 'axis_1'=4] {'axis_0'}: the named axes' sizes
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh[1]))
        n = 1
        for axis in re.findall(r"'([^']+)'", mesh[2]):
            n *= int(sizes.get(axis, 1))
        return n
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
    if iota:
        return int(iota[2])
    groups = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if groups:
        return len(groups[1].split(","))
    return devices


def _dims(text: str) -> list[int]:
    match = SHAPE.search(text)
    return [int(d) for d in match[2].split(",") if d] if match else []


def _dot_flops(result: str, lhs_type: str, attrs: str) -> float:
    """2 x output elements x contracted elements of a dot (``lhs_type``: its first
    operand's type)."""
    out = math.prod(_dims(result))
    lhs = _dims(lhs_type)
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
    k = 1
    if contracting:
        for i in contracting[1].split(","):
            if i and int(i) < len(lhs):
                k *= lhs[int(i)]
    return 2.0 * out * k


def _conv_flops(result: str, lhs_type: str, rhs_type: str, attrs: str) -> float:
    """A convolution (XLA:TPU writes matmuls as convolutions): 2 x batch x output features
    x input features x, along each spatial dimension, the (output, window) positions that
    fall on the input rather than its padding. XLA:TPU writes a matmul over attention heads
    as a window as wide as the heads padded on both sides (``size=1x12 pad=0_0x11_11``),
    where each output position meets one input position, not twelve."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    out, lhs, rhs = _dims(result), _dims(lhs_type), _dims(rhs_type)
    if not labels or "dilate" in attrs or not (
            len(labels[1]) == len(lhs) and len(labels[2]) == len(rhs) == len(out)
            == len(labels[3])):
        # unlabelled or dilated: every output element x the kernel's elements per feature
        per_feature = math.prod(d for i, d in enumerate(rhs)
                                if not labels or i >= len(labels[2]) or labels[2][i] != "o")
        return 2.0 * math.prod(out) * per_feature
    lhs_labels, rhs_labels, out_labels = labels[1], labels[2], labels[3]
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    window = re.search(r"window=\{([^}]*)\}", attrs)
    spec = dict(re.findall(r"(\w+)=(\S+)", window[1])) if window else {}
    sizes = [int(x) for x in spec["size"].split("x")] if "size" in spec else \
        [rhs[rhs_labels.index(c)] for c in spatial]
    pads = [tuple(int(v) for v in x.split("_")) for x in spec["pad"].split("x")] \
        if "pad" in spec else [(0, 0)] * len(spatial)
    strides = [int(x) for x in spec["stride"].split("x")] if "stride" in spec else \
        [1] * len(spatial)
    macs = (out[out_labels.index("b")] * out[out_labels.index("f")]
            * rhs[rhs_labels.index("i")])
    for k, c in enumerate(spatial):
        n, positions = lhs[lhs_labels.index(c)], out[out_labels.index(c)]
        size, (low, _), stride = sizes[k], pads[k], strides[k]
        macs *= sum(max(0, min(o * stride + size, low + n) - max(o * stride, low))
                    for o in range(positions))
    return 2.0 * macs


def _part(opcode: str, metadata: str) -> str:
    if opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES:
        return "collectives"
    if "optimizer_update" in metadata:
        return "optimizer"
    if "accumulate_grads" in metadata:
        return "accumulate"
    if "transpose(" in metadata:
        return "backward"
    if "jvp(" in metadata:
        return "forward"
    return "other"


def breakdown(hlo_text: str, devices: int, slices: int = 1,
              every_memory: bool = False) -> Breakdown:
    """The HBM bytes per chip of one run of the module's entry computation, by part, and
    its collectives (``devices``: the program's device count, for groups it leaves out;
    ``slices``: the group of its DCN transfers). ``every_memory``: count the buffers in the
    chip's on-chip memories too, as XLA's own cost analysis does (to compare with it)."""

    def counts(in_hbm: bool) -> bool:  # whether an array of ``_arrays`` counts
        return in_hbm or every_memory

    def counted(text: str) -> float:  # the bytes of a type text's arrays that count
        return sum(size for size, in_hbm in _arrays(text) if counts(in_hbm))
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        header = HEADER.match(line)
        if header and " = " not in line.split("{")[0]:
            current = header[2]
            computations[current] = []
            if header[1]:
                entry = current
            continue
        if current is not None and line.strip() == "}":
            current = None
            continue
        if current is not None:
            computations[current].append(line)
    parts = dict.fromkeys(PARTS, 0.0)
    collectives: dict[tuple, Collective] = {}
    flops = [0.0]
    shapes: dict[str, str] = {}  # instruction name -> its result type (operands name them)
    producers: dict[str, tuple[str, str]] = {}  # instruction name -> (opcode, operands)
    for lines in computations.values():
        for line in lines:
            match = INSTRUCTION.match(line)
            if match:
                shapes[match[1]] = match[2]
                producers[match[1]] = (match[3], _split_operands(match[4])[0])

    def gathered(name: str, depth: int = 0) -> bool:
        """Whether ``name`` is a dynamic-update-slice (a shard written into a zero buffer,
        which an all-reduce then turns into the gathered array), through copies."""
        opcode, operands = producers.get(name, ("", ""))
        if opcode == "dynamic-update-slice" or (
                opcode == "fusion" and "dynamic-update-slice_fusion" in name):
            return True
        first = re.search(r"%([\w.\-]+)", operands)
        return bool(opcode in PASS_THROUGH and first and depth < 8
                    and gathered(first[1], depth + 1))

    chained = {channel for lines in computations.values() for line in lines
               if re.match(r"\s*%?async-collective-start[\w.\-]* = ", line)
               for callee in re.findall(r"calls=%?([\w.\-]+)", line)
               for inner in computations.get(callee, ())
               for channel in re.findall(r"channel_id=(\d+)", inner)}

    def fused_collective(name: str, attrs: str
                         ) -> tuple[str, str, float, str, set[str]] | None:
        """(kind, the inner collective's attributes, its payload, its role, its arrays'
        bytes) of a fusion around a collective: an all-gather's gathered result, else its
        full (unreduced) operands, as for a reduce-scatter. Only the collective's own
        arrays: such a fusion also carries other buffers through. The role: XLA:TPU splits
        an asynchronous collective into a chain (one channel) of a ``start`` fusion, ``step``
        fusions on the start's channel that each move a part of it inside compute fusions
        (``async_collective_fusion``s, also spread over a loop's iterations) and a ``done``
        fusion; ``whole`` otherwise. The arrays (their types, ``bf16[4,256]``): what a step
        carries through (the collective's operands and its result in flight), not traffic
        of its own."""
        callee = re.search(r"calls=%?([\w.\-]+)", attrs)
        for line in computations.get(callee[1], ()) if callee else ():
            match = INSTRUCTION.match(line)
            if match and match[3] in COLLECTIVES:
                kind = "reduce-scatter" if "reduce-scatter" in callee[1] else match[3]
                inner_operands, inner_attrs = _split_operands(match[4])
                payload = _logical_bytes(match[2]) if kind == "all-gather" else \
                    operand_bytes(inner_operands, _logical_bytes)
                channel = re.search(r"channel_id=(\d+)", inner_attrs)
                role = "start" if name.startswith("async-collective-start") else \
                    "done" if name.startswith("async-collective-done") else \
                    "step" if channel and channel[1] in chained else "whole"
                carried = {m.group(0) for m in SHAPE.finditer(
                    match[2] + " " + " ".join(shapes.get(n, "") for n in re.findall(
                        r"%([\w.\-]+)", inner_operands)) + " " + inner_operands)}
                return kind, inner_attrs, payload, role, carried
        return None

    def add_collective(kind: str, group: int, asynchronous: bool, payload: float,
                       weight: float) -> None:
        key = (kind, group, asynchronous)
        c = collectives.setdefault(key, Collective(kind, group, 0.0, asynchronous, 0))
        c.payload_bytes += weight * payload
        c.count += int(weight)

    def operand_bytes(operands: str, size: Callable[[str], float] = counted) -> float:
        """Operands print as names (``%fusion.3``) or with their types."""
        if SHAPE.search(operands):
            return size(operands)
        return sum(size(shapes.get(name, "")) for name in
                   re.findall(r"%([\w.\-]+)", operands))

    def operand_type(operands: str, index: int) -> str:
        typed = re.findall(r"((?:" + SHAPE.pattern + r")\{?[^ ]*)\s+%", operands)
        if typed:
            return typed[index][0] if index < len(typed) else ""
        names = re.findall(r"%([\w.\-]+)", operands)
        return shapes.get(names[index], "") if index < len(names) else ""

    def lhs_type(operands: str) -> str:
        return operand_type(operands, 0)

    def matmul_flops(opcode: str, result: str, operands: str, attrs: str) -> float:
        if opcode == "dot":
            return _dot_flops(result, lhs_type(operands), attrs)
        if opcode == "convolution":
            return _conv_flops(result, operand_type(operands, 0),
                               operand_type(operands, 1), attrs)
        return 0.0

    def constant_of(computation: str, name: str) -> int | None:
        """The integer a scalar constant instruction of ``computation`` holds."""
        for row in parsed(computation):
            if row[0] == name and row[1] == "constant":
                return int(row[2]) if re.fullmatch(r"-?\d+", row[2]) else None
        return None

    def trip_count(condition: str, body: str, attrs: str) -> int:
        """The loop's known trip count, else from its condition (counter < bound) and the
        counter's step in the body (XLA's windowed collective matmuls count by 2 when they
        compute two windows an iteration), from 0."""
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
        if known:
            return int(known[1])
        rows = {row[0]: row for row in parsed(condition)}
        bound, index = None, None
        for _, opcode, _, operands, attrs_ in parsed(condition):
            if opcode == "compare" and "direction=LT" in attrs_ and len(operands) == 2:
                counter = rows.get(operands[0])
                bound = constant_of(condition, operands[1])
                if counter and counter[1] == "get-tuple-element":
                    found = re.search(r"index=(\d+)", counter[4])
                    index = int(found[1]) if found else None
                break
        if bound is None:
            for line in computations.get(condition, ()):
                found = re.search(r"constant\((\d+)\)", line)
                if found:
                    return int(found[1])
            return 1
        step = 1
        body_rows = {row[0]: row for row in parsed(body)}
        root = next((line for line in computations.get(body, ())
                     if line.lstrip().startswith("ROOT")), "")
        root_match = INSTRUCTION.match(root)
        if index is not None and root_match and root_match[3] == "tuple":
            elements = re.findall(r"%([\w.\-]+)", _split_operands(root_match[4])[0])
            update = body_rows.get(elements[index]) if index < len(elements) else None
            if update and update[1] == "add":
                steps = [constant_of(body, o) for o in update[3]]
                step = next((c for c in steps if c), 1)
        return max(1, -(-bound // max(step, 1)))

    def inner_flops(name: str, depth: int = 0) -> float:
        """The dot FLOPs inside a fused (or called) computation."""
        total = 0.0
        for line in computations.get(name, ()):
            match = INSTRUCTION.match(line)
            if not match:
                continue
            _, result, opcode, rest = match.groups()
            operands, attrs = _split_operands(rest)
            if opcode in ("dot", "convolution"):
                total += matmul_flops(opcode, result, operands, attrs)
            elif opcode == "fusion" and depth < 4:
                callee = re.search(r"calls=%?([\w.\-]+)", attrs)
                if callee:
                    total += inner_flops(callee[1], depth + 1)
        return total

    def fused_text(name: str, depth: int = 0) -> str:
        """A fused computation's text with the fusions nested in it (a dynamic slice of a
        stacked operand often sits one fusion down)."""
        lines = computations.get(name, ())
        nested = [fused_text(c, depth + 1) for line in lines if depth < 4
                  for c in re.findall(r"calls=%?([\w.\-]+)", line)]
        return "\n".join((*lines, *nested))

    instructions: dict[str, list[tuple[str, str, str, list[str], str]]] = {}

    def parsed(name: str) -> list[tuple[str, str, str, list[str], str]]:
        """A computation's instructions as (name, opcode, operands as written, operand
        names, attributes)."""
        if name not in instructions:
            rows = []
            for line in computations.get(name, ()):
                m = INSTRUCTION.match(line)
                if m:
                    operands, attrs = _split_operands(m[4])
                    rows.append((m[1], m[3], operands.strip(),
                                 re.findall(r"%([\w.\-]+)", operands), attrs))
            instructions[name] = rows
        return instructions[name]

    def read_fraction(callee: str, index: int, depth: int = 0) -> float:
        """The part of a fusion's operand ``index`` that its fused computation reads: where
        every use is a (dynamic) slice, through bitcasts and nested fusions, the slices'
        share of it (a scan's layer of a stack, a windowed matmul's window of an activation,
        as XLA's cost model counts them); else all of it."""
        param = next((name for name, opcode, written, _, _ in parsed(callee)
                      if opcode == "parameter" and written == str(index)), None)
        full = _logical_bytes(shapes.get(param, "")) if param else 0.0
        return 1.0 if full <= 0 else min(1.0, read_of(callee, param, depth) / full)

    def read_of(computation: str, name: str, depth: int) -> float:
        """Logical bytes of ``name`` the instructions of ``computation`` read."""
        full = _logical_bytes(shapes.get(name, ""))
        total = 0.0
        for user, opcode, _, operands, attrs in parsed(computation):
            if name not in operands:
                continue
            if opcode in ("dynamic-slice", "slice") and operands.index(name) == 0 and \
                    operands.count(name) == 1:
                total += _logical_bytes(shapes.get(user, ""))
            elif opcode == "bitcast" and depth < 8:
                total += read_of(computation, user, depth + 1)
            elif opcode == "fusion" and depth < 8:
                callee = re.search(r"calls=%?([\w.\-]+)", attrs)
                if not callee:
                    return full
                total += sum(read_fraction(callee[1], k, depth + 1) * full
                             for k, operand in enumerate(operands) if operand == name)
            else:
                return full
        return min(total, full)

    def in_place_update(opcode: str, operands: str, callee: str
                        ) -> tuple[float, list[str]] | None:
        """(bytes written, the buffers updated in place) where ``opcode`` is a
        dynamic-update-slice, or a fusion whose root is one or a tuple holding some (a
        multi-output fusion writing layers of several stacks and other outputs whole); else
        None. A dynamic-update-slice writes its update, another output all of itself."""
        if opcode == "dynamic-update-slice":
            return counted(operand_type(operands, 1)), [operand_type(operands, 0)]
        if opcode != "fusion" or not callee:
            return None
        matches = [INSTRUCTION.match(line) for line in computations.get(callee, ())]
        named = {m[1]: m for m in matches if m}
        root = next((m for line, m in zip(computations.get(callee, ()), matches, strict=True)
                     if m and line.lstrip().startswith("ROOT")), None)
        if root is None:
            return None
        outputs = [root[1]] if root[3] != "tuple" else \
            re.findall(r"%([\w.\-]+)", _split_operands(root[4])[0])
        written, buffers = 0.0, []
        for name in outputs:
            m = named.get(name)
            if m is not None and m[3] == "dynamic-update-slice":
                written += counted(operand_type(_split_operands(m[4])[0], 1))
                buffers.append(m[2])
            else:
                written += counted(shapes.get(name, ""))
        return (written, buffers) if buffers else None

    def moved_bytes(opcode: str, result: str, operands: str, attrs: str, trips: int
                    ) -> float:
        """Operands read plus result written; inside a loop, an operand stacked along the
        loop (leading dimension = trip count) that a dynamic slice reads, or a dynamic
        update writes in place, moves one slice per iteration, not the whole stack."""
        names = re.findall(r"%([\w.\-]+)", operands)
        types = [shapes.get(n, "") for n in names] if not SHAPE.search(operands) else \
            [t[0] for t in re.findall(r"((?:" + SHAPE.pattern + r")\S*)\s+%", operands)]
        if opcode.endswith("-start") or opcode == "slice":
            # a -start's result tuple: copy-start (destination, source, context), the others
            # (operands, output, ...): the operands again as aliases
            read = [a for t in types for a in _arrays(t)]
            skip = len(read) if opcode.endswith("-start") and opcode != "copy-start" else 0
            output = _arrays(result)[skip:][:1]
            if opcode in ("slice-start", "slice"):  # reads only the slice it writes
                read = [(size, any(hbm for _, hbm in read)) for size, _ in output]
            return sum(size for size, hbm in (*read, *output) if counts(hbm))
        callee = re.search(r"calls=%?([\w.\-]+)", attrs)
        body = fused_text(callee[1]) if callee else ""
        slicing = opcode in ("dynamic-slice", "dynamic-update-slice") or \
            "dynamic-slice(" in body or "dynamic-update-slice(" in body

        def read(index: int, t: str) -> float:
            """Operand ``index`` (of type ``t``): the part a fusion's slices read of it, or
            a dynamic slice's own result; else, inside a loop, one layer of a stack along
            the loop that the body slices; else all of it."""
            fraction = read_fraction(callee[1], index) if callee else 1.0
            if opcode == "dynamic-slice" and index == 0:
                fraction = min(1.0, _logical_bytes(result) / max(_logical_bytes(t), 1.0))
            if fraction < 1.0:
                return counted(t) * fraction
            stacked = slicing and trips > 1 and _dims(t)[:1] == [trips]
            return counted(t) / (trips if stacked else 1)

        in_place = in_place_update(opcode, operands, callee[1] if callee else "")
        if in_place is not None:
            # XLA updates the buffers in place: the other operands are read and the updates
            # written; a buffer (an operand of an output's type) is neither read nor written
            # whole (a windowed matmul's output window, a scan's saved layer)
            written, buffers = in_place
            others = list(enumerate(types))
            for buffer in buffers:
                same = next((k for k, (_, t) in enumerate(others)
                             if t.split("{")[0] == buffer.split("{")[0]), None)
                if same is not None:
                    others.pop(same)
            return written + sum(read(index, t) for index, t in others)
        size = counted(result)
        if slicing and trips > 1 and _dims(result)[:1] == [trips]:
            size /= trips
        return size + sum(read(index, t) for index, t in enumerate(types))

    def carried_bytes(result: str, operands: str, attrs: str, carried: set[str]) -> float:
        """The bytes a fusion's walk counted of the arrays it carries for a collective in
        flight (operands and outputs of the ``carried`` types)."""
        callee = re.search(r"calls=%?([\w.\-]+)", attrs)
        total = 0.0
        for index, name in enumerate(re.findall(r"%([\w.\-]+)", operands)):
            t = shapes.get(name, "")
            match = SHAPE.search(t)
            if match and match.group(0) in carried:
                total += counted(t) * (read_fraction(callee[1], index) if callee else 1.0)
        for match, (size, hbm) in zip(SHAPE.finditer(result), _arrays(result), strict=True):
            if match.group(0) in carried and counts(hbm):
                total += size
        return total

    def walk(name: str, weight: float, seen: tuple[str, ...], trips: int = 1) -> None:
        for line in computations.get(name, ()):
            match = INSTRUCTION.match(line)
            if not match:
                continue
            instruction, result, opcode, rest = match.groups()
            operands, attrs = _split_operands(rest)
            if opcode == "while":
                body = re.search(r"body=%?([\w.\-]+)", attrs)
                condition = re.search(r"condition=%?([\w.\-]+)", attrs)
                inner = trip_count(condition[1] if condition else "",
                                   body[1] if body else "", attrs)
                if body and body[1] not in seen:  # (this body's own trips stay as they are)
                    walk(body[1], weight * inner, (*seen, body[1]), inner)
                continue
            if opcode in ("call", "conditional"):
                for callee in re.findall(r"(?:to_apply|branch_computations|"
                                         r"true_computation|false_computation)=\{?%?"
                                         r"([\w.\-]+)", attrs):
                    if callee not in seen:
                        walk(callee, weight, (*seen, callee), trips)
                continue
            if opcode in NO_TRAFFIC or opcode.endswith("-done") or (
                    opcode == "custom-call" and re.search(
                        r'custom_call_target="(' + "|".join(NO_TRAFFIC_CALLS) + ')"', attrs)):
                continue
            if opcode in ("dot", "convolution"):
                flops[0] += weight * matmul_flops(opcode, result, operands, attrs)
            elif opcode == "fusion":
                callee = re.search(r"calls=%?([\w.\-]+)", attrs)
                if callee:
                    flops[0] += weight * inner_flops(callee[1])
            elif opcode == "custom-call":
                declared = re.search(r'\\?"flops\\?":\s*\\?"?(\d+)', attrs)
                if declared:
                    flops[0] += weight * float(declared[1])
            metadata = re.search(r'op_name="([^"]*)"', attrs)
            fused = fused_collective(instruction, attrs) if opcode == "fusion" else None
            if fused and fused[3] == "done":  # waits for its chain's start
                continue
            moved = moved_bytes(opcode, result, operands, attrs, trips)
            if fused and fused[3] == "start":  # its result tuple holds its operands again
                aliased = _arrays(result)[:len(_arrays(" ".join(
                    shapes.get(n, "") for n in re.findall(r"%([\w.\-]+)", operands))))]
                moved -= sum(size for size, hbm in aliased if counts(hbm))
            if fused and fused[3] == "step":  # compute that moves a part of its chain
                parts[_part(opcode, metadata[1] if metadata else "")] += weight * max(
                    moved - carried_bytes(result, operands, attrs, fused[4]), 0.0)
                continue
            part = "collectives" if fused else _part(opcode, metadata[1] if metadata else "")
            parts[part] += weight * moved
            if fused:
                add_collective(fused[0], _group_size(fused[1], devices), fused[3] == "start",
                               fused[2], weight)
                continue
            if opcode == "send":  # the DCN part of a multislice collective (megascale)
                transfer = re.search(r'_xla_megascale_transfer_type="(\w+)"', attrs)
                if transfer:
                    add_collective(transfer[1].lower().replace("_", "-"), slices, True,
                                   operand_bytes(_first_operand(operands), _logical_bytes),
                                   weight)
                continue
            base = opcode.removesuffix("-start")
            if base not in COLLECTIVES:
                continue
            group = _group_size(attrs, devices)
            asynchronous = opcode.endswith("-start")
            if base == "all-gather":  # the gathered result (less the chip's own shard)
                payload = _logical_bytes(result)
                if asynchronous:
                    payload = max(payload - operand_bytes(operands, _logical_bytes), 0.0)
                add_collective(base, group, asynchronous, payload, weight)
            elif base == "all-reduce":  # each operand: a gather in disguise or a sum
                typed = re.findall(r"((?:" + SHAPE.pattern + r")\S*)\s+%([\w.\-]+)", operands)
                arrays = [(t[0], t[-1]) for t in typed] if SHAPE.search(operands) else [
                    (shapes.get(n, ""), n) for n in re.findall(r"%([\w.\-]+)", operands)]
                for type_text, name in arrays:
                    kind = GATHER_AS_ALL_REDUCE if gathered(name) else base
                    add_collective(kind, group, asynchronous, _logical_bytes(type_text),
                                   weight)
            else:  # the full array: the unreduced operand
                add_collective(base, group, asynchronous,
                               operand_bytes(operands, _logical_bytes), weight)

    if entry is not None:
        walk(entry, 1.0, (entry,))
    return Breakdown(parts, sorted(collectives.values(), key=lambda c: -c.payload_bytes),
                     flops[0])


def main(argv: list[str] | None = None) -> int:
    """``python -m bert_jax.tpu.hlo FILE --devices N``: the byte breakdown of a compiled
    program saved by ``bert-jax compile --save-hlo FILE``."""
    import argparse

    from bert_jax import storage

    ap = argparse.ArgumentParser(description="HBM bytes by part and the collectives of a "
                                             "compiled step (optimized HLO text)")
    ap.add_argument("file", help="HLO text, e.g. from bert-jax compile --save-hlo FILE")
    ap.add_argument("--devices", type=int, required=True,
                    help="the program's device count (chips of all its slices)")
    ap.add_argument("--slices", type=int, default=1, help="slices of a multislice program")
    ap.add_argument("--every-memory", action="store_true",
                    help="count the buffers in on-chip memories too (S(n) layouts), as XLA's "
                         "own cost analysis does")
    args = ap.parse_args(argv)
    b = breakdown(storage.read_text(args.file), args.devices, args.slices, args.every_memory)
    where = "every memory space" if args.every_memory else "HBM"
    print(f"bytes ({where}) per chip per step: "
          + ", ".join(f"{k} {v / 1e9:.3f}" for k, v in b.parts.items())
          + f" GB (sum {b.total / 1e9:.3f} GB)")
    print(f"matmul FLOPs per chip per step: {b.flops / 1e12:.3f} TFLOP")
    for c in b.collectives:
        print(f"collective {c.kind} over groups of {c.group}: {c.payload_bytes / 1e9:.3f} GB "
              f"payload, {c.link_bytes / 1e9:.3f} GB on the links, {c.count} ops, "
              f"{'async' if c.asynchronous else 'synchronous'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
