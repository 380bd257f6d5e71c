"""The BERT family at equal pretraining compute, fine-tuned on GLUE, SQuAD and CoNLL-2003.

Eight members pretrain the 6 x 512 model of ``experiments/e2e.py`` from one corpus, one
tokenizer and one set of prepared batches, each for the steps that spend the FLOPs of 6,000
BERT steps of 256 x 128 (``experiments/variants.py``); every member is fine-tuned with 3
seeds as soon as it is pretrained. docs/variants.md has the results and what they say.

  python -m bench variants prepare --corpus CORPUS --glue GLUE --conll CONLL --squad FILE \
      --out variants_data                 # tensorflow machine, ~15 min on 2 cores
  python -m bench variants gpu --data variants_data --work variants_work --out OUT \
      [--cells electra:glue,...]
      # the GPU; stops by itself before --deadline-s and continues where it stopped when
      # run again on the same machine (Orbax checkpoints, finished runs are kept)
  python -m bench variants merge RUN1.jsonl RUN2.jsonl --out RECORDS
  python -m bench variants report RECORDS --docs docs

``scripts/variants_compare.sh`` runs them.

Measured on one H200 (jax 0.11.2), pretraining side by side with the fine-tuning workers:
ELECTRA and RoBERTa-style pretrained together plus their 30 GLUE runs took 6.3 min; BERT,
SpanBERT and ERNIE together plus 12 SQuAD and CoNLL-2003 runs 6.5 min (a GLUE run 15-30 s,
SQuAD and CoNLL ~30-80 s, the first of each shape compiling); BERT alone 2.1 min, then
DistilBERT 2.6 min and its 15 GLUE runs, 7.3 min in all. Four members at a time take
~5 min each; the whole table (8 members, 168 runs) needs ~25 min of the GPU. The jobs run in
the order of the claims (GLUE of bert, electra, roberta, albert, distilbert; SQuAD of bert
and spanbert; CoNLL of bert and both ERNIEs; then the other cells), so a budget that runs out
cuts the table's extra cells first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

from bench.common import REPO

EXPERIMENT = os.path.join(REPO, "experiments", "variants.py")
SETTINGS = runpy.run_path(EXPERIMENT)
VARIANTS = SETTINGS["VARIANTS"]
VOCAB_SIZE = SETTINGS["VOCAB"]
GLUE = {"sst2": "SST-2", "cola": "CoLA", "mrpc": "MRPC", "stsb": "STS-B", "rte": "RTE"}
TASKS = (*GLUE, "squad", "conll")
SEEDS = (0, 1, 2)
BATCHES = 800  # materialized per (kind, masking): 204,800 sequences, ~7.5 passes at 6,000 steps
SST2_TRAIN_ROWS = 8_000
# Each process's cap on the GPU's memory (nothing is preallocated): four pretraining runs and
# six fine-tuning workers share one GPU.
PRETRAIN_MEMORY, FINETUNE_MEMORY = 0.18, 0.06
FINISHED = "finished.json"  # in pretrain/: written once no member is pretraining any more
CELLS = "cells.json"  # the (variant, task) cells a run is limited to (``--cells``)
SPEED_SECONDS = 60  # what timing DistilBERT against its teacher needs, after the fine-tuning
DATA_MODES = {"nsp": ["--mode", "nsp", "--knowledge-units"], "sop": ["--mode", "sop"],
              "full": ["--mode", "full_sentences"], "nsplex": ["--mode", "nsp"]}
# The claims and the cells each needs, in the order they run.
CLAIM_CELLS = ([(v, t) for v in ("bert", "electra", "roberta", "albert", "distilbert")
                for t in GLUE]
               + [(v, "squad") for v in ("bert", "spanbert")]
               + [(v, "conll") for v in ("bert", "ernie", "ernie_lexicon")])
# Fine-tuning-only rows: a member's pretrained encoder fine-tuned with extra overrides, on the
# GLUE tasks, after the claims' cells. Only a pair objective (NSP, SOP) trains the pooler;
# this row re-initialises BERT's to show what an untrained pooler costs the NSP-free members.
ABLATIONS = {"bert_fresh_pooler": ("bert", ["--config.reinitialize=bert/pooler"])}
ROWS = (*VARIANTS, *ABLATIONS)  # every row of the records and the tables


def pretrained_member(row: str) -> str:
    """The member whose pretraining ``row`` fine-tunes."""
    return ABLATIONS[row][0] if row in ABLATIONS else row


def _log(message: str) -> None:
    print(f"[variants {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _cli(args: list[str]) -> None:
    from bert_jax.cli import main

    rc = main(args)
    if rc:
        sys.exit(f"bert-jax {' '.join(args)}: exit {rc}")


# ---- prepare (tensorflow) ---------------------------------------------------------------------
def conll_lexicon(train_file: str) -> list[str]:
    """The distinct entity strings of a CoNLL-2003 file (IOB tags, last column), in order of
    first appearance."""
    entities: dict[str, None] = {}
    words: list[str] = []
    with open(train_file, encoding="utf-8") as f:
        for line in [*f, "\n"]:
            parts = line.split()
            tag = parts[-1] if parts and not parts[0].startswith("-DOCSTART-") else "O"
            if words and not tag.startswith("I-"):
                entities[" ".join(words)] = None
                words = []
            if tag.startswith(("B-", "I-")):
                words.append(parts[0])
    return list(entities)


def corpus_files(corpus: str) -> list[str]:
    """The corpus' UTF-8 text files in sorted order (metadata files and the few files in other
    encodings left out)."""
    skip = ("MANIFEST.tsv", "README", "cats.txt", "stopwords")
    files = sorted(os.path.join(root, n) for root, _, names in os.walk(corpus)
                   for n in names if not n.startswith(skip))
    chosen = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                f.read()
        except UnicodeDecodeError:
            continue
        chosen.append(path)
    return chosen


def prepare(args) -> None:
    from bench import variants_prep
    from bert_jax.data.materialize import materialize_batches
    from bert_jax.tokenization.factory import load_tokenizer

    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    files = corpus_files(args.corpus)
    tokenizer = os.path.join(work, "tokenizer")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        _log(f"tokenizer: {len(files)} files, vocab {SETTINGS['VOCAB']}")
        _cli(["train-tokenizer", "--input", *files, "--output", tokenizer, "--vocab-size",
              str(SETTINGS["VOCAB"]), "--model-type", "unigram", "--seed", "0"])
    lexicon = os.path.join(work, "conll_train_entities.txt")
    entities = conll_lexicon(os.path.join(args.conll, "train.txt"))
    with open(lexicon, "w", encoding="utf-8") as f:
        f.write("# CoNLL-2003 train entities\n" + "\n".join(entities) + "\n")
    _log(f"lexicon: {len(entities)} entities from CoNLL-2003 train")
    kinds = sorted({kind for _, kind, _ in VARIANTS.values()})
    for kind in kinds:
        directory = os.path.join(work, f"data_{kind}")
        if not os.path.exists(os.path.join(directory, "metadata.json")):
            _log(f"pretraining data: {kind}")
            extra = ["--knowledge-lexicon", lexicon] if kind == "nsplex" else []
            _cli(["create-pretraining-data", "--input", *files, "--tokenizer", tokenizer,
                  "--output-dir", directory, "--max-seq-length", str(SETTINGS["SEQ"]),
                  "--dupe-factor", "2", "--num-shards", "8", "--num-workers",
                  str(args.num_workers), "--seed", "12345", "--no-progress",
                  *DATA_MODES[kind], *extra])
    combos = {variants_prep.combo_name(kind, masking): (kind, masking)
              for _, kind, masking in VARIANTS.values()}
    materialized = {}
    tok = load_tokenizer(tokenizer)
    for combo, (kind, masking) in sorted(combos.items()):
        directory = os.path.join(work, "materialized", combo)
        if not os.path.exists(os.path.join(directory, "manifest.json")):
            _log(f"materialize {combo}: {BATCHES} batches of 256")
            materialize_batches(os.path.join(work, f"data_{kind}"), directory, steps=BATCHES,
                                batch_size=256, max_predictions=SETTINGS["PREDICTIONS"],
                                seed=0, tokenizer=tok, shuffle_buffer=10_000,
                                masking=masking, basic_fraction=0.25, progress=False)
        materialized[combo] = directory
    # The lexicon changes only the units, not the examples: both NSP kinds store their ids
    # once (packing checks that they are equal).
    stored = {c: "nsp" if k == "nsplex" else k for c, (k, _) in combos.items()}
    stage = os.path.join(work, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    variants_prep.pack(stage, materialized, stored)
    shutil.copytree(tokenizer, os.path.join(stage, "tokenizer"))
    _log("GLUE dev held out from train (seed 1234)")
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "e2e_glue_data.py"),
                    "--glue", args.glue, "--output", os.path.join(stage, "glue")], check=True)
    subprocess.run([sys.executable, "-m", "bench", "quality", "squad", "split", "--input",
                    args.squad, "--dev-articles", "6", "--out", os.path.join(stage, "squad")],
                   check=True, cwd=REPO)
    os.makedirs(os.path.join(stage, "conll"))
    shutil.copy(os.path.join(args.conll, "train.txt"), os.path.join(stage, "conll"))
    shutil.copy(os.path.join(args.conll, "valid.txt"), os.path.join(stage, "conll"))
    prepared = variants_prep.write_archive(stage, args.out, {
        "batches": BATCHES, "batch_size": 256, "seq_len": SETTINGS["SEQ"],
        "corpus_files": len(files), "lexicon_entities": len(entities),
        "combos": {c: {"kind": stored[c], "masking": m} for c, (_, m) in combos.items()}})
    shutil.rmtree(stage)
    _log(f"{args.out}: {prepared['archive_bytes'] / 2 ** 20:.1f} MiB")


# ---- gpu ----------------------------------------------------------------------------------
class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _done(path: str) -> bool:
    return os.path.exists(path)


def _spawn(cmd: list[str], log: str, mem_fraction: float) -> subprocess.Popen:
    env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{mem_fraction:.3f}",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "a", encoding="utf-8") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def pretrain_all(data: dict, work: str, deadline: Deadline, parallel: int, check: bool,
                 tick=lambda: None, chosen: list[str] | None = None) -> bool:
    """Pretrains every member, ``parallel`` at a time (distilbert once bert is done), the
    members of the claims on GLUE first; returns whether all finished."""
    from bench.variants_prep import combo_name

    order = [n for n in ("bert", "electra", "roberta", "albert", "spanbert", "ernie_lexicon",
                         "ernie", "distilbert") if chosen is None or n in chosen]
    running: dict[str, subprocess.Popen] = {}
    root = os.path.join(work, "pretrain")
    os.makedirs(root, exist_ok=True)

    def marker(name):
        return os.path.join(root, name, "done.json")

    started: dict[str, float] = {}
    failed: set[str] = set()
    attempts: dict[str, int] = {}
    last_start = 0.0
    while True:
        for name, p in list(running.items()):
            if p.poll() is not None:
                del running[name]
                if p.returncode != 0:
                    _log(f"pretrain {name} failed (exit {p.returncode}); log: "
                         f"{root}/{name}.log")
                    attempts[name] = attempts.get(name, 0) + 1
                    if attempts[name] >= 2:  # a second start (a CUDA start that lost a race)
                        failed.add(name)
                    continue
                with open(marker(name), "w", encoding="utf-8") as f:
                    json.dump({"seconds": round(time.monotonic() - started[name], 1)}, f)
                _log(f"pretrain {name} done")
        todo = [n for n in order if not _done(marker(n)) and n not in running
                and n not in failed]
        if not todo and not running:  # every member done, or failed in this call
            return not failed
        if deadline.left() < 40:
            _log("deadline: stopping the pretraining runs (they resume from their checkpoint)")
            _stop(running)
            return False
        for name in todo:
            if len(running) >= parallel or time.monotonic() - last_start < 10:
                break  # one start at a time: simultaneous CUDA starts can fail
            if name == "distilbert" and not _done(marker("bert")):
                continue
            _, kind, masking = VARIANTS[name]
            workdir = os.path.join(root, name)
            cmd = [sys.executable, "-m", "bert_jax", "pretrain", "--config",
                   f"{EXPERIMENT}:{name}{'_check' if check else ''}", "--workdir", workdir,
                   f"--config.data.directory={data[combo_name(kind, masking)]}",
                   f"--config.data.tokenizer={data['tokenizer']}"]
            if name == "distilbert":
                cmd.append(f"--config.distill.teacher={os.path.join(root, 'bert')}")
            _log(f"pretrain {name}: {20 if check else SETTINGS['steps'](name)} steps")
            started[name] = last_start = time.monotonic()
            running[name] = _spawn(cmd, os.path.join(root, f"{name}.log"), PRETRAIN_MEMORY)
        tick()
        time.sleep(2)


def parse_cells(text: str) -> list[tuple[str, str]]:
    """``--cells`` (``variant:task,...``; task ``glue`` names the five GLUE tasks) as
    (variant, task) pairs."""
    cells = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        variant, _, task = item.partition(":")
        if variant not in ROWS or task not in (*TASKS, "glue"):
            raise SystemExit(f"--cells: {item!r} is not VARIANT:TASK (variants: "
                             f"{', '.join(ROWS)}; tasks: {', '.join(TASKS)}, glue)")
        cells += [(variant, t) for t in (GLUE if task == "glue" else (task,))]
    return cells


def members(cells: list[tuple[str, str]] | None) -> list[str]:
    """The members to pretrain for ``cells`` (all without; DistilBERT needs its teacher)."""
    if not cells:
        return list(VARIANTS)
    chosen = {pretrained_member(v) for v, _ in cells}
    if "distilbert" in chosen:
        chosen.add("bert")
    return [v for v in VARIANTS if v in chosen]


def jobs(check: bool = False, cells: list[tuple[str, str]] | None = None
         ) -> list[tuple[str, str, int]]:
    """(variant, task, seed) in the order they run: the claims' cells first (only ``cells``
    when given). ``check``: three members on RTE, SQuAD and CoNLL, one seed."""
    if check:
        return [(v, t, 0) for v in ("bert", "albert", "distilbert")
                for t in ("rte", "squad", "conll")]
    order = (list(CLAIM_CELLS) + [(v, t) for t in TASKS for v in VARIANTS
                                  if (v, t) not in CLAIM_CELLS]
             + [(v, t) for v in ABLATIONS for t in GLUE])
    return [(v, t, s) for v, t in order if not cells or (v, t) in cells for s in SEEDS]


def read_cells(work: str) -> list[tuple[str, str]] | None:
    path = os.path.join(work, CELLS)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [tuple(c) for c in json.load(f)]


def finetune_dir(work: str, variant: str, task: str, seed: int) -> str:
    return os.path.join(work, "finetune", f"{variant}_{task}_seed{seed}")


def finetune_overrides(task: str, data_root: str, init: str, seed: int, check: bool
                       ) -> tuple[str, list]:
    """(experiment spec, overrides) of one fine-tuning run: the paper's recipe at length 128
    (batch 32, 3 epochs, 10% warmup; lr 5e-5, SQuAD 1e-4 as docs/results.md found a small
    model needs)."""
    common = [f"--config.init_checkpoint={init}", f"--config.seed={seed}",
              "--config.progress_bar=false", "--config.log_every=1000",
              "--config.model.dtype=" + ("float32" if check else "bfloat16"),
              "--config.max_seq_length=128",
              "--config.length_bucket_min=0"]
    if check:
        common += ["--config.max_train_examples=64", "--config.epochs=1"]
    if task in GLUE:
        rows = SST2_TRAIN_ROWS if task == "sst2" and not check else 0
        return (f"{REPO}/experiments/glue.py:{task}",
                [*common, f"--config.data_dir={data_root}/glue/{GLUE[task]}",
                 "--config.optimizer.learning_rate=5e-5",
                 *([] if check else ["--config.epochs=3", f"--config.max_train_examples={rows}"])])
    if task == "squad":
        return (f"{REPO}/experiments/squad.py:v1",
                [*common, f"--config.data_dir={data_root}/squad",
                 "--config.featurize.doc_stride=64", "--config.featurize.max_query_length=32",
                 "--config.optimizer.learning_rate=1e-4"])
    return (f"{REPO}/experiments/ner.py:conll2003",
            [*common, f"--config.data_dir={data_root}/conll",
             "--config.optimizer.learning_rate=5e-5"])


def next_job(work: str, check: bool) -> tuple[str, str, int] | None | bool:
    """The first job, in :func:`jobs` order, that is not finished, not claimed by a worker and
    whose member is pretrained, claimed for the caller; ``None`` when a job may still become
    ready (a member is pretraining), ``False`` when nothing is left to run."""
    waiting = False
    over = os.path.exists(os.path.join(work, "pretrain", FINISHED))
    for variant, task, seed in jobs(check, read_cells(work)):
        workdir = finetune_dir(work, variant, task, seed)
        if os.path.exists(os.path.join(workdir, "metrics.json")):
            continue
        if not os.path.exists(os.path.join(work, "pretrain", pretrained_member(variant),
                                           "done.json")):
            waiting = waiting or not over
            continue
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        try:
            os.close(os.open(workdir + ".claim", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        return variant, task, seed
    return None if waiting else False


def finetune_worker(args) -> int:
    """One process: claims unfinished jobs in order as their members finish pretraining and
    runs them in-process (programs of the same shape compiled once)."""
    import jax

    from bert_jax.finetuning.config import load_config
    from bert_jax.finetuning.finetune import finetune
    from bert_jax.finetuning.trainer import FinetunerCache

    jax.config.update("jax_compilation_cache_dir", os.path.join(args.work, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    programs = FinetunerCache()
    deadline = Deadline(args.deadline_s)
    time.sleep(args.start_delay)  # the workers' CUDA starts apart from each other's
    jax.devices()
    failures = 0
    while deadline.left() >= 60 and failures < 3:
        job = next_job(args.work, args.check)
        if job is False:
            break
        if job is None:  # the next members are still pretraining
            time.sleep(3)
            continue
        variant, task, seed = job
        workdir = finetune_dir(args.work, variant, task, seed)
        shutil.rmtree(workdir, ignore_errors=True)
        spec, overrides = finetune_overrides(
            task, args.data_root, os.path.join(args.work, "pretrain", pretrained_member(variant)),
            seed, args.check)
        overrides += ABLATIONS.get(variant, (None, []))[1]
        start = time.perf_counter()
        try:
            finetune(load_config(spec, overrides), workdir, programs=programs)
        except Exception:  # noqa: BLE001 - logged; the job is tried once more, by any worker
            failures += 1
            _log(f"{variant} {task} seed {seed}: failed\n{traceback.format_exc()}")
            if not os.path.exists(workdir + ".failed"):
                open(workdir + ".failed", "w").close()
                os.remove(workdir + ".claim")
            continue
        failures = 0
        _log(f"{variant} {task} seed {seed}: {time.perf_counter() - start:.0f} s")
    return 0


def start_finetune_workers(data_root: str, work: str, seconds: float, parallel: int,
                           check: bool) -> dict[str, subprocess.Popen]:
    """``parallel`` worker processes that run the fine-tuning jobs as members finish
    pretraining (claims of runs stopped in an earlier call are dropped first)."""
    os.makedirs(os.path.join(work, "finetune"), exist_ok=True)
    for name in os.listdir(os.path.join(work, "finetune")):
        if name.endswith(".claim") and not os.path.exists(
                os.path.join(work, "finetune", name[:-6], "metrics.json")):
            os.remove(os.path.join(work, "finetune", name))
    procs = {}
    for i in range(parallel):  # CUDA starts after the first pretraining runs', 10 s apart
        delay = 0 if check else 45 + 10 * i
        cmd = [sys.executable, "-m", "bench", "variants", "finetune-worker", "--work", work,
               "--data-root", data_root, "--deadline-s", str(max(0.0, seconds)),
               "--start-delay", str(delay), *(["--check"] if check else [])]
        procs[str(i)] = _spawn(cmd, os.path.join(work, "finetune", f"worker{i}.log"),
                               FINETUNE_MEMORY)
    return procs


def wait_finetune(procs: dict[str, subprocess.Popen], work: str, deadline: Deadline,
                  reserve: float, check: bool, tick=lambda: None) -> bool:
    """Waits for the workers (stopping them ``reserve`` seconds before the deadline); returns
    whether every job finished."""
    while any(p.poll() is None for p in procs.values()):
        if deadline.left() < reserve:
            _stop(procs)
            break
        tick()
        time.sleep(2)
    return all(os.path.exists(os.path.join(finetune_dir(work, *j), "metrics.json"))
               for j in jobs(check, read_cells(work)))


def _time(fn, *args, repeats: int = 5, iters: int = 20) -> float:
    """Median seconds of one call over ``repeats`` timings of ``iters`` calls (after warm-up)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _speed(cfg) -> dict:
    """Inference (batch 256) and fine-tuning (batch 32, AdamW) sequences/s of a sequence
    classifier of ``cfg`` at length 128, on random ids."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from bert_jax.modeling import BertForSequenceClassification

    rng = np.random.default_rng(0)
    model = BertForSequenceClassification(cfg, num_labels=2)
    ids = jnp.asarray(rng.integers(5, cfg.vocab_size, (256, 128)), jnp.int32)
    mask = jnp.ones_like(ids)
    params = model.init(jax.random.PRNGKey(0), ids[:1], mask[:1])["params"]
    forward = jax.jit(lambda p, x, m: model.apply({"params": p}, x, m)["logits"])
    tx = optax.adamw(5e-5)
    labels = jnp.asarray(rng.integers(0, 2, 32))

    def loss(p, x, m, y):
        logits = model.apply({"params": p}, x, m, deterministic=False,
                             rngs={"dropout": jax.random.PRNGKey(1)})["logits"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, o):
        grads = jax.grad(loss)(p, ids[:32], mask[:32], labels)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o

    infer = _time(forward, params, ids, mask)
    train = _time(lambda p, o: step(p, o)[0], params, tx.init(params))
    return {"layers": cfg.num_hidden_layers, "inference_seq_per_s": round(256 / infer),
            "finetune_seq_per_s": round(32 / train)}


def encoder_params() -> dict[str, int]:
    """Every member's encoder parameters (embeddings included, no pooler), from its config."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # shapes only: no accelerator needed
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bert_jax.modeling import BertModel
    from bert_jax.runs.config import model_config

    out = {}
    for name in VARIANTS:
        cfg = model_config(SETTINGS["get_config"](name), VOCAB_SIZE)
        shapes = jax.eval_shape(BertModel(cfg, add_pooler=False).init, jax.random.PRNGKey(0),
                                jnp.ones((1, 8), jnp.int32))
        out[name] = int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))
    return out


