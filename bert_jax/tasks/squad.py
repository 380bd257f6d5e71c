"""SQuAD v1.1 / v2.0: JSON reader, document-stride windows, n-best span decoding, outputs.

Follows Google's ``run_squad.py``: the context is split into words on whitespace, answer
character offsets become word offsets, each word is sub-tokenized, long contexts are cut into
windows of ``max_seq_length`` with stride ``doc_stride``, and a token's "max context" window is
the one where it has the most context on its shorter side. Decoding keeps the ``n_best_size``
best starts and ends, drops spans outside the context, reversed, longer than
``max_answer_length`` or starting where the window is not the token's max context, and (v2)
answers "" when the null score beats the best span by more than ``null_score_diff_threshold``.

One difference by design: the answer text is cut from the original context by character
offsets of each sub-token (aligned within its word), instead of Google's re-tokenization
heuristic ``get_final_text``; it is tokenizer-independent (WordPiece and SentencePiece) and picks
the right occurrence when a word contains the predicted text twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.tasks import squad_eval
from bert_jax.tasks.base import (
    ExampleList,
    Features,
    RowProblems,
    Task,
    pad_rows,
    resolve_file,
    write_json,
)
from bert_jax.textio import read_text
from bert_jax.tokenization.base import SPECIAL_TOKENS


@dataclasses.dataclass(frozen=True)
class SquadExample:
    qas_id: str
    question: str
    context: str
    doc_tokens: tuple[str, ...]  # context split on whitespace (Google's "words")
    doc_offsets: tuple[int, ...]  # character offset of each word in ``context``
    answers: tuple[str, ...]  # all gold answer texts (empty when impossible)
    answer_text: str | None  # the first answer, the training target
    start_position: int | None  # word index of the first answer's first / last character
    end_position: int | None
    is_impossible: bool = False


@dataclasses.dataclass
class SpanPredictions:
    """Decoded answers per question id, the n-best lists and (v2) the null odds."""

    answers: dict[str, str]
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] | None = None


def is_whitespace(c: str) -> bool:
    """Google's run_squad whitespace: space, tab, CR, LF and the narrow no-break space."""
    return c in " \t\r\n" or ord(c) == 0x202F


def split_context(context: str) -> tuple[list[str], list[int], list[int]]:
    """Context -> (words, start offset of each word, word index of every character)."""
    words: list[str] = []
    offsets: list[int] = []
    char_to_word: list[int] = []
    prev_ws = True
    for i, c in enumerate(context):
        if is_whitespace(c):
            prev_ws = True
        else:
            if prev_ws:
                words.append(c)
                offsets.append(i)
            else:
                words[-1] += c
            prev_ws = False
        char_to_word.append(len(words) - 1)
    return words, offsets, char_to_word


