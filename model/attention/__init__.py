"""Gated full attention of Qwen3.5/3.6: the layer over a KV cache (`layer`: reference, staged and core paths, prefill
over a cached prefix), its decode layer over a static cache as a table of whole-layer paths (`decode_layer`), the
one-kernel middle of that layer (`triton_decode_layer`), and partial NeoX RoPE (`rope`)."""