def speed_and_size(work: str) -> dict:
    """Parameter counts of every member's encoder, and DistilBERT's inference and fine-tuning
    speed against its teacher's."""
    from bert_jax.checkpoint import store

    out: dict = {"params": encoder_params(), "speed": {}}
    for name in ("bert", "distilbert"):
        cfg, _ = store.read_config(os.path.join(work, "pretrain", name))
        out["speed"][name] = _speed(cfg)
    return out


def pretraining_figures(pre: str) -> dict:
    """A member's pretraining wall time, last logged losses and median rate (its workdir
    ``pre``); empty before it has logged."""
    rec: dict = {}
    marker = os.path.join(pre, "done.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            rec["pretrain_seconds"] = json.load(f)["seconds"]
    metrics_file = os.path.join(pre, "metrics.jsonl")
    if os.path.exists(metrics_file):
        with open(metrics_file, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in rows if "loss" in r]
        if rows:
            keep = ("step", "loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy",
                    "sop_accuracy", "sbo_loss", "rtd_loss", "rtd_accuracy", "kd_loss",
                    "seq_per_sec")
            rec["last"] = {k: rows[-1][k] for k in keep if k in rows[-1]}
            rates = sorted(r["seq_per_sec"] for r in rows if "seq_per_sec" in r)
            if rates:
                rec["median_seq_per_sec"] = rates[len(rates) // 2]
    return rec


def collect(work: str, data_root: str) -> list[dict]:
    """One record per row: pretraining steps, tokens, FLOPs, time, last losses (an ablation
    row names its member and overrides instead), and per task the seeds' dev scores."""
    records = []
    for name in ROWS:
        member = pretrained_member(name)
        rec: dict = {"variant": name, "steps": SETTINGS["steps"](member),
                     "flops_per_seq": SETTINGS["train_flops"](member), "tasks": {}}
        if name in ABLATIONS:
            rec.update(pretrained=member, overrides=ABLATIONS[name][1])
        else:
            rec.update(pretraining_figures(os.path.join(work, "pretrain", member)))
        for task in TASKS:
            scores = {}
            for seed in SEEDS:
                path = os.path.join(finetune_dir(work, name, task, seed), "metrics.json")
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        result = json.load(f)
                    split = next(k for k in result["final"]
                                 if isinstance(result["final"][k], dict))
                    scores[seed] = {k: v for k, v in result["final"][split].items()
                                    if isinstance(v, (int, float))}
                    scores[seed]["train_seq_per_s"] = result.get("train_sequences_per_second")
            if scores:
                rec["tasks"][task] = scores
        if name not in ABLATIONS or rec["tasks"]:
            records.append(rec)
    return records


def write_records(work: str, data_root: str, path: str, env: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"environment": env}) + "\n")
        for rec in collect(work, data_root):
            f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)


