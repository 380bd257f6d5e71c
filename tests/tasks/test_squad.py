import json

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task
from bert_jax.tasks.squad import split_context, subtoken_char_spans

DIGITS = "0 1 2 3 4 5 6 7 8 9 0 1 2 3"  # 14 one-token words


def squad_file(tmp_path, qas_by_context, version="1.1", name="data.json"):
    data = {"version": version, "data": [{"title": "T", "paragraphs": [
        {"context": c, "qas": qas} for c, qas in qas_by_context]}]}
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def qa(qid, question, answers, impossible=None):
    out = {"id": qid, "question": question,
           "answers": [{"text": t, "answer_start": s} for t, s in answers]}
    if impossible is not None:
        out["is_impossible"] = impossible
    return out


def test_reader_char_offsets_to_words_and_multiple_answers(tmp_path):
    context = "The Denver  Broncos\twon\nSuper Bowl 50."
    words, offsets, char_to_word = split_context(context)
    assert words == ["The", "Denver", "Broncos", "won", "Super", "Bowl", "50."]
    assert offsets == [0, 4, 12, 20, 24, 30, 35]
    assert char_to_word[11] == 1  # whitespace belongs to the word before it (Google)
    path = squad_file(tmp_path, [(context, [
        qa("q1", "Who won?", [("Denver  Broncos", 4), ("Broncos", 12)]),
        qa("q2", "Which bowl?", [("50", 35)]),  # starts inside the word "50."
    ])])
    ex = get_task("squad_v1").read("dev", files=path)
    assert (ex[0].start_position, ex[0].end_position) == (1, 2)
    assert ex[0].answers == ("Denver  Broncos", "Broncos")
    assert (ex[1].start_position, ex[1].end_position) == (6, 6)


def test_reader_v2_and_bad_spans(tmp_path):
    context = "Paris is the capital of France."
    path = squad_file(tmp_path, [(context, [
        qa("ok", "What?", [("Paris", 0)], impossible=False),
        qa("none", "Who?", [], impossible=True),
        qa("bad", "Where?", [("France", 3)], impossible=False),
    ])], version="v2.0")
    task = get_task("squad_v2")
    with pytest.raises(BertJaxError, match=r"data\.json: question 'bad' .*'France' is not at"):
        task.read("dev", files=path)
    ex = task.read("dev", files=path, on_error="skip")
    assert [e.qas_id for e in ex] == ["ok", "none"] and len(ex.skipped) == 1
    assert ex[1].is_impossible and ex[1].answers == () and ex[1].start_position is None
    with pytest.raises(BertJaxError, match="is_impossible=true in a SQuAD v1.1"):
        get_task("squad_v1").read("dev", files=path)


def digits_features(tmp_path, tokenizer, answer=("5 6 7", 10)):
    path = squad_file(tmp_path, [(DIGITS, [qa("d", "who won", [answer])])])
    task = get_task("squad_v1")
    ex = task.read("train", files=path)
    # max_seq_length 11 - 2 question tokens - 3 specials = 6 context tokens per window.
    return task, ex, task.featurize(ex, tokenizer, 11, doc_stride=3, max_query_length=64)


def test_windows_positions_and_max_context(tmp_path, tokenizer):
    _, _, f = digits_features(tmp_path, tokenizer)
    # Windows start at context tokens 0, 3, 6, 9 (the last one is 5 long).
    assert f["input_ids"].shape == (4, 11)
    assert f["example_index"].tolist() == [0, 0, 0, 0]
    assert f["token_to_orig"][1].tolist() == [-1] * 4 + [3, 4, 5, 6, 7, 8] + [-1]
    assert f["token_to_orig"][3].tolist() == [-1] * 4 + [9, 10, 11, 12, 13, -1, -1]
    assert f["segment_ids"][3].tolist() == [0] * 4 + [1] * 6 + [0]
    # The answer (words 5..7) lies wholly only in window 1: positions 4 + (5 - 3) ...
    assert f["start_positions"].tolist() == [0, 6, 0, 0]
    assert f["end_positions"].tolist() == [0, 8, 0, 0]
    # Max context (Google's score: min(left, right) + 0.01 * length; ties -> earlier window).
    assert f["token_is_max_context"][1].tolist() == [0] * 4 + [0, 0, 1, 1, 1, 0] + [0]
    assert f["token_is_max_context"][0, 4:10].tolist() == [1, 1, 1, 1, 1, 0]
    # Character spans in the context of each token.
    assert f["token_char_start"][1, 4:10].tolist() == [6, 8, 10, 12, 14, 16]
    assert f["token_char_end"][1, 4:10].tolist() == [7, 9, 11, 13, 15, 17]


