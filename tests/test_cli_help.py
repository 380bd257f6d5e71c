"""The command line explains itself: the top-level help describes the tool (without importing
JAX), and every option of every command has help text and shows its default."""

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys

import pytest

from bert_jax import cli


def test_top_level_help_is_for_users_and_imports_no_jax():
    code = ("import sys; from bert_jax import cli; p = cli.build_parser(['--help']); "
            "print(p.format_help()); print('jax' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().endswith("False False")
    assert "fine-tune" in out and "A first run" in out and "plot-metrics" in out
    assert "no logic lives here" not in out  # not the module's internal docstring


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_option_has_help_and_default(name):
    parser = cli.build_parser([name])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = sub.choices[name]
    assert command.formatter_class is cli.HelpFormatter
    missing = [a.option_strings or a.dest for a in command._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, f"{name}: options without help text: {missing}"
    # ArgumentDefaultsHelpFormatter appends each option's default to its help text.
    text = " ".join(command.format_help().split())
    for action in command._actions:
        unset = action.default is None or action.default is False
        if action.option_strings and action.help and not unset \
                and action.default is not argparse.SUPPRESS and "default" not in action.help:
            assert f"default: {action.default}" in text, (name, action.option_strings)


HEAVY = ("jax", "tensorflow", "flax", "optax", "orbax", "torch")


def test_every_command_help_imports_no_jax():
    """`bert-jax COMMAND --help` for every command, through the real entry point, in one fresh
    interpreter: none of them may import JAX, TensorFlow, Flax, Optax, Orbax or PyTorch."""
    code = ("import contextlib, io, json, sys\n"
            "from bert_jax import cli\n"
            f"heavy = {HEAVY!r}\n"
            "found = {}\n"
            "for name in sorted(cli.COMMANDS):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n"
            "            cli.main([name, '--help'])\n"
            "        except SystemExit as e:\n"
            "            assert e.code == 0, (name, e.code)\n"
            "    assert 'usage: bert-jax ' + name in out.getvalue(), name\n"
            "    found[name] = [m for m in heavy if m in sys.modules]\n"
            "print(json.dumps(found))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert set(found) == set(cli.COMMANDS)
    assert {name: mods for name, mods in found.items() if mods} == {}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_first_run_example_names_paths_that_exist_in_a_clone():
    """The top-level help's first run, as written (from the clone's root): its inputs and the
    experiment config exist, and each command parses."""
    text = cli.DESCRIPTION.replace("\\\n", " ")
    commands = [shlex.split(line.strip())[1:] for line in text.splitlines()
                if line.strip().startswith("bert-jax ")]
    assert [c[0] for c in commands] == ["train-tokenizer", "create-pretraining-data",
                                        "pretrain", "fill-mask"]
    for argv in commands:
        for flag in ("--input", "--config"):
            if flag in argv:
                path = argv[argv.index(flag) + 1].split(":")[0]
                assert os.path.exists(os.path.join(REPO, path)), (argv[0], path)
        parser = cli.build_parser(argv)
        args, unknown = parser.parse_known_args(argv)
        assert all(u.startswith("--config.") for u in unknown), (argv, unknown)
    assert os.path.isfile(os.path.join(REPO, "docs", "first-hour.md"))


def test_finetune_help_lists_every_experiment_and_variant():
    """`finetune --help` names each experiment file and all its variants, and each one
    loads."""
    from bert_jax.cli.finetune import EXPERIMENTS_HELP
    from bert_jax.finetuning.config import load_config

    listed = {}
    for line in EXPERIMENTS_HELP.splitlines():
        if line.strip().startswith("experiments/"):
            path, *variants = line.split(":")[0].split("(")[0].split()
            listed[path] = variants
    assert set(listed) == {"experiments/glue.py", "experiments/squad.py", "experiments/ner.py",
                           "experiments/swag.py", "experiments/custom.py"}
    for path, variants in listed.items():
        spec = importlib.util.spec_from_file_location("x", os.path.join(REPO, path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        known = (getattr(module, "TASKS", None) or getattr(module, "VARIANTS", None)
                 or getattr(module, "VERSIONS", None))
        if known is not None:
            assert set(known) <= set(variants), (path, set(known) - set(variants))
        for variant in variants:
            load_config(os.path.join(REPO, f"{path}:{variant}"), [])
