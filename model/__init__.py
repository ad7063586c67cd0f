"""The Qwen3.6 compute: float64-capable references and the optimised paths, in pure PyTorch.

Device-agnostic and free of project imports: `patches` and `harness` depend on `model`, never the reverse.
"""
