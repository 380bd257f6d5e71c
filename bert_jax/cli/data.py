"""``bert-jax create-pretraining-data`` (raw text -> TFRecord shards) and
``bert-jax materialize-batches`` (the masking pipeline's batches saved as numpy)."""

from __future__ import annotations

import os

from bert_jax import storage
from bert_jax.data import documents as document_shards
from bert_jax.data import instances, text
from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data, summary
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.materialize import MASKING_MODES, materialize_batches
from bert_jax.errors import BertJaxError


class CreatePretrainingData:
    """``bert-jax create-pretraining-data``."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                            help="text files or directories (read recursively)")
        parser.add_argument("--tokenizer", required=True,
                            help="tokenizer directory, vocab.txt or SentencePiece .model")
        parser.add_argument("--output-dir", required=True,
                            help="directory for the TFRecord shards and metadata.json")
        parser.add_argument("--max-seq-length", type=int, default=128,
                            help="tokens per example, [CLS] and [SEP]s included (the model's "
                                 "data.max_seq_length must match)")
        parser.add_argument("--short-seq-prob", type=float, default=0.1,
                            help="share of examples cut short on purpose (BERT's 10%%), so "
                                 "the model also sees short inputs")
        parser.add_argument("--mode", choices=instances.MODES, default="nsp",
                            help="nsp: sentence pairs + is-next label (BERT); sop: sentence "
                                 "order (ALBERT); full_sentences: MLM only (RoBERTa)")
        parser.add_argument("--dupe-factor", type=int, default=1,
                            help="passes over the corpus (masking is dynamic, so extra passes "
                                 "only re-sample the pairs)")
        parser.add_argument("--num-shards", type=int, default=8,
                            help="training TFRecord files to write (at least the number of "
                                 "hosts that will read them)")
        parser.add_argument("--seed", type=int, default=12345,
                            help="seed of pairing, truncation and shard order")
        parser.add_argument("--num-workers", type=int, default=os.cpu_count() or 1,
                            help="processes tokenizing in parallel (default: this machine's CPU "
                                 "count, %(default)s here)")
        parser.add_argument("--input-format", choices=text.INPUT_FORMATS, default="auto",
                            help="lines: one sentence per line, blank line between documents; "
                                 "paragraphs: prose; auto: decided per file")
        parser.add_argument("--holdout-fraction", type=float, default=0.0,
                            help="fraction of documents written to eval-*.tfrecord instead "
                                 "(held-out data for pretraining's evaluation; 0.05 is "
                                 "typical, 0 leaves none)")
        parser.add_argument("--format", choices=document_shards.FORMATS, default="pairs",
                            dest="output_format",
                            help="pairs: finished NSP/SOP/packed examples; documents: tokenized "
                                 "documents with sentence boundaries, paired afresh every epoch "
                                 "by the pipeline (--max-seq-length, --mode, --short-seq-prob "
                                 "and --dupe-factor then do not apply)")
        parser.add_argument("--max-record-tokens", type=int,
                            default=document_shards.DEFAULT_MAX_RECORD_TOKENS,
                            help="documents: longer documents are stored in chunks of whole "
                                 "sentences of at most this many tokens (0: never chunk)")
        parser.add_argument("--knowledge-units", action="store_true",
                            help="annotate phrases and entities (unit_ids) for "
                                 "data.masking=knowledge: capitalised spans and frequent "
                                 "n-grams, plus --knowledge-lexicon entries")
        parser.add_argument("--knowledge-lexicon", metavar="FILE",
                            help="entities/phrases, one per line (implies --knowledge-units)")
        parser.add_argument("--pack", action="store_true",
                            help="write packed rows: several examples per record (their "
                                 "natural lengths, best-fit), attention kept within each "
                                 "example, so short examples stop paying for padding "
                                 "(docs/data.md, \"Sequence packing\")")
        parser.add_argument("--max-examples-per-row", type=int, default=8,
                            help="--pack: examples a row may hold (default 8)")
        parser.add_argument("--no-progress", action="store_true",
                            help="no progress bar (for logs)")

    @staticmethod
    def run(args) -> int:
        from bert_jax.tokenization.factory import load_tokenizer

        if not storage.exists(args.tokenizer):
            raise BertJaxError(f"--tokenizer {args.tokenizer}: no such file or directory")
        tokenizer = load_tokenizer(args.tokenizer)
        lexicon: tuple[str, ...] = ()
        if args.knowledge_lexicon:
            from bert_jax.data.knowledge_masking import load_lexicon

            lexicon = tuple(load_lexicon(args.knowledge_lexicon))
        config = CreationConfig(
            knowledge_units=bool(args.knowledge_units or lexicon), knowledge_lexicon=lexicon,
            max_seq_length=args.max_seq_length, short_seq_prob=args.short_seq_prob,
            mode=args.mode, dupe_factor=args.dupe_factor, seed=args.seed,
            input_format=args.input_format, holdout_fraction=args.holdout_fraction,
            output_format=args.output_format, max_record_tokens=args.max_record_tokens,
            pack=args.pack, max_examples_per_row=args.max_examples_per_row)
        metadata = create_pretraining_data(
            args.input, tokenizer, args.output_dir, config, num_shards=args.num_shards,
            num_workers=args.num_workers, progress=not args.no_progress)
        print(summary(metadata))
        return 0


class MaterializeBatches:
    """``bert-jax materialize-batches``."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--data-dir", required=True, help="output of create-pretraining-data")
        parser.add_argument("--output", required=True,
                            help="directory for the .npy batches and manifest.json")
        parser.add_argument("--steps", type=int, required=True, help="batches to write")
        parser.add_argument("--batch-size", type=int, required=True, help="global batch size")
        parser.add_argument("--max-predictions", type=int, required=True,
                            help="masked positions per sequence (data.max_predictions_per_seq)")
        parser.add_argument("--seq-len", type=int, default=None,
                            help="pad to this length (default: the data's max_seq_length)")
        parser.add_argument("--seed", type=int, default=0, help="shuffle and masking seed")
        parser.add_argument("--split", choices=("train", "eval"), default="train",
                            help="eval: the held-out shards (--holdout-fraction)")
        parser.add_argument("--pairing", default=None,
                            choices=("static", "nsp", "sop", "full_sentences", "doc_sentences"),
                            help="static: pair shards; the others pair document shards "
                                 "(default: static for pair shards, nsp for document shards)")
        parser.add_argument("--short-seq-prob", type=float, default=0.1,
                            help="document shards, nsp/sop: chance of a shorter target length")
        parser.add_argument("--masking", default=None, choices=MASKING_MODES,
                            help="as a training run's data.masking: token, whole_word, span "
                                 "(SpanBERT) or knowledge (ERNIE: data created with "
                                 "--knowledge-units); default token")
        parser.add_argument("--mask-rate", type=float, default=MaskSettings.mask_rate,
                            help="share of tokens masked (data.masked_lm_prob)")
        parser.add_argument("--mask-token-fraction", type=float,
                            default=MaskSettings.mask_token_fraction,
                            help="share of the masked tokens shown as [MASK] "
                                 "(data.mask_token_fraction)")
        parser.add_argument("--random-token-fraction", type=float,
                            default=MaskSettings.random_token_fraction,
                            help="share of the masked tokens replaced by a random token "
                                 "(data.random_token_fraction); the rest stay unchanged")
        parser.add_argument("--span-p", type=float, default=MaskSettings.span_p,
                            help="--masking span: geometric parameter of span lengths in words")
        parser.add_argument("--max-span", type=int, default=MaskSettings.max_span,
                            help="--masking span: longest span in words")
        parser.add_argument("--basic-masking-fraction", type=float, default=0.25,
                            help="--masking knowledge: share of sequences masked token by "
                                 "token (data.basic_masking_fraction)")
        parser.add_argument("--shuffle-buffer", type=int, default=10_000,
                            help="example shuffle buffer (data.shuffle_buffer)")
        parser.add_argument("--whole-word", action="store_true",
                            help="mask all pieces of a word together (= --masking whole_word)")
        parser.add_argument("--span-masking", action="store_true",
                            help="the older contiguous-span switch of the pipeline; "
                                 "--masking span is what data.masking=span trains with")
        parser.add_argument("--tokenizer", default=None,
                            help="checked against the data; required for every masking but "
                                 "token")
        parser.add_argument("--no-progress", action="store_true",
                            help="no progress bar (for logs)")

    @staticmethod
    def run(args) -> int:
        tokenizer = None
        if args.tokenizer:
            from bert_jax.tokenization.factory import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer)
        manifest = materialize_batches(
            args.data_dir, args.output, steps=args.steps, batch_size=args.batch_size,
            max_predictions=args.max_predictions, seed=args.seed, whole_word=args.whole_word,
            span_masking=args.span_masking, seq_len=args.seq_len, tokenizer=tokenizer,
            split=args.split, pairing=args.pairing, short_seq_prob=args.short_seq_prob,
            masking=args.masking, mask_rate=args.mask_rate,
            mask_token_fraction=args.mask_token_fraction,
            random_token_fraction=args.random_token_fraction, span_p=args.span_p,
            max_span=args.max_span, basic_fraction=args.basic_masking_fraction,
            shuffle_buffer=args.shuffle_buffer, progress=not args.no_progress)
        print(f"wrote {manifest['steps']} batches of {manifest['batch_size']} to {args.output}")
        return 0