def write_logs(work: str, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for root, _, names in os.walk(work):
            for n in sorted(names):
                if n.endswith(".log"):
                    with open(os.path.join(root, n), encoding="utf-8", errors="replace") as g:
                        lines = g.readlines()
                    f.write(f"==> {os.path.join(root, n)}\n" + "".join(lines[-15:]))


def gpu(args) -> int:
    """Pretrains the members while the fine-tuning workers take each member's jobs as soon
    as it is pretrained; the records are rewritten every few seconds, so a run cut short
    still leaves what it finished."""
    import jax

    from bench import variants_prep

    deadline = Deadline(args.deadline_s)
    work = os.path.abspath(args.work)
    os.makedirs(os.path.join(work, "pretrain"), exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    data = variants_prep.unpack(args.data, os.path.join(work, "data"))
    data_root = os.path.join(work, "data")
    env = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    path = os.path.join(args.out, "variants_h200.jsonl")
    last = [0.0]

    def tick(force: bool = False):
        if force or time.monotonic() - last[0] > 20:
            write_records(work, data_root, path, env)
            last[0] = time.monotonic()

    finished = os.path.join(work, "pretrain", FINISHED)
    if os.path.exists(finished):
        os.remove(finished)
    cells = parse_cells(args.cells) if args.cells else None
    if cells:
        with open(os.path.join(work, CELLS), "w", encoding="utf-8") as f:
            json.dump(cells, f)
        env["cells"] = sorted({f"{v}:{t}" for v, t in cells})
    elif os.path.exists(os.path.join(work, CELLS)):
        os.remove(os.path.join(work, CELLS))
    chosen = members(cells)
    # the fine-tuning comes first; DistilBERT's speed is timed after it where time is left
    reserve = 10 if args.check else 30
    workers = start_finetune_workers(data_root, work, deadline.left() - reserve,
                                     args.finetune_parallel, args.check)
    env["pretrained"] = pretrain_all(data, work, deadline, args.pretrain_parallel, args.check,
                                     tick, chosen)
    with open(finished, "w", encoding="utf-8") as f:
        json.dump({"all": env["pretrained"]}, f)
    env["finetuned"] = wait_finetune(workers, work, deadline, reserve - 20, args.check, tick)
    speed_file = os.path.join(work, "speed.json")
    ready = all(os.path.exists(os.path.join(work, "pretrain", n, "done.json"))
                for n in ("bert", "distilbert"))
    if ready and not os.path.exists(speed_file) and deadline.left() > SPEED_SECONDS:
        # alone on the GPU, after every other process has ended
        with open(speed_file, "w", encoding="utf-8") as f:
            json.dump(speed_and_size(work), f)
    if os.path.exists(speed_file):
        with open(speed_file, encoding="utf-8") as f:
            env.update(json.load(f))
    tick(force=True)
    write_logs(work, os.path.join(args.out, "logs.txt"))
    done = env["finetuned"] and "speed" in env
    _log(f"{path}: pretrained {env['pretrained']}, finetuned {env['finetuned']}; "
         + ("complete" if done else "not complete: run again on this machine to continue"))
    return 0


def merge(paths: list[str], out: str) -> None:
    """One records file from the records of several ``gpu`` runs (``--cells`` runs on
    machines that did not share their work folder): a member's pretraining from the last
    file in which it finished, each (member, task) cell from the last file that has it. The
    environment lists every run's."""
    envs, by = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        envs.append(lines[0]["environment"])
        for rec in lines[1:]:
            have = by.setdefault(rec["variant"], {k: rec[k] for k in
                                                  ("variant", "steps", "flops_per_seq")})
            if "pretrain_seconds" in rec or "pretrained" in rec:  # (not in a run stopped early)
                have.update({k: v for k, v in rec.items() if k != "tasks"})
            have.setdefault("tasks", {}).update(rec["tasks"])
    env = {k: v for k, v in envs[0].items()
           if k not in ("pretrained", "finetuned", "cells", "speed", "speed_runs")}
    for extra in envs[1:]:
        for name, value in extra.get("params", {}).items():
            env.setdefault("params", {}).setdefault(name, value)
    # DistilBERT's speed: every run's timing kept, the table shows their median
    runs = [r for e in envs
            for r in (e.get("speed_runs") or ([e["speed"]] if "speed" in e else []))]
    if runs:
        env["speed_runs"] = runs
        env["speed"] = {m: {k: (statistics.median(r[m][k] for r in runs) if k != "layers"
                                else runs[0][m][k]) for k in runs[0][m]} for m in runs[0]}
    env["runs"] = [run for e in envs for run in e.get("runs") or  # a merged file: its runs
                   [{k: e[k] for k in ("date", "cells", "pretrained", "finetuned") if k in e}]]
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"environment": env}) + "\n")
        for name in ROWS:
            if name in by:
                f.write(json.dumps(by[name]) + "\n")


