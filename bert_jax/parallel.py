"""Device mesh, logical-axis rules, directly sharded initialization and multi-host setup.

Model code names logical axes only (``batch``, ``embed``, ``mlp``, ``heads``, ``vocab``...);
the training config maps them onto the mesh axes ``data``, ``fsdp`` and ``tensor``:

* pure data parallel: mesh ``data=-1``; parameters replicated, batch split.
* FSDP: mesh ``fsdp=-1``; rule ``embed -> fsdp`` shards parameters, gradients and optimizer
  state, the batch is split over ``(data, fsdp)``.
* tensor parallel: mesh ``tensor=N``; rules ``heads/mlp/vocab -> tensor`` split the matmuls.

Everything is ``jax.jit`` with ``NamedSharding`` (no pmap); a global batch is assembled from
each process's local rows with ``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.errors import BertJaxError
from bert_jax.sharding import mesh_axes_size, shard_map_unchecked

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes (None = replicated). The same data lives in experiment configs.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("layers", None),
    ("activation_embed", None),
    ("classes", None),
    ("length", None),
)

Rules = Sequence[tuple[str, Any]]


# ---- multi-host ---------------------------------------------------------------------------
def maybe_initialize_distributed() -> bool:
    """Initializes ``jax.distributed`` when running as one of several processes.

    * ``BERT_JAX_COORDINATOR_ADDRESS`` / ``BERT_JAX_NUM_PROCESSES`` / ``BERT_JAX_PROCESS_ID``
      (GPU clusters, localhost tests); optional ``BERT_JAX_LOCAL_DEVICE_IDS`` (comma list)
      and the timeouts of :func:`_timeouts`.
    * SLURM (``SLURM_NTASKS`` > 1) and TPU pods: ``jax.distributed.initialize()`` detects
      everything itself.
    On CPU the cross-process collectives use gloo. Returns True if initialized here.
    """
    if _distributed_is_initialized():
        return False
    address = os.environ.get("BERT_JAX_COORDINATOR_ADDRESS")
    if address:
        try:
            num_processes = int(os.environ["BERT_JAX_NUM_PROCESSES"])
            process_id = int(os.environ["BERT_JAX_PROCESS_ID"])
        except (KeyError, ValueError) as e:
            raise BertJaxError("BERT_JAX_COORDINATOR_ADDRESS is set, so BERT_JAX_NUM_PROCESSES "
                               f"and BERT_JAX_PROCESS_ID must be integers too ({e})") from None
        local_ids = os.environ.get("BERT_JAX_LOCAL_DEVICE_IDS")
        _use_gloo_on_cpu()
        jax.distributed.initialize(
            coordinator_address=address, num_processes=num_processes, process_id=process_id,
            local_device_ids=[int(i) for i in local_ids.split(",")] if local_ids else None,
            **_timeouts())
        return True
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 or _on_tpu_pod():
        _use_gloo_on_cpu()
        jax.distributed.initialize(**_timeouts())
        return True
    return False


def _timeouts() -> dict[str, int]:
    """``BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS`` (how soon a silent peer fails the job; jax's
    default 100) and ``BERT_JAX_INITIALIZATION_TIMEOUT_SECONDS`` (how long to wait for all
    processes to join; default 300), where set."""
    out = {}
    for env, arg in (("BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS", "heartbeat_timeout_seconds"),
                     ("BERT_JAX_INITIALIZATION_TIMEOUT_SECONDS", "initialization_timeout")):
        if os.environ.get(env):
            try:
                out[arg] = int(os.environ[env])
            except ValueError:
                raise BertJaxError(f"{env}={os.environ[env]!r}: expected whole seconds") from None
    return out


def _distributed_is_initialized() -> bool:
    from jax._src import distributed

    return distributed.global_state.client is not None


def _use_gloo_on_cpu() -> None:
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or not _has_accelerator_env():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _has_accelerator_env() -> bool:
    return any(k in os.environ for k in ("CUDA_VISIBLE_DEVICES", "TPU_WORKER_HOSTNAMES",
                                         "TPU_ACCELERATOR_TYPE", "NVIDIA_VISIBLE_DEVICES"))


def _on_tpu_pod() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts


# ---- mesh ---------------------------------------------------------------------------------
def resolve_axis_sizes(sizes: Mapping[str, int], total: int, what: str) -> tuple[int, ...]:
    """{'data': -1, 'fsdp': 2, 'tensor': 1} with ``total`` devices -> (4, 2, 1) for 8.

    At most one axis may be -1; it takes whatever the others leave.
    """
    unknown = sorted(set(sizes) - set(MESH_AXES))
    if unknown:
        raise BertJaxError(f"{what}: unknown mesh axes {unknown}; valid: {list(MESH_AXES)}")
    values = [int(sizes.get(axis, 1)) for axis in MESH_AXES]
    fill = [i for i, v in enumerate(values) if v == -1]
    shown = dict(zip(MESH_AXES, values, strict=True))
    if len(fill) > 1 or any(v == 0 or v < -1 for v in values):
        raise BertJaxError(f"{what}: {shown} — sizes must be positive with at most one -1")
    known = math.prod(v for v in values if v != -1)
    if fill:
        if total % known:
            raise BertJaxError(f"{what}: {total} devices are not divisible by {known}")
        values[fill[0]] = total // known
    if math.prod(values) != total:
        raise BertJaxError(f"{what}: {dict(zip(MESH_AXES, values, strict=True))} uses "
                           f"{math.prod(values)} devices but {total} are available")
    return tuple(values)


def create_mesh(ici: Mapping[str, int], dcn: Mapping[str, int] | None = None,
                devices: Sequence[Any] | None = None) -> Mesh:
    """A ``Mesh`` over axes (data, fsdp, tensor).

    ``ici`` sizes are within a slice (or host group), ``dcn`` sizes across slices (multislice
    TPU) or across processes (GPU hosts); -1 fills. Without DCN parallelism, the whole device
    set is one ICI mesh.
    """
    devices = list(jax.devices() if devices is None else devices)
    dcn = dict(dcn or {})
    dcn_total = (_num_granules(devices) if -1 in dcn.values()
                 else math.prod(int(v) for v in dcn.values()))
    dcn_shape = resolve_axis_sizes(dcn, dcn_total, "parallel.dcn_mesh")
    granules = math.prod(dcn_shape)
    if len(devices) % granules:
        raise BertJaxError(f"parallel.dcn_mesh: {len(devices)} devices do not split into "
                           f"{granules} slices")
    ici_shape = resolve_axis_sizes(ici, len(devices) // granules, "parallel.mesh")
    if granules > 1:
        process_is_granule = not _slices_differ(devices)
        array = mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices,
                                                     process_is_granule=process_is_granule)
    else:
        try:
            array = mesh_utils.create_device_mesh(ici_shape, devices)
        except (AssertionError, NotImplementedError, ValueError):
            # Device kinds without a known physical topology (e.g. simulated CPUs).
            array = np.asarray(devices).reshape(ici_shape)
    return Mesh(array, MESH_AXES)


def _slices_differ(devices: Sequence[Any]) -> bool:
    """Multislice TPU devices carry distinct ``slice_index``es; devices of several CPU (or
    GPU) processes carry the attribute too but all 0, so there the granule is the process."""
    return len({getattr(d, "slice_index", 0) for d in devices}) > 1


def _num_granules(devices: Sequence[Any]) -> int:
    if _slices_differ(devices):
        return len({d.slice_index for d in devices})
    return len({d.process_index for d in devices})


def rules_from_config(rules: Sequence[Sequence[Any]]) -> tuple[tuple[str, Any], ...]:
    """Config data (lists from JSON/ConfigDict) -> flax rules with tuples for multi-axes."""
    out = []
    for entry in rules:
        if len(entry) != 2:
            raise BertJaxError(f"parallel.logical_axis_rules: entry {entry!r} is not a "
                               "(logical axis, mesh axes) pair")
        name, target = entry
        if isinstance(target, list | tuple):
            target = tuple(target)
            bad = [t for t in target if t not in MESH_AXES]
        else:
            bad = [target] if target is not None and target not in MESH_AXES else []
        if bad:
            raise BertJaxError(f"parallel.logical_axis_rules: {name!r} maps to unknown mesh "
                               f"axes {bad}; valid: {list(MESH_AXES)}")
        out.append((str(name), target))
    return tuple(out)


# ---- sharding helpers ---------------------------------------------------------------------
def logical_sharding(mesh: Mesh, rules: Rules, *axes: str | None) -> NamedSharding:
    """NamedSharding for an array whose dimensions carry these logical names."""
    return nn.logical_to_mesh_sharding(PartitionSpec(*axes), mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int) -> NamedSharding:
    """Leading dimension split as ``batch``, the rest replicated."""
    return logical_sharding(mesh, rules, "batch", *([None] * (ndim - 1)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def abstract_and_shardings(init_fn: Callable[..., Any], mesh: Mesh, rules: Rules, *args):
    """Shapes and shardings of ``init_fn(*args)`` without computing it.

    ``init_fn`` returns a tree with ``nn.Partitioned`` boxes (flax params and anything built
    from them, such as optimizer moments); logical specs -> mesh shardings. Returns
    (unboxed abstract tree of ShapeDtypeStructs with shardings, shardings tree).
    """
    abstract = jax.eval_shape(init_fn, *args)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
    return abstract_with_shardings(nn.unbox(abstract), shardings), shardings


def sharded_init(init_fn: Callable[..., Any], shardings, *args):
    """Runs ``init_fn(*args)`` under jit with ``out_shardings``: each device computes only
    its own shards, so no parameter is ever materialized whole on one device."""
    return jax.jit(lambda *a: nn.unbox(init_fn(*a)), out_shardings=shardings)(*args)


def abstract_with_shardings(tree, shardings):
    """ShapeDtypeStructs carrying target shardings (for restoring onto any mesh)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh, rules: Rules
                 ) -> dict[str, jax.Array]:
    """This process's rows of each array -> global jax.Arrays split along ``batch``."""
    out = {}
    for name, value in local.items():
        value = np.asarray(value)
        sharding = batch_sharding(mesh, rules, value.ndim)
        global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
        out[name] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out