def read_squad_json(path: str, version_2: bool, on_error: str = "raise") -> ExampleList:
    """Reads an official SQuAD JSON file; bad answer spans are reported with the question id."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise BertJaxError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise BertJaxError(f"{path}: expected the SQuAD layout {{'version', 'data': [...]}}")
    problems = RowProblems(on_error)
    examples = []
    for a, article in enumerate(data["data"]):
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            context = paragraph["context"]
            words, offsets, char_to_word = split_context(context)
            for qa in paragraph["qas"]:
                where = f"{path}: question {qa.get('id')!r} (article {a}, paragraph {p})"
                ex = _read_question(qa, context, words, offsets, char_to_word, version_2,
                                    where, problems)
                if ex is not None:
                    examples.append(ex)
    return problems.finish(examples, path)


def _read_question(qa, context, words, offsets, char_to_word, version_2, where, problems):
    impossible = bool(qa.get("is_impossible", False)) if version_2 else False
    if "is_impossible" in qa and not version_2 and qa["is_impossible"]:
        problems.report(where, "is_impossible=true in a SQuAD v1.1 task (use squad_v2)")
        return None
    answers = qa.get("answers", [])
    if impossible:
        answers = []
    elif not answers:
        problems.report(where, "no answers and not is_impossible")
        return None
    for ans in answers:
        start, text = ans.get("answer_start"), ans.get("text")
        if not isinstance(start, int) or not isinstance(text, str) or not text:
            problems.report(where, f"answer {ans!r} needs a text and an int answer_start")
            return None
        if start < 0 or context[start:start + len(text)] != text:
            problems.report(where, f"answer {text!r} is not at answer_start={start} of the "
                            f"context (found {context[start:start + len(text)]!r})")
            return None
    start_pos = end_pos = answer_text = None
    if answers:
        first = answers[0]
        answer_text = first["text"]
        start_pos = char_to_word[first["answer_start"]]
        end_pos = char_to_word[first["answer_start"] + len(answer_text) - 1]
    return SquadExample(qas_id=str(qa["id"]), question=qa["question"], context=context,
                        doc_tokens=tuple(words), doc_offsets=tuple(offsets),
                        answers=tuple(a["text"] for a in answers), answer_text=answer_text,
                        start_position=start_pos, end_position=end_pos,
                        is_impossible=impossible)


def subtoken_char_spans(word: str, subtokens: Sequence[str], kind: str) -> list[tuple[int, int]]:
    """Character span of each sub-token inside ``word``; the whole word when they don't align.

    The sub-token surfaces (``##``/``▁`` markers removed) must spell the word's non-space
    characters with equal length (lower-casing and accent stripping keep lengths for nearly all
    text); otherwise (e.g. [UNK]) every sub-token maps to the whole word, as Google's fallback.
    """
    whole = [(0, len(word))] * len(subtokens)
    positions = [i for i, c in enumerate(word) if not c.isspace()]
    surfaces = []
    for tok in subtokens:
        if tok in SPECIAL_TOKENS:
            return whole
        if kind == "wordpiece" and tok.startswith("##"):
            tok = tok[2:]
        elif kind == "sentencepiece":
            tok = tok.lstrip("\u2581")
        surfaces.append(tok)
    if not positions or sum(len(s) for s in surfaces) != len(positions):
        return whole
    spans, k = [], 0
    for s in surfaces:
        if not s:  # a bare marker piece covers nothing; attach it to the next character
            spans.append((positions[min(k, len(positions) - 1)],) * 2)
            continue
        spans.append((positions[k], positions[k + len(s) - 1] + 1))
        k += len(s)
    return spans


def _improve_answer_span(doc_tokens, start, end, tokenizer, answer_text):
    """Google's tightening of the answer span to the tokenized answer text."""
    target = " ".join(tokenizer.tokenize(answer_text))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == target:
                return new_start, new_end
    return start, end


def _is_max_context(spans, current, position) -> bool:
    """Whether window ``current`` gives token ``position`` the most context (Google's rule)."""
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, i
    return current == best


def featurize_squad(examples: Sequence[SquadExample], tokenizer, max_seq_length: int,
                    doc_stride: int = 128, max_query_length: int = 64) -> Features:
    """Examples -> one feature per window: ``[CLS] question [SEP] context window [SEP]``.

    Arrays ([F] or [F, S] int32): input_ids, input_mask, segment_ids, start_positions,
    end_positions (0 = [CLS] when the answer is outside the window or impossible),
    example_index, token_to_orig (word index of context tokens, -1 elsewhere),
    token_is_max_context, token_char_start / token_char_end (span in the context, -1 elsewhere).
    """
    if doc_stride <= 0:
        raise BertJaxError(f"doc_stride must be positive, got {doc_stride}")
    cols: dict[str, list] = {k: [] for k in (
        "input_ids", "segment_ids", "start_positions", "end_positions", "example_index",
        "token_to_orig", "token_is_max_context", "token_char_start", "token_char_end")}
    for ex_index, ex in enumerate(examples):
        query = tokenizer.tokenize(ex.question)[:max_query_length]
        max_doc = max_seq_length - len(query) - 3
        if max_doc <= 0:
            raise BertJaxError(f"max_seq_length={max_seq_length} leaves no room for the context "
                               f"after a {len(query)}-token question (max_query_length="
                               f"{max_query_length})")
        tok_to_orig, orig_to_tok, doc_toks, char_start, char_end = [], [], [], [], []
        for w, word in enumerate(ex.doc_tokens):
            orig_to_tok.append(len(doc_toks))
            subs = tokenizer.tokenize(word)
            for sub, (s, e) in zip(subs, subtoken_char_spans(word, subs, tokenizer.kind),
                                   strict=True):
                tok_to_orig.append(w)
                doc_toks.append(sub)
                char_start.append(ex.doc_offsets[w] + s)
                char_end.append(ex.doc_offsets[w] + e)
        tok_start = tok_end = None
        if ex.start_position is not None:
            tok_start = orig_to_tok[ex.start_position]
            tok_end = (orig_to_tok[ex.end_position + 1] - 1
                       if ex.end_position + 1 < len(ex.doc_tokens) else len(doc_toks) - 1)
            if tok_end >= tok_start:
                tok_start, tok_end = _improve_answer_span(doc_toks, tok_start, tok_end,
                                                          tokenizer, ex.answer_text)
            else:  # the answer's words produced no tokens
                tok_start = tok_end = None
        spans = []
        offset = 0
        while offset < len(doc_toks) or not spans:
            length = min(len(doc_toks) - offset, max_doc)
            spans.append((offset, length))
            if offset + length >= len(doc_toks):
                break
            offset += min(length, doc_stride)
        query_ids = [tokenizer.token_to_id(t) for t in query]
        for span_index, (start, length) in enumerate(spans):
            doc_offset = len(query) + 2
            ids = [tokenizer.cls_id, *query_ids, tokenizer.sep_id]
            to_orig = [-1] * len(ids)
            is_max = [0] * len(ids)
            c_start = [-1] * len(ids)
            c_end = [-1] * len(ids)
            for i in range(start, start + length):
                ids.append(tokenizer.token_to_id(doc_toks[i]))
                to_orig.append(tok_to_orig[i])
                is_max.append(int(_is_max_context(spans, span_index, i)))
                c_start.append(char_start[i])
                c_end.append(char_end[i])
            ids.append(tokenizer.sep_id)
            for lst, pad in ((to_orig, -1), (is_max, 0), (c_start, -1), (c_end, -1)):
                lst.append(pad)
            segs = [0] * doc_offset + [1] * (length + 1)
            s_pos = e_pos = 0
            if tok_start is not None and start <= tok_start and tok_end <= start + length - 1:
                s_pos, e_pos = tok_start - start + doc_offset, tok_end - start + doc_offset
            for key, value in (("input_ids", ids), ("segment_ids", segs),
                               ("start_positions", s_pos), ("end_positions", e_pos),
                               ("example_index", ex_index), ("token_to_orig", to_orig),
                               ("token_is_max_context", is_max), ("token_char_start", c_start),
                               ("token_char_end", c_end)):
                cols[key].append(value)
    S = max_seq_length
    feats = {
        "input_ids": pad_rows(cols["input_ids"], S, tokenizer.pad_id),
        "input_mask": pad_rows([[1] * len(r) for r in cols["input_ids"]], S, 0),
        "segment_ids": pad_rows(cols["segment_ids"], S, 0),
        "token_to_orig": pad_rows(cols["token_to_orig"], S, -1),
        "token_is_max_context": pad_rows(cols["token_is_max_context"], S, 0),
        "token_char_start": pad_rows(cols["token_char_start"], S, -1),
        "token_char_end": pad_rows(cols["token_char_end"], S, -1),
    }
    for key in ("start_positions", "end_positions", "example_index"):
        feats[key] = np.asarray(cols[key], dtype=np.int32).reshape(-1)
    return feats


def _split_logits(model_outputs) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) logits from a dict, a pair or an array [F, S, 2]."""
    if isinstance(model_outputs, dict):
        return np.asarray(model_outputs["start_logits"]), np.asarray(model_outputs["end_logits"])
    if isinstance(model_outputs, (tuple, list)):
        return np.asarray(model_outputs[0]), np.asarray(model_outputs[1])
    arr = np.asarray(model_outputs)
    return arr[..., 0], arr[..., 1]


def decode_spans(features: Features, model_outputs, examples: Sequence[SquadExample],
                 n_best_size: int = 20, max_answer_length: int = 30, version_2: bool = False,
                 null_score_diff_threshold: float = 0.0) -> SpanPredictions:
    """Google's n-best decoding over all windows of each example (see module docstring)."""
    start_logits, end_logits = _split_logits(model_outputs)  # [F, S] each
    n_feat = features["input_ids"].shape[0]
    if start_logits.shape[0] != n_feat:
        raise BertJaxError(f"{start_logits.shape[0]} span outputs for {n_feat} features")
    by_example: dict[int, list[int]] = {}
    for f, e in enumerate(features["example_index"]):
        by_example.setdefault(int(e), []).append(f)
    answers, nbest_out, null_odds = {}, {}, {} if version_2 else None
    to_orig, is_max = features["token_to_orig"], features["token_is_max_context"]
    c_start, c_end = features["token_char_start"], features["token_char_end"]
    for e, ex in enumerate(examples):
        prelim = []  # (score, feature, start, end, start_logit, end_logit)
        null = None  # (score, feature, start_logit, end_logit) of the lowest null score
        for f in by_example.get(e, []):
            sl, el = start_logits[f], end_logits[f]
            if version_2:
                score = float(sl[0] + el[0])
                if null is None or score < null[0]:
                    null = (score, f, float(sl[0]), float(el[0]))
            starts = np.argsort(-sl, kind="stable")[:n_best_size]
            ends = np.argsort(-el, kind="stable")[:n_best_size]
            for s in starts:
                for t in ends:
                    if to_orig[f, s] < 0 or to_orig[f, t] < 0 or not is_max[f, s]:
                        continue
                    if t < s or t - s + 1 > max_answer_length:
                        continue
                    prelim.append((float(sl[s] + el[t]), f, int(s), int(t), float(sl[s]),
                                   float(el[t])))
        if null is not None:
            prelim.append((null[2] + null[3], null[1], 0, 0, null[2], null[3]))
        prelim.sort(key=lambda p: p[0], reverse=True)
        nbest, seen = [], set()
        for _, f, s, t, s_logit, e_logit in prelim:
            if len(nbest) >= n_best_size:
                break
            text = ex.context[c_start[f, s]:c_end[f, t]] if s > 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": s_logit, "end_logit": e_logit})
        if version_2 and "" not in seen and null is not None:
            nbest.append({"text": "", "start_logit": null[2], "end_logit": null[3]})
        if not any(n["text"] for n in nbest):  # no valid span at all (rare): a nonce answer
            nbest.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
        totals = np.array([n["start_logit"] + n["end_logit"] for n in nbest])
        probs = np.exp(totals - totals.max())
        probs /= probs.sum()
        for n, p in zip(nbest, probs, strict=True):
            n["probability"] = float(p)
        best = next(n for n in nbest if n["text"])
        nbest_out[ex.qas_id] = nbest
        if version_2:
            diff = null[0] - best["start_logit"] - best["end_logit"] if null else -math.inf
            null_odds[ex.qas_id] = float(diff)
            answers[ex.qas_id] = "" if diff > null_score_diff_threshold else best["text"]
        else:
            answers[ex.qas_id] = nbest[0]["text"]
    return SpanPredictions(answers, nbest_out, null_odds)


