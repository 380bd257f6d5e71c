"""Writes what `make demo` printed into the docs that quote it, so the numbers a reader sees
are the ones the demo prints.

Each quote is a marked block, rewritten whole::

    <!-- demo:NAME -->
    ...
    <!-- /demo:NAME -->

    python scripts/demo_docs.py pretrain DEMO_DIR [--root REPO]   # after scripts/demo.sh
    python scripts/demo_docs.py finetune DEMO_DIR [--root REPO]   # after demo_finetune.sh

``pretrain`` quotes DEMO_DIR/pretrain_report.txt (the report of scripts/demo_report.py) in
docs/pretraining.md; ``finetune`` quotes DEMO_DIR/finetune_output.txt in docs/finetuning.md
and writes the README's summary of both. Paths under DEMO_DIR are written as
``demo_workdir/`` (the default), so a run elsewhere quotes the same text.
"""

from __future__ import annotations

import argparse
import os
import re
import textwrap

PRETRAIN_REPORT = "pretrain_report.txt"
FINETUNE_OUTPUT = "finetune_output.txt"
# Where each block lives, relative to the repository root.
BLOCK_FILES = {"pretrain-report": "docs/pretraining.md",
               "finetune-report": "docs/finetuning.md",
               "readme-summary": "README.md"}


def block_pattern(name: str) -> re.Pattern:
    name = re.escape(name)
    return re.compile(rf"(<!-- demo:{name} -->\n)(.*?)(<!-- /demo:{name} -->)", re.S)


def read_block(text: str, name: str) -> str:
    """The body of block ``name`` in ``text`` (an error naming it when it is missing)."""
    match = block_pattern(name).search(text)
    if match is None:
        raise SystemExit(f"error: no <!-- demo:{name} --> ... <!-- /demo:{name} --> block")
    return match.group(2)


def replace_block(text: str, name: str, body: str) -> str:
    read_block(text, name)
    return block_pattern(name).sub(lambda m: m.group(1) + body + m.group(3), text, count=1)


def _relative(text: str, demo_dir: str) -> str:
    """Paths under the demo's directory written as under the default ``demo_workdir``."""
    for prefix in {os.path.abspath(demo_dir), demo_dir.rstrip("/")}:
        text = text.replace(prefix + "/", "demo_workdir/")
    return text


def pretrain_block(report: str) -> str:
    """The report as printed, less the line naming the PNG's path."""
    lines = [line for line in report.strip("\n").splitlines() if not line.startswith("curves:")]
    return "```\n" + "\n".join(lines).strip("\n") + "\n```\n"


def finetune_block(output: str) -> str:
    """What the fine-tuning stage printed that a reader needs: the task's size, each epoch's
    line and the best one."""
    keep = [line for line in output.splitlines()
            if re.match(r"(\d+ train and \d+ dev sentences|epoch \d+: train loss|best: )", line)]
    return "```\n" + "\n".join(keep) + "\n```\n"


def _number(pattern: str, text: str, group: int = 1) -> str:
    match = re.search(pattern, text, re.M)
    if match is None:
        raise SystemExit(f"error: the demo's output has no line matching {pattern!r}")
    return match.group(group)


def summary(report: str, finetune: str) -> str:
    """The README's sentence on what the demo shows, with its numbers."""
    acc = re.search(r"^held-out masked-LM accuracy: [0-9.]+ \(step \d+\) -> ([0-9.]+) "
                    r"\(step \d+\); unigram baseline ([0-9.]+)", report, re.M)
    loss = re.search(r"^held-out masked-LM loss: +[0-9.]+ -> ([0-9.]+); unigram baseline "
                     r"([0-9.]+)", report, re.M)
    at_mask = re.search(r"^held-out accuracy at the \[MASK\] positions alone: ([0-9.]+); "
                        r"unigram baseline ([0-9.]+)", report, re.M)
    if not (acc and loss and at_mask):
        raise SystemExit("error: the demo report lacks its held-out lines")
    fills = []
    for line in report.splitlines():
        m = re.match(r"\s+(?:\S+ )*?(\S+) \[MASK\].*?->\s+'([^']*)' ([0-9.]+)", line)
        if m and len(fills) < 3:
            fills.append(f"`{m.group(2)}` after \"{m.group(1)}\" ({m.group(3)})")
    best = re.search(r"^best: epoch (\d+), dev accuracy (\d+\.\d+)", finetune, re.M)
    if best is None:
        raise SystemExit("error: the fine-tuning output has no 'best: epoch N, dev accuracy' "
                         "line")
    return textwrap.fill(
        f"It prints what the model was trained on; the held-out masked-LM accuracy and "
            f"loss beside the unigram baseline (a model that ignores the context): "
            f"{acc.group(1)} against {acc.group(2)}, and {float(loss.group(1)):.2f} against "
            f"{float(loss.group(2)):.2f}; the accuracy at the `[MASK]` positions alone "
            f"({at_mask.group(1)} against {at_mask.group(2)}); "
            f"`demo_workdir/pretrain/curves.png`; fill-mask's most probable fillers "
            f"({', '.join(fills)}); and the fine-tuned model's dev accuracy on which book a "
            f"sentence is from ({float(best.group(2)):.3f}, best epoch {best.group(1)}; "
            "chance 0.5).", width=95, break_on_hyphens=False, break_long_words=False) + "\n"


def write(root: str, name: str, body: str) -> str:
    path = os.path.join(root, BLOCK_FILES[name])
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = replace_block(text, name, body)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["pretrain", "finetune"])
    parser.add_argument("demo_dir", help="the demo's output directory (DEMO_DIR)")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the repository whose README.md and docs/ to write")
    args = parser.parse_args(argv)

    def read(name: str) -> str:
        with open(os.path.join(args.demo_dir, name), encoding="utf-8") as f:
            return _relative(f.read(), args.demo_dir)

    report = read(PRETRAIN_REPORT)
    written = [write(args.root, "pretrain-report", pretrain_block(report))]
    if args.stage == "finetune":
        output = read(FINETUNE_OUTPUT)
        written.append(write(args.root, "finetune-report", finetune_block(output)))
        written.append(write(args.root, "readme-summary", summary(report, output)))
    print("wrote the demo's output into " + ", ".join(os.path.relpath(p, args.root)
                                                     for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