def check_batch_split_over_processes(mesh: Mesh, rules: Rules) -> None:
    """Each process reads its own rows, so no two processes may hold the same batch shard
    (as when the batch axes ``data``/``fsdp`` stay inside each process and ``tensor`` spans
    the processes, e.g. pure tensor parallelism over hosts)."""
    if jax.process_count() == 1:
        return
    shards = batch_divisor(mesh, rules)
    held: dict[int, set[int]] = {}
    for device, index in batch_sharding(mesh, rules, 1).devices_indices_map((shards,)).items():
        held.setdefault(device.process_index, set()).add(index[0].start or 0)
    if sum(map(len, held.values())) != shards:  # some shard is held by several processes
        raise BertJaxError(
            f"mesh {dict(mesh.shape)} splits the batch {shards} ways, so the "
            f"{jax.process_count()} processes cannot each hold distinct rows; make the batch "
            "axes span the processes (e.g. parallel.mesh.data=-1, or "
            f"parallel.dcn_mesh.data={jax.process_count()})")


def batch_divisor(mesh: Mesh, rules: Rules) -> int:
    """How many ways the batch dimension is split (global batch must divide by it)."""
    return mesh_axes_size(mesh, batch_sharding(mesh, rules, 1).spec[0])


# The mesh ``traced_in_mesh`` entered, for the model code traced under it. Our own context
# variable: JAX's ``with mesh:`` is deprecated (and never reached Flax's constraints), and
# ``jax.set_mesh`` cannot be entered inside ``jax.jit``.
_ENTERED_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar(
    "bert_jax_entered_mesh", default=None)