# ---- report -----------------------------------------------------------------------------
GLUE_METRIC = {"sst2": "accuracy", "cola": "mcc", "mrpc": "acc_and_f1", "stsb": "corr",
               "rte": "accuracy"}
LABELS = {"sst2": "SST-2 acc", "cola": "CoLA MCC", "mrpc": "MRPC acc/F1", "stsb": "STS-B corr",
          "rte": "RTE acc", "glue": "GLUE avg", "glue4": "avg w/o STS-B", "squad": "SQuAD F1",
          "conll": "CoNLL F1"}


def task_scores(rec: dict, task: str) -> dict[int, float]:
    """{seed: score x 100} of one member on one task (GLUE: the task's main metric;
    SQuAD and CoNLL: F1); ``glue``: the five tasks' average, per seed that has all five;
    ``glue4``: the same without STS-B."""
    if task in ("glue", "glue4"):
        per = [task_scores(rec, t) for t in GLUE if task == "glue" or t != "stsb"]
        seeds = set.intersection(*(set(p) for p in per)) if all(per) else set()
        return {s: statistics.fmean(p[s] for p in per) for s in sorted(seeds)}
    runs = rec["tasks"].get(task, {})
    out = {}
    for seed, metrics in runs.items():
        value = metrics[GLUE_METRIC[task]] if task in GLUE else metrics["f1"]
        out[int(seed)] = value * 100 if task in GLUE else value  # SQuAD, CoNLL: percent
    return out


