# The platform image: the platform's CoreX vLLM image plus this project, installed as a package whose vLLM
# general plugin applies the patch set in every vLLM process. No network beyond the base image: pip runs
# with --no-index --no-deps (the base provides torch and vLLM; the plugin imports nothing else).
# `docker build` cannot run in this workplace (no engine); `qwen36 presubmit` checks this file statically.
ARG BASE_IMAGE=git.modelhub.org.cn:9443/enginex-iluvatar/bi100-3.2.3-x86-ubuntu20.04-py3.10-poc-llm-infer:v1.2.3
FROM ${BASE_IMAGE}

# The project lives in its own folder; the server starts from /workspace, which has no `vllm/` to shadow
# the installed package (a root `vllm/` broke a platform start once; docs/design.md).
WORKDIR /workspace
COPY pyproject.toml README.md /opt/qwen36/
COPY model /opt/qwen36/model
COPY patches /opt/qwen36/patches
COPY harness /opt/qwen36/harness
RUN python3 -m pip install --no-index --no-deps --no-build-isolation /opt/qwen36
# The measured dispatch tables (`qwen36 tune`, docs/tuning.md): the installed package has no checkout beside
# it, so the dispatchers are told where the tables are; a device without a table keeps the knobs below.
COPY fixtures/dispatch /opt/qwen36/fixtures/dispatch
ENV QWEN36_DISPATCH_DIR=/opt/qwen36/fixtures/dispatch

# Where computility-run.yaml's --chat-template points.
COPY patches/chat_template.jinja /workspace/chat_template.jinja
COPY computility-run.yaml /workspace/computility-run.yaml

# The run config's environment (presubmit checks they agree).
ENV QWEN36_PATCHES=all \
    QWEN36_PATCH_ROUTER=0 \
    MOE_NATIVE=1 \
    MOE_DECODE_NATIVE=1 \
    ENGINEX_MOE_TINY_IMPL=bmm \
    ENGINEX_MOE_TINY_MAX=8 \
    PROF_TRACE=0 \
    PROF_MOE_SUMMARY=0 \
    PROF_MOE_SYNC=0 \
    ENGINEX_PROFILE_DECODE=0

# Fail the build unless vLLM's own plugin loader finds the plugin and every required patch applies to the
# vLLM in this image (prints the patch table either way).
RUN cd / && python3 -m patches.verify && test -f /workspace/chat_template.jinja

EXPOSE 8000
CMD ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/root/public-storage/models/Qwen/Qwen3.6-35B-A3B", "--served-model-name", "Qwen3.6-35B-A3B", "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "4", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.9", "--max-model-len", "245000", "--max-num-batched-tokens", "16384", "--max-num-seqs", "1", "--enable-chunked-prefill", "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3", "--chat-template", "/workspace/chat_template.jinja"]