def entered_mesh() -> Mesh | None:
    """The mesh ``traced_in_mesh`` entered around the current trace, if it has more than one
    device; None otherwise (no mesh, or one device)."""
    mesh = _ENTERED_MESH.get()
    return None if mesh is None or mesh.size == 1 else mesh


def constrain(x, logical_axes: Sequence[str | None]):
    """``nn.with_logical_constraint`` against the mesh ``traced_in_mesh`` entered (a no-op
    without one). The mesh is passed explicitly: Flax looks for JAX's abstract mesh
    (``jax.set_mesh``), which cannot be set inside ``jax.jit``; a step traced under
    ``with mesh:`` alone does not set it, and every constraint would be silently dropped."""
    mesh = entered_mesh()
    if mesh is None:
        return x
    return nn.with_logical_constraint(x, tuple(logical_axes), mesh=mesh)


# The platform the traced computation will run on, for choosing kernels at trace time.
# ``jax.default_backend()`` names where this process runs; a step compiled ahead of time for
# TPU devices on a CPU machine (``bert_jax/tpu/compile.py``) runs elsewhere.
_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "bert_jax_target_platform", default=None)


def target_platform() -> str:
    """``tpu`` / ``gpu`` / ``cpu``: the platform recorded by :func:`targeting` (inside
    :func:`traced_in_mesh`: its mesh's), else the default backend."""
    return _TARGET_PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def targeting(platform: str | None):
    """Within this block, :func:`target_platform` is ``platform`` (None: unchanged)."""
    if platform is None:
        yield
        return
    token = _TARGET_PLATFORM.set("gpu" if platform == "cuda" else platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


def traced_in_mesh(fn: Callable[..., Any], mesh: Mesh, rules: Rules) -> Callable[..., Any]:
    """Wraps ``fn`` so that it traces inside ``mesh`` and the logical-axis ``rules``: the
    model's activation constraints (:func:`constrain`) then take effect, and the model picks
    its kernels for the mesh's platform (:func:`target_platform`; a TPU mesh compiled ahead
    of time on a CPU machine gets the TPU kernels)."""
    platform = mesh.devices.flat[0].platform  # kernels are chosen for the mesh's devices

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        token = _ENTERED_MESH.set(mesh)
        try:
            with nn.logical_axis_rules(rules), targeting(platform):
                return fn(*args, **kwargs)
        finally:
            _ENTERED_MESH.reset(token)

    return wrapped


# ---- parameters gathered in the compute dtype (FSDP) ---------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _cast_in_place(param, sharding, dtype):
    return jax.lax.with_sharding_constraint(param.astype(dtype), sharding)


def _cast_in_place_fwd(param, sharding, dtype):
    # The parameter's dtype travels as a zero-size residual (a dtype is not a JAX value).
    return _cast_in_place(param, sharding, dtype), jnp.zeros((0,), param.dtype)


def _cast_in_place_bwd(sharding, dtype, like, grad):
    # Back to the parameter's dtype before the constraint: the gradient's reduce-scatter runs
    # in float32, as it does when the parameter is gathered first and cast afterwards.
    return (jax.lax.with_sharding_constraint(grad.astype(like.dtype), sharding),)


_cast_in_place.defvjp(_cast_in_place_fwd, _cast_in_place_bwd)

PARAM_GATHERS = ("param_dtype", "compute_dtype")


def param_gather_cast(shardings, dtype, gather: str) -> Callable[[Any], Any] | None:
    """``params -> params`` for a train step that makes sharded (FSDP) matmul kernels reach
    their all-gathers in the compute ``dtype`` (``gather="compute_dtype"``): each ``kernel``
    leaf is cast where it lives, under its own sharding, so the gather moves half the bytes
    of float32. The VJP casts the gradient back to float32 before its reduce-scatter.
    Embedding tables, biases and LayerNorm parameters stay in their dtype (the embeddings are
    looked up in float32 on purpose, ``modeling/encoder.py``). ``gather="param_dtype"`` (or a
    float32 compute dtype) returns None: XLA gathers the stored parameters."""
    if gather not in PARAM_GATHERS:
        raise BertJaxError(f"parallel.param_gather={gather!r}: expected one of {PARAM_GATHERS}")
    dtype = np.dtype(dtype)
    if gather == "param_dtype" or dtype == np.float32:
        return None

    def cast(params):
        def leaf(path, param, sharding):
            boxed = isinstance(param, nn.Partitioned)  # Flax's logical-axis metadata box
            value = param.unbox() if boxed else param
            if getattr(path[-1], "key", None) != "kernel" or value.dtype == dtype:
                return param
            value = _cast_in_place(value, sharding, dtype)
            return param.replace_boxed(value) if boxed else value

        return jax.tree_util.tree_map_with_path(
            leaf, params, shardings, is_leaf=lambda x: isinstance(x, nn.Partitioned))

    return cast


# ---- explicit data-parallel gradient reduction ---------------------------------------------
GRAD_REDUCTIONS = ("auto", "partitioner", "explicit")


def grad_reduction(mesh: Mesh, rules: Rules, param_shardings, choice: str,
                   param_cast: Callable[[Any], Any] | None = None, compute_dtype=np.float32
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]] | None:
    """How the train step sums its gradients over the batch shards (``parallel.grad_reduce``).

    ``partitioner`` (None): XLA's partitioner reduces each gradient contribution where it is
    made, so a parameter used twice is reduced twice (the tied word embeddings: once for the
    lookup, once for the MLM decoder). ``explicit``: :func:`reduce_gradients_explicitly` — the
    gradients are computed per device inside a ``shard_map`` over the batch axes and summed
    with one ``psum`` of the whole tree, every parameter once. It needs every parameter
    replicated (a data-parallel mesh) and no ``param_cast``. ``auto``: explicit where it
    applies on more than one device, else the partitioner. Matmul kernels are summed in
    ``compute_dtype``, as the partitioner sums them (at the output of their gradient's
    matmul), everything else in its own dtype."""
    if choice not in GRAD_REDUCTIONS:
        raise BertJaxError(f"parallel.grad_reduce={choice!r}: expected one of {GRAD_REDUCTIONS}")
    batch_axes = batch_sharding(mesh, rules, 1).spec[0]
    sharded = [s.spec for s in jax.tree.leaves(param_shardings)
               if any(mesh_axes_size(mesh, axes) > 1 for axes in s.spec)]
    applies = not sharded and param_cast is None and mesh_axes_size(mesh, batch_axes) > 1
    if choice == "explicit" and not applies:
        raise BertJaxError(
            f"parallel.grad_reduce='explicit' needs replicated parameters, a batch split over "
            f"several devices and parallel.param_gather='param_dtype'; mesh {dict(mesh.shape)}"
            + (f" shards parameters ({sharded[0]})" if sharded else ""))
    if choice == "partitioner" or not applies:
        return None
    return lambda fn: reduce_gradients_explicitly(fn, mesh, batch_axes, compute_dtype)