def mean_std(scores: dict[int, float]) -> tuple[float, float] | None:
    if not scores:
        return None
    values = list(scores.values())
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(ms) -> str:
    return "–" if ms is None else f"{ms[0]:.1f} ± {ms[1]:.1f}"


def claims(by: dict[str, dict], params: dict[str, int] | None = None
           ) -> list[tuple[str, str, str, str]]:
    """(claim, member's result, baseline's result, verdict) per claim (``params``: encoder
    parameters per member, for ALBERT's row)."""
    def ms(v, t):
        return mean_std(task_scores(by[v], t)) if v in by else None

    def verdict(a, b, better=True, ratio=None):
        if a is None or b is None:
            return "not measured"
        if ratio is not None:
            held = a[0] >= ratio * b[0]
            return f"{'held' if held else 'did not hold'} ({100 * a[0] / b[0]:.1f}% of BERT)"
        diff = a[0] - b[0]
        noise = max(a[1], b[1])
        held = diff > 0 if better else diff >= 0
        size = "within the seed spread" if abs(diff) <= noise else "beyond the seed spread"
        return f"{'held' if held else 'did not hold'} ({diff:+.1f}, {size})"

    bert_glue = ms("bert", "glue")

    def size_verdict(a):
        if a is None or bert_glue is None or not {"albert", "bert"} <= set(params or {}):
            return "not measured"
        return (f"{a[0] - bert_glue[0]:+.1f} points with {params['albert'] / 1e6:.1f} M "
                f"encoder parameters against {params['bert'] / 1e6:.1f} M")
    rows = [("ELECTRA: higher GLUE avg than BERT", _fmt(ms("electra", "glue")), _fmt(bert_glue),
             verdict(ms("electra", "glue"), bert_glue)),
            ("RoBERTa-style: GLUE avg at least BERT's", _fmt(ms("roberta", "glue")),
             _fmt(bert_glue), verdict(ms("roberta", "glue"), bert_glue, better=False)),
            ("SpanBERT: higher SQuAD F1 than BERT", _fmt(ms("spanbert", "squad")),
             _fmt(ms("bert", "squad")), verdict(ms("spanbert", "squad"), ms("bert", "squad"))),
            ("ERNIE (CoNLL-train lexicon): higher CoNLL F1 than token masking",
             _fmt(ms("ernie_lexicon", "conll")), _fmt(ms("bert", "conll")),
             verdict(ms("ernie_lexicon", "conll"), ms("bert", "conll"))),
            ("ERNIE (built-in fallback units): higher CoNLL F1 than token masking",
             _fmt(ms("ernie", "conll")), _fmt(ms("bert", "conll")),
             verdict(ms("ernie", "conll"), ms("bert", "conll"))),
            ("ALBERT: GLUE avg beside BERT's, with its parameters",
             _fmt(ms("albert", "glue")), _fmt(bert_glue), size_verdict(ms("albert", "glue"))),
            ("DistilBERT: at least 95% of its teacher's GLUE avg",
             _fmt(ms("distilbert", "glue")), _fmt(bert_glue),
             verdict(ms("distilbert", "glue"), bert_glue, ratio=0.95))]
    return rows


