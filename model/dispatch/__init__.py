"""What every block's path choice is built on: the path tables (`paths`), the measured per-device dispatch tables
(`table`), one answer per selector question within a forward pass (`scope`), the boolean environment knobs (`env`),
where the Triton kernels can run (`triton_support`) and launching them without the JIT's per-call work
(`triton_launch`). Imports nothing else of `model`: every block imports it."""
