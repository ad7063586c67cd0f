"""What every patch is built on: the patch table (`registry`: each patch's seam, switch, probe, install and what
it did in this process) and the seam helpers (`seams`: finding a vLLM attribute, hooking a pydantic model or a
method)."""
