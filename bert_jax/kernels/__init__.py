"""Kernels apart from the model layers: Pallas flash attention with in-kernel dropout
(``flash``), the fused bias + dropout + residual + LayerNorm (``fused_norm``), bias + erf GELU
(``fused_gelu``), the MLM decoder's softmax cross-entropy (``fused_xent``), the FP8 matmuls'
float8 casts with transposed copies (``fp8_cast``), splash attention
(``splash``), the counter-hash dropout masks they share (``dropout``), the launch helpers of
the row-tiled kernels (``row_tiles``), and the plain math they are tested against
(``reference``). Nothing here imports ``bert_jax.modeling``; the model picks
a kernel from its config's fields."""