class SquadTask(Task):
    """SQuAD v1.1 (``squad_v1``) or v2.0 with unanswerable questions (``squad_v2``)."""

    kind = "span"
    label_keys = ("start_positions", "end_positions")
    splits = ("train", "dev")
    main_metric = "f1"

    def __init__(self, version_2: bool):
        self.version_2 = version_2
        self.name = "squad_v2" if version_2 else "squad_v1"
        self.tfds_name = "squad/v2.0" if version_2 else "squad/v1.1"
        v = "v2.0" if version_2 else "v1.1"
        self._files = {"train": (f"train-{v}.json",), "dev": (f"dev-{v}.json",)}

    def read(self, split, data_dir=None, files=None, on_error="raise") -> ExampleList:
        path = resolve_file(split, self._files, data_dir, files)
        return read_squad_json(path, self.version_2, on_error)

    def from_tfds(self, records, split, label_names=None) -> ExampleList:
        """tensorflow-datasets ``squad/*`` records (numpy) -> examples."""
        paragraphs: dict[str, dict] = {}
        for rec in records:
            context = _text(rec["context"])
            qa = {"id": _text(rec["id"]), "question": _text(rec["question"]),
                  "is_impossible": bool(rec.get("is_impossible", False)),
                  "answers": [{"text": _text(t), "answer_start": int(s)} for t, s in zip(
                      rec["answers"]["text"], rec["answers"]["answer_start"], strict=True)]}
            paragraphs.setdefault(context, {"context": context, "qas": []})["qas"].append(qa)
        examples = []
        problems = RowProblems("raise")
        for par in paragraphs.values():
            words, offsets, char_to_word = split_context(par["context"])
            for qa in par["qas"]:
                ex = _read_question(qa, par["context"], words, offsets, char_to_word,
                                    self.version_2, f"{self.tfds_name}:{split}: {qa['id']}",
                                    problems)
                examples.append(ex)
        return ExampleList(examples)

    def featurize(self, examples, tokenizer, max_seq_length, doc_stride=128,
                  max_query_length=64) -> Features:
        return featurize_squad(examples, tokenizer, max_seq_length, doc_stride, max_query_length)

    def postprocess(self, features, model_outputs, examples, n_best_size=20,
                    max_answer_length=30, null_score_diff_threshold=0.0) -> SpanPredictions:
        return decode_spans(features, model_outputs, examples, n_best_size, max_answer_length,
                            self.version_2, null_score_diff_threshold)

    def metrics(self, predictions: SpanPredictions, examples) -> dict[str, float]:
        """evaluate-v1.1.py, or evaluate-v2.0.py with the null odds as ``--na-prob-file``."""
        golds = {ex.qas_id: list(ex.answers) for ex in examples}
        if self.version_2:
            missing = [q for q in golds if q not in predictions.answers]
            if missing:
                raise BertJaxError(f"{self.name}: no prediction for {len(missing)} questions, "
                                   f"e.g. {missing[0]!r}")
            return squad_eval.evaluate_v2(golds, predictions.answers, predictions.null_odds)
        return squad_eval.evaluate_v1(golds, predictions.answers)

    def write_predictions(self, predictions: SpanPredictions, examples, output_dir,
                          split) -> list[str]:
        """predictions.json and nbest_predictions.json (+ null_odds.json for v2)."""
        storage.makedirs(output_dir)
        paths = [write_json(storage.join(output_dir, "predictions.json"), predictions.answers),
                 write_json(storage.join(output_dir, "nbest_predictions.json"),
                            predictions.nbest)]
        if predictions.null_odds is not None:
            paths.append(write_json(storage.join(output_dir, "null_odds.json"),
                                    predictions.null_odds))
        return paths


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