def report(records_path: str, docs: str) -> int:
    """Writes the generated part of docs/variants.md and docs/variants.png."""
    with open(records_path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    env = lines[0]["environment"]
    by = {r["variant"]: r for r in lines[1:]}
    cols = [*GLUE, "glue", "glue4", "squad", "conll"]
    params = env.get("params") or encoder_params()
    out = ["| member | steps | GFLOP / sequence | wall s | final loss | MLM acc | other |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for name, rec in by.items():
        if "pretrained" in rec:  # an ablation: its member's pretraining
            continue
        last = rec.get("last", {})
        other = ", ".join(f"{k.replace('_', ' ')} {last[k]:.3f}" for k in
                          ("nsp_accuracy", "sbo_loss", "rtd_accuracy", "rtd_loss", "kd_loss")
                          if k in last)
        loss, acc = (f"{last[k]:.3f}" if k in last else "–" for k in ("loss", "mlm_accuracy"))
        out.append(f"| {name} | {rec['steps']:,} | {rec['flops_per_seq'] / 1e9:.1f} | "
                   f"{rec.get('pretrain_seconds', '–')} | {loss} | {acc} | {other} |")
    out += ["", "| member | pretrain steps | encoder params | "
           + " | ".join(LABELS[c] for c in cols) + " |",
           "|---|---:|---:|" + "---:|" * len(cols)]
    for name, rec in by.items():
        cells = []
        for c in cols:
            cell = _fmt(mean_std(task_scores(rec, c)))
            cells.append(f"**{cell}**" if c == "glue" else cell)
        p = params.get(name)
        out.append(f"| {name} | {rec['steps']:,} | {f'{p / 1e6:.1f} M' if p else '–'} | "
                   + " | ".join(cells) + " |")
    out += ["", "| claim | member | baseline (BERT) | at this scale |", "|---|---:|---:|---|"]
    out += [f"| {c} | {a} | {b} | {v} |" for c, a, b, v in claims(by, params)]
    ablations = [(n, r) for n, r in by.items() if "pretrained" in r]
    if ablations:
        out += ["", "| ablation | overrides | task | ablation | its member |",
                "|---|---|---|---:|---:|"]
        for name, rec in ablations:
            member = by.get(rec["pretrained"], {"tasks": {}})
            for t in (t for t in TASKS if t in rec["tasks"]):
                a, b = (mean_std(task_scores(r, t)) for r in (rec, member))
                out.append(f"| {name} | `{' '.join(rec.get('overrides', []))}` | {LABELS[t]} | "
                           f"{_fmt(a)} | {_fmt(b)} ({rec['pretrained']}) |")
    speed = env.get("speed", {})
    if "bert" in speed and "distilbert" in speed:
        t, s = speed["bert"], speed["distilbert"]
        runs = len(env.get("speed_runs", [speed]))
        note = f"; median of {runs} runs" if runs > 1 else ""
        out += ["", f"| model | layers | inference seq/s (batch 256{note}) | fine-tuning seq/s "
                f"(batch 32{note}) |", "|---|---:|---:|---:|",
                f"| BERT (teacher) | {t['layers']} | {t['inference_seq_per_s']:,} | "
                f"{t['finetune_seq_per_s']:,} |",
                f"| DistilBERT | {s['layers']} | {s['inference_seq_per_s']:,} "
                f"({s['inference_seq_per_s'] / t['inference_seq_per_s']:.2f}x) | "
                f"{s['finetune_seq_per_s']:,} "
                f"({s['finetune_seq_per_s'] / t['finetune_seq_per_s']:.2f}x) |"]
    section = "\n".join(out) + "\n"
    path = os.path.join(docs, "variants.md")
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin, end = "<!-- variants:begin -->\n", "<!-- variants:end -->"
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin) + len(begin)] + section + doc[doc.index(end):]
        with open(path, encoding="utf-8", mode="w") as f:
            f.write(doc)
    print(section)
    _plot(by, os.path.join(docs, "variants.png"),
          f"{env.get('device', '?')}, jax {env.get('jax', '?')}, {env.get('date', '')}: "
          f"{os.path.basename(records_path)}")
    return 0


