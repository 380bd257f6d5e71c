"""Builds the wheel from setup.cfg; the one addition: the experiment configs of the top-level
``experiments/`` folder travel inside the package as ``bert_jax/experiments/``, so that an
installed bert-jax finds ``--config experiments/pretrain.py:tiny`` from any folder."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithExperiments(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "bert_jax", "experiments")
        self.mkpath(target)
        for name in sorted(os.listdir("experiments")):
            if name.endswith(".py"):
                self.copy_file(os.path.join("experiments", name), os.path.join(target, name))


setup(cmdclass={"build_py": BuildWithExperiments})
