"""``bert-jax analyze-attention`` and ``bert-jax probe``: their arguments. Parsing imports
nothing heavy (``--help`` runs without JAX); ``run`` imports the module that does the work."""

from __future__ import annotations


class AnalyzeAttention:
    @staticmethod
    def add_arguments(p):
        p.add_argument("checkpoint", help="bert-jax model dir / workdir or Hugging Face dir")
        p.add_argument("--input", required=True,
                       help="text file (one text per line) or a TSV with --text-column")
        p.add_argument("--output", required=True, help="output directory")
        p.add_argument("--text-column", help="TSV column of the text (header name or 0-based "
                                             "index for files without a header)")
        p.add_argument("--text-pair-column", help="TSV column of a second segment")
        p.add_argument("--max-examples", type=int, default=0, help="0 = every text")
        p.add_argument("--max-length", type=int, default=128,
                       help="tokens per text, [CLS] and [SEP] included")
        p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass")
        p.add_argument("--sentence-index", type=int, default=0,
                       help="the text (0-based) drawn as an attention map")
        p.add_argument("--layer", type=int, default=1, help="its layer (1-based)")
        p.add_argument("--head", type=int, default=1, help="its head (1-based)")
        p.add_argument("--no-plots", action="store_true", help="only attention_stats.json")

    @staticmethod
    def run(args) -> int:
        from bert_jax.analysis.attention import run_command

        return run_command(args)


class Probe:
    @staticmethod
    def add_arguments(p):
        p.add_argument("checkpoint", help="bert-jax model dir / workdir or Hugging Face dir")
        p.add_argument("--train", required=True, help="CoNLL-format file (token labels) or "
                                                      "TSV with a header (sentence labels)")
        p.add_argument("--dev-file", help="dev split (default: --holdout of train)")
        p.add_argument("--output", required=True, help="output directory")
        p.add_argument("--level", choices=["auto", "token", "sentence"], default="auto",
                       help="auto: sentence for .tsv files, else token (CoNLL)")
        p.add_argument("--label-column", default="-1",
                       help="CoNLL: 0-based column (CoNLL-2003: 1 POS, 2 chunk, 3 NER; -1 the "
                            "last); TSV: the header name")
        p.add_argument("--text-column", help="TSV: the text column's header name")
        p.add_argument("--text-pair-column", help="TSV: a second segment's column")
        p.add_argument("--pooling", choices=["mean", "cls"], default="mean",
                       help="sentence features: mean over tokens or the [CLS] vector")
        p.add_argument("--probe", choices=["linear", "mlp"], default="linear",
                       help="classifier trained on each layer's frozen features")
        p.add_argument("--mlp-hidden", type=int, default=256, help="mlp probe: hidden width")
        p.add_argument("--mix", action="store_true",
                       help="also train a probe on a learned scalar mix of all states")
        p.add_argument("--steps", type=int, default=500, help="training steps per probe")
        p.add_argument("--batch-size", type=int, default=1024, help="0 = full batch")
        p.add_argument("--learning-rate", type=float, default=1e-3, help="probe learning rate")
        p.add_argument("--holdout", type=float, default=0.1,
                       help="fraction of train held out as dev when no --dev-file is given")
        p.add_argument("--max-train-examples", type=int, default=0, help="sentences / rows")
        p.add_argument("--max-dev-examples", type=int, default=0,
                       help="at most this many dev sentences / rows (0: all)")
        p.add_argument("--max-length", type=int, default=128,
                       help="tokens per text, [CLS] and [SEP] included")
        p.add_argument("--batch-size-extract", type=int, default=64,
                       help="texts per forward pass when extracting features")
        p.add_argument("--cache", help=".npz file keeping the extracted features (reused "
                                       "when it exists)")
        p.add_argument("--seed", type=int, default=0, help="random seed of the probes")
        p.add_argument("--no-plots", action="store_true", help="write no figures")

    @staticmethod
    def run(args) -> int:
        from bert_jax.analysis.probe import run_command

        return run_command(args)
