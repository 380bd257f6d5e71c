"""bert-jax: BERT in JAX/Flax for TPU pod slices and GPUs."""

from bert_jax.config import PRESETS, BertConfig, KernelOptions
from bert_jax.errors import BertJaxError

__version__ = "0.1.0"
__all__ = ["BertConfig", "KernelOptions", "PRESETS", "BertJaxError", "__version__"]