def reduce_gradients_explicitly(grads_fn: Callable[..., Any], mesh: Mesh, batch_axes,
                                kernel_dtype=None) -> Callable[..., Any]:
    """``grads_fn(params, batch, rng, dens) -> (grads, sums)`` run per device on its rows of
    ``batch`` (every leaf split on its first axis over ``batch_axes``; params, rng and the
    batch-wide denominators ``dens`` whole), then one ``psum`` over the batch axes of both
    trees: each gradient leaf is reduced once, after the whole backward pass has added up its
    contributions. Inside, the model traces as on one device (no activation constraints, the
    kernels called directly). The dropout key is folded with the device's batch-shard index,
    so every shard draws its own masks (a different draw than the partitioner's, same
    distribution). ``kernel_dtype``: the dtype ``kernel`` leaves are summed in (their
    gradients come out of matmuls in the compute dtype; None: their own dtype)."""

    def per_device(params, batch, rng, dens):
        rng = jax.random.fold_in(rng, jax.lax.axis_index(batch_axes))
        token = _ENTERED_MESH.set(None)
        try:
            grads, sums = grads_fn(params, batch, rng, dens)
        finally:
            _ENTERED_MESH.reset(token)
        wire = jax.tree_util.tree_map_with_path(
            lambda path, g: g.astype(kernel_dtype) if _is_kernel(path, g, kernel_dtype) else g,
            grads)
        wire, sums = jax.lax.psum((wire, sums), batch_axes)
        return jax.tree.map(lambda w, g: w.astype(g.dtype), wire, grads), sums

    def reduced(params, batch, rng, dens):
        whole = PartitionSpec()
        specs = jax.tree.map(lambda _: PartitionSpec(batch_axes), batch)
        return shard_map_unchecked(per_device, mesh, in_specs=(whole, specs, whole, whole),
                                   out_specs=whole)(params, batch, rng, dens)

    return reduced


def _is_kernel(path, leaf, dtype) -> bool:
    return (dtype is not None and getattr(path[-1], "key", None) == "kernel"
            and leaf.dtype != np.dtype(dtype))
