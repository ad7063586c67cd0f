"""The model-path substitutions: vLLM's own compute replaced by the project's `model` paths in the served model
(`moe_experts`: the routed experts, `moe_router`: the top-k routing), and `step_slowdown`, the perf gates'
test-only slower engine step (not a patch of the set: never on in the platform image)."""