def test_answer_across_window_boundary_is_cls_in_partial_windows(tmp_path, tokenizer):
    _, _, f = digits_features(tmp_path, tokenizer, answer=("2 3 4 5 6 7 8", 4))
    # 7 tokens never fit a 6-token window: every window points at [CLS].
    assert f["start_positions"].tolist() == [0, 0, 0, 0]
    _, _, f = digits_features(tmp_path, tokenizer, answer=("7 8 9", 14))
    assert f["start_positions"].tolist() == [0, 0, 5, 0]  # only window 2 (tokens 6..11)


def logits_like(f, value=-5.0):
    F, S = f["input_ids"].shape
    return np.full((F, S), value), np.full((F, S), value)


def test_decoding_respects_max_context_order_and_length(tmp_path, tokenizer):
    task, ex, f = digits_features(tmp_path, tokenizer)
    start, end = logits_like(f)
    start[1, 6], end[1, 8] = 5.0, 5.0  # "5 6 7" in window 1 (max context for its start)
    start[2, 5], end[2, 6] = 9.0, 9.0  # higher, but token 7 is not max context in window 2
    start[0, 9], end[0, 4] = 9.5, 9.5  # end before start
    pred = task.postprocess(f, {"start_logits": start, "end_logits": end}, ex)
    assert pred.answers == {"d": "5 6 7"}
    nbest = pred.nbest["d"]
    assert nbest[0]["text"] == "5 6 7" and nbest[0]["start_logit"] == 5.0
    assert len(nbest) <= 20 and len({n["text"] for n in nbest}) == len(nbest)
    assert sum(n["probability"] for n in nbest) == pytest.approx(1.0)
    # max_answer_length: a 3-token answer is dropped when only 2 are allowed.
    short = task.postprocess(f, (start, end), ex, max_answer_length=2)
    assert short.answers["d"] != "5 6 7"
    # n_best_size bounds the list; an array [F, S, 2] is accepted too.
    pred3 = task.postprocess(f, np.stack([start, end], -1), ex, n_best_size=3)
    assert len(nbest) > 3 and len(pred3.nbest["d"]) <= 3 and pred3.answers["d"] == "5 6 7"


def test_answer_text_is_cut_inside_words(tmp_path, tokenizer):
    context = "born (1895–1943). unbelievable"
    path = squad_file(tmp_path, [(context, [qa("y", "when", [("1943", 11)])])])
    task = get_task("squad_v1")
    ex = task.read("dev", files=path)
    f = task.featurize(ex, tokenizer, 32)
    ids = f["input_ids"][0].tolist()
    pos = {t: ids.index(tokenizer.token_to_id(t)) for t in ("1895", "1943", "##believ", "##able")}
    assert (f["start_positions"][0], f["end_positions"][0]) == (pos["1943"], pos["1943"])
    for (s, e), text in [(("1895", "1895"), "1895"), (("1895", "1943"), "1895–1943"),
                         (("##believ", "##able"), "believable")]:
        start, end = logits_like(f)
        start[0, pos[s]], end[0, pos[e]] = 3.0, 3.0
        assert task.postprocess(f, (start, end), ex).answers["y"] == text
    # Sub-tokens that do not spell the word fall back to the whole word ([UNK], Google too).
    assert subtoken_char_spans("xyz", ["[UNK]"], "wordpiece") == [(0, 3)]
    assert subtoken_char_spans("Café", ["ca", "##fe"], "wordpiece") == [(0, 2), (2, 4)]
    assert subtoken_char_spans("\u2581", [], "sentencepiece") == []
    assert subtoken_char_spans("New", ["\u2581Ne", "w"], "sentencepiece") == [(0, 2), (2, 3)]


