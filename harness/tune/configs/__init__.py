"""`qwen36 tune moe --sweep-configs`: the Triton expert kernels' block configs searched per token count.

`space` (the candidates), `precompile` (compiling them in parallel processes), `sweep` (timing them),
`choice` (the fastest correct config per token count, and the table to paste into the kernel's module).
"""