def _plot(by: dict[str, dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(by)
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, task in zip(axes, ("glue", "stsb", "squad", "conll"), strict=True):
        stats = [mean_std(task_scores(by[n], task)) for n in names]
        xs = [i for i, s in enumerate(stats) if s]
        ax.bar(xs, [stats[i][0] for i in xs], yerr=[stats[i][1] for i in xs], capsize=3,
               color=["tab:gray" if names[i] == "bert" else "tab:blue" for i in xs])
        for i in xs:
            ax.plot([i] * len(task_scores(by[names[i]], task)),
                    list(task_scores(by[names[i]], task).values()), "k.", ms=3)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{LABELS[task]} (dev, x100; mean ± sd over seeds, dots = seeds)",
                     fontsize=9)
        lows = [stats[i][0] - stats[i][1] for i in xs]
        if lows:
            ax.set_ylim(max(0.0, min(lows) - 5), None)
        else:
            ax.set_yticks([])
            ax.text(0.5, 0.5, "not measured", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench variants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("prepare", help="tensorflow: tokenizer, data, batches, task files")
    q.add_argument("--corpus", required=True)
    q.add_argument("--glue", required=True)
    q.add_argument("--conll", required=True, help="folder with CoNLL-2003 train.txt, valid.txt")
    q.add_argument("--squad", required=True, help="a SQuAD v1.1 JSON file, split by article")
    q.add_argument("--out", required=True)
    q.add_argument("--work", default="variants_work")
    q.add_argument("--num-workers", type=int, default=2)
    g = sub.add_parser("gpu", help="pretrain, fine-tune, time; resumable")
    g.add_argument("--data", required=True, help="the folder `prepare` wrote")
    g.add_argument("--work", default="variants_work")
    g.add_argument("--out", required=True)
    g.add_argument("--deadline-s", type=float, default=560)
    g.add_argument("--pretrain-parallel", type=int, default=4)
    g.add_argument("--finetune-parallel", type=int, default=6)
    g.add_argument("--cells", default="",
                   help="only these cells, e.g. electra:glue,bert:squad (task glue: the five "
                        "GLUE tasks); only their members pretrain (DistilBERT with its teacher)")
    g.add_argument("--check", action="store_true",
                   help="CPU validation: the 2 x 128 model, 20 steps, three members fine-tuned "
                        "on 64 rows of RTE, SQuAD and CoNLL")
    w = sub.add_parser("finetune-worker")
    w.add_argument("--work", required=True)
    w.add_argument("--data-root", required=True)
    w.add_argument("--deadline-s", type=float, required=True)
    w.add_argument("--start-delay", type=float, default=0.0)
    w.add_argument("--check", action="store_true")
    m = sub.add_parser("merge", help="one records file from several runs' records")
    m.add_argument("records", nargs="+")
    m.add_argument("--out", required=True)
    r = sub.add_parser("report", help="the table and plot of docs/variants.md")
    r.add_argument("records")
    r.add_argument("--docs", default=os.path.join(REPO, "docs"))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "prepare":
        prepare(args)
        return 0
    if args.command == "gpu":
        return gpu(args)
    if args.command == "finetune-worker":
        return finetune_worker(args)
    if args.command == "merge":
        merge(args.records, args.out)
        return 0
    return report(args.records, args.docs)


if __name__ == "__main__":
    sys.exit(main())
