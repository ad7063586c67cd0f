"""The API patches: each mends one deviation of vLLM's OpenAI server that the API-conformance suite found
(its module docstring names the deviation), and `request_compat` does the same for callers that render the chat
template without vLLM's server. Siblings that import none of each other; each hooks vLLM through `core.seams`."""