def test_v2_null_threshold_and_odds(tmp_path, tokenizer):
    path = squad_file(tmp_path, [("paris is the capital of france .", [
        qa("has", "what", [("paris", 0)], impossible=False),
        qa("no", "who", [], impossible=True)])], version="v2.0")
    task = get_task("squad_v2")
    ex = task.read("dev", files=path)
    f = task.featurize(ex, tokenizer, 16)
    assert f["start_positions"].tolist() == [3, 0]  # impossible -> [CLS]
    start, end = logits_like(f)
    start[:, 0], end[:, 0] = 1.0, 1.0  # null score 2 in both
    start[:, 3], end[:, 3] = 2.0, 1.5  # "paris": span score 3.5 -> null odds 2 - 3.5 = -1.5
    start[1, 3], end[1, 3] = 0.5, 0.5  # second question: span score 1 -> null odds +1
    pred = task.postprocess(f, (start, end), ex)
    assert pred.null_odds == {"has": pytest.approx(-1.5), "no": pytest.approx(1.0)}
    assert pred.answers == {"has": "paris", "no": ""}
    assert any(n["text"] == "" for n in pred.nbest["has"])  # the null entry is in the n-best
    loose = task.postprocess(f, (start, end), ex, null_score_diff_threshold=1.5)
    assert loose.answers == {"has": "paris", "no": "paris"}
    strict = task.postprocess(f, (start, end), ex, null_score_diff_threshold=-2.0)
    assert strict.answers == {"has": "", "no": ""}
    m = task.metrics(pred, ex)
    assert m["exact"] == 100.0 and m["HasAns_total"] == 1 and m["NoAns_total"] == 1
    assert m["best_f1"] == 100.0
    m_loose = task.metrics(loose, ex)
    assert m_loose["NoAns_exact"] == 0.0 and m_loose["HasAns_exact"] == 100.0

    paths = task.write_predictions(pred, ex, str(tmp_path / "out"), "dev")
    names = sorted(p.rsplit("/", 1)[1] for p in paths)
    assert names == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    with open(tmp_path / "out" / "predictions.json") as fh:
        assert json.load(fh) == {"has": "paris", "no": ""}
    with open(tmp_path / "out" / "null_odds.json") as fh:
        assert json.load(fh)["no"] == pytest.approx(1.0)


def test_oracle_logits_score_full_marks_across_windows(tmp_path, tokenizer):
    context = "the denver broncos won the super bowl game . " * 3 + "john smith lives in paris ."
    answers = [("bronco", "denver broncos", 4), ("city", "paris", context.index("paris")),
               ("who", "john smith", context.index("john"))]
    path = squad_file(tmp_path, [(context, [qa(q, "who won the game", [(t, s)])
                                            for q, t, s in answers])])
    task = get_task("squad_v1")
    ex = task.read("train", files=path)
    f = task.featurize(ex, tokenizer, 16, doc_stride=4, max_query_length=3)
    assert f["input_ids"].shape[0] > 3 * 3  # several windows per question
    start, end = logits_like(f)
    rows = np.arange(len(start))
    start[rows, f["start_positions"]] = 4.0
    end[rows, f["end_positions"]] = 4.0
    pred = task.postprocess(f, (start, end), ex)
    assert pred.answers == {"bronco": "denver broncos", "city": "paris", "who": "john smith"}
    assert task.metrics(pred, ex) == {"exact_match": 100.0, "f1": 100.0}
    (path_pred,) = [p for p in task.write_predictions(pred, ex, str(tmp_path), "dev")
                    if p.endswith("/predictions.json")]
    assert not (tmp_path / "null_odds.json").exists()


def test_featurize_rejects_no_room_for_context(tmp_path, tokenizer):
    _, ex, _ = digits_features(tmp_path, tokenizer)
    with pytest.raises(BertJaxError, match="leaves no room for the context"):
        get_task("squad_v1").featurize(ex, tokenizer, 5)
