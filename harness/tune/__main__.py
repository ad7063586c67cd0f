"""`python -m harness.tune ...`: the tuning command without the rest of the `qwen36` CLI's imports."""
import sys

from harness.tune.cli import main

sys.exit(main())
